"""QJL: the 1-bit quantized Johnson–Lindenstrauss sketch (Zandieh, Daliri, Han, arXiv 2406.03482).

    encode:  b = sign(S k) ∈ {±1}^m (packed 8 per byte, LSB first), ‖k‖
    inner:   Prod(q, k) = (c/m) · ‖k‖ · ⟨S q, b⟩          (asymmetric: the query is projected, not quantized)
    decode:  k̂ = (c/m) · ‖k‖ · Sᵀ b                        (unbiased reconstruction; ⟨q, k̂⟩ = Prod(q, k))

Rows of S:
* ``"gaussian"``: i.i.d. N(0, 1), c = √(π/2). Unbiased; Var = ((π/2)‖q‖²‖k‖² − ⟨q,k⟩²)/m.
* ``"orthogonal"`` (default, the QJL paper's practice): rows orthogonalised in blocks of d, each of norm
  √d, so each row is uniform on the sphere of radius √d. The Gaussian constant √(π/2) would then be
  slightly biased (by ≈ 0.4% at d = 64); kvstats uses the exact constant
  c = √π Γ((d+1)/2) / (√d Γ(d/2)) (:func:`kvstats.quant.rotations.spherical_sign_scale`) so it stays unbiased.
  Building it costs one float64 QR of a d×d Gaussian per block of d rows, O(d³): 0.14 s at d = 1,024 and
  3.8 s at d = 4,096 on a 2-core CPU per block (``"gaussian"`` rows: 0.4 s at d = 4,096) — exact Haar rows
  have no cheaper construction, so build the quantizer once and reuse it.
* ``"srht"``: D'Alberto's randomized Hadamard sketch (arXiv 2605.08114 §2.2, eq. 3), S = H·diag(s′) with H
  the unnormalised ±1 Sylvester–Hadamard matrix and s′ Rademacher signs (:func:`kvstats.quant.rotations.srht_sketch`),
  c = √(π/2). With m = d, r̂ = (√(π/2)·‖r‖/d)·s′⊙(H q). Unbiased only approximately (averaged over s′, for
  spread vectors whose signed sums are near Gaussian); for a spike r = e₁ it returns exactly √(π/2)·e₁
  for every s′ (biased by the factor √(π/2)). Needs the sketched width d to be a power of two.

Outlier channels (``outliers=[...]``): those channels get their own sketch (``outlier_m`` rows) and
norm, the rest another; the estimate is the sum of the two (both unbiased). A single outlier channel
needs no sketch: its value is stored exactly (one ``norm_dtype`` scalar, ``outlier_m`` unused) and its
term of the estimate is exact. Encode and scores run in
the fused kernels ``qjl_encode`` / ``qjl_scores`` (kvstats.ops).
"""

from __future__ import annotations

import functools
import math

import torch

from kvstats._random import spawn_seeds
from kvstats.quant import ops
from kvstats.quant.packing import packed_nbytes
from kvstats.quant.quantizers._common import DeviceCache, dtype_bits
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import ROWS, QJLConfig
from kvstats.quant.quantizers.numerics import acc_dtype
from kvstats.quant.quantizers.plans import GroupedPlan, broadcast_groups, flat_keys
from kvstats.quant.rotations import gaussian_sketch, orthogonal_sketch, spherical_sign_scale, srht_sketch

__all__ = ["ROWS", "SignSketch", "QJLQuantizer"]


class SignSketch:
    """One QJL sketch S [m, d] with its unbiasing constant c; the building block of qjl and turbo_prod."""

    def __init__(self, m: int, d: int, rows: str, seed: int, rotation=None):
        """``rotation`` (a :class:`~kvstats.quant.rotations.Rotation` Π, optional): sketch Πᵀ x instead of x, i.e. use
        S·Πᵀ (rows Π sᵢ) on inputs given in Π's domain (turbo_prod's residual sketched in the original domain)."""
        if rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
        self.m, self.d, self.rows = m, d, rows
        if rows == "gaussian":
            s, self.scale = gaussian_sketch(m, d, seed), math.sqrt(math.pi / 2)
        elif rows == "srht":
            s, self.scale = srht_sketch(m, d, seed), math.sqrt(math.pi / 2)
        else:
            s, self.scale = orthogonal_sketch(m, d, seed), spherical_sign_scale(d)
        if rotation is not None:
            s = rotation.forward(s)  # row i of S·Πᵀ is (Π sᵢ)ᵀ
        self._s = DeviceCache(s)

    def matrix(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return self._s.on(device, dtype)

    def encode(self, x: torch.Tensor, norm_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed sign(S x) [..., ceil(m/8)], ‖x‖ [...]) for x [..., d]."""
        lead = x.shape[:-1]
        s = self.matrix(x.device, acc_dtype(x.dtype))
        packed, norm = ops.qjl_encode(x.reshape(-1, self.d), s, norm_dtype)
        return packed.reshape(*lead, -1), norm.reshape(lead)

    def estimate(self, query: torch.Tensor, packed: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """(c/m)·‖x‖·⟨S q, b⟩: query [..., n_q, d] (acc dtype), packed [..., n_k, m/8], norm [..., n_k]."""
        sq = ops.rows_matmul(query, self.matrix(query.device, query.dtype).T)
        lead, q3, (p3, n2) = broadcast_groups(sq, packed, norm, key_dims=(1, 0))
        scores = ops.qjl_scores(q3, p3, n2, self.scale / self.m)
        return scores.reshape(*lead, *scores.shape[-2:])

    def reconstruct(self, packed: torch.Tensor, norm: torch.Tensor, dtype: torch.dtype,
                    basis: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                    base: torch.Tensor | None = None) -> torch.Tensor:
        """base + (c/m)·‖x‖·Bᵀ b: [..., d'], with B = S (default) or ``basis`` = (B [m, d'], its byte tables from
        :func:`kvstats.ops.sign_tables`), e.g. B = S·Π to de-rotate in the same pass; ``base`` ([..., d'] in
        ``dtype``) or None (0). Bᵀ b is summed from the byte tables by :func:`kvstats.ops.sign_decode` (the dense
        product up to fp32 rounding); without tables (larger than :data:`kvstats.ops.SIGN_TABLE_LIMIT`) the signs
        are unpacked and multiplied densely."""
        if basis is None:
            s, tables = self.matrix(packed.device, dtype), self.tables(packed.device, dtype)
        else:
            s, tables = basis
        weight = self.weights(norm, dtype)
        if tables is None:
            flat_signs = ops.unpack_bits(packed.reshape(-1, packed.shape[-1]), 1, self.m)
            signs = flat_signs.view(*packed.shape[:-1], self.m).to(dtype).mul_(2).sub_(1)
            part = (signs @ s) * weight.unsqueeze(-1)
            return part if base is None else base + part
        flat = ops.sign_decode(packed.reshape(-1, packed.shape[-1]), tables, weight.reshape(-1),
                               None if base is None else base.reshape(-1, s.shape[1]))
        return flat.view(*packed.shape[:-1], s.shape[1])

    def weighted_sum(self, weights: torch.Tensor, packed: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """Σⱼ wᵢⱼ (c/m)·‖xⱼ‖·Sᵀbⱼ = Sᵀ Σⱼ wᵢⱼ (c/m)·‖xⱼ‖·bⱼ: weights [..., n_q, n_k] (acc dtype), packed
        [..., n_k, m/8], norm [..., n_k] -> [..., n_q, d], the signs summed from the packed bits (one Sᵀ per row)."""
        return self.weighted_sum_plan(packed, norm).broadcast(weights)

    def weighted_sum_plan(self, packed: torch.Tensor, norm: torch.Tensor) -> GroupedPlan:
        """:meth:`weighted_sum` over one code's signs and norms, planned for many weights."""
        return GroupedPlan(self._weighted_kernel, packed, norm, key_dims=(1, 0))

    def _weighted_kernel(self, w3: torch.Tensor, p3: torch.Tensor, n2: torch.Tensor) -> torch.Tensor:
        return ops.rows_matmul(ops.qjl_weighted_sum(w3, p3, n2, self.scale / self.m, self.m),
                               self.matrix(w3.device, w3.dtype))

    def weights(self, norm: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The per-vector factor of the reconstruction, (c/m)·‖x‖ (or γ for a residual), in ``dtype``."""
        return (self.scale / self.m) * norm.to(dtype)

    def tables(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Byte tables of S (:func:`kvstats.ops.sign_tables`), built once per (device, dtype)."""
        cache = self.__dict__.setdefault("_tables", {})
        key = (torch.device(device), dtype)
        if key not in cache:
            cache[key] = ops.sign_tables(self.matrix(device, dtype))
        return cache[key]


class QJLQuantizer(Quantizer):
    """QJL key quantizer: m sign bits of S k and ‖k‖ per vector.

    Args:
        dim: d ≥ 2.
        bits: sign bits per coordinate; m = bits·d when ``m`` is not given (default 1, i.e. m = d).
        m: number of sketch rows (the QJL paper's default is 256 at d = 128).
        rows: ``"orthogonal"`` (default), ``"gaussian"`` or ``"srht"`` (power-of-two sketched widths only).
        outliers: channel indices sketched separately (e.g. the 4–8 outlier channels of deep layers).
        outlier_m: rows of the outlier sketch (default m).
        norm_dtype: precision of the stored norms (fp32 default).
    """

    name = "qjl"
    codes_per_vector = True
    storage_options = {"norm": "norm_dtype", "norm_outlier": "norm_dtype", "value_outlier": "norm_dtype"}

    Config = QJLConfig

    def _setup_from_config(self) -> None:
        cfg = self._qconfig
        seeds = spawn_seeds(self.seed, 2)
        if cfg.outliers is None:
            self.outliers = None
            self.sketch = SignSketch(cfg.m, self.dim, cfg.rows, seeds[0])
            self.outlier_sketch = None
            return
        self.outliers = torch.tensor(cfg.outliers)
        mask = torch.ones(self.dim, dtype=torch.bool)
        mask[self.outliers] = False
        self.inliers = torch.nonzero(mask).flatten()
        self.sketch = SignSketch(cfg.m, len(self.inliers), cfg.rows, seeds[0])
        # one channel: stored exactly (no sketch; see the module docstring)
        self.outlier_sketch = SignSketch(cfg.outlier_m, len(cfg.outliers), cfg.rows, seeds[1]) \
            if len(cfg.outliers) > 1 else None

    @property
    def exact_outlier(self) -> bool:
        """True when the outlier part is one channel, stored exactly instead of sketched."""
        return self.outliers is not None and self.outlier_sketch is None

    def _parts(self, x: torch.Tensor) -> list[tuple[str, SignSketch, torch.Tensor]]:
        if self.outliers is None:
            return [("", self.sketch, x)]
        parts = [("", self.sketch, x[..., self.inliers.to(x.device)])]
        if not self.exact_outlier:
            parts.append(("_outlier", self.outlier_sketch, x[..., self.outliers.to(x.device)]))
        return parts

    def _outlier_value(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., self.outliers.to(x.device)].squeeze(-1)

    def _encode(self, x: torch.Tensor) -> Code:
        code = Code(x.shape, x.dtype)
        for suffix, sketch, part in self._parts(x):
            code.payload["signs" + suffix], code.scalars["norm" + suffix] = sketch.encode(part, self.norm_dtype)
        if self.exact_outlier:
            value = self._outlier_value(x)
            code.scalars["value_outlier"] = value.to(torch.float64 if x.dtype == torch.float64 else self.norm_dtype)
        return code

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        q = query.to(acc_dtype(query.dtype))
        # reduce, not sum: sum's start value 0 would copy the whole [..., n_q, n_k] score tensor once more.
        scores = functools.reduce(torch.add, (sketch.estimate(part, code.payload["signs" + sfx],
                                                              code.scalars["norm" + sfx])
                                              for sfx, sketch, part in self._parts(q)))
        if self.exact_outlier:  # exact term q_o · x_o
            value = code.scalars["value_outlier"].to(q.dtype)
            scores = scores + self._outlier_value(q).unsqueeze(-1) * value.unsqueeze(-2)
        return scores

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        if self.outliers is None:
            return self.sketch.reconstruct(code.payload["signs"], code.scalars["norm"], acc)
        dev = code.device
        out = torch.zeros(*code.shape, dtype=acc, device=dev)
        out[..., self.inliers.to(dev)] = self.sketch.reconstruct(code.payload["signs"], code.scalars["norm"], acc)
        if self.exact_outlier:
            out[..., self.outliers.to(dev)] = code.scalars["value_outlier"].to(acc).unsqueeze(-1)
        else:
            out[..., self.outliers.to(dev)] = self.outlier_sketch.reconstruct(
                code.payload["signs_outlier"], code.scalars["norm_outlier"], acc)
        return out

    def weighted_sum_plan(self, code: Code):
        if self.outliers is not None or not self._plan_reproduces("_weighted_sum", QJLQuantizer):
            return super().weighted_sum_plan(code)
        return self.sketch.weighted_sum_plan(code.payload["signs"], code.scalars["norm"])

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        inlier = self.sketch.weighted_sum(weights, code.payload["signs"], code.scalars["norm"])
        if self.outliers is None:
            return inlier
        if self.exact_outlier:  # Σⱼ wᵢⱼ x_o,j, exact
            outlier = (weights @ code.scalars["value_outlier"].to(weights.dtype).unsqueeze(-1))
        else:
            outlier = self.outlier_sketch.weighted_sum(weights, code.payload["signs_outlier"],
                                                       code.scalars["norm_outlier"])
        out = inlier.new_zeros(*inlier.shape[:-1], self.dim)
        out[..., self.inliers.to(out.device)] = inlier
        out[..., self.outliers.to(out.device)] = outlier
        return out

    def decode_parts(self, code: Code, dtype: torch.dtype):
        # scores: qjl_scores(S q, …); sums: Sᵀ · qjl_weighted_sum (the one sketch of a quantizer without outliers)
        if self.outliers is not None or not (
                self._methods_of(QJLQuantizer, "inner_plan", "weighted_sum_plan", "_inner", "_weighted_sum", "_parts",
                                 "_outlier_value")
                and type(self.sketch) is SignSketch):
            return None
        signs = code.payload["signs"]
        return ops.CodeParts(sketch=self.sketch.matrix(signs.device, dtype), signs=flat_keys(signs, 1),
                             sign_norm=flat_keys(code.scalars["norm"], 0), sign_scale=self.sketch.scale / self.sketch.m)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        norm_bits = dtype_bits(self.norm_dtype)
        if self.outliers is None:
            return BitBudget(payload=8 * packed_nbytes(self.m, 1) / self.dim, norms=norm_bits / self.dim)
        if self.exact_outlier:  # the inlier norm and the outlier value
            return BitBudget(payload=8 * packed_nbytes(self.m, 1) / self.dim, norms=2 * norm_bits / self.dim)
        payload = 8 * (packed_nbytes(self.m, 1) + packed_nbytes(self.outlier_m, 1)) / self.dim
        return BitBudget(payload=payload, norms=2 * norm_bits / self.dim)

    def __repr__(self) -> str:
        extra = f", outliers={self.outliers.tolist()}" if self.outliers is not None else ""
        return f"QJLQuantizer(m={self.m}, dim={self.dim}, seed={self.seed}, rows={self.rows!r}{extra})"
