"""Association of paired values: Spearman ρ with its bootstrap CI, and the least-squares slope."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

from kvstats.measure.stats._bootstrap import _bootstrap_interval
from kvstats.measure.stats._common import _check_level, _sample, check_resamples
from kvstats.results import TestResult


@dataclass(frozen=True)
class CorrelationResult(TestResult):
    """Result of :func:`spearman`: ``statistic`` is ρ, ``pvalue`` scipy's test of ρ = 0,
    ``confidence_interval`` the bootstrap CI of ρ (pairs resampled), ``ci_method`` the interval used."""

    ci_method: str = ""
    n_resamples: int = 0

    def summary(self) -> str:
        return self.summary_with(("ci_method", "n_resamples"))


def _spearman_rho(a, b, axis: int = -1) -> np.ndarray:
    """Spearman's ρ along ``axis`` of many resamples at once: Pearson's correlation of the average ranks (the
    statistic of ``scipy.stats.spearmanr``, which takes one pair of samples per call: a bootstrap then spends
    ~1 ms per resample in it). NaN where a resample is constant, as spearmanr."""
    ra = scipy.stats.rankdata(a, axis=axis)
    rb = scipy.stats.rankdata(b, axis=axis)
    ra = ra - ra.mean(axis=axis, keepdims=True)
    rb = rb - rb.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(axis=axis) / np.sqrt((ra * ra).sum(axis=axis) * (rb * rb).sum(axis=axis))


def spearman(
    x,
    y,
    *,
    confidence_level: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    alternative: str = "two-sided",
    method: str = "BCa",
) -> CorrelationResult:
    """Spearman's rank correlation ρ of paired samples with a bootstrap CI.

    ρ is Pearson's correlation of the ranks (average ranks for ties); the p-value is
    ``scipy.stats.spearmanr``'s (t approximation ``t = ρ√((n−2)/(1−ρ²))`` with n − 2 df). The CI resamples
    the (xᵢ, yᵢ) pairs (``scipy.stats.bootstrap(paired=True)``), BCa by default, percentile when BCa is not
    finite. A resample in which x or y is constant has no ρ; with at least a handful of distinct values this
    is rare, and if the percentile interval is still not finite ``ci_method`` says so.

    Args:
        x, y: 1-D samples of one length ≥ 4, not constant.
    """
    xs, ys = _sample(x, "x", min_size=4), _sample(y, "y", min_size=4)
    level = _check_level(confidence_level)
    n_resamples = check_resamples(n_resamples, level)
    if xs.size != ys.size:
        raise ValueError(f"x and y must have one length (pairs), got {xs.size} and {ys.size}")
    for arr, name in ((xs, "x"), (ys, "y")):
        if np.ptp(arr) == 0:
            raise ValueError(f"{name} is constant ({arr[0]}): Spearman's rho is undefined")
    ref = scipy.stats.spearmanr(xs, ys, alternative=alternative)

    low, high, _, how = _bootstrap_interval((xs, ys), _spearman_rho, level, n_resamples, method, seed, paired=True)
    if not (math.isfinite(low) and math.isfinite(high)):
        how = "none: the bootstrap distribution holds undefined rho (resamples with constant x or y)"
    return CorrelationResult(
        statistic=float(ref.statistic),
        pvalue=float(ref.pvalue),
        method="Spearman rank correlation (scipy.stats.spearmanr), bootstrap CI over pairs",
        null_hypothesis="rho = 0" if alternative == "two-sided" else
        ("rho >= 0" if alternative == "less" else "rho <= 0"),
        n=xs.size,
        effect_size=float(ref.statistic),
        effect_size_name="Spearman rho",
        confidence_interval=(low, high),
        ci_of=f"rho (paired bootstrap, {how})",
        confidence_level=level,
        ci_method=how,
        n_resamples=n_resamples,
    )


def ols_slope(points) -> float:
    """The ordinary least-squares slope of y on x, ``β = Σ(xᵢ − x̄)(yᵢ − ȳ) / Σ(xᵢ − x̄)²``, for ``points``
    [n, 2] (column 0 x, column 1 y): ``scipy.stats.linregress``'s slope. A plain statistic (no interval, no
    validation beyond the shape), so that a bootstrap can call it on every resample: e.g.
    ``cluster_bootstrap_ci(units, ols_slope, clusters=...)`` with units of rows (x, y) gives the slope's cluster
    bootstrap CI. nan when x is constant."""
    xy = np.asarray(points, dtype=np.float64)
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise ValueError(f"points must be [n, 2] (x, y), got shape {xy.shape}")
    x, y = xy[:, 0] - xy[:, 0].mean(), xy[:, 1] - xy[:, 1].mean()
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((x * y).sum() / (x * x).sum())
