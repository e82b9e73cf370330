"""KV-cache schemes: a K quantizer + a V quantizer at one fair budget of n bits per cache element.

    s = kvstats.scheme("kqv", bits=4, dim=128, seed=0)
    cache = s.encode(keys, values)             # keys, values [B, H_kv, S, d]
    out = s.attention(queries, cache)          # queries [B, H_q, N, d] -> [B, H_q, N, d]

Budget n (payload bits per element, the same for K and V; norms counted in ``bits_per_coordinate``):

* ``kv``   — K and V: n-bit Lloyd–Max on the raw coordinates of the unit vector + norm (no rotation).
* ``kqv``  — K: TurboQuant_mse(n) (WHT + n-bit Lloyd–Max). V: TurboQuant_prod(n) ((n−1)-bit + 1-bit QJL).
* ``qkqv`` — K and V: TurboQuant_prod(n).
* ``minmax`` — KIVI-style min-max (:class:`~kvstats.quantizers.MinMaxQuantizer`), deterministic: K per channel
  (each coordinate over groups of ``k_group_size`` = d consecutive tokens), V per token (groups of
  ``v_group_size`` = d coordinates), lo and step in ``side_dtype`` (fp16): 32/d side bits per element.
* ``kivi`` — KIVI as published (arXiv 2402.02750 §3), at n = 2 or 4 only: K min-max per channel over groups of
  ``group_size`` = 32 tokens, V min-max per token over groups of 32 channels, fp16 lo and step (1 side bit per
  element each); its full-precision residual of the recent 128 tokens is the cache's window
  (:func:`kvstats.hf.cache.kivi_cache`).
* ``nova`` — NOVA-KV (calibrated; :mod:`kvstats.quant.quantizers.nova`): K: per-head transform + stratified group VQ,
  V: rotation + n-bit min-max. ``NovaScheme.calibrate(queries, keys, values, bits=n)`` or
  ``scheme("nova", bits=n, dim=d, queries=..., keys=...)``. Kept out of ``SCHEMES`` (which lists the
  data-oblivious schemes) in ``CALIBRATED_SCHEMES``.

Attention uses each quantizer's own estimator: scores = K-quantizer.inner(q, K-code) / √d (the
unbiased asymmetric estimator for turbo_prod/QJL, decode-then-dot for the MSE quantizers), then
softmax, then the weights times V̂ = V-quantizer.decode(V-code).

Grouped-query attention: H_q must be a multiple of H_kv; query head h reads KV head h // (H_q/H_kv)
(the grouping of transformers' ``repeat_kv``). Causal masking aligns the N queries with the last N
cache positions: query i sits at position S − N + i and sees keys 0 .. S − N + i.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvstats._random import check_seed, spawn_seeds
from kvstats._validation import check_float_tensor, check_int_range
from kvstats.quant import attention as _attention
from kvstats.quant.quantizers import BitBudget, Code, Quantizer, quantizer
from kvstats.quant.quantizers.config import ROWS, QuantizerConfig
from kvstats.quant.quantizers.identity import IdentityQuantizer
from kvstats.quant.quantizers.numerics import acc_dtype

__all__ = ["CacheCode", "Scheme", "SchemeConfig", "NovaScheme", "IdentityScheme", "SCHEMES", "CALIBRATED_SCHEMES",
           "KIVI_BITS", "KIVI_GROUP_SIZE", "KIVI_RESIDUAL_LENGTH", "scheme", "register_scheme", "causal_mask",
           "gqa_groups", "is_quantizer_spec", "pair_widths"]


def _set_on_instance(obj, *methods: str) -> bool:
    """Whether any of ``methods`` was replaced on the instance (``obj.inner = f``): the class's plans and fused
    kernels do not stand for it then."""
    held = getattr(obj, "__dict__", {})
    return any(m in held for m in methods)


@dataclass(frozen=True)
class SchemeConfig:
    """A scheme as a pair of configs: its name, budget n, seed, and the K and V quantizers' configs
    (:mod:`kvstats.quant.quantizers.config`; None for a quantizer that is not a kvstats Quantizer)."""

    name: str
    bits: int
    seed: int | None
    k: QuantizerConfig | None
    v: QuantizerConfig | None

    def to_dict(self) -> dict:
        """JSON-ready, as results files record it."""
        return {"scheme": self.name, "bits": self.bits, "seed": self.seed,
                "k": None if self.k is None else self.k.to_dict(), "v": None if self.v is None else self.v.to_dict()}


@dataclass
class CacheCode:
    """An encoded cache: the codes of K and V, both of shape [B, H_kv, S, d]."""

    k: Code
    v: Code

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def gqa_groups(queries: torch.Tensor, kv_heads: int) -> int:
    """Query heads per KV head, checking that H_q is a multiple of H_kv."""
    hq = queries.shape[1]
    if hq % kv_heads:
        raise ValueError(f"queries.shape[1] (query heads) must be a multiple of the KV heads {kv_heads}, got {hq}")
    return hq // kv_heads


def causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """Boolean [n_q, n_k], True where query i (at position n_k − n_q + i) may attend key j."""
    if n_q > n_k:
        raise ValueError(f"causal attention needs n_q <= n_k, got n_q={n_q}, n_k={n_k}")
    return _attention.causal_visible(n_q, n_k, device=device)


class Scheme:
    """A K quantizer and a V quantizer at the same nominal budget."""

    def __init__(self, name: str, bits: int, k: Quantizer, v: Quantizer, seed: int | None = None):
        if k.dim != v.dim:
            raise ValueError(f"k and v quantizers must share dim, got {k.dim} and {v.dim}")
        self.name, self.bits, self.k, self.v, self.dim = name, bits, k, v, k.dim
        #: the seed the scheme was built from (None when built by hand from two quantizers)
        self.seed = seed

    @property
    def config(self) -> SchemeConfig:
        """The scheme's :class:`SchemeConfig` (the K and V quantizers' frozen configs)."""
        def config_of(q):
            config = getattr(q, "_qconfig", None)
            return config if isinstance(config, QuantizerConfig) else None

        return SchemeConfig(self.name, self.bits, self.seed, config_of(self.k), config_of(self.v))

    def _check_cache(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        for name, t in (("keys", keys), ("values", values)):
            check_float_tensor(t, name)
            if t.dim() != 4 or t.shape[-1] != self.dim:
                raise ValueError(f"{name} must be [B, H_kv, S, {self.dim}], got shape {tuple(t.shape)}")
        if keys.shape != values.shape:
            raise ValueError(f"keys and values must have the same shape, got {tuple(keys.shape)} "
                             f"and {tuple(values.shape)}")

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> CacheCode:
        """Encode a cache: keys, values [B, H_kv, S, d]."""
        self._check_cache(keys, values)
        return CacheCode(self.k.encode(keys), self.v.encode(values))

    def decode(self, cache: CacheCode) -> tuple[torch.Tensor, torch.Tensor]:
        """(K̂, V̂), each [B, H_kv, S, d]."""
        return self.k.decode(cache.k), self.v.decode(cache.v)

    def _check_queries(self, queries: torch.Tensor, cache: CacheCode) -> int:
        check_float_tensor(queries, "queries")
        b, hkv, _, d = cache.k.shape
        if queries.dim() != 4 or queries.shape[-1] != d or queries.shape[0] != b:
            raise ValueError(f"queries must be [{b}, H_q, N, {d}] for this cache, got shape {tuple(queries.shape)}")
        return gqa_groups(queries, hkv)

    def scores(self, queries: torch.Tensor, cache: CacheCode) -> torch.Tensor:
        """Estimated logits ⟨q, k⟩ (not yet divided by √d): queries [B, H_q, N, d] -> [B, H_q, N, S]."""
        self._check_queries(queries, cache)
        return self._scores_by(self.k.inner, queries, cache)

    @staticmethod
    def _scores_by(inner, queries: torch.Tensor, cache: CacheCode) -> torch.Tensor:
        return _attention.scores(queries, cache.k, scale=1.0, inner=inner, kv_heads=cache.k.shape[1])

    def weighted_values(self, weights: torch.Tensor, cache: CacheCode) -> torch.Tensor:
        """Attention's output from the value codes, Σⱼ wᵢⱼ v̂ⱼ with grouped-query heads: weights [B, H_q, N, S] ->
        [B, H_q, N, d] in fp32 (fp64 for fp64 weights); query head h reads KV head h // (H_q/H_kv).

        Equal to ``apply_weights(weights, V̂)`` up to fp32 summation order, without decoding V̂
        (:meth:`Quantizer.weighted_sum`); a value quantizer without ``weighted_sum`` (the protocol does not require
        it) is decoded, then multiplied.
        """
        check_float_tensor(weights, "weights")
        b, hkv, s, _ = cache.v.shape
        if weights.dim() != 4 or weights.shape[0] != b or weights.shape[-1] != s:
            raise ValueError(f"weights must be [{b}, H_q, N, {s}] for this cache, got shape {tuple(weights.shape)}")
        gqa_groups(weights, hkv)
        weighted_sum = getattr(self.v, "weighted_sum", None)
        if weighted_sum is None:
            acc = acc_dtype(weights.dtype)
            return _attention.apply_weights(weights.to(acc), self.v.decode(cache.v).to(acc))
        return self._weighted_by(weighted_sum, weights, cache)

    @staticmethod
    def _weighted_by(weighted_sum, weights: torch.Tensor, cache: CacheCode) -> torch.Tensor:
        """``weighted_sum(grouped weights [B, H_kv, G·N, S], cache.v)`` ungrouped to [B, H_q, N, d]."""
        grouped = _attention.group_queries(weights, cache.v.shape[1])
        return _attention.ungroup(weighted_sum(grouped, cache.v), weights.shape[1], weights.shape[2])

    # ------------------------------------------------------------------------ a cache's own codes (KVStatsCache)
    # The cache calls these on states and queries it has checked and on codes this scheme made: the quantizers'
    # estimators without the public methods' re-validation of every argument (a decode step calls them for every
    # layer). A scheme or quantizer that overrides the public method is called through it.
    def encode_checked(self, keys: torch.Tensor, values: torch.Tensor) -> CacheCode:
        """:meth:`encode` of keys and values the caller checked (float [B, H_kv, S, d] of one shape, d = dim,
        finite); each quantizer's encode still checks its range and what it stores."""
        if type(self).encode is not Scheme.encode:
            return self.encode(keys, values)
        return CacheCode(self.k.encode(keys), self.v.encode(values))

    def _own_inner(self) -> bool:
        """Whether the scores are K's own estimator (neither the scheme's ``scores`` nor K's ``inner`` overridden,
        by a subclass or on the instance: ``scheme.k.inner = f`` is honoured by the cache, through :meth:`scores`)."""
        return (type(self).scores is Scheme.scores and isinstance(self.k, Quantizer)
                and type(self.k).inner is Quantizer.inner
                and not _set_on_instance(self, "scores") and not _set_on_instance(self.k, "inner", "_inner"))

    def _own_weighted_sum(self) -> bool:
        """Whether the weighted values are V's own ``weighted_sum`` (neither overridden, by a subclass or on the
        instance)."""
        return (type(self).weighted_values is Scheme.weighted_values and isinstance(self.v, Quantizer)
                and type(self.v).weighted_sum is Quantizer.weighted_sum
                and not _set_on_instance(self, "weighted_values")
                and not _set_on_instance(self.v, "weighted_sum", "_weighted_sum"))

    def own_scores(self, queries: torch.Tensor, cache: CacheCode) -> torch.Tensor:
        """:meth:`scores` of finite queries [B, H_q, N, d] against a cache this scheme encoded."""
        if not self._own_inner():
            return self.scores(queries, cache)
        with self.k._code_fields(cache.k):
            return self._scores_by(self.k._inner, queries, cache)

    def own_weighted_values(self, weights: torch.Tensor, cache: CacheCode) -> torch.Tensor:
        """:meth:`weighted_values` of weights [B, H_q, N, S] (a softmax of finite logits) over a cache this scheme
        encoded."""
        if not self._own_weighted_sum():
            return self.weighted_values(weights, cache)
        v, acc = self.v, acc_dtype(weights.dtype)
        with v._code_fields(cache.v):
            return self._weighted_by(lambda grouped, code: v._weighted_sum(
                grouped if grouped.dtype == acc else grouped.to(acc), code), weights, cache)

    def own_plan(self, cache: CacheCode) -> tuple[Callable[[torch.Tensor], torch.Tensor],
                                                   Callable[[torch.Tensor], torch.Tensor]]:
        """(scores, values) for many decode steps against one cache this scheme encoded: ``scores(q)`` =
        :meth:`own_scores` (q, cache) and ``values(w)`` = :meth:`own_weighted_values` (w, cache), the same numbers,
        with the quantizers' plans (``inner_plan``, ``weighted_sum_plan``: what does not depend on the queries or
        weights worked out once). q [B, H_q, N, d] and w [B, H_q, N, S] in the accumulation dtype; the cache must not
        change while the plan is used."""
        # planned where own_scores / own_weighted_values would call the quantizers' estimators; else through them
        def grouped(plan, kv_heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
            return lambda x: _attention.ungroup(plan(_attention.group_queries(x, kv_heads)), x.shape[1], x.shape[2])

        if type(self).own_scores is Scheme.own_scores and self._own_inner():
            scores = grouped(self.k.inner_plan(cache.k), cache.k.shape[1])
        else:
            scores = functools.partial(self.own_scores, cache=cache)
        if type(self).own_weighted_values is Scheme.own_weighted_values and self._own_weighted_sum():
            values = grouped(self.v.weighted_sum_plan(cache.v), cache.v.shape[1])
        else:
            values = functools.partial(self.own_weighted_values, cache=cache)
        return scores, values

    def decode_parts(self, cache: CacheCode, dtype: torch.dtype):
        """(K parts, V parts) of a cache this scheme encoded, for the fused decode step
        (:func:`kvstats.ops.decode_attention`; :meth:`Quantizer.decode_parts`, side tensors in ``dtype``), or None
        where the op cannot stand for :meth:`own_plan`: a scheme or quantizer with an estimator of its own, or a
        quantizer whose codes the op does not read."""
        if not (type(self).own_plan is Scheme.own_plan and type(self).own_scores is Scheme.own_scores
                and type(self).own_weighted_values is Scheme.own_weighted_values and self._own_inner()
                and self._own_weighted_sum()):
            return None
        k, v = self.k.decode_parts(cache.k, dtype), self.v.decode_parts(cache.v, dtype)
        return None if k is None or v is None else (k, v)

    def attention(self, queries: torch.Tensor, cache: CacheCode, *, causal: bool = False,
                  window: int | None = None, return_weights: bool = False):
        """softmax(scores/√d [+ causal mask]) · V̂: queries [B, H_q, N, d] -> [B, H_q, N, d] (queries' dtype).

        ``window``: a sliding window of that many keys within the causal mask (query at position p sees
        p − window < j ≤ p; :func:`kvstats.quant.attention.window_visible`); needs ``causal=True``.
        With ``return_weights=True`` returns (output, weights [B, H_q, N, S]).
        """
        if window is not None:
            if not causal:
                raise ValueError(f"window = {window} needs causal=True (a sliding window is a causal mask), got "
                                 f"causal={causal!r}")
            window = check_int_range(window, "window", 1, 2**62)
        logits = self.scores(queries, cache) / math.sqrt(self.dim)
        visible = causal_mask(logits.shape[-2], logits.shape[-1], logits.device) if causal else None
        if window is not None:
            visible = _attention.window_visible(logits.shape[-2], logits.shape[-1], window, device=logits.device)
        weights = _attention.attention_weights(logits, visible)
        out = _attention.apply_weights(weights, self.v.decode(cache.v).to(weights.dtype)).to(queries.dtype)
        return (out, weights) if return_weights else out

    def bits_per_coordinate(self, n_tokens: int | None = None) -> dict[str, BitBudget]:
        """Bits per element of K, of V, and their mean (the cache's cost per element).

        n_tokens: cached tokens that side information shared across tokens (per-channel min-max groups,
        NOVA's calibration) is amortised over; see :meth:`Quantizer.bits_per_coordinate`.
        """
        k, v = self.k.bits_per_coordinate(n_tokens=n_tokens), self.v.bits_per_coordinate(n_tokens=n_tokens)
        return {"k": k, "v": v, "mean": (k + v).scaled(0.5)}

    def __repr__(self) -> str:
        return f"Scheme({self.name!r}, bits={self.bits}, k={self.k!r}, v={self.v!r})"


def _kv(bits, dim, seeds, *, rows=None, **opts):  # no QJL stage: rows is accepted and ignored
    return quantizer("lloyd", bits=bits, dim=dim, seed=seeds[0], **opts), \
        quantizer("lloyd", bits=bits, dim=dim, seed=seeds[1], **opts)


def _sketch_options(rows, sketch_domain) -> dict:
    """The QJL stages' sketch options that were given (each quantizer's defaults otherwise)."""
    return {k: v for k, v in (("rows", rows), ("sketch_domain", sketch_domain)) if v is not None}


def _kqv(bits, dim, seeds, *, rows=None, sketch_domain=None, **opts):
    sketch = _sketch_options(rows, sketch_domain)
    return quantizer("turbo_mse", bits=bits, dim=dim, seed=seeds[0], **opts), \
        quantizer("turbo_prod", bits=bits, dim=dim, seed=seeds[1], **sketch, **opts)


def _qkqv(bits, dim, seeds, *, rows=None, sketch_domain=None, **opts):
    sketch = _sketch_options(rows, sketch_domain)
    return quantizer("turbo_prod", bits=bits, dim=dim, seed=seeds[0], **sketch, **opts), \
        quantizer("turbo_prod", bits=bits, dim=dim, seed=seeds[1], **sketch, **opts)


def _minmax(bits, dim, seeds, *, k_axis: str = "channel", k_group_size: int | None = None, v_axis: str = "token",
            v_group_size: int | None = None, side_dtype: torch.dtype = torch.float16, rows=None):
    # Deterministic (the seeds only enter the fingerprint); no QJL stage: rows is accepted and ignored.
    k_group = dim if k_group_size is None and k_axis == "channel" else k_group_size
    return quantizer("minmax", bits=bits, dim=dim, seed=seeds[0], axis=k_axis, group_size=k_group,
                     side_dtype=side_dtype), \
        quantizer("minmax", bits=bits, dim=dim, seed=seeds[1], axis=v_axis, group_size=v_group_size,
                  side_dtype=side_dtype)


#: KIVI's budgets, group size G and residual length R as published (arXiv 2402.02750 §3–4: KIVI-2 and KIVI-4,
#: G = 32, R = 128)
KIVI_BITS, KIVI_GROUP_SIZE, KIVI_RESIDUAL_LENGTH = (2, 4), 32, 128


def _kivi(bits, dim, seeds, *, group_size: int = KIVI_GROUP_SIZE, side_dtype: torch.dtype = torch.float16,
          rows=None):
    """KIVI (Liu et al., arXiv 2402.02750 §3, Algorithm 1; the authors' code, jy-yuan/KIVI): keys min-max per channel
    over groups of ``group_size`` consecutive tokens, values min-max per token over groups of ``group_size``
    consecutive channels (it must divide d), lo and step in ``side_dtype`` (fp16: KIVI's kernels keep them in the
    model's dtype, fp16), at 2 or 4 bits. The residual (the recent tokens in full precision, flushed in blocks of G)
    is the cache's window: ``KVStatsCache(scheme, full_precision_window=128, flush_size=32)``. Deterministic; no QJL
    stage (rows ignored)."""
    if bits not in KIVI_BITS:
        raise ValueError(f"bits must be one of {KIVI_BITS} for scheme 'kivi' (KIVI-2 and KIVI-4 as published), "
                         f"got {bits}; scheme('minmax', ...) takes any budget")
    return quantizer("minmax", bits=bits, dim=dim, seed=seeds[0], axis="channel", group_size=group_size,
                     side_dtype=side_dtype), \
        quantizer("minmax", bits=bits, dim=dim, seed=seeds[1], axis="token", group_size=group_size,
                  side_dtype=side_dtype)


def _qjl_cache(bits, dim, seeds, *, outliers=None, outlier_m: int | None = None, rows: str | None = None,
         norm_dtype: torch.dtype = torch.float16, v_group_size: int | None = None,
         side_dtype: torch.dtype = torch.float16):
    """QJL's cache (arXiv 2406.03482, Algorithm 1 and §4): keys sketched to m = bits·d sign bits with the norm
    (``outliers``: channels in their own sketch of ``outlier_m`` rows, taken out of the m), values min-max per token
    at ``bits`` bits (the paper's "standard per-token quantization")."""
    m = bits * dim
    k_opts = {"rows": rows or "orthogonal", "norm_dtype": norm_dtype}
    if outliers is not None and len(outliers):
        if len(outliers) > 1:
            if outlier_m is None:
                raise ValueError("outlier_m must be given with outliers: the rows of the outlier sketch, taken "
                                 "out of the m = bits·d sign bits")
            check_int_range(outlier_m, "outlier_m", 1, m - 1)
            k_opts["outlier_m"] = outlier_m
            m -= outlier_m
        k_opts["outliers"] = list(outliers)
    return quantizer("qjl", dim=dim, m=m, seed=seeds[0], **k_opts), \
        quantizer("minmax", bits=bits, dim=dim, seed=seeds[1], axis="token", group_size=v_group_size,
                  side_dtype=side_dtype)


def _nova(bits, dim, seeds, *, queries=None, keys=None, values=None, rows=None, **opts):
    from kvstats.quant.quantizers.nova import calibrate_cache

    if queries is None or keys is None:
        raise ValueError("scheme 'nova' is calibrated: pass queries= [B, H_q, N, d] and keys= [B, H_kv, S, d]")
    if keys.shape[-1] != dim:
        raise ValueError(f"keys.shape[-1] must equal dim {dim}, got {keys.shape[-1]}")
    return calibrate_cache(bits, queries, keys, values, seed=seeds[0], **opts)


#: name -> (builder(bits, dim, seeds, **options) -> (K quantizer, V quantizer), smallest budget n)
SCHEMES: dict[str, tuple[Callable, int]] = {"kv": (_kv, 1), "kqv": (_kqv, 2), "qkqv": (_qkqv, 2),
                                            "minmax": (_minmax, 1), "qjl_cache": (_qjl_cache, 1),
                                            "kivi": (_kivi, 2)}
#: schemes that need calibration data (``queries=``, ``keys=``) among their options
CALIBRATED_SCHEMES: dict[str, tuple[Callable, int]] = {"nova": (_nova, 1)}


class NovaScheme(Scheme):
    """NOVA-KV for one layer: per-KV-head calibrated keys (:class:`~kvstats.quant.quantizers.nova.NovaQuantizer`)
    and rotated min-max values (or, with ``value_codec="nova"``, per-KV-head calibrated values: the KLT
    transform and the same group VQ); same encode / scores / attention as every :class:`Scheme`."""

    @classmethod
    def calibrate(cls, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor | None = None, *,
                  bits: int = 2, seed: int = 0, **options) -> NovaScheme:
        """Calibrate on one layer's queries [B, H_q, N, d], keys [B, H_kv, S, d] and values (same shape as keys;
        calibration data with ``value_codec="nova"``, a shape check otherwise).

        ``options`` go to :func:`kvstats.quant.quantizers.nova.calibrate_cache` (ridge, rotation, side_dtype,
        value_codec, transform, ...).
        """
        check_int_range(bits, "bits", 1, 8)
        seed = check_seed(seed)
        check_float_tensor(keys, "keys")
        k, v = _nova(bits, keys.shape[-1], spawn_seeds(seed, 2), queries=queries, keys=keys, values=values,
                     **options)
        return cls("nova", bits, k, v, seed)


def IdentityScheme(dim: int, *, dtype: torch.dtype | None = None) -> Scheme:  # noqa: N802 - a factory read as a type
    """A lossless :class:`Scheme` ("identity"): K and V stored as given (or cast to ``dtype``); its bits are the
    stored dtype's width. The reference of every model-level check (docs/cache.md)."""
    return Scheme("identity", torch.finfo(dtype or torch.float32).bits,
                  IdentityQuantizer(dim, dtype=dtype), IdentityQuantizer(dim, dtype=dtype))


def register_scheme(name: str, factory: Callable, *, min_bits: int = 1, calibrated: bool = False,
                    replace: bool = False) -> Callable:
    """Register a scheme built by ``factory`` so that ``kvstats.scheme(name, bits, dim, seed, ...)`` builds it.

    Args:
        name: the scheme's name (a non-empty str); an existing name is refused unless ``replace=True``.
        factory: ``factory(bits, dim, seeds, **options) -> (K quantizer, V quantizer)``; ``seeds`` holds the
            K and V child seeds of the scheme's seed. It must accept (and may ignore) ``rows=``, which
            :func:`scheme` passes on only when the caller gives it.
        min_bits: smallest budget n the scheme supports (``scheme`` also enforces n ≥ 2).
        calibrated: True if the factory needs calibration data among its options (listed in
            ``CALIBRATED_SCHEMES`` rather than ``SCHEMES``).

    Returns the factory (so it can be used as a decorator through ``functools.partial``).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable (bits, dim, seeds, **options) -> (k, v), got {factory!r}")
    check_int_range(min_bits, "min_bits", 1, 8)
    if (name in SCHEMES or name in CALIBRATED_SCHEMES) and not replace:
        raise ValueError(f"a scheme named {name!r} is already registered; pass replace=True to replace it")
    SCHEMES.pop(name, None)
    CALIBRATED_SCHEMES.pop(name, None)
    (CALIBRATED_SCHEMES if calibrated else SCHEMES)[name] = (factory, min_bits)
    return factory


#: "name" or "name@b" of one part of a pair spec "K/V"
_PART = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:@(?P<bits>[0-9]+))?$")


def is_quantizer_spec(name) -> bool:
    """Whether ``name`` is a scheme spec built from registered quantizers: a quantizer name (K and V), or a pair
    ``"K/V"`` of quantizer names, each optionally with its width (``"fp8_e4m3/nvfp4"``, ``"int_token@8/int_token@4"``).
    A malformed pair (a ``/`` with parts that are not registered quantizers) is a spec too: :func:`scheme` refuses
    it by name."""
    from kvstats.quant.quantizers import QUANTIZERS

    return isinstance(name, str) and (name in QUANTIZERS or "/" in name)


def _fixed_width(cls) -> int | None:
    """The only width a quantizer class takes (fp8: 8, nvfp4: 4), or None when it takes a range."""
    return cls.min_bits if cls.min_bits == cls.max_bits else None


def pair_widths(name: str, bits) -> tuple[tuple[str, int], tuple[str, int]]:
    """((K quantizer, its width), (V quantizer, its width)) of a quantizer spec at budget n = ``bits``.

    The budget of a spec is the mean of its two nominal widths, n = (b_K + b_V)/2, so that an asymmetric pair is
    named by the bits it stands for: ``"fp8_e4m3/nvfp4"`` (widths 8 and 4, the only ones those formats have) is
    n = 6, ``"int_token@8/int_token@4"`` is n = 6, ``"int_token@8/int_token"`` at n = 6 gives V the width
    2n − 8 = 4, and ``"turbo_mse/minmax"`` (neither width given) builds both at n. A part's width is its ``@b``,
    else the only width its format has, else what the budget leaves it; a budget the widths do not add up to is
    refused, naming the widths."""
    from kvstats.quant.quantizers import QUANTIZERS

    parts = name.split("/")
    if len(parts) == 1:
        parts = [name, name]
    if len(parts) != 2:
        raise ValueError(f"name {name!r}: a pair is 'K/V' (two quantizers), got {len(parts)} parts")
    found = []
    for role, part in zip("KV", parts):
        match = _PART.match(part)
        if match is None or match["name"] not in QUANTIZERS:
            raise ValueError(f"name {name!r}: its {role} part {part!r} must be a registered quantizer "
                             f"({sorted(QUANTIZERS)}), optionally with its width as name@b")
        cls = QUANTIZERS[match["name"]]
        width = int(match["bits"]) if match["bits"] is not None else _fixed_width(cls)
        found.append((match["name"], width))
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not math.isfinite(bits) \
            or (2 * bits) != int(2 * bits):
        raise TypeError(f"bits must be a whole or half number of bits (the mean of the K and V widths), got {bits!r}")
    (k, kb), (v, vb) = found
    if kb is None and vb is None:
        kb = vb = bits
    elif kb is None or vb is None:
        known = kb if vb is None else vb
        other = 2 * bits - known
        kb, vb = (other, vb) if kb is None else (kb, other)
    if (kb + vb) != 2 * bits or kb != int(kb) or vb != int(vb):
        raise ValueError(f"name {name!r} holds K at {kb} and V at {vb} bits: its budget n is their mean, "
                         f"{(kb + vb) / 2:g}, got bits={bits}")
    return (k, int(kb)), (v, int(vb))


def _checked_rows(rows):
    """``rows`` (a QJL sketch's rows, or None for each quantizer's default), refused by name unless one of ROWS."""
    if rows is not None and rows not in ROWS:
        raise ValueError(f"rows must be one of {ROWS} (or None: each quantizer's default), got {rows!r}")
    return rows


def _takes_rows(cls) -> bool:
    """Whether a quantizer class has a QJL sketch (its config has ``rows``): the parts of a pair that ``rows=``
    reaches; the others (fp8, nvfp4, int_token, ...) have no sketch and take no ``rows``, as :func:`scheme` documents
    for schemes without a QJL stage."""
    config = getattr(cls, "Config", None)
    return config is not None and any(f.name == "rows" for f in dataclasses.fields(config))


def _pair(name: str, bits, dim: int, seed, *, k_options: dict | None = None, v_options: dict | None = None,
          **options) -> Scheme:
    """The scheme of a quantizer spec (:func:`pair_widths`): K and V built by :func:`kvstats.quantizer` at their
    widths with the scheme's K and V child seeds, ``options`` to both, ``k_options`` / ``v_options`` to one."""
    from kvstats.quant.quantizers import QUANTIZERS

    (k, kb), (v, vb) = pair_widths(name, bits)
    seed = check_seed(seed)
    seeds = spawn_seeds(seed, 2)
    rows = _checked_rows(options.pop("rows", None))
    built = []
    for role, qname, width, own, child in (("K", k, kb, k_options, seeds[0]), ("V", v, vb, v_options, seeds[1])):
        if getattr(QUANTIZERS[qname], "needs_calibration", False):
            raise ValueError(f"scheme {name!r}: its {role} quantizer {qname} needs calibration, which a scheme built "
                             "by name does not do; calibrate it (kvstats.schemes.NovaScheme.calibrate)")
        sketch = {} if rows is None or not _takes_rows(QUANTIZERS[qname]) else {"rows": rows}
        try:
            built.append(quantizer(qname, bits=width, dim=dim, seed=child, **options, **sketch, **(own or {})))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"scheme {name!r}, its {role} quantizer {qname} at {width} bits: {exc}") from None
    label = name if "/" not in name else f"{k}@{kb}/{v}@{vb}"
    return Scheme(label, int(bits) if bits == int(bits) else bits, built[0], built[1], seed)


def scheme(name: str, bits: int, dim: int, seed: int = 0, **options) -> Scheme:
    """Build a scheme by name (``kv``, ``kqv``, ``qkqv``, ``minmax``, ``nova`` or one added with
    :func:`register_scheme`) at budget n = ``bits`` ∈ [2, 8].

    K and V get independent child seeds of ``seed`` (the package's seed rule: an int in [0, 2**63 − 1], or
    None for fresh entropy, recorded as ``.seed``). ``options`` go to both quantizers
    (e.g. ``norm_dtype=torch.float16``); ``nova`` needs ``queries=`` and ``keys=`` (its calibration data).
    ``rows=`` ("gaussian", "orthogonal", "srht") sets the sketch of every QJL stage of the scheme (the V of
    ``kqv``, K and V of ``qkqv``); schemes without a QJL stage (``kv``, ``minmax``, ``nova``) accept and
    ignore it. ``sketch_domain=`` ("rotated", the default, or "original") sets where the QJL stages of
    ``kqv``/``qkqv`` sketch their residual (:class:`~kvstats.quant.quantizers.config.TurboProdConfig`). ``minmax``
    options: ``k_axis`` ("channel"), ``k_group_size`` (d), ``v_axis`` ("token"), ``v_group_size`` (d),
    ``side_dtype`` (fp16). ``qjl_cache`` (QJL's own cache): keys ``m = bits·d`` sign bits (``rows``, default
    "orthogonal"; ``norm_dtype`` fp16; ``outliers=`` channels with ``outlier_m`` of those rows), values
    per-token min-max at ``bits`` (``v_group_size``, ``side_dtype``). ``kivi``: bits 2 or 4 only (refused
    otherwise), ``group_size`` (32: K's tokens per channel group, V's channels per token group), ``side_dtype``.

    A registered quantizer's name (``"fp8_e4m3"``) builds it for K and V; a pair ``"K/V"`` of them
    (``"fp8_e4m3/nvfp4"``, the engines' FP8-K/NVFP4-V; ``"int_token@8/int_token@4"``, asymmetric widths) builds
    each part at its width, the budget n being the mean of the two (:func:`pair_widths`; ``k_options=`` /
    ``v_options=`` go to one part only). The scheme's name then carries the widths (``"fp8_e4m3@8/nvfp4@4"``).
    """
    known = {**SCHEMES, **CALIBRATED_SCHEMES}
    if name not in known and is_quantizer_spec(name):
        return _pair(name, bits, dim, seed, **options)
    if name not in known:
        raise ValueError(f"name must be one of {sorted(known)}, a registered quantizer or a pair 'K/V' of them, "
                         f"got {name!r}")
    builder, low = known[name]
    check_int_range(bits, "bits", max(2, low), 8)
    seed = check_seed(seed)
    _checked_rows(options.get("rows"))
    k, v = builder(bits, dim, spawn_seeds(seed, 2), **options)
    return (NovaScheme if name == "nova" else Scheme)(name, bits, k, v, seed)
