"""Equivalence and non-inferiority: "no worse than δ" as a test that can succeed, not a failure to find a difference.

A non-significant difference test says nothing about equivalence ("quality-neutral at 4 bits" is an
equivalence claim). Here the null is the difference of interest:

* :func:`equivalence` — TOST (Schuirmann 1987): H0: |μ_a − μ_b| ≥ δ against |μ_a − μ_b| < δ, two one-sided t
  tests at level α, p = the larger of the two; equivalent exactly when the (1 − 2α) CI of μ_a − μ_b lies
  inside (−δ, δ). statsmodels' ``ttost_paired`` (its ``DescrStatsW.ttost_mean`` of a − b) / ``ttost_ind`` do the
  arithmetic.
* :func:`noninferiority` — one-sided: H0: μ_a − μ_b ≥ δ (a is worse than b by δ or more, for a metric where
  lower is better, like KL) against μ_a − μ_b < δ; ``higher_is_better=True`` flips it (accuracy:
  H0: μ_a − μ_b ≤ −δ). statsmodels' ``DescrStatsW.ttest_mean`` / ``CompareMeans.ttest_ind``.

Both take a declared margin δ > 0 in the metric's units; the margin is part of the claim and is stated in
the result. Paired (same units for a and b, the difference per unit is tested) or unpaired (Welch's t by
default, pooled on request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from statsmodels.stats import weightstats

from kvstats.measure.stats._common import _sample, unit_exponent
from kvstats.results import TestResult

__all__ = ["EquivalenceResult", "equivalence", "noninferiority"]


@dataclass(frozen=True)
class EquivalenceResult(TestResult):
    """Result of :func:`equivalence` / :func:`noninferiority`: ``statistic`` is the t of the deciding one-sided
    test, ``pvalue`` its p, ``effect_size`` the mean difference μ_a − μ_b with its (1 − 2α) CI (the TOST
    interval; its relevant end is the one-sided (1 − α) bound of a non-inferiority test); ``margin`` δ;
    ``alpha``; ``conclusion`` True when H0 is rejected at ``alpha`` (equivalent within δ / not inferior by δ)."""

    margin: float = float("nan")
    alpha: float = 0.05
    conclusion: bool = False
    paired: bool = True

    def summary(self) -> str:
        return self.summary_with(("margin", "alpha", "conclusion", "paired"))


def _margin(margin) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"margin must be a finite number > 0 (δ, in the metric's units), got {margin!r}")
    return float(margin)


def _alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < float(alpha) < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    return float(alpha)


def _samples(a, b, paired: bool, delta: float) -> tuple[np.ndarray, np.ndarray, float, int, float]:
    """(x, y, δ) times 2^k, k and the data's largest magnitude, k bringing the data near 1 so that no variance over-
    or underflows (values near 1e200 or 4.5e-263 gave NaN p and intervals; paired differences near 1e-170 gave
    t = ±inf). t and p do not depend on the units; the mean difference and its interval are the scaled ones times
    2^-k (exact: a power of two). Paired: x holds the differences a − b, taken after a first scaling (so they cannot
    overflow) and scaled again on their own magnitude; y is 0."""
    x, y = _sample(a, "a", min_size=2), _sample(b, "b", min_size=2)
    if paired and x.size != y.size:
        raise ValueError(f"paired samples must have one length, got {x.size} and {y.size}")
    first, big = float(x[0]) - float(y[0]), max(float(np.abs(x).max()), float(np.abs(y).max()))
    if not paired and x.min() == x.max() and y.min() == y.max():
        raise ValueError("a and b are both constant (no spread): the t tests are undefined; compare "
                         f"{float(x[0])!r} − {float(y[0])!r} with the margin directly")
    k = unit_exponent(np.concatenate([x, y]))
    x, y = np.ldexp(x, k), np.ldexp(y, k)
    if paired:
        d = x - y
        j = unit_exponent(d)
        x, y, k = np.ldexp(d, j), np.zeros_like(d), k + j
    # no spread, no t statistic: its p would be 0, 1 or NaN by the sign of a division by zero
    if paired and np.ptp(x) == 0:
        raise ValueError(f"the paired differences a − b have no spread (all {first!r}): the t tests are undefined; "
                         "compare the constant difference with the margin directly")
    with np.errstate(over="ignore", under="ignore"):  # a margin beyond float64 at that scale: t = ±inf, p = 0 or 1
        return x, y, float(np.ldexp(delta, k)), k, big


def _mean_difference_ci(x, y, paired: bool, usevar: str, level: float) -> tuple[float, float]:
    if paired:
        return weightstats.DescrStatsW(x).tconfint_mean(alpha=1 - level)
    return weightstats.CompareMeans.from_data(x, y).tconfint_diff(alpha=1 - level, usevar=usevar)


def _difference(x, y, paired: bool, usevar: str, level: float, k: int, big: float) -> tuple[float, tuple[float, float]]:
    """The mean difference a − b and its ``level`` t interval, back in the data's units (× 2^-k); refused, naming the
    data's magnitude, where float64 cannot hold them (a and b near ±1e308 of opposite signs)."""
    low, high = _mean_difference_ci(x, y, paired, usevar, level)
    with np.errstate(over="ignore"):
        effect, low, high = (float(np.ldexp(v, -k)) for v in (x.mean() - y.mean(), low, high))
    if not all(math.isfinite(v) for v in (effect, low, high)):
        raise ValueError(f"mean(a) − mean(b) or its interval does not fit float64 (max |a|, |b| = {big:.4g}): the "
                         "t test is defined but its difference is not representable; rescale the data")
    return effect, (low, high)


def equivalence(a, b, *, margin: float, paired: bool = True, alpha: float = 0.05,
                usevar: str = "unequal") -> EquivalenceResult:
    """TOST: are the means of a and b within ±δ of each other?

    Args:
        a, b: 1-D samples (paired: per unit, same order; at least 2 each).
        margin: δ > 0, the largest difference still called equivalent (declared before the data).
        paired: test the per-unit differences (one-sample t) or two independent samples.
        alpha: level of each one-sided test (the CI reported is the 1 − 2α one).
        usevar: unpaired only, ``"unequal"`` (Welch, default) or ``"pooled"``.
    """
    delta, alpha = _margin(margin), _alpha(alpha)
    x, y, scaled, k, big = _samples(a, b, paired, delta)
    if paired:
        p, lower, upper = weightstats.DescrStatsW(x).ttost_mean(-scaled, scaled)  # = ttost_paired on a − b
    else:
        p, lower, upper = weightstats.ttost_ind(x, y, -scaled, scaled, usevar=usevar)
    deciding = lower if lower[1] >= upper[1] else upper
    effect, ci = _difference(x, y, paired, usevar, 1 - 2 * alpha, k, big)
    return EquivalenceResult(
        statistic=float(deciding[0]), pvalue=float(p), method=f"TOST ({'paired' if paired else usevar} t)",
        null_hypothesis=f"|mean(a) − mean(b)| ≥ {delta:g}", n=x.size if paired else (x.size, y.size),
        effect_size=effect, effect_size_name="mean difference a − b", confidence_interval=ci,
        ci_of="mean(a) − mean(b) (the TOST interval)", confidence_level=1 - 2 * alpha,
        margin=delta, alpha=alpha, conclusion=bool(p < alpha), paired=paired)


def noninferiority(a, b, *, margin: float, paired: bool = True, alpha: float = 0.05, higher_is_better: bool = False,
                   usevar: str = "unequal") -> EquivalenceResult:
    """Is a no worse than b by δ? One-sided t test of H0: μ_a − μ_b ≥ δ (lower is better; with
    ``higher_is_better``, H0: μ_a − μ_b ≤ −δ). The CI is the (1 − 2α) two-sided one, whose relevant end is
    the one-sided (1 − α) bound: not inferior exactly when that end is inside the margin."""
    delta, alpha = _margin(margin), _alpha(alpha)
    x, y, scaled, k, big = _samples(a, b, paired, delta)
    value, alternative = (-scaled, "larger") if higher_is_better else (scaled, "smaller")
    if paired:
        t, p, _ = weightstats.DescrStatsW(x).ttest_mean(value=value, alternative=alternative)
    else:
        t, p, _ = weightstats.CompareMeans.from_data(x, y).ttest_ind(alternative=alternative, usevar=usevar,
                                                                      value=value)
    worse = "≤ −" if higher_is_better else "≥ "
    effect, ci = _difference(x, y, paired, usevar, 1 - 2 * alpha, k, big)
    return EquivalenceResult(
        statistic=float(t), pvalue=float(p), method=f"non-inferiority ({'paired' if paired else usevar} t, one-sided)",
        null_hypothesis=f"mean(a) − mean(b) {worse}{delta:g} (a worse than b by the margin or more)",
        n=x.size if paired else (x.size, y.size), effect_size=effect, effect_size_name="mean difference a − b",
        confidence_interval=ci, ci_of="mean(a) − mean(b)", confidence_level=1 - 2 * alpha, margin=delta,
        alpha=alpha, conclusion=bool(p < alpha), paired=paired)
