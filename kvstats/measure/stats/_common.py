"""Constants and input checks shared by the statistics modules."""

from __future__ import annotations

import math

import numpy as np

from kvstats._validation import check_int_range

#: Largest n₁·n₂ for which the exact (no-ties) p-value of U is computed (:func:`mwu_exact_cdf`): up to
#: here its float64 result agrees with exact rational arithmetic to ~1e-11 relative (tests), and costs
#: ≤ 0.1 s. Larger samples get the asymptotic p (normal approximation), which is also what scipy's
#: ``method="auto"`` uses there.
EXACT_MAX_PAIRS = 100_000
#: Largest n₁·n₂ for which the Hodges–Lehmann CI uses the exact null distribution of U.
EXACT_CI_MAX_PAIRS = 10_000
#: Resampled values held at once by the bootstrap (8 bytes each: 400 MB); larger runs go in batches.
BOOTSTRAP_MAX_ELEMENTS = 50_000_000
#: Largest n₁·n₂ for which the Hodges–Lehmann estimate is computed (it needs all pairwise differences).
HL_MAX_PAIRS = 20_000_000


def _sample(x, name: str, *, min_size: int = 1) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array of numbers, got {type(x).__name__}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size < min_size:
        raise ValueError(f"{name} must have at least {min_size} value(s), got {arr.size}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains non-finite values (first seen: {arr[~np.isfinite(arr)][0]})")
    return arr


#: The alternatives every test of kvstats.stats takes, as scipy names them.
ALTERNATIVES = ("two-sided", "less", "greater")


def check_alternative(alternative) -> str:
    """``alternative`` when it is one of :data:`ALTERNATIVES`, else ValueError naming the value."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be 'two-sided', 'less' or 'greater', got {alternative!r}")
    return alternative


def _check_level(confidence_level: float) -> float:
    if not 0.0 < float(confidence_level) < 1.0:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}")
    return float(confidence_level)


def min_resamples(level: float) -> int:
    """The fewest bootstrap resamples that give a level-confidence interval: ⌈2 / (1 − level)⌉ (40 at 95%).

    Below it a tail of the bootstrap distribution, (1 − level)/2 of the resamples, holds less than one resample,
    so its bound is not estimated but interpolated between the extreme draws — with one resample the "interval"
    is that single draw, which need not contain the estimate.
    """
    return math.ceil(2 / (1 - level) - 1e-9)


def check_resamples(n_resamples, level: float, high: int = 10**8, *, allow_zero: bool = False) -> int:
    """n_resamples as an int in [min_resamples(level), high] (0 also, where it means "no interval")."""
    low = min_resamples(level)
    n = check_int_range(n_resamples, "n_resamples", 0 if allow_zero else 1, high)
    if 0 < n < low or (n == 0 and not allow_zero):
        raise ValueError(f"n_resamples must be at least {low} for a {level:g} confidence interval (each tail of the "
                         f"bootstrap distribution needs a resample beyond its bound: n_resamples·(1 − level)/2 ≥ 1), "
                         f"got {n}")
    return n


#: Data whose magnitude lies outside [2^-160, 2^160] (about 1e±48) are rescaled by a power of two before a bootstrap of
#: a scale-equivariant statistic: scipy's BCa cubes jackknife deviations (overflow from about 1e103) and squares
#: resampled statistics; the power-of-two scaling is exact, so the interval does not depend on the units.
UNIT_BAND = (2.0 ** -160, 2.0 ** 160)
#: Beyond this magnitude a non-finite bootstrap interval is taken for float64 overflow and refused; below it, a
#: non-finite interval means resamples on which the statistic is undefined (a zero denominator, an empty subset) and
#: is returned as it is (the caller's nan handling decides).
OVERFLOW_MAGNITUDE = 1e100


def unit_exponent(values) -> int:
    """k with max |values|·2^k in [1/2, 1) when max |values| lies outside :data:`UNIT_BAND` (where squares or cubes of
    deviations over- or underflow), else 0. ``np.ldexp(values, k)`` is exact, subnormal values included."""
    top = float(np.abs(np.asarray(values, dtype=np.float64)).max())
    if top == 0 or UNIT_BAND[0] <= top <= UNIT_BAND[1]:
        return 0
    return -math.frexp(top)[1]


def robust_std(values: np.ndarray) -> float:
    """Sample standard deviation (ddof 1) without overflow or underflow of the squares: computed on
    values / max |values| and scaled back. nan for fewer than 2 values or when any value is NaN or ±inf (as
    ``np.std`` and scipy's bootstrap standard error are)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2 or not np.isfinite(v).all():
        return math.nan
    top = float(np.abs(v).max())
    return 0.0 if top == 0 else top * float(np.std(v / top, ddof=1))


def check_finite_interval(low: float, high: float, se: float, what: str, samples) -> None:
    """Refuse an interval or standard error that came out non-finite from finite data of magnitude beyond
    :data:`OVERFLOW_MAGNITUDE` (a statistic that overflows float64 there, e.g. a variance of values near 1e200),
    naming what and the data's largest magnitude. A non-finite interval of moderate data (resamples on which the
    statistic is undefined) is left to the caller."""
    if math.isfinite(low) and math.isfinite(high) and (math.isfinite(se) or math.isnan(se)):
        return
    big = max(float(np.abs(np.asarray(s)).max()) for s in samples)
    if big <= OVERFLOW_MAGNITUDE:
        return
    raise ValueError(f"the bootstrap interval of {what} is not finite ([{low:.4g}, {high:.4g}], standard error "
                     f"{se:.4g}) on finite data with max |value| = {big:.4g}: the statistic overflows float64 there; "
                     f"rescale the data")
