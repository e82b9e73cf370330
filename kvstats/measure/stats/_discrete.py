"""Intervals for a mean over units that take few values, where the studentized bootstrap fails (issue 43).

A mean over units of 0/1 outcomes, of two-valued units, or of a proportion that sits at 1 for many units (a top-k
recall) has few distinct resamples: many of them have no spread, the bootstrap-t distribution is lumpy, and its
interval covered 35–86% at 5–12 units. :func:`kvstats.stats.mean_ci` ("auto") uses these instead:

* **Two-valued units** (every unit a or b, both seen): the hull of the Clopper–Pearson interval on the count k of b
  among n, mapped onto [a, b] (exact when the units can only be a or b), and Student's t interval (which reaches
  outside [a, b] when they can take other values the sample did not show).
* **Units in [0, 1] with some exactly at 0 or 1** (a proportion averaged over units): Korn & Graubard's (1998)
  interval, the Clopper–Pearson interval at the effective sample size of the mean (with two values: hulled with the
  above, and clipped to [0, 1]).
"""

from __future__ import annotations

import numpy as np
import scipy.stats
from statsmodels.stats.proportion import proportion_confint

__all__ = ["PROPORTION_FLOOR", "at_a_bound", "korn_graubard", "two_point"]

#: A mean of units in [0, 1] nearer than this to 0 or 1 is not taken for a proportion at a bound: its effective
#: sample size (up to n²/p̂) would leave what scipy's Beta quantiles compute (NaN beyond ~1e100), and the data go to
#: the scale-equivariant intervals (rescaled) instead.
PROPORTION_FLOOR = 2.0 ** -160


def at_a_bound(x: np.ndarray) -> bool:
    """Whether every value lies in [0, 1], some is exactly 0 or 1, and the mean is at least
    :data:`PROPORTION_FLOOR` from both ends (x not constant)."""
    low, high = float(x.min()), float(x.max())
    if not (0.0 <= low and high <= 1.0 and (low == 0.0 or high == 1.0)):  # first: the mean of 1e308s overflows
        return False
    mean = float(x.mean())
    return min(mean, 1.0 - mean) >= PROPORTION_FLOOR


def korn_graubard(x: np.ndarray, level: float) -> tuple[float, float, float]:
    """Korn & Graubard's (1998, Survey Methodology 24:193) interval for a proportion estimated from clustered data,
    here the mean p̂ of n units in [0, 1]: the Clopper–Pearson interval of p̂·n* successes in n* trials,
    ``[B(α/2; p̂n*, (1 − p̂)n* + 1), B(1 − α/2; p̂n* + 1, (1 − p̂)n*)]`` (B the Beta quantile, statsmodels'
    ``proportion_confint(method="beta")``), at the effective sample size
    ``n* = p̂(1 − p̂)/(s²/n) · (z_{1−α/2} / t_{1−α/2, n−1})²`` (the variance of a proportion over that of the mean,
    with their degrees-of-freedom adjustment). n* is not capped at n: units that are means of many hits vary less
    than 0/1 outcomes, and n* is then the hits' count. Returns (low, high, n*).

    Why: it is the binomial interval of the count the units' spread is worth, so it stays asymmetric and away
    from the bound where a t interval or the bootstrap-t collapses onto it. Exact coverage of units Binomial(m, p)/m,
    m = 2, 3, at 5–20 units, p ∈ [0.005, 0.995], among the samples that get an interval (as used by ``mean_ci``):
    ≥ 0.958; simulated, units the mean of 640 hits at 0.999 (a top-k recall, half the units at 1): 0.966–0.986 at
    5–20 units, where the studentized bootstrap gave 0.855 at 8 (tests/measure/test_stats_discrete.py).
    """
    n, p = x.size, float(x.mean())
    a = (1 - level) / 2
    adjust = (scipy.stats.norm.isf(a) / scipy.stats.t.isf(a, n - 1)) ** 2
    n_eff = p * (1 - p) / (float(x.var(ddof=1)) / n) * adjust
    low, high = proportion_confint(p * n_eff, n_eff, alpha=1 - level, method="beta")
    return float(low), float(high), n_eff


def two_point(x: np.ndarray, level: float) -> tuple[float, float]:
    """The hull of the Clopper–Pearson interval of the count k of the larger value b among the n units (the other
    a), mapped onto [a, b] (``a + (b − a)·[B(α/2; k, n − k + 1), B(1 − α/2; k + 1, n − k)]``), and Student's t
    interval ``x̄ ± t_{1−α/2, n−1}·s/√n``; x takes exactly two values.

    Why both: Clopper–Pearson is exact for units that can only be a or b but lies inside [a, b], so it misses when
    the units can take other values (a count that showed only 0 and 1); t reaches beyond but alone falls to 86%
    at some p. Exact coverage of the hull, over p ∈ [0.005, 0.995] and among the samples that are not constant: ≥
    0.958 at 5, 8, 12 and 20 units (tests/measure/test_stats_discrete.py).
    """
    a, b = np.unique(x)
    k, n = int((x == b).sum()), x.size
    cp_low, cp_high = proportion_confint(k, n, alpha=1 - level, method="beta")
    t = scipy.stats.ttest_1samp(x, 0.0).confidence_interval(confidence_level=level)
    return (min(float(a + (b - a) * cp_low), float(t.low)), max(float(a + (b - a) * cp_high), float(t.high)))
