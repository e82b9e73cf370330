"""Synthetic queries, keys and values with controlled laws.

:func:`generate` draws ``(Q, K, V)`` with ``Q [batch, q_heads, n_q, d]`` and ``K, V [batch, heads, seq, d]``
(grouped-query attention: query head ``h`` reads KV head ``h // (q_heads // heads)``).

Key / value laws (``kind``), each drawn independently for K and for V:

* ``"gaussian"``   — i.i.d. coordinates N(0, scale²).
* ``"heavy_tail"`` — i.i.d. coordinates scale · t_df (Student-t with ``df`` degrees of freedom: tail index
  ``df``, i.e. P(|x| > t) ~ c t^(-df); variance scale² · df/(df − 2) for df > 2, infinite for df ≤ 2).
* ``"low_rank"``   — x = scale · √(d/r) · U z + scale · noise · ε with z ~ N(0, I_r), ε ~ N(0, I_d) and U a
  uniformly random d×r orthonormal basis, one per (batch, head) and drawn separately for K and V. The
  cache of a head then has rank exactly r when ``noise == 0``; E‖x‖² = scale² · d · (1 + noise²).

Outlier channels (any kind): ``outlier_channels`` (a list of channel indices, or a count of channels drawn
at random by :func:`outlier_channel_indices`) are multiplied by ``outlier_scale`` in K and by
``value_outlier_scale`` in V — the fixed-channel outliers of real keys (docs/references.md §8: max/median channel
magnitude 3–5.6 in SmolLM2's keys, 1.7–3.8 in its values).

Queries. Real attention is peaked: a query attends to a few keys. Each query here aims at ``n_focus``
keys chosen uniformly without replacement among the ``seq`` keys of its KV head:

    u = (k_{j1} + … + k_{jm}) / ‖k_{j1} + … + k_{jm}‖,   g ~ N(0, I_d) / ‖·‖,
    q = A · (ρ u + √(1 − ρ²) g),   A = peak · √m · √d / (ρ · median_j ‖k_j‖).

``ρ = query_key_correlation`` is the cosine between the query and its focus direction, and ``A`` makes a
focus key's logit q·k/√d about ``peak`` nats (for roughly orthogonal focus keys of median norm); the other
keys' logits spread with standard deviation about peak · √m / (ρ √d).

Measured mean attention entropy (nats, over 2 × 4 heads × 64 queries; seq = 1024, d = 64, defaults
n_focus = 2, ρ = 0.7; uniform attention over 1024 keys is ln 1024 = 6.93, two equal keys ln 2 = 0.69):

    ====  ========  =================  ==============  ===========================
    peak  gaussian  heavy_tail (df=3)  low_rank (r=8)  gaussian + 4 outlier ch. ×5
    ====  ========  =================  ==============  ===========================
    2     6.79      6.47               6.29            6.45
    4     6.20      4.58               4.50            5.09
    8     3.01      1.44               1.85            2.54
    12    1.16      0.63               1.02            1.43
    16    0.58      0.40               0.68            0.96
    ====  ========  =================  ==============  ===========================

(``python -m kvstats.data.synthetic`` reprints it.) The default peak = 8 gives a few nats, the range of
real attention heads; KL and top-k recall then measure the quantizer, not noise.

Numeric safety. Draws are refused, not clipped, when the output dtype cannot hold them: before drawing,
:func:`generate` computes the expected number of K and V coordinates whose magnitude exceeds the dtype's
largest finite value (``scale`` × outlier scale × the law's two-sided tail: Student-t for ``heavy_tail``,
normal for the others) and raises ``ValueError`` with the numbers when it exceeds ``MAX_EXPECTED_OVERFLOWS``
= 1e-6 (``df=1e-3`` or ``df=0.05`` in float32, ``scale=1e5`` in float16). Queries whose amplitude does not
fit the dtype (``peak=1e300``) are refused likewise, and a draw that still overflows (probability below
1e-6) raises rather than returns inf/NaN.

Seeds: the same ``seed`` (an int in [0, 2**63 − 1], or a ``torch.Generator`` consumed in place) gives
bit-identical tensors; ``seed=None`` draws fresh OS entropy (the package's seed rule, docs/quantizers.md).
Everything is drawn on the CPU in float64 and cast to ``dtype`` at the end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from kvstats._random import make_generator
from kvstats._validation import FLOAT_DTYPES, check_int_range

__all__ = ["KINDS", "generate", "generate_keys", "synthetic_queries", "outlier_channel_indices", "attention_entropy"]

#: Key/value laws accepted by :func:`generate`.
KINDS = ("gaussian", "heavy_tail", "low_rank")

_COMMON_DEFAULTS = {
    "scale": 1.0,
    "outlier_channels": None,
    "outlier_scale": 5.0,
    "value_outlier_scale": 1.0,
    "peak": 8.0,
    "query_key_correlation": 0.7,
    "n_focus": 2,
}
_KIND_DEFAULTS = {
    "gaussian": {},
    "heavy_tail": {"df": 3.0},
    "low_rank": {"rank": 8, "noise": 0.01},
}
_MAX_SIZE = 2**31 - 1
#: generate() refuses parameters for which more K/V coordinates than this are expected to overflow the dtype.
MAX_EXPECTED_OVERFLOWS = 1e-6


def _generator(seed: int | torch.Generator | None) -> torch.Generator:
    # The package's one seed rule (kvstats._random.check_seed): int in [0, 2**63 - 1], None = fresh entropy.
    return make_generator(seed)


def _positive_float(value, name: str, *, allow_zero: bool = False, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    v = float(value)
    ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0) and (upper is None or v <= upper)
    if not ok:
        bound = f"in {'[' if allow_zero else '('}0, {upper}]" if upper is not None else (
            ">= 0" if allow_zero else "> 0")
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return v


def outlier_channel_indices(
    outlier_channels: int | Sequence[int] | None, d: int, seed: int | torch.Generator = 0
) -> list[int]:
    """The channel indices :func:`generate` scales for ``outlier_channels``.

    Args:
        outlier_channels: None (no outliers), a count c (c distinct channels drawn uniformly at random from
            ``seed``), or an explicit sequence of distinct indices in [0, d).
        d: head dim.
        seed: an int, or a generator consumed in place (as :func:`generate` does).

    Returns:
        sorted list of channel indices.
    """
    if outlier_channels is None:
        return []
    if isinstance(outlier_channels, (int, np.integer)) and not isinstance(outlier_channels, bool):
        count = check_int_range(outlier_channels, "outlier_channels", 0, d)
        if count == 0:
            return []
        perm = torch.randperm(d, generator=_generator(seed))
        return sorted(int(i) for i in perm[:count])
    if isinstance(outlier_channels, (str, bytes)) or not isinstance(outlier_channels, Sequence | np.ndarray):
        raise TypeError(
            f"outlier_channels must be None, an int count or a sequence of channel indices, got {outlier_channels!r}"
        )
    idx = []
    for i in outlier_channels:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= int(i) < d:
            raise ValueError(f"outlier_channels must hold ints in [0, {d}), got {list(outlier_channels)!r}")
        idx.append(int(i))
    if len(set(idx)) != len(idx):
        raise ValueError(f"outlier_channels must be distinct, got {list(outlier_channels)!r}")
    return sorted(idx)


def _check_params(kind: str, params: dict) -> dict:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    allowed = {**_COMMON_DEFAULTS, **_KIND_DEFAULTS[kind]}
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TypeError(f"unknown parameter(s) {unknown} for kind {kind!r}; accepted: {sorted(allowed)}")
    p = {**allowed, **params}
    p["scale"] = _positive_float(p["scale"], "scale")
    p["outlier_scale"] = _positive_float(p["outlier_scale"], "outlier_scale")
    p["value_outlier_scale"] = _positive_float(p["value_outlier_scale"], "value_outlier_scale")
    p["peak"] = _positive_float(p["peak"], "peak", allow_zero=True)
    p["query_key_correlation"] = _positive_float(p["query_key_correlation"], "query_key_correlation", upper=1.0)
    if kind == "heavy_tail":
        p["df"] = _positive_float(p["df"], "df")
    if kind == "low_rank":
        p["noise"] = _positive_float(p["noise"], "noise", allow_zero=True)
    return p


def _coordinate_sd(kind: str, p: dict, d: int) -> float:
    """An upper bound on the standard deviation of one K/V coordinate before ``scale`` and outliers
    (low_rank: √(d/r)·(U z)_i has variance (d/r)·Σ_j U_ij² ≤ d/r, plus the noise)."""
    if kind == "low_rank":
        return math.sqrt(d / p["rank"] + p["noise"] ** 2)
    return 1.0


def _boost(p: dict, outliers: bool) -> float:
    return max(1.0, p["outlier_scale"], p["value_outlier_scale"]) if outliers else 1.0


def _tail(kind: str, p: dict, x: float, df: float | None = None) -> float:
    """P(|coordinate| > x) in units of scale·sd: two-sided Student-t (heavy_tail) or normal tail."""
    from scipy import stats

    if kind == "heavy_tail":
        return 2.0 * float(stats.t.sf(x, p["df"] if df is None else df))
    return 2.0 * float(stats.norm.sf(x))


def _check_representable(kind: str, p: dict, d: int, n_draws: int, dtype: torch.dtype, outliers: bool) -> None:
    """Refuse parameters for which more than MAX_EXPECTED_OVERFLOWS of the 2·n_draws K/V coordinates are
    expected beyond the dtype's largest finite value."""
    from scipy import stats
    from scipy.optimize import brentq

    dmax = torch.finfo(dtype).max
    unit = p["scale"] * _boost(p, outliers) * _coordinate_sd(kind, p, d)  # one standard unit, worst channel
    limit = dmax / unit
    expected = 2 * n_draws * _tail(kind, p, limit)
    if expected <= MAX_EXPECTED_OVERFLOWS:
        return
    per_draw = MAX_EXPECTED_OVERFLOWS / (2 * n_draws) / 2.0  # allowed one-sided tail per coordinate
    if kind == "heavy_tail":
        law = f"|t_df| with df={p['df']!r}"
        x_max = float(stats.t.isf(per_draw, p["df"]))

        def excess(log_df: float) -> float:
            return math.log(max(2 * n_draws * _tail(kind, p, limit, math.exp(log_df)), 1e-300)) - math.log(
                MAX_EXPECTED_OVERFLOWS)

        fixes = f"df >= {math.exp(brentq(excess, math.log(p['df']), math.log(1e6))):.3g} (at this scale), " if (
            excess(math.log(1e6)) < 0) else ""
    else:
        law, x_max, fixes = "|N(0, 1)|", float(stats.norm.isf(per_draw)), ""
    raise ValueError(
        f"{kind} K/V coordinates with scale={p['scale']!r} do not fit {dtype} (max {dmax:.4g}): of the "
        f"{2 * n_draws} coordinates, {expected:.3g} are expected beyond it ({law} > {limit:.3g} after scale, "
        f"spread {_coordinate_sd(kind, p, d):.3g} and outlier scale {_boost(p, outliers):g}); this needs "
        f"{fixes}scale <= {dmax / (unit / p['scale'] * x_max):.3g}{' (at this df)' if kind == 'heavy_tail' else ''}"
        ", or a wider dtype")


def _check_finite(tensors, names, dtype, params: dict) -> None:
    for t, name in zip(tensors, names):
        if not bool(torch.isfinite(t).all()):
            top = float(t.double().abs().nan_to_num(math.inf).max())
            raise ValueError(
                f"the {name} drawn do not fit {dtype} (|x| up to {top:.3g}, "
                f"max {torch.finfo(dtype).max:.4g}) with {params}; a smaller scale or peak, a larger df or a wider "
                f"dtype avoids it")


def _standard_gamma(shape: tuple[int, ...], alpha: float, gen: torch.Generator, *, with_log: bool = False):
    """Gamma(alpha, 1) draws in float64 (Marsaglia–Tsang 2000, vectorised rejection; exact in law).

    ``with_log=True`` also returns their logarithms computed without underflow (for alpha < 1 the draws
    G(alpha + 1)·U^(1/alpha) underflow to 0 with probability ~ 10^(−300·alpha)·…, large for alpha ≤ 0.01)."""
    boost = alpha < 1.0  # Gamma(a) = Gamma(a + 1) · U^(1/a)
    a = alpha + 1.0 if boost else alpha
    dd = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * dd)
    n = int(np.prod(shape)) if shape else 1
    out = torch.empty(n, dtype=torch.float64)
    todo = torch.arange(n)
    while todo.numel() > 0:
        m = todo.numel()
        x = torch.randn(m, generator=gen, dtype=torch.float64)
        u = torch.rand(m, generator=gen, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        accept = (v > 0) & (torch.log(u) < 0.5 * x * x + dd - dd * v + dd * torch.log(v.clamp_min(1e-300)))
        out[todo[accept]] = dd * v[accept]
        todo = todo[~accept]
    log_out = None
    if boost:
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        if with_log:
            log_out = torch.log(out) + torch.log(u) / alpha
        out = out * u.pow(1.0 / alpha)
    if not with_log:
        return out.reshape(shape)
    if log_out is None:
        log_out = torch.log(out)
    return out.reshape(shape), log_out.reshape(shape)


def _cache(kind: str, shape: tuple[int, int, int, int], p: dict, gen: torch.Generator) -> torch.Tensor:
    b, h, s, d = shape
    if kind == "gaussian":
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
    elif kind == "heavy_tail":
        z = torch.randn(shape, generator=gen, dtype=torch.float64)
        df = p["df"]
        gamma, log_gamma = _standard_gamma(shape, df / 2.0, gen, with_log=True)
        chi2 = 2.0 * gamma  # chi²_df = 2 Gamma(df/2)
        x = z / torch.sqrt(chi2 / df)
        tiny = chi2 < 1e-300  # (sub)normal underflow for small df: the same draw through its logarithm
        if bool(tiny.any()):
            x[tiny] = z[tiny] * torch.exp(0.5 * (math.log(df / 2.0) - log_gamma[tiny]))
    else:  # low_rank
        r = p["rank"]
        basis, _ = torch.linalg.qr(torch.randn(b, h, d, r, generator=gen, dtype=torch.float64))  # [b,h,d,r]
        z = torch.randn(b, h, s, r, generator=gen, dtype=torch.float64)
        x = math.sqrt(d / r) * z @ basis.transpose(-1, -2)
        if p["noise"] > 0:
            x = x + p["noise"] * torch.randn(shape, generator=gen, dtype=torch.float64)
    return p["scale"] * x


def _queries(keys: torch.Tensor, q_heads: int, n_q: int, p: dict, gen: torch.Generator):
    b, h, s, d = keys.shape
    group = q_heads // h
    k = keys.repeat_interleave(group, dim=1)  # [b, hq, s, d]: the KV head each query head reads
    unit = float(k.abs().max()) if k.numel() else 1.0
    if 1e-150 < unit < 1e150:  # norms and sums of m keys cannot overflow or underflow float64
        unit = 1.0
    elif unit != 0.0:  # u is scale-free; the median norm is rescaled below
        k = k / unit
    else:
        unit = 1.0
    m = min(p["n_focus"], s)
    # m focus keys per query, uniformly without replacement (the first m of a random permutation).
    focus = torch.rand(b, q_heads, n_q, s, generator=gen, dtype=torch.float64).argsort(dim=-1)[..., :m]
    gathered = torch.gather(k, 2, focus.reshape(b, q_heads, n_q * m)[..., None].expand(-1, -1, -1, d))
    target = gathered.reshape(b, q_heads, n_q, m, d).sum(dim=3)
    u = target / torch.linalg.vector_norm(target, dim=-1, keepdim=True).clamp_min(1e-300)
    g = torch.randn(b, q_heads, n_q, d, generator=gen, dtype=torch.float64)
    g = g / torch.linalg.vector_norm(g, dim=-1, keepdim=True).clamp_min(1e-300)
    rho = p["query_key_correlation"]
    direction = rho * u + math.sqrt(max(0.0, 1.0 - rho * rho)) * g
    med = torch.linalg.vector_norm(k, dim=-1).median(dim=-1).values.clamp_min(1e-300)  # [b, hq]
    amplitude = p["peak"] * math.sqrt(m) * math.sqrt(d) / (rho * med) / unit
    return amplitude[..., None, None] * direction, focus


def synthetic_queries(
    keys: torch.Tensor,
    q_heads: int,
    n_q: int,
    seed: int | torch.Generator,
    *,
    peak: float = 8.0,
    query_key_correlation: float = 0.7,
    n_focus: int = 2,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Peaked queries for given keys (synthetic or real), as :func:`generate` builds them.

    Args:
        keys: ``[batch, heads, seq, d]`` float tensor, finite.
        q_heads: query heads, a multiple of ``heads``; n_q: queries per query head.
        seed: int ≥ 0 or a CPU ``torch.Generator`` (consumed in place).
        peak, query_key_correlation, n_focus: see the module doc.
        dtype: output dtype (default: the keys' dtype).

    Returns:
        ``(Q [batch, q_heads, n_q, d], focus [batch, q_heads, n_q, n_focus])`` — focus holds the indices of
        the keys each query aims at.
    """
    from kvstats._validation import check_float_tensor

    check_float_tensor(keys, "keys", min_dim=4)
    if keys.dim() != 4:
        raise ValueError(f"keys must be 4-D [batch, heads, seq, d], got shape {tuple(keys.shape)}")
    h = keys.shape[1]
    q_heads = check_int_range(q_heads, "q_heads", 1, _MAX_SIZE)
    if q_heads % h:
        raise ValueError(f"q_heads must be a multiple of heads={h} (grouped-query attention), got {q_heads}")
    n_q = check_int_range(n_q, "n_q", 1, _MAX_SIZE)
    p = _check_params("gaussian", {"peak": peak, "query_key_correlation": query_key_correlation,
                                   "n_focus": n_focus})
    p["n_focus"] = check_int_range(p["n_focus"], "n_focus", 1, _MAX_SIZE)
    q, focus = _queries(keys.detach().cpu().double(), q_heads, n_q, p, _generator(seed))
    q = q.to(dtype or keys.dtype).contiguous()
    _check_queries(q, p["peak"])
    return q, focus


def _check_queries(q: torch.Tensor, peak: float) -> None:
    """Queries of amplitude peak·√m·√d/(ρ·median‖k‖) must fit their dtype."""
    if not bool(torch.isfinite(q).all()):
        raise ValueError(f"peak={peak!r} gives queries beyond {q.dtype}'s max {torch.finfo(q.dtype).max:.4g} "
                         f"(amplitude peak·√n_focus·√d/(ρ·median key norm)); use a smaller peak or a wider dtype")


def _draw_caches(kind: str, batch: int, heads: int, seq: int, d: int, seed, dtype: torch.dtype, params: dict,
                 *, values: bool) -> tuple[dict, torch.Generator, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Validate, then draw K (and V when ``values``) as :func:`generate` does, in its order on the generator.

    Returns the checked parameters, the generator (positioned after the caches, where the queries start),
    K in float64 and the outputs cast to ``dtype``: ``(K,)`` or ``(K, V)``.
    """
    batch = check_int_range(batch, "batch", 1, _MAX_SIZE)
    heads = check_int_range(heads, "heads", 1, _MAX_SIZE)
    seq = check_int_range(seq, "seq", 1, _MAX_SIZE)
    d = check_int_range(d, "d", 2, _MAX_SIZE)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype!r}")
    p = _check_params(kind, params)
    p["n_focus"] = check_int_range(p["n_focus"], "n_focus", 1, _MAX_SIZE)
    if kind == "low_rank":
        p["rank"] = check_int_range(p["rank"], "rank", 1, d)

    outliers = p["outlier_channels"] is not None and not (
        isinstance(p["outlier_channels"], (int, np.integer)) and p["outlier_channels"] == 0)
    _check_representable(kind, p, d, batch * heads * seq * d, dtype, outliers)

    gen = _generator(seed)
    channels = outlier_channel_indices(p["outlier_channels"], d, gen)
    shape = (batch, heads, seq, d)
    caches = [_cache(kind, shape, p, gen) for _ in range(1 + values)]
    if channels:
        for x, factor in zip(caches, (p["outlier_scale"], p["value_outlier_scale"])):
            x[..., channels] *= factor
    outs = tuple(x.to(dtype).contiguous() for x in caches)
    law = {name: p[name] for name in ("scale", "df", "outlier_scale", "value_outlier_scale") if name in p}
    _check_finite(outs, ("keys", "values"), dtype, law)
    return p, gen, caches[0], outs


def generate(
    kind: str,
    batch: int,
    heads: int,
    seq: int,
    d: int,
    seed: int | torch.Generator,
    *,
    q_heads: int | None = None,
    n_q: int = 16,
    dtype: torch.dtype = torch.float32,
    **params,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw synthetic ``(Q, K, V)``.

    Args:
        kind: ``"gaussian"``, ``"heavy_tail"`` or ``"low_rank"`` (the law of K and V; see the module doc).
        batch, heads, seq, d: cache shape ``[batch, heads, seq, d]``; ``heads`` is the number of KV heads;
            d ≥ 2.
        seed: int ≥ 0 or a CPU ``torch.Generator`` (consumed in place). Same seed → identical tensors.
        q_heads: query heads, a multiple of ``heads`` (default ``heads``: no grouping).
        n_q: queries per query head.
        dtype: float16, bfloat16, float32 or float64 (drawn in float64, cast at the end).
        **params: law parameters —

            * all kinds: ``scale`` (> 0, default 1) coordinate scale;
              ``outlier_channels`` (None, a count, or indices; default None) and ``outlier_scale``
              (> 0, default 5) for K, ``value_outlier_scale`` (> 0, default 1: none) for V;
              ``peak`` (≥ 0 nats, default 8) logit of a focus key; ``query_key_correlation`` ρ in (0, 1]
              (default 0.7) cosine of a query with its focus direction; ``n_focus`` (≥ 1, default 2) keys
              each query aims at.
            * ``heavy_tail``: ``df`` (> 0, default 3) degrees of freedom = tail index.
            * ``low_rank``: ``rank`` r in [1, d] (default 8); ``noise`` (≥ 0, default 0.01) isotropic noise
              std relative to ``scale``.

    Returns:
        ``Q [batch, q_heads, n_q, d]``, ``K [batch, heads, seq, d]``, ``V [batch, heads, seq, d]``, contiguous,
        of ``dtype``, on the CPU.

    Raises:
        ValueError: naming the argument and the value seen (unknown kind or parameter, sizes below 1, d < 2,
            q_heads not a multiple of heads, rank outside [1, d], df ≤ 0, ρ outside (0, 1], ...).
        TypeError: naming the argument and the type seen.
    """
    check_int_range(batch, "batch", 1, _MAX_SIZE)  # the arguments in generate's order (checked again below)
    heads = check_int_range(heads, "heads", 1, _MAX_SIZE)
    check_int_range(seq, "seq", 1, _MAX_SIZE)
    check_int_range(d, "d", 2, _MAX_SIZE)
    n_q = check_int_range(n_q, "n_q", 1, _MAX_SIZE)
    if q_heads is None:
        q_heads = heads
    q_heads = check_int_range(q_heads, "q_heads", 1, _MAX_SIZE)
    if q_heads % heads:
        raise ValueError(f"q_heads must be a multiple of heads={heads} (grouped-query attention), got {q_heads}")
    p, gen, k, (k_out, v_out) = _draw_caches(kind, batch, heads, seq, d, seed, dtype, params, values=True)
    q, _ = _queries(k, q_heads, n_q, p, gen)  # from the float64 keys, as before the cast
    q = q.to(dtype).contiguous()
    _check_queries(q, p["peak"])
    return q, k_out, v_out


def generate_keys(
    kind: str,
    batch: int,
    heads: int,
    seq: int,
    d: int,
    seed: int | torch.Generator,
    *,
    dtype: torch.dtype = torch.float32,
    **params,
) -> torch.Tensor:
    """The keys ``K [batch, heads, seq, d]`` of :func:`generate` alone: for the same arguments and seed, the
    tensor ``generate(...)[1]`` returns (K is drawn first), without drawing the values and the queries.

    ``params`` as :func:`generate` (the query parameters ``peak``, ``query_key_correlation``, ``n_focus`` are
    checked and otherwise ignored, so one dict serves both); raises as :func:`generate` does. A generator
    passed as ``seed`` is left where the values would start.
    """
    _, _, _, (k,) = _draw_caches(kind, batch, heads, seq, d, seed, dtype, params, values=False)
    return k


def attention_entropy(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(q·kᵀ/√d) over the keys, per query: ``[batch, q_heads, n_q]`` (fp64).

    A diagnostic of how peaked the generated attention is (uniform attention over n keys gives ln n).
    """
    group = q.shape[1] // k.shape[1]
    logits = q.double() @ k.double().repeat_interleave(group, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _entropy_table(seq: int = 1024, d: int = 64) -> str:
    rows = ["| peak | gaussian | heavy_tail (df=3) | low_rank (r=8) | gaussian + 4 outlier ch. ×5 |",
            "|---:|---:|---:|---:|---:|"]
    for peak in (2.0, 4.0, 8.0, 12.0, 16.0):
        cells = []
        for kind, extra in (("gaussian", {}), ("heavy_tail", {}), ("low_rank", {}),
                            ("gaussian", {"outlier_channels": 4})):
            q, k, _ = generate(kind, 2, 4, seq, d, 0, n_q=64, peak=peak, **extra)
            cells.append(f"{attention_entropy(q, k).mean().item():.2f}")
        rows.append(f"| {peak:g} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # prints the entropy table of docs/data.md
    print(_entropy_table())
