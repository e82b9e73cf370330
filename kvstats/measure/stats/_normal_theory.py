"""Normal-theory intervals and tests, written out: Student's t interval of a mean and of a paired geometric-mean
ratio, the standard error behind a t interval, the z-test of the difference of two independent estimates.

These are the textbook formulas evaluated as written (numpy's ``std(ddof=1)``, scipy's ``t.ppf``): for Monte Carlo
estimates whose sampling distribution is close to normal (means over many independent draws), where an exact
closed form is what the interval is compared with. :func:`kvstats.stats.mean_ci` picks an interval that covers at
few units of any law; its ``method="t"`` gives the interval of :func:`t_interval` through scipy's ``ttest_1samp``
(equal to a few units in the last place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

from kvstats.measure.stats._common import _check_level, _sample
from kvstats.results import TestResult

__all__ = ["TIntervalResult", "ZTestResult", "log_ratio_t_interval", "t_interval", "t_standard_error",
           "z_difference_test"]


@dataclass(frozen=True)
class TIntervalResult(TestResult):
    """Result of :func:`t_interval` / :func:`log_ratio_t_interval`: ``statistic`` the estimate (the mean; the
    geometric-mean ratio), ``confidence_interval`` its Student's t interval, ``standard_error`` s/√n (of the mean;
    of the mean log ratio), ``df`` = n − 1; no test (``pvalue`` nan)."""

    standard_error: float = math.nan
    df: int = 0

    def summary(self) -> str:
        return self.summary_with(("standard_error", "df"))


@dataclass(frozen=True)
class ZTestResult(TestResult):
    """Result of :func:`z_difference_test`: ``statistic`` z = (a − b)/se, ``pvalue`` two-sided, ``effect_size`` the
    difference a − b, ``standard_error`` se = √(se_a² + se_b²)."""

    standard_error: float = math.nan

    def summary(self) -> str:
        return self.summary_with(("standard_error",))


def _t_half_width(x: np.ndarray, level: float) -> float:
    """t_{(1+level)/2, n−1}·s/√n, evaluated in that order (s = numpy's std with ddof 1)."""
    return scipy.stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))


def t_interval(data, confidence_level: float = 0.95) -> TIntervalResult:
    """The mean of ``data`` with Student's t interval ``x̄ ± t_{(1+level)/2, n−1}·s/√n``.

    Exact for normal data; for a mean over independent Monte Carlo draws (many per unit) it is the usual interval.
    At few units of a skewed law use :func:`kvstats.stats.mean_ci`.

    Args:
        data: 1-D sample of at least 2 finite values.
    """
    x = _sample(data, "data", min_size=2)
    level = _check_level(confidence_level)
    half = _t_half_width(x, level)
    mean = x.mean()
    return TIntervalResult(
        statistic=float(mean), pvalue=math.nan, method=f"mean with Student's t interval ({x.size - 1} df)",
        null_hypothesis="none (estimate with confidence interval)", n=x.size,
        confidence_interval=(float(mean - half), float(mean + half)), ci_of="mean", confidence_level=level,
        standard_error=float(x.std(ddof=1) / math.sqrt(x.size)), df=x.size - 1)


def log_ratio_t_interval(a, b, confidence_level: float = 0.95) -> TIntervalResult:
    """The geometric-mean ratio of paired positive samples, ``exp(mean(log aᵢ − log bᵢ))``, with the t interval of
    the mean log ratio (:func:`t_interval` on ``log a − log b``) mapped back by ``exp``.

    Args:
        a, b: 1-D samples of one length ≥ 2, positive (paired: aᵢ and bᵢ share a unit).
    """
    xa, xb = _sample(a, "a", min_size=2), _sample(b, "b", min_size=2)
    level = _check_level(confidence_level)
    if xa.size != xb.size:
        raise ValueError(f"a and b must have one length (pairs), got {xa.size} and {xb.size}")
    if (xa <= 0).any() or (xb <= 0).any():
        raise ValueError("a and b must be positive (the ratio is taken on the log scale)")
    lr = np.log(xa) - np.log(xb)
    half = _t_half_width(lr, level)
    mean = lr.mean()
    return TIntervalResult(
        statistic=float(np.exp(mean)), pvalue=math.nan,
        method=f"geometric-mean ratio a/b with Student's t interval on the log ratios ({lr.size - 1} df)",
        null_hypothesis="none (estimate with confidence interval)", n=lr.size,
        confidence_interval=(float(np.exp(mean - half)), float(np.exp(mean + half))),
        ci_of="geometric-mean ratio a/b", confidence_level=level,
        standard_error=float(lr.std(ddof=1) / math.sqrt(lr.size)), df=lr.size - 1)


def t_standard_error(low, high, n, confidence_level: float = 0.95) -> np.ndarray:
    """The standard error s/√n behind Student's t interval [low, high] over n units:
    ``(high − low) / (2·t_{(1+level)/2, n−1})``. Arrays broadcast (n against ``low``'s shape)."""
    level = _check_level(confidence_level)
    n = np.broadcast_to(np.asarray(n, float), np.shape(low))
    if (n < 2).any():
        raise ValueError(f"n must be at least 2 (a t interval has n − 1 ≥ 1 degrees of freedom), got {n.tolist()}")
    return (np.asarray(high, float) - np.asarray(low, float)) / (2 * scipy.stats.t.ppf((1 + level) / 2, n - 1))


def z_difference_test(estimate_a: float, se_a: float, estimate_b: float, se_b: float) -> ZTestResult:
    """Two-sided z-test of H0: the two quantities are equal, from two independent estimates with standard errors:
    ``z = (a − b)/√(se_a² + se_b²)``, ``p = 2Φ(−|z|)``. For estimates that are close to normal (means over many
    independent draws), e.g. two Monte Carlo estimates of a variance."""
    if not (se_a >= 0 and se_b >= 0) or se_a == se_b == 0:
        raise ValueError(f"the standard errors must be >= 0 and not both 0, got {se_a} and {se_b}")
    diff = estimate_a - estimate_b
    se = math.hypot(se_a, se_b)
    return ZTestResult(
        statistic=diff / se, pvalue=float(2 * scipy.stats.norm.sf(abs(diff) / se)),
        method="z-test of the difference of two independent estimates",
        null_hypothesis="the two estimated quantities are equal", n=2, effect_size=float(diff),
        effect_size_name="difference a - b", standard_error=se)
