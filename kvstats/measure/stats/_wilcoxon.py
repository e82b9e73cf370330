"""The Wilcoxon signed-rank test with the matched-pairs rank-biserial r."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

from kvstats.measure.stats._bootstrap import _bootstrap_interval
from kvstats.measure.stats._common import _check_level, _sample, check_alternative, check_resamples, min_resamples
from kvstats.results import TestResult

#: Largest number of pairs for which :func:`wilcoxon` (method "auto") uses the exact null (scipy's rule).
WILCOXON_EXACT_MAX_N = 50
#: Largest number of pairs for which a tied / zero-difference sample gets scipy's exhaustive sign-flip
#: permutation p-value (2ⁿ ≤ 8192 < 9999 resamples: every flip enumerated, so the p-value is exact).
WILCOXON_PERMUTATION_MAX_N = 13
#: Largest number of pairs whose bootstrap CI of r :func:`wilcoxon` computes by default (n_resamples=None): the
#: bootstrap costs n_resamples ranking passes over n pairs (≈ 13 s at 5,000 pairs and 9,999 resamples); above it
#: the CI is left out, with the reason in ``ci_of``, unless n_resamples is given.
WILCOXON_BOOTSTRAP_MAX_N = 2000


def _signed_rank_sums(d: np.ndarray, zero_method: str, axis: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W⁺, W⁻, total rank sum) of differences ``d`` along ``axis``, zeros handled as ``zero_method``."""
    d = np.moveaxis(np.asarray(d, dtype=np.float64), axis, -1)
    ranks = scipy.stats.rankdata(np.abs(d), axis=-1)  # zeros take the lowest ranks
    n_zero = (d == 0).sum(axis=-1)
    if zero_method == "wilcox":  # drop zeros: ranks among the non-zero differences
        ranks = ranks - n_zero[..., None]
        n_used = d.shape[-1] - n_zero
    else:  # "pratt": zeros keep their ranks but count for neither side; "zsplit": half to each side
        n_used = np.full(n_zero.shape, d.shape[-1])
    w_plus = np.where(d > 0, ranks, 0.0).sum(axis=-1)
    w_minus = np.where(d < 0, ranks, 0.0).sum(axis=-1)
    if zero_method == "zsplit":
        half_zero = np.where(d == 0, ranks, 0.0).sum(axis=-1) / 2
        w_plus, w_minus = w_plus + half_zero, w_minus + half_zero
    return w_plus, w_minus, n_used * (n_used + 1) / 2.0


def _matched_rank_biserial(d, zero_method: str, axis: int = -1) -> np.ndarray:
    """r = (W⁺ − W⁻)/S; 0 for differences that are all zero (W⁺ = W⁻ = 0: no tendency either way), which a
    bootstrap resample of a sample with zero differences can be."""
    w_plus, w_minus, total = _signed_rank_sums(d, zero_method, axis)
    return np.divide(w_plus - w_minus, total, out=np.zeros(np.shape(total)), where=np.asarray(total) > 0)


@dataclass(frozen=True)
class WilcoxonResult(TestResult):
    """Result of :func:`wilcoxon`. ``statistic`` is scipy's (``min(W⁺, W⁻)`` two-sided, ``W⁺`` one-sided),
    ``effect_size`` the matched-pairs rank-biserial ``r = (W⁺ − W⁻)/(W⁺ + W⁻ + zero ranks)``,
    ``confidence_interval`` its paired bootstrap CI.

    Extra fields: ``w_plus``, ``w_minus`` (rank sums of the positive / negative differences a − b),
    ``n_pairs``, ``n_zero`` (pairs with a = b), ``median_difference`` (median of a − b), ``median_a``,
    ``median_b``, ``median_ratio``, ``pvalue_method`` ("exact", "exact permutation" or "asymptotic"),
    ``zero_method``, ``alternative``; ``prob_less`` = (#{aᵢ < bᵢ} + ½·#{aᵢ = bᵢ})/n, the share of pairs in which
    a is below b (the probability of improvement for a metric where lower is better), beside r.
    """

    w_plus: float = math.nan
    w_minus: float = math.nan
    rank_biserial: float = math.nan
    prob_less: float = math.nan
    n_pairs: int = 0
    n_zero: int = 0
    median_difference: float = math.nan
    median_a: float = math.nan
    median_b: float = math.nan
    median_ratio: float = math.nan
    pvalue_method: str = ""
    zero_method: str = "wilcox"
    alternative: str = "two-sided"

    _FIELDS = ("w_plus", "w_minus", "prob_less", "n_zero", "median_difference", "median_a", "median_b",
               "median_ratio", "pvalue_method", "zero_method", "alternative")

    def summary(self) -> str:
        return self.summary_with(self._FIELDS)


def wilcoxon(
    a,
    b=None,
    alternative: str = "two-sided",
    method: str = "auto",
    *,
    zero_method: str = "wilcox",
    confidence_level: float = 0.95,
    n_resamples: int | None = None,
    seed: int = 0,
) -> WilcoxonResult:
    """Wilcoxon signed-rank test of paired samples (a[i] and b[i] measured on the same unit) with the
    matched-pairs rank-biserial effect size and its bootstrap CI.

    Wraps ``scipy.stats.wilcoxon`` on the differences ``dᵢ = aᵢ − bᵢ`` (or on ``a`` when ``b`` is None).
    H0: the distribution of d is symmetric about 0. Ranks ``Rᵢ`` of ``|dᵢ|`` (average ranks for ties);
    ``W⁺ = Σ_{dᵢ>0} Rᵢ``, ``W⁻ = Σ_{dᵢ<0} Rᵢ``. Effect size (Kerby 2014, the "simple difference formula"):
    ``r = (W⁺ − W⁻)/S`` with ``S = n(n+1)/2`` the sum of all ranks (n = pairs used): **positive when a tends
    to be larger**, ±1 when every difference has one sign. Its CI resamples the pairs
    (``scipy.stats.bootstrap``, BCa, percentile when BCa is not finite, the point itself when every
    difference has one sign: r is then ±1 in every resample).

    p-value (``pvalue_method`` says which): "auto" uses the exact null when there are at most
    ``WILCOXON_EXACT_MAX_N`` pairs with neither ties in |d| nor zero differences, scipy's exhaustive
    sign-flip permutation when there are ties or zeros and at most ``WILCOXON_PERMUTATION_MAX_N`` pairs,
    else the normal approximation (tie-corrected variance, no continuity correction: scipy's default).
    This is scipy's own ``method="auto"`` rule, stated.

    Args:
        a, b: 1-D paired samples of one length (b None: a holds the differences).
        alternative: "two-sided", "less" (a tends to be smaller) or "greater".
        method: "auto", "exact" (refused with ties or zeros) or "asymptotic".
        zero_method: "wilcox" (drop zero differences, the default), "pratt" or "zsplit" (scipy's).
        confidence_level, n_resamples, seed: the bootstrap CI of r (cost ≈ n_resamples ranking passes over n
            pairs plus an n-fold jackknife: ~0.8 s at 300 pairs and 9999 resamples on one core). None (default):
            9999 resamples up to ``WILCOXON_BOOTSTRAP_MAX_N`` pairs, none above (the CI is nan and ``ci_of`` says
            why); 0: no CI at any n. The p-value and r never depend on it.
    """
    xa = _sample(a, "a")
    if b is None:
        d, xb = xa, None
    else:
        xb = _sample(b, "b")
        if xa.size != xb.size:
            raise ValueError(f"a and b must have one length (a[i] pairs with b[i]), got {xa.size} and {xb.size}")
        d = xa - xb
    level = _check_level(confidence_level)
    by_default = n_resamples is None
    if by_default:
        n_resamples = max(9999, min_resamples(level)) if d.size <= WILCOXON_BOOTSTRAP_MAX_N else 0
    else:
        n_resamples = check_resamples(n_resamples, level, allow_zero=True)
    check_alternative(alternative)
    if method not in ("auto", "exact", "asymptotic"):
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', got {method!r}")
    if zero_method not in ("wilcox", "pratt", "zsplit"):
        raise ValueError(f"zero_method must be 'wilcox', 'pratt' or 'zsplit', got {zero_method!r}")
    n_zero = int((d == 0).sum())
    if n_zero == d.size:
        raise ValueError(f"every one of the {d.size} paired differences is 0: the signed-rank test is undefined")
    nonzero = np.abs(d[d != 0])
    ties = np.unique(nonzero).size < nonzero.size
    if method == "exact" and (ties or n_zero):
        raise ValueError(f"method='exact' needs differences without ties or zeros ({n_zero} zero(s), ties in |a - b|: "
                         f"{ties}): use method='auto' or 'asymptotic'")
    if method == "auto":
        if d.size <= WILCOXON_EXACT_MAX_N and not ties and not n_zero:
            method = "exact"
        elif d.size <= WILCOXON_PERMUTATION_MAX_N:
            method = "exact permutation"
        else:
            method = "asymptotic"
    scipy_method = scipy.stats.PermutationMethod() if method == "exact permutation" else method
    ref = scipy.stats.wilcoxon(d, zero_method=zero_method, alternative=alternative, method=scipy_method)
    w_plus, w_minus, _ = _signed_rank_sums(d, zero_method)
    rb = float(_matched_rank_biserial(d, zero_method))
    if np.all(d >= 0) or np.all(d <= 0):  # r = ±1 in every resample that has a non-zero difference
        ci, ci_how = (rb, rb), "every difference has one sign"
    elif n_resamples == 0:
        ci = (math.nan, math.nan)
        ci_how = (f"not computed: {d.size} pairs > WILCOXON_BOOTSTRAP_MAX_N = {WILCOXON_BOOTSTRAP_MAX_N}; pass "
                  "n_resamples=9999 for it" if by_default else "not computed: n_resamples=0")
    else:
        low, high, _, ci_how = _bootstrap_interval(
            (d,), lambda x, axis=-1: _matched_rank_biserial(x, zero_method, axis), level, n_resamples, "BCa", seed,
            paired=False)
        ci = (low, high)
    med_a = float(np.median(xa)) if xb is not None else math.nan
    med_b = float(np.median(xb)) if xb is not None else math.nan
    return WilcoxonResult(
        statistic=float(ref.statistic),
        pvalue=float(ref.pvalue),
        method=f"Wilcoxon signed-rank ({method}, zero_method={zero_method})",
        null_hypothesis="a - b symmetric about 0" if alternative == "two-sided" else
        ("a - b symmetric about a value >= 0" if alternative == "less" else "a - b symmetric about a value <= 0"),
        n=d.size,
        effect_size=rb,
        effect_size_name="matched-pairs rank-biserial r = (W+ - W-)/(W+ + W-)",
        confidence_interval=ci,
        ci_of=f"rank-biserial r (paired bootstrap, {ci_how})",
        confidence_level=level,
        w_plus=float(w_plus),
        w_minus=float(w_minus),
        rank_biserial=rb,
        prob_less=float(((d < 0).sum() + 0.5 * (d == 0).sum()) / d.size),
        n_pairs=d.size,
        n_zero=n_zero,
        median_difference=float(np.median(d)),
        median_a=med_a,
        median_b=med_b,
        median_ratio=med_a / med_b if xb is not None and med_b != 0 else math.nan,
        pvalue_method=method,
        zero_method=zero_method,
        alternative=alternative,
    )
