"""Goodness of fit as an equivalence: an interval for the Kolmogorov distance between a sample's law and a model.

"The coordinates follow f_d" is a claim of identity of two laws. A KS test that does not reject it is absence of
evidence (it always passes at small n); the symmetric form asks how far the true law F can be from the model G.
With D = sup|F_n − G| (the KS statistic of n i.i.d. draws) and Δ = sup|F − G| the triangle inequality gives
|D − Δ| ≤ sup|F_n − F|, whose law does not depend on F (continuous F): Kolmogorov's distribution, scipy's
``kstwo``. So ``[max(0, D − c), min(1, D + c)]`` with ``c = kstwo.isf(1 − level, n)`` holds Δ with probability at
least ``level`` — a confidence interval for the distance, to hold against a declared margin
(:func:`kvstats.measure.verdicts.equivalence`).
"""

from __future__ import annotations

import math

from scipy import stats

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import _check_level

__all__ = ["ks_distance_interval"]


def ks_distance_interval(distance: float, n: int, *, confidence_level: float = 0.95) -> tuple[float, float]:
    """Confidence interval for Δ = sup|F − G| from the KS distance ``distance`` = sup|F_n − G| of ``n`` i.i.d.
    draws of a continuous F: ``[max(0, D − c), min(1, D + c)]``, ``c = kstwo.isf(1 − confidence_level, n)``
    (Kolmogorov's exact law of sup|F_n − F|; ≈ 1.358/√n at 95%)."""
    d = float(distance)
    if not (math.isfinite(d) and 0.0 <= d <= 1.0):
        raise ValueError(f"distance must be a KS distance in [0, 1], got {distance!r}")
    n = check_int_range(n, "n", 1, 2**62)
    level = _check_level(confidence_level)
    c = float(stats.kstwo.isf(1.0 - level, n))
    return max(0.0, d - c), min(1.0, d + c)
