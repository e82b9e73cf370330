"""NOVA-KV: calibrated, attention-aware transform coding of keys (arXiv 2608.04074; docs/references.md §6).

Calibration, per (layer, KV head), from real queries q (every query head of the GQA group) and keys k:

    Σ_Q = E[q qᵀ] + ρ·(tr E[q qᵀ] / d)·I       second moment of the queries, ridge ρ (default 1e-3)
    μ_K = E[k],   C_K = E[(k − μ_K)(k − μ_K)ᵀ]
    A = Σ_Q^{1/2} C_K Σ_Q^{1/2} = V Λ Vᵀ         Λ descending; column r of V has eigen-rank r
    T = Vᵀ Σ_Q^{1/2},   T⁻¹ = Σ_Q^{−1/2} V        the key transform (not orthogonal) and its inverse

Keys (:class:`NovaQuantizer`, b bits per coefficient, groups of g coefficients, G = d/g groups):

    y = T (k − μ_K)                 coefficients; Cov(y) = Λ
    s = ‖y‖ / √d                    per-token RMS scale, stored in ``scale_dtype`` (fp16)
    u = y / s, cut into G groups    stratified: eigen-rank r goes to group r mod G, so every group spans
                                    the spectrum and the groups' volumes ∏σ_r are close to equal
    idx_j = nearest centroid of group j's g values in its k-means codebook of 2^{g·b} centroids
    decode: ŷ = s · c[idx],  k̂ = μ_K + T⁻¹ ŷ
    scores: ⟨q, k̂⟩ = ⟨q, μ_K⟩ + ⟨q̃, ŷ⟩  with  q̃ = T⁻ᵀ q = Vᵀ Σ_Q^{−1/2} q

(k − μ = T⁻¹ y = Σ_Q^{−1/2} V y, hence ⟨q, k⟩ = ⟨q, μ⟩ + ⟨Vᵀ Σ_Q^{−1/2} q, y⟩.) The queries are mapped
once and the dot products run in the coefficient domain; ⟨q, μ_K⟩ is the same for every key of a query,
so it does not change the attention weights, but it is added so scores equal ⟨q, k̂⟩ exactly.

Generalized Parseval relation (:func:`parseval_terms`). TᵀT = Σ_Q^{1/2} V Vᵀ Σ_Q^{1/2} = Σ_Q, so for any
k, k̂ with coefficients y, ŷ

    ‖y − ŷ‖² = (k − k̂)ᵀ Σ_Q (k − k̂) = E_q[(qᵀ(k − k̂))²]

where the last equality holds for the queries Σ_Q was computed from (ridge ρ = 0). MSE in the coefficient
domain is the expected squared logit error, so an MSE-optimal quantizer of y (k-means) minimises it.
With ρ > 0 the middle term uses the ridged Σ_Q. The identity is exact (float64) with ``side_dtype=float64``;
with fp16 side information T is rounded and TᵀT equals Σ_Q to about 1e-3 relative.

Group size and codebook size. g·b ≤ 8 so an index fits in a byte: g = 8 // b by default (b = 2: 4
coefficients, 256 centroids, the paper's setting; b = 3: pairs, 64 centroids; b = 1: 8 coefficients),
lowered to the largest divisor of d. Codebooks are trained (scipy.cluster.vq.kmeans2, k-means++ seeding
drawn from ``seed``: same seed, same codebooks) on u of the calibration keys, in float64, then rounded to
``side_dtype``.

Ridge. Σ_Q is often ill-conditioned (SmolLM2 layer 0: smallest eigenvalue 2e-4 of the mean) and is
singular when there are fewer queries than d or a dead channel. Adding ρ·(mean eigenvalue)·I floors
every direction at a fraction ρ of the average query energy: T⁻¹ stays bounded (‖T⁻¹‖ ≤ 1/√(ρ·tr Σ_Q/d)),
directions the calibration queries never use still get a little weight, and held-out queries that do use
them are not met by unbounded key errors. ρ = 0 is allowed for a non-singular Σ_Q (Parseval tests).

Bits per coordinate (:meth:`NovaQuantizer.bits_per_coordinate`), per key element, d = head dim:

    payload  d·b bits per token (G indices of g·b bits, packed)                     -> b
    norms    the scale s, one ``scale_dtype`` value per token                       -> 16/d
    side     calibration: T (d² values), μ_K (d) and the codebooks (2^{g·b}·d values, G of them with
             2^{g·b} centroids of g values) in ``side_dtype``, amortised over ``n_tokens`` cached tokens
             -> 16·(d² + d + 2^{g·b}·d) / (n_tokens·d). T⁻¹ is computed from T when loaded, Σ_Q and Λ are
             not needed to decode: neither is counted.

Values (:class:`RotatedMinMax`): an orthogonal rotation (randomized Hadamard by default), then b-bit
min-max per token (lo and step in fp16: 32/d bits per element). See docs/nova.md for the totals.

Unbiasedness is not expected: the codec is deterministic once calibrated, so for a fixed key the logit
error ⟨q, k − k̂⟩ is a fixed function of q; NOVA-KV minimises its second moment over the query
distribution, not its mean (unlike turbo_prod / QJL).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from kvstats._random import spawn_seeds
from kvstats._validation import check_float_tensor, check_int_range
from kvstats.quant.packing import pack_bits, packed_nbytes, unpack_bits
from kvstats.quant.quantizers._common import DeviceCache, dtype_bits, store_scalar
from kvstats.quant.quantizers.base import _GIVEN_BY_CONFIG, BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import NovaConfig
from kvstats.quant.quantizers.minmax import RotatedMinMax
from kvstats.quant.quantizers.nova_calibration import (
    DEFAULT_AMORTIZE_TOKENS,
    DEFAULT_RIDGE,
    NovaCalibration,
    as_stored,
    attention_transform,
    calibration_rows,
    default_group_dim,
    isotropic_calibration,
    kmeans_codebook,
    kmeans_plusplus,
    one_thread,
    stratified_ranks,
)
from kvstats.quant.quantizers.numerics import acc_dtype
from kvstats.quant.quantizers.per_head import PerHeadQuantizer
from kvstats.quant.rotations import make_rotation

__all__ = [
    "DEFAULT_AMORTIZE_TOKENS",
    "DEFAULT_RIDGE",
    "NovaCalibration",
    "NovaQuantizer",
    "ParsevalTerms",
    "PerHeadQuantizer",
    "RotatedMinMax",
    "VALUE_CODECS",
    "attention_transform",
    "calibrate_cache",
    "default_group_dim",
    "isotropic_calibration",
    "kmeans_codebook",
    "kmeans_plusplus",
    "one_thread",
    "parseval_terms",
    "stratified_ranks",
]



# ------------------------------------------------------------------------------------- the quantizer


class NovaQuantizer(Quantizer):
    """NOVA-KV keys for one KV head: calibrated transform + stratified group VQ + per-token RMS scale.

    Build, calibrate, then use like any quantizer::

        q = kvstats.quantizer("nova", bits=2, dim=64, seed=0).calibrate(queries, keys)
        code = q.encode(k); s = q.inner(query, code)

    Before :meth:`calibrate` (``calibrated`` is False) it runs on :func:`isotropic_calibration`, the
    transform NOVA-KV derives without data (identity; shared Gaussian codebooks): plain group VQ.

    Args:
        bits: b bits per coefficient, in [1, 8]. dim: d ≥ 2. seed: k-means seeding (child seed per group).
        group_dim: coefficients per VQ group g (default :func:`default_group_dim`); g·b ≤ 8, g divides d.
        ridge: relative ridge ρ of Σ_Q (module docstring); 0 needs a non-singular Σ_Q.
        kmeans_iters: Lloyd iterations after k-means++ seeding.
        scale_dtype: precision of the per-token scale (fp16 default).
        side_dtype: precision of T, μ_K and the codebooks (fp16 default; float64 for exact oracles).
        amortize_tokens: cached tokens the calibration data are amortised over in bits_per_coordinate.
        calibration: a :class:`NovaCalibration` to reuse instead of calling :meth:`calibrate`.
    """

    name = "nova"
    codes_per_vector = True
    needs_calibration = True
    storage_options = {"scale": "scale_dtype"}

    Config = NovaConfig

    def __init__(self, bits=_GIVEN_BY_CONFIG, dim=_GIVEN_BY_CONFIG, seed=_GIVEN_BY_CONFIG, *,
                 calibration: NovaCalibration | None = None, config: NovaConfig | None = None, **options):
        super().__init__(bits, dim, seed, config=config, **options)
        self.calibration: NovaCalibration | None = None  # the isotropic prior is built on first use
        self._calibration_digest = "isotropic prior"
        if calibration is not None:
            self._set_calibration(calibration)

    def _setup_from_config(self) -> None:
        self.groups = self.dim // self.group_dim
        self.index_bits = self.group_dim * self.bits
        self.codebook_size = 1 << self.index_bits

    @property
    def min_calibration_keys(self) -> int:
        """Fewest calibration keys accepted: max(2^{g·b} (one per centroid), d + 1 (a full-rank C_K))."""
        return max(self.codebook_size, self.dim + 1)

    # ---------------------------------------------------------------------------------- calibration
    def calibrate(self, queries: torch.Tensor | None, keys: torch.Tensor) -> NovaQuantizer:
        """Fit Σ_Q, μ_K, T and the codebooks from queries [..., d] and keys [..., d] (rows pooled); returns self.

        queries: every query of the KV head's GQA group (at least d rows); keys: at least
        :attr:`min_calibration_keys` rows. With ``transform="klt"`` or ``"rotation"`` the metric is the
        identity and ``queries`` must be None (the value transform is calibrated on values alone).

        Transforms (rows sorted by coefficient variance, then stratified into groups):

        * ``"attention"`` — T = Vᵀ Σ_Q^{1/2} with Σ_Q^{1/2} C_K Σ_Q^{1/2} = V Λ Vᵀ (NOVA-KV's key transform).
        * ``"klt"`` — T = Vᵀ with C = V Λ Vᵀ: the attention-aware transform for the identity metric. A value
          error e reaches the attention output as Σⱼ wⱼ eⱼ, whose expected squared norm is Σⱼ wⱼ² E‖eⱼ‖² for
          errors uncorrelated across tokens (the high-resolution model), so the value distortion is plain
          MSE and its optimal transform is the Karhunen–Loève transform (docs/references.md §6).
        * ``"rotation"`` — T = a randomized Hadamard rotation drawn from the seed, data-oblivious; codebooks
          still trained on the data: the ablation that keeps the VQ and removes the calibrated transform.
        """
        k = calibration_rows(keys, "keys", self.dim)
        if self.transform == "attention":
            if queries is None:
                raise ValueError("queries are needed to calibrate transform='attention' (Σ_Q = E[q qᵀ])")
            q = calibration_rows(queries, "queries", self.dim)
            if q.shape[0] < self.dim:
                raise ValueError(f"queries must hold at least d = {self.dim} query vectors to calibrate Σ_Q, "
                                 f"got {q.shape[0]}")
        elif queries is not None:
            raise ValueError(f"queries must be None for transform={self.transform!r} (its metric is the "
                             f"identity), got a tensor of shape {tuple(queries.shape)}")
        if k.shape[0] < self.min_calibration_keys:
            raise ValueError(f"keys must hold at least {self.min_calibration_keys} calibration tokens "
                             f"(codebook size 2^(g*b) = {self.codebook_size}, d + 1 = {self.dim + 1}), "
                             f"got {k.shape[0]}")
        # every sum over tokens, the transform and the coefficients the k-means sees on one thread: a
        # multithreaded GEMM changes last bits with the thread count, and the eigenvalues, the ridge and the
        # k-means would carry them into the reports (tests/study/test_reproducibility.py)
        with one_thread():
            self._set_calibration(self._fit(q if self.transform == "attention" else None, k))
        return self

    def _fit(self, q: torch.Tensor | None, k: torch.Tensor) -> NovaCalibration:
        """The calibration from float64 rows q [n_q, d] (None unless transform="attention") and k [n_k, d]."""
        eye = torch.eye(self.dim, dtype=torch.float64)
        mu = k.mean(0)
        centred = k - mu
        cov = centred.T @ centred / k.shape[0]
        second = q.T @ q / q.shape[0] if self.transform == "attention" else None
        ridge, n_queries = 0.0, 0
        if self.transform == "attention":
            mean_energy = float(torch.trace(second)) / self.dim
            if mean_energy <= 0:
                raise ValueError("queries are all zero: Σ_Q = E[q qᵀ] = 0 has no attention geometry to "
                                 "calibrate on")
            ridge, n_queries = self.ridge * mean_energy, int(q.shape[0])
            sigma_q = second + ridge * eye
            transform, lam = attention_transform(sigma_q, cov)
        elif self.transform == "klt":
            sigma_q = eye
            transform, lam = attention_transform(eye, cov)
        else:
            sigma_q = eye
            rot = make_rotation("wht", self.dim, spawn_seeds(self.seed, 2)[1]).matrix()
            lam = ((rot @ cov) * rot).sum(-1)  # coefficient variances diag(Π C Πᵀ)
            order = torch.argsort(lam, descending=True, stable=True)
            transform, lam = rot[order], lam[order]
        ranks = stratified_ranks(self.dim, self.group_dim)
        t_s = as_stored(transform[ranks], self.side_dtype, "T")
        mu_s = as_stored(mu, self.side_dtype, "mean")
        y = (k - mu_s) @ t_s.T
        rms = torch.linalg.vector_norm(y, dim=-1, keepdim=True) / math.sqrt(self.dim)
        u = (y / torch.where(rms > 0, rms, torch.ones_like(rms))).reshape(-1, self.groups, self.group_dim).numpy()
        books = kmeans_codebook(u.transpose(1, 0, 2), self.codebook_size, self.seed, self.kmeans_iters)
        return NovaCalibration(
            transform=t_s, inverse=torch.linalg.inv(t_s), mean=mu_s,
            codebooks=as_stored(torch.from_numpy(books), self.side_dtype, "codebooks"),
            eigenvalues=lam[ranks], ranks=ranks, sigma_q=sigma_q, ridge=ridge,
            n_queries=n_queries, n_keys=int(k.shape[0]))

    def _set_calibration(self, cal: NovaCalibration) -> None:
        d, shape = self.dim, (self.groups, self.codebook_size, self.group_dim)
        if not isinstance(cal, NovaCalibration):
            raise TypeError(f"calibration must be a NovaCalibration, got {type(cal).__name__}")
        if cal.transform.shape != (d, d) or tuple(cal.codebooks.shape) != shape:
            raise ValueError(f"calibration must have a [{d}, {d}] transform and {list(shape)} codebooks, got "
                             f"{list(cal.transform.shape)} and {list(cal.codebooks.shape)}")
        self.calibration = cal
        digest = hashlib.sha256()
        for t in (cal.transform, cal.mean, cal.codebooks):
            digest.update(t.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
        self._calibration_digest = f"{cal.source}:{digest.hexdigest()[:16]}"
        self._t = DeviceCache(cal.transform)
        self._t_inv = DeviceCache(cal.inverse)
        self._mu = DeviceCache(cal.mean)
        self._books = DeviceCache(cal.codebooks)

    @property
    def calibrated(self) -> bool:
        """True once calibrated on data (False while running on the isotropic prior)."""
        return self.calibration is not None and self.calibration.source == "data"

    def _need_calibration(self) -> None:
        if self.calibration is None:
            self._set_calibration(isotropic_calibration(self.dim, self.bits, self.group_dim, self.seed,
                                                        self.side_dtype))

    # ------------------------------------------------------------------------------ transform domain
    def coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """y = T (x − μ_K), [..., d] in group-major order, fp32 (fp64 for fp64 x)."""
        self._need_calibration()
        self._check_vectors(x, "x")
        acc = acc_dtype(x.dtype)
        return (x.to(acc) - self._mu.on(x.device, acc)) @ self._t.on(x.device, acc).T

    def reconstruct(self, y: torch.Tensor) -> torch.Tensor:
        """k = μ_K + T⁻¹ y (the inverse of :meth:`coefficients`), y's dtype."""
        self._need_calibration()
        return self._mu.on(y.device, y.dtype) + y @ self._t_inv.on(y.device, y.dtype).T

    def map_queries(self, query: torch.Tensor) -> torch.Tensor:
        """q̃ = T⁻ᵀ q = Vᵀ Σ_Q^{−1/2} q (group-major order), so ⟨q, k⟩ = ⟨q, μ_K⟩ + ⟨q̃, y⟩."""
        self._need_calibration()
        acc = acc_dtype(query.dtype)
        return query.to(acc) @ self._t_inv.on(query.device, acc)

    # -------------------------------------------------------------------------------------- codec
    def encode_coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices [..., G] int64, stored scale [...], y [..., d]) for x [..., d]."""
        y = self.coefficients(x)
        acc = y.dtype
        rms = torch.linalg.vector_norm(y, dim=-1) / math.sqrt(self.dim)
        stored = store_scalar(rms, self.scale_dtype)
        s = stored.to(acc)
        u = y / torch.where(s > 0, s, torch.ones_like(s)).unsqueeze(-1)
        books = self._books.on(y.device, acc)  # [G, K, g]
        flat = u.reshape(-1, self.groups, self.group_dim)
        idx = torch.empty(flat.shape[:2], dtype=torch.int64, device=y.device)
        step = max(1, (1 << 22) // (self.groups * self.codebook_size))
        book_sq = (books ** 2).sum(-1).unsqueeze(1)  # [G, 1, K]
        books_t = books.transpose(1, 2)  # [G, g, K]
        for start in range(0, flat.shape[0], step):
            # ‖u − c‖² − ‖u‖² = ‖c‖² − 2⟨u, c⟩ per group, [G, n, K], as one fused batched matmul
            dist = torch.baddbmm(book_sq, flat[start:start + step].transpose(0, 1), books_t, alpha=-2)
            idx[start:start + step] = dist.argmin(-1).T
        idx = torch.where(s.reshape(-1, 1) > 0, idx, torch.zeros_like(idx))
        return idx.reshape(*y.shape[:-1], self.groups), stored, y

    def decode_coefficients(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """ŷ = s · c[idx], [..., d] in group-major order."""
        self._need_calibration()
        idx = unpack_bits(code.payload["indices"], self.index_bits, self.groups)  # [..., G]
        books = self._books.on(idx.device, acc)
        cent = books[torch.arange(self.groups, device=idx.device), idx]  # [..., G, g]
        return cent.reshape(*idx.shape[:-1], self.dim) * code.scalars["scale"].to(acc).unsqueeze(-1)

    def _encode(self, x: torch.Tensor) -> Code:
        idx, scale, _ = self.encode_coefficients(x)
        return Code(x.shape, x.dtype, payload={"indices": pack_bits(idx, self.index_bits)},
                    scalars={"scale": scale})

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        return self.reconstruct(self.decode_coefficients(code, acc))

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        # ⟨q, k̂⟩ = ⟨q, μ⟩ + ⟨q̃, ŷ⟩: map the (few) queries, never reconstruct the (many) keys.
        acc = acc_dtype(query.dtype)
        y_hat = self.decode_coefficients(code, acc)
        offset = query.to(acc) @ self._mu.on(query.device, acc)
        return self.map_queries(query) @ y_hat.transpose(-1, -2) + offset.unsqueeze(-1)

    def provenance(self):
        self._need_calibration()  # the isotropic prior, if not calibrated: part of what the codes depend on
        return super().provenance()

    def options(self) -> dict:
        options = self._qconfig.options()
        options.pop("amortize_tokens")  # the bit count's amortisation, not the codes
        return {**options, "calibration": self._calibration_digest}

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        """Bits per key element; calibration data amortised over n_tokens (default ``amortize_tokens``)."""
        tokens = self.amortize_tokens if n_tokens is None else check_int_range(n_tokens, "n_tokens", 1, 1 << 40)
        d = self.dim
        side_values = d * d + d + self.codebook_size * d
        return BitBudget(payload=8 * packed_nbytes(self.groups, self.index_bits) / d,
                         norms=dtype_bits(self.scale_dtype) / d,
                         side=dtype_bits(self.side_dtype) * side_values / (tokens * d))

    def __repr__(self) -> str:
        return (f"NovaQuantizer(bits={self.bits}, dim={self.dim}, seed={self.seed}, group_dim={self.group_dim}, "
                f"ridge={self.ridge:g}, transform={self.transform!r}, calibrated={self.calibrated})")


# ---------------------------------------------------------------------------------------- Parseval


@dataclass(frozen=True)
class ParsevalTerms:
    """The three sides of the generalized Parseval relation, one entry per key (float64).

    coefficient_error: ‖y − ŷ‖²;  sigma_form: (k − k̂)ᵀ Σ_Q (k − k̂) with the calibration's (ridged) Σ_Q;
    query_mean: mean over the given queries of (qᵀ(k − k̂))² (None when no queries were given).
    """

    coefficient_error: torch.Tensor
    sigma_form: torch.Tensor
    query_mean: torch.Tensor | None

    def max_relative_gap(self) -> float:
        """max over keys and the available right-hand sides of |side − ‖y − ŷ‖²|, over the mean ‖y − ŷ‖².

        (Normalised by the mean, not per key: a key that k-means reproduces exactly has ‖y − ŷ‖² ≈ 0.)
        """
        ref = self.coefficient_error.mean().clamp_min(1e-300)
        gaps = [(self.sigma_form - self.coefficient_error).abs() / ref]
        if self.query_mean is not None:
            gaps.append((self.query_mean - self.coefficient_error).abs() / ref)
        return float(torch.stack(gaps).max())


def parseval_terms(quantizer: NovaQuantizer, keys: torch.Tensor, queries: torch.Tensor | None = None,
                   keys_hat: torch.Tensor | None = None) -> ParsevalTerms:
    """Both sides of ‖y − ŷ‖² = (k − k̂)ᵀ Σ_Q (k − k̂) = E_q[(qᵀ(k − k̂))²], in float64.

    Args:
        quantizer: a calibrated :class:`NovaQuantizer`.
        keys: k [..., d]. keys_hat: k̂ (default: decode(encode(keys)) in float64).
        queries: q [..., d] (pooled) for the right-hand side; pass the calibration queries with ridge 0
            for an exact identity, held-out queries to see how far it carries over.
    """
    quantizer._need_calibration()
    k = keys.to(torch.float64)
    k_hat = quantizer.decode(quantizer.encode(k)) if keys_hat is None else keys_hat.to(torch.float64)
    if k_hat.shape != k.shape:
        raise ValueError(f"keys_hat must have the shape of keys {tuple(k.shape)}, got {tuple(k_hat.shape)}")
    dy = quantizer.coefficients(k) - quantizer.coefficients(k_hat)
    dk = (k - k_hat).reshape(-1, quantizer.dim)
    sigma = quantizer.calibration.sigma_q.to(dk.device)
    lead = k.shape[:-1]
    coef = (dy ** 2).sum(-1)
    form = ((dk @ sigma) * dk).sum(-1).reshape(lead)
    qmean = None
    if queries is not None:
        q = calibration_rows(queries, "queries", quantizer.dim).to(dk.device)
        qmean = ((dk @ q.T) ** 2).mean(-1).reshape(lead)
    return ParsevalTerms(coef, form, qmean)


# ----------------------------------------------------------------------------------- whole caches

#: the value paths of :func:`calibrate_cache`
VALUE_CODECS = ("rotated_minmax", "nova", "rotated_vq")


def calibrate_cache(bits: int, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor | None = None, *,
                    seed: int = 0, rotation: str = "wht", value_side_dtype: torch.dtype = torch.float16,
                    value_codec: str = "rotated_minmax",
                    **options) -> tuple[PerHeadQuantizer, RotatedMinMax | PerHeadQuantizer]:
    """Calibrate NOVA-KV for one layer: (keys quantizer for [B, H_kv, S, d], values quantizer).

    Args:
        bits: b for keys (bits per coefficient) and values (min-max bits).
        queries: [B, H_q, N, d], H_q a multiple of H_kv; KV head h is calibrated on query heads
            h·(H_q/H_kv) … (h + 1)·(H_q/H_kv) − 1 (transformers' repeat_kv grouping), all B·N positions.
        keys: [B, H_kv, S, d]. values: same shape; needed for ``value_codec="nova"``, only checked otherwise.
        seed: child seeds for the heads' k-means and the value rotation.
        value_codec: ``"rotated_minmax"`` (default; a rotation then b-bit min-max per token, data-oblivious)
            or ``"nova"``: per KV head a :class:`NovaQuantizer` with ``transform="klt"`` calibrated on the
            values (the closed-form value transform, then the same stratified group VQ as the keys;
            ``options`` other than ``transform`` apply to it too); ``"rotated_vq"``: the same group VQ behind a
            randomized Hadamard rotation instead of the KLT (``transform="rotation"``, codebooks trained on the
            values) — the arm that isolates the value transform from the value quantizer.
        options: passed to every key :class:`NovaQuantizer` (ridge, group_dim, side_dtype, transform, ...).
    """
    for name, t in (("queries", queries), ("keys", keys)):
        check_float_tensor(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, heads, tokens, d], got shape {tuple(t.shape)}")
    b, hkv, _, d = keys.shape
    if queries.shape[0] != b or queries.shape[-1] != d:
        raise ValueError(f"queries must be [{b}, H_q, N, {d}] for keys of shape {tuple(keys.shape)}, "
                         f"got {tuple(queries.shape)}")
    if queries.shape[1] % hkv:
        raise ValueError(f"queries.shape[1] (query heads) must be a multiple of the KV heads {hkv}, "
                         f"got {queries.shape[1]}")
    if values is not None:
        check_float_tensor(values, "values")
        if values.shape != keys.shape:
            raise ValueError(f"values must have the shape of keys {tuple(keys.shape)}, got {tuple(values.shape)}")
    if value_codec not in VALUE_CODECS:
        raise ValueError(f"value_codec must be one of {VALUE_CODECS}, got {value_codec!r}")
    if value_codec in ("nova", "rotated_vq") and values is None:
        raise ValueError(f"value_codec={value_codec!r} calibrates on the values: pass values= [B, H_kv, S, d]")
    g = queries.shape[1] // hkv
    head_seeds = spawn_seeds(seed, hkv + 1)
    query_heads = [None if options.get("transform", "attention") != "attention" else queries[:, h * g:(h + 1) * g]
                   for h in range(hkv)]
    heads = [NovaQuantizer(bits, d, head_seeds[h], **options).calibrate(query_heads[h], keys[:, h])
             for h in range(hkv)]
    if value_codec in ("nova", "rotated_vq"):
        value_options = {k: v for k, v in options.items() if k != "transform"}
        value_seeds = spawn_seeds(head_seeds[-1], hkv)
        transform = "klt" if value_codec == "nova" else "rotation"
        value_heads = [NovaQuantizer(bits, d, value_seeds[h], transform=transform, **value_options)
                       .calibrate(None, values[:, h]) for h in range(hkv)]
        return PerHeadQuantizer(heads), PerHeadQuantizer(value_heads)
    return PerHeadQuantizer(heads), RotatedMinMax(bits, d, head_seeds[-1], rotation=rotation,
                                                  side_dtype=value_side_dtype)
