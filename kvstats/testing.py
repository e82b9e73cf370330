"""Test helpers for code built on kvstats: hypothesis strategies and statistical assertions.

Example (a QJL-style estimator, vectorised over seeds)::

    from kvstats.testing import assert_unbiased
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

from kvstats.inference import check_unbiased

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover
    raise ImportError("kvstats.testing needs hypothesis: pip install 'kvstats[dev]'") from exc

__all__ = [
    "assert_unbiased",
    "assert_variance_matches",
    "caches",
    "head_dims",
    "query_key_pairs",
    "unit_vectors",
    "vectors",
]

#: Head dims worth testing (STYLE.md): powers of two, 96, and odd sizes.
HEAD_DIMS = (2, 3, 7, 16, 64, 96, 128, 129, 256)


def head_dims() -> st.SearchStrategy[int]:
    """Head dimensions d ≥ 2, drawn from :data:`HEAD_DIMS`."""
    return st.sampled_from(HEAD_DIMS)


def _gaussian(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


@st.composite
def vectors(draw, d: int | st.SearchStrategy[int] | None = None, *, batch: tuple[int, ...] = (),
            dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Random Gaussian vectors ``[*batch, d]`` (never zero) scaled by ``scale``; ``d`` an int or a strategy."""
    d = draw(head_dims()) if d is None else (draw(d) if isinstance(d, st.SearchStrategy) else d)
    seed = draw(st.integers(0, 2**31 - 1))
    return _gaussian((*batch, d), seed, dtype) * scale


@st.composite
def unit_vectors(draw, d: int | st.SearchStrategy[int] | None = None, *, batch: tuple[int, ...] = (),
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform points on the unit sphere S^{d−1}: normalised Gaussians ``[*batch, d]``."""
    x = draw(vectors(d, batch=batch, dtype=torch.float64))
    return (x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)).to(dtype)


@st.composite
def caches(draw, batch: int | None = None, kv_heads: int | None = None, seq: int | None = None,
           d: int | None = None, gqa_ratio: int | None = None, *, n_q: int | None = None,
           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` with ``q [B, Hkv·ratio, Nq, d]`` and ``k, v [B, Hkv, S, d]`` (DESIGN.md shapes).

    Any argument left None is drawn: batch 1–2, kv_heads 1–4, seq 1–33 (odd counts included), d from
    :func:`head_dims`, GQA ratio 1–8, n_q 1–5.
    """
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


@st.composite
def query_key_pairs(draw, d: int | st.SearchStrategy[int] | None = None, *,
                    cos: st.SearchStrategy[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A fp64 numpy pair ``(q, k)`` of unit vectors with a drawn cosine (default: uniform in [−0.95, 0.95])."""
    dd = draw(head_dims().filter(lambda n: n >= 2)) if d is None else (draw(d) if isinstance(d, st.SearchStrategy)
                                                                       else d)
    c = draw(cos if cos is not None else st.floats(-0.95, 0.95))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q = rng.normal(size=dd)
    q /= np.linalg.norm(q)
    w = rng.normal(size=dd)
    w -= (w @ q) * q
    w /= np.linalg.norm(w)
    return q, c * q + math.sqrt(max(1 - c * c, 0.0)) * w


def assert_unbiased(estimator, q, k, *, n_seeds: int = 10_000, alpha: float = 1e-6, truth: float | None = None,
                    seed: int = 0) -> None:
    """Assert that ``estimator`` is unbiased for ``⟨q, k⟩`` (or ``truth``) at false-alarm rate ``alpha``.

    Runs :func:`kvstats.inference.check_unbiased` (two-sided t test over ``n_seeds`` independent draws) and
    raises ``AssertionError`` with the bias, its CI and the p-value when ``p < alpha``. With a correct
    estimator the assertion fails with probability ``alpha``; a bias of δ is caught (probability ≈ 1/2) once
    ``|δ| ≳ z_{1−α/2}·sd/√n_seeds`` (4.9 sd/√n at the default alpha).
    """
    r = check_unbiased(estimator, q, k, n_draws=n_seeds, truth=truth, confidence_level=1 - alpha, seed=seed)
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
    """
    r = check_unbiased(estimator, q, k, n_draws=n_seeds, variance_closed_form=variance, confidence_level=1 - alpha,
                       seed=seed)
    lo, hi = r.variance_ratio_ci
    if not lo <= 1.0 <= hi:
        raise AssertionError(
            f"estimator variance {r.variance:.6g} does not match the closed form {variance:.6g}: ratio "
            f"{r.variance_ratio:.4g}, {1 - alpha:.6g} CI [{lo:.4g}, {hi:.4g}] excludes 1 (p = {r.variance_pvalue:.3g},"
            f" kurtosis {r.kurtosis:.3g}, {r.n} draws)"
        )

from kvstats.conformance import check_quantizer  # noqa: E402, F401  (re-exported: the conformance kit)
