"""Test helpers for code built on kvstats: hypothesis strategies and statistical assertions.

Example (an estimator vectorised over seeds)::

    import numpy as np
    from kvstats.measure.testing import assert_unbiased

    def my_estimator(q, k, seeds):  # <q, k> plus unit-variance noise: unbiased
        return q @ k + np.random.default_rng(int(seeds[0])).standard_normal(len(seeds))

    q, k = np.ones(16) / 4, np.ones(16) / 4
    assert_unbiased(my_estimator, q, k, n_seeds=20_000)   # raises AssertionError if biased at alpha=1e-6

The estimator protocol is the one of :func:`kvstats.inference.check_unbiased`:
``estimator(q, k, seeds: np.ndarray) -> one estimate per seed``. The strategies need ``hypothesis``
(a dev dependency); importing this module without it raises ImportError naming it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kvstats._validation import check_int_range
from kvstats.measure.inference import check_unbiased
from kvstats.quant.conformance import check_quantizer  # re-exported: the conformance kit

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover
    raise ImportError("kvstats.testing needs hypothesis: pip install 'kvstats[dev]'") from exc

__all__ = [
    "assert_unbiased",
    "assert_variance_matches",
    "caches",
    "check_quantizer",
    "head_dims",
    "query_key_pairs",
    "unit_vectors",
    "vectors",
    "RTOL_FP32",
]

#: Head dims worth testing: powers of two, 96, and odd sizes.
HEAD_DIMS = (2, 3, 7, 16, 64, 96, 128, 129, 256)


def head_dims() -> st.SearchStrategy[int]:
    """Head dimensions d ≥ 2, drawn from :data:`HEAD_DIMS`."""
    return st.sampled_from(HEAD_DIMS)


def _gaussian(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


#: Gaussian draws are scaled by ``scale``; beyond 8 standard deviations (probability ~1e-15 per element) a
#: draw could still overflow, so ``scale · 8`` must fit the dtype.
_SIGMAS = 8.0


def _check_dim(d, name: str = "d"):
    """d: None (drawn), a strategy (its draws are checked when drawn) or an int >= 2."""
    if d is None or isinstance(d, st.SearchStrategy):
        return d
    return check_int_range(d, name, 2, 1 << 20)


def _check_count(value, name: str, low: int = 1):
    return None if value is None else check_int_range(value, name, low, 1 << 20)


def _check_batch(batch) -> tuple[int, ...]:
    try:
        batch = tuple(batch)
    except TypeError:
        raise TypeError(f"batch must be a tuple of ints, got {batch!r}") from None
    for size in batch:
        check_int_range(size, "batch entries", 1, 1 << 20)
    return batch


def _check_scale(scale, dtype: torch.dtype) -> float:
    """``scale`` > 0 such that Gaussian draws times scale stay finite (and the vectors non-zero) in ``dtype``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    info = torch.finfo(dtype)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    # low: the smallest normal number, so a draw |x| >= 1e-3 (all of a d >= 2 vector is below that with
    # probability < 1e-6) still scales to a non-zero value, even in fp16
    high, low = info.max / _SIGMAS, info.tiny
    if not low <= scale <= high:
        raise ValueError(f"scale={scale:g} does not fit {dtype}: Gaussian draws up to {_SIGMAS:g}*scale must stay "
                         f"below its max {info.max:g} and non-zero, so scale must be in [{low:.3g}, {high:.3g}]")
    return float(scale)


def _draw_dim(draw, d) -> int:
    if d is None:
        return draw(head_dims())
    if isinstance(d, st.SearchStrategy):
        return check_int_range(draw(d), "d (drawn from the strategy)", 2, 1 << 20)
    return d


def vectors(d: int | st.SearchStrategy[int] | None = None, *, batch: tuple[int, ...] = (),
            dtype: torch.dtype = torch.float32, scale: float = 1.0) -> st.SearchStrategy[torch.Tensor]:
    """Random Gaussian vectors ``[*batch, d]`` (never zero) scaled by ``scale``; ``d`` an int ≥ 2 or a strategy.

    Refused (ValueError): ``d < 2``, a batch entry < 1, a ``scale`` for which ``8·scale`` exceeds the
    dtype's largest value (fp16: scale ≤ 8188) or is below its smallest normal number (fp16: 6.1e-5).
    """
    d, batch, scale = _check_dim(d), _check_batch(batch), _check_scale(scale, dtype)
    return _vectors(d, batch, dtype, scale)


@st.composite
def _vectors(draw, d, batch, dtype, scale) -> torch.Tensor:
    dd = _draw_dim(draw, d)
    seed = draw(st.integers(0, 2**31 - 1))
    return (_gaussian((*batch, dd), seed, torch.float64) * scale).to(dtype)


def unit_vectors(d: int | st.SearchStrategy[int] | None = None, *, batch: tuple[int, ...] = (),
                 dtype: torch.dtype = torch.float32) -> st.SearchStrategy[torch.Tensor]:
    """Uniform points on the unit sphere S^{d−1}: normalised Gaussians ``[*batch, d]`` (d ≥ 2)."""
    d, batch = _check_dim(d), _check_batch(batch)
    _check_scale(1.0, dtype)
    return _unit_vectors(d, batch, dtype)


@st.composite
def _unit_vectors(draw, d, batch, dtype) -> torch.Tensor:
    x = draw(_vectors(d, batch, torch.float64, 1.0))
    return (x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)).to(dtype)


def caches(batch: int | None = None, kv_heads: int | None = None, seq: int | None = None,
           d: int | None = None, gqa_ratio: int | None = None, *, n_q: int | None = None,
           dtype: torch.dtype = torch.float32) -> st.SearchStrategy[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(q, k, v)`` with ``q [B, Hkv·ratio, Nq, d]`` and ``k, v [B, Hkv, S, d]`` (the shapes of docs/metrics.md).

    Any argument left None is drawn: batch 1–2, kv_heads 1–4, seq 1–33 (odd counts included), d from
    :func:`head_dims`, GQA ratio 1–8, n_q 1–5. Given ones must be ints ≥ 1 (d ≥ 2); others are refused.
    """
    sizes = (_check_count(batch, "batch"), _check_count(kv_heads, "kv_heads"), _check_count(seq, "seq"),
             _check_count(d, "d", 2), _check_count(gqa_ratio, "gqa_ratio"), _check_count(n_q, "n_q"))
    _check_scale(1.0, dtype)
    return _caches(*sizes, dtype)


@st.composite
def _caches(draw, batch, kv_heads, seq, d, gqa_ratio, n_q, dtype):
    b = draw(st.integers(1, 2)) if batch is None else batch
    hkv = draw(st.integers(1, 4)) if kv_heads is None else kv_heads
    s = draw(st.integers(1, 33)) if seq is None else seq
    dd = draw(head_dims()) if d is None else d
    ratio = draw(st.integers(1, 8)) if gqa_ratio is None else gqa_ratio
    nq = draw(st.integers(1, 5)) if n_q is None else n_q
    seed = draw(st.integers(0, 2**31 - 4))
    q = _gaussian((b, hkv * ratio, nq, dd), seed, dtype)
    k = _gaussian((b, hkv, s, dd), seed + 1, dtype)
    v = _gaussian((b, hkv, s, dd), seed + 2, dtype)
    return q, k, v


def query_key_pairs(d: int | st.SearchStrategy[int] | None = None, *,
                    cos: st.SearchStrategy[float] | None = None) -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """A fp64 numpy pair ``(q, k)`` of unit vectors (d ≥ 2) with a drawn cosine (default: uniform in
    [−0.95, 0.95]; a given ``cos`` strategy's draws must lie in [−1, 1])."""
    return _query_key_pairs(_check_dim(d), cos)


@st.composite
def _query_key_pairs(draw, d, cos) -> tuple[np.ndarray, np.ndarray]:
    dd = _draw_dim(draw, d)
    c = draw(cos if cos is not None else st.floats(-0.95, 0.95))
    if not -1.0 <= c <= 1.0:
        raise ValueError(f"cos must draw values in [-1, 1], drew {c}")
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q = rng.normal(size=dd)
    q /= np.linalg.norm(q)
    w = rng.normal(size=dd)
    w -= (w @ q) * q
    w /= np.linalg.norm(w)
    return q, c * q + math.sqrt(max(1 - c * c, 0.0)) * w


#: Default relative rounding tolerance of :func:`assert_unbiased` for (nearly) deterministic estimators:
#: fp32 rounding of a dot product, ~√d·2⁻²⁴ for d up to a few thousand, with a margin.
RTOL_FP32 = 1e-5


def _scale(q, k, truth: float) -> float:
    """The magnitude rounding errors are relative to: ‖q‖·‖k‖ (bounds every partial sum of ⟨q, k⟩), else |truth|."""
    try:
        qv, kv = np.asarray(q, dtype=np.float64).ravel(), np.asarray(k, dtype=np.float64).ravel()
        scale = float(np.linalg.norm(qv) * np.linalg.norm(kv))
    except (TypeError, ValueError):
        scale = 0.0
    return max(scale, abs(truth)) if math.isfinite(scale) else abs(truth)


def assert_unbiased(estimator, q, k, *, n_seeds: int = 10_000, alpha: float = 1e-6, truth: float | None = None,
                    seed: int = 0, rtol: float = RTOL_FP32) -> None:
    """Assert that ``estimator`` is unbiased for ``⟨q, k⟩`` (or ``truth``) at false-alarm rate ``alpha``.

    Runs :func:`kvstats.inference.check_unbiased` (two-sided t test over ``n_seeds`` independent draws) and
    raises ``AssertionError`` with the bias, its CI and the p-value when ``p < alpha``. With a correct
    estimator the assertion fails with probability ``alpha``; a bias of δ is caught (probability ≈ 1/2) once
    ``|δ| ≳ z_{1−α/2}·sd/√n_seeds`` (4.9 sd/√n at the default alpha).

    A (nearly) deterministic estimator — sample sd ≤ ``rtol·scale``, ``scale = max(‖q‖·‖k‖, |truth|)`` — has
    no sampling noise for a t test to weigh (its t is ±inf for any rounding error). It is judged instead
    against floating-point rounding: it passes when ``|bias| ≤ rtol·scale`` and the message says so
    otherwise. The default ``rtol`` (1e-5) suits fp32 arithmetic; pass ~1e-2 for fp16/bf16 estimators.
    """
    if not (isinstance(rtol, (int, float)) and not isinstance(rtol, bool) and 0 <= rtol < 1):
        raise ValueError(f"rtol must be a number in [0, 1), got {rtol!r}")
    r = check_unbiased(estimator, q, k, n_draws=n_seeds, truth=truth, confidence_level=1 - alpha, seed=seed)
    scale = _scale(q, k, r.truth)
    tol = rtol * scale
    if math.sqrt(r.variance) <= tol:
        if abs(r.bias) > tol:
            raise AssertionError(
                f"estimator is biased beyond floating-point rounding: it is (nearly) deterministic (sd "
                f"{math.sqrt(r.variance):.3g} over {r.n} draws, at most the rounding tolerance), so no t test "
                f"applies; mean {r.mean:.9g} vs truth {r.truth:.9g}, |bias| {abs(r.bias):.3g} > rtol*scale = "
                f"{rtol:g}*{scale:.4g} = {tol:.3g} (scale = max(|q|*|k|, |truth|))"
            )
        return
    if not r.pvalue >= alpha:
        lo, hi = r.confidence_interval
        raise AssertionError(
            f"estimator is biased: mean {r.mean:.6g} vs truth {r.truth:.6g}, bias {r.bias:.4g} "
            f"({1 - alpha:.6g} CI [{lo:.4g}, {hi:.4g}]), t = {r.statistic:.3g}, p = {r.pvalue:.3g} < alpha = {alpha}"
            f" over {r.n} draws"
        )


def assert_variance_matches(estimator, q, k, variance: float, *, n_seeds: int = 20_000, alpha: float = 1e-6,
                            seed: int = 0) -> None:
    """Assert that the estimator's variance equals the closed form ``variance`` at false-alarm rate ``alpha``.

    The test is on ``log(s²/variance)`` with the kurtosis-aware standard error of
    :func:`kvstats.inference.unbiasedness_test` (valid for non-normal estimates; needs a large
    ``n_seeds``, ≥ 10⁴, for the fourth moment to settle). Raises ``AssertionError`` with the ratio and its CI.
    An estimator whose draws are all equal (sample variance 0) cannot match a positive ``variance``: the
    assertion fails saying so (its kurtosis, hence the CI, is undefined).
    """
    if isinstance(variance, bool) or not isinstance(variance, (int, float, np.floating)) or \
            not (math.isfinite(variance) and variance > 0):
        raise ValueError(f"variance must be a finite number > 0, got {variance!r}")
    r = check_unbiased(estimator, q, k, n_draws=n_seeds, variance_closed_form=variance, confidence_level=1 - alpha,
                       seed=seed)
    if r.variance == 0.0:
        raise AssertionError(
            f"estimator variance 0 does not match the closed form {variance:.6g}: all {r.n} draws equal "
            f"{r.mean:.9g} (a deterministic estimator, or one that ignores its seeds)"
        )
    lo, hi = r.variance_ratio_ci
    if not lo <= 1.0 <= hi:
        raise AssertionError(
            f"estimator variance {r.variance:.6g} does not match the closed form {variance:.6g}: ratio "
            f"{r.variance_ratio:.4g}, {1 - alpha:.6g} CI [{lo:.4g}, {hi:.4g}] excludes 1 (p = {r.variance_pvalue:.3g},"
            f" kurtosis {r.kurtosis:.3g}, {r.n} draws)"
        )
