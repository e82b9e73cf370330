"""Mann–Whitney U with its exact null distribution, the rank-biserial r and Hodges–Lehmann."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import (
    EXACT_CI_MAX_PAIRS,
    EXACT_MAX_PAIRS,
    HL_MAX_PAIRS,
    _check_level,
    _sample,
    check_alternative,
)
from kvstats.results import TestResult


def mwu_null_cdf(n1: int, n2: int) -> np.ndarray:
    """Exact null CDF of the Mann–Whitney U (no ties): ``cdf[u] = P(U ≤ u)`` for ``u = 0 … n₁n₂``.

    Uses the recursion ``P_{i,j}(u) = i/(i+j)·P_{i−1,j}(u − j) + j/(i+j)·P_{i,j−1}(u)`` on probabilities
    (sums of positive terms only: no cancellation, accurate in the far tail). Cost O(n₁·n₂·n₁n₂).
    """
    n1 = check_int_range(n1, "n1", 1, 10**6)
    n2 = check_int_range(n2, "n2", 1, 10**6)
    if n1 * n2 > 4 * EXACT_CI_MAX_PAIRS:
        raise ValueError(f"n1*n2 must be <= {4 * EXACT_CI_MAX_PAIRS} for the exact null CDF, got {n1 * n2}")
    # prev[j] = pmf of U for (i-1, j); iterate i = 1..n1, inner j = 0..n2
    prev = [np.ones(1) for _ in range(n2 + 1)]  # i = 0: U = 0 with probability 1
    for i in range(1, n1 + 1):
        cur = [np.ones(1)]  # j = 0: U = 0
        for j in range(1, n2 + 1):
            pmf = np.zeros(i * j + 1)
            a = prev[j]  # (i-1, j): shifted by j (the new largest a-value beats all j b-values)
            pmf[j : j + a.size] += (i / (i + j)) * a
            b = cur[j - 1]  # (i, j-1): the largest value is a b-value, U unchanged
            pmf[: b.size] += (j / (i + j)) * b
            cur.append(pmf)
        prev = cur
    return np.minimum(np.cumsum(prev[n2]), 1.0)


def _mwu_exact_cdf(n1: int, n2: int, u_max: int) -> np.ndarray:
    """Exact null CDF of U (no ties), ``P(U ≤ u)`` for ``u = 0 … u_max``, in O(min(n₁, n₂)·u_max).

    The counts of U are the coefficients of the Gaussian binomial
    ``[N choose m]_q = Π_{i=1..m} (1 − q^{n+i}) / (1 − q^i)`` (``m = min(n₁, n₂)``, ``n = max``, ``N = m + n``;
    Harding 1984, Appl. Statist. 33:1-6). Each factor is applied to the coefficients 0 … u_max: a shifted
    subtraction, then a strided cumulative sum for the division; the vector is rescaled to max 1 after each
    step and the log of the scale kept, so nothing overflows (``C(1200, 600) ≈ 1e359``, the overflow of
    scipy's exact machinery for samples above ~515). Probabilities are ``count / C(N, m)`` taken in log space;
    tails below ~1e-308 underflow to 0, the float64 value nearest to them. Accuracy against exact rational
    arithmetic: ≤ 2e-11 relative for ``n₁n₂ ≤ EXACT_MAX_PAIRS`` and ``u_max ≤ n₁n₂/2`` (tests); beyond,
    the subtractions cancel and the error grows, which is why larger samples use the normal approximation.
    """
    m, n = min(n1, n2), max(n1, n2)
    size = u_max + 1
    counts = np.zeros(size)
    counts[0] = 1.0
    log_scale = 0.0
    for i in range(1, m + 1):
        shift = n + i
        if shift < size:
            counts[shift:] -= counts[: size - shift].copy()
        if i < size:  # divide by (1 - q^i): c[u] += c[u - i], a cumulative sum along each residue class mod i
            padded = np.concatenate([counts, np.zeros((-size) % i)]).reshape(-1, i)
            counts = np.cumsum(padded, axis=0).ravel()[:size]
        top = counts.max()
        counts /= top
        log_scale += math.log(top)
    log_total = math.lgamma(m + n + 1) - math.lgamma(m + 1) - math.lgamma(n + 1)
    cum = np.cumsum(counts)
    with np.errstate(divide="ignore"):  # log(0) = -inf -> probability 0 (only if the tail underflowed)
        return np.minimum(np.exp(np.log(cum) + (log_scale - log_total)), 1.0)


def _mwu_exact_pvalue(u1: float, n1: int, n2: int, alternative: str) -> float:
    """Exact p-value of U₁ (integer, no ties) under H0, as scipy's ``method="exact"`` defines it."""
    total = n1 * n2
    u1 = int(round(u1))
    if alternative == "less":
        tail = u1  # P(U <= U1)
    elif alternative == "greater":
        tail = total - u1  # P(U >= U1) = P(U <= n1 n2 - U1) by symmetry
    else:
        tail = min(u1, total - u1)
    if 2 * tail > total:  # P(U <= t) = 1 - P(U <= n1 n2 - t - 1): stay in the accurate lower half
        below = total - tail - 1  # -1 when t = n1 n2: P(U <= -1) = 0, so p = 1
        p = 1.0 - (float(_mwu_exact_cdf(n1, n2, below)[-1]) if below >= 0 else 0.0)
    else:
        p = float(_mwu_exact_cdf(n1, n2, tail)[-1])
    return min(1.0, 2.0 * p if alternative == "two-sided" else p)


def _tie_sigma(n1: int, n2: int, pooled: np.ndarray) -> float:
    n = n1 + n2
    _, counts = np.unique(pooled, return_counts=True)
    tie_term = float((counts**3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    return math.sqrt(max(n1 * n2 / 12.0 * ((n + 1) - tie_term), 0.0))


def hodges_lehmann(a, b, *, confidence_level: float = 0.95) -> tuple[float, tuple[float, float], str]:
    """Hodges–Lehmann shift ``Δ̂ = median{aᵢ − bⱼ}`` with its distribution-free CI (Moses / Bauer 1972).

    The CI is ``[D₍ₖ₎, D₍ₙ₁ₙ₂₋ₖ₊₁₎]`` from the sorted pairwise differences, with ``k`` the largest integer
    such that ``P(U ≤ k − 1) ≤ α/2`` under H0 (exact null distribution of U when ``n₁n₂ ≤``
    ``EXACT_CI_MAX_PAIRS``, else the normal approximation with tie correction and continuity correction,
    ``k = ⌊n₁n₂/2 − z_{1−α/2}·σ_U + ½⌋``). Coverage is ≥ the nominal level for continuous data under a
    pure shift model. When ``k < 1`` the interval is unbounded (too few observations).

    Returns:
        (shift, (low, high), method) where method is "exact" or "normal".
    """
    a, b = _sample(a, "a"), _sample(b, "b")
    level = _check_level(confidence_level)
    n1, n2 = a.size, b.size
    if n1 * n2 > HL_MAX_PAIRS:
        raise ValueError(f"Hodges-Lehmann needs all n1*n2 pairwise differences; n1*n2 must be <= {HL_MAX_PAIRS}, "
                         f"got {n1 * n2}")
    diffs = np.sort((a[:, None] - b[None, :]).ravel())
    shift = float(np.median(diffs))
    alpha = 1.0 - level
    if n1 * n2 <= EXACT_CI_MAX_PAIRS:
        cdf = mwu_null_cdf(n1, n2)
        # k - 1 = largest u with P(U <= u) <= alpha/2  ->  k = number of such u's
        k = int(np.searchsorted(cdf, alpha / 2 * (1 + 1e-12), side="right"))
        how = "exact"
    else:
        sigma = _tie_sigma(n1, n2, np.concatenate([a, b]))
        k = int(math.floor(n1 * n2 / 2.0 - scipy.stats.norm.isf(alpha / 2) * sigma + 0.5))
        how = "normal"
    if k < 1:
        return shift, (-math.inf, math.inf), how
    return shift, (float(diffs[k - 1]), float(diffs[n1 * n2 - k])), how


@dataclass(frozen=True)
class MannWhitneyResult(TestResult):
    """Result of :func:`mann_whitney`. ``statistic`` is U₁, ``effect_size`` the rank-biserial r,
    ``confidence_interval`` the CI of the Hodges–Lehmann shift (a − b).

    Extra fields: ``u1``; ``rank_biserial`` (= 2U₁/(n₁n₂) − 1); ``z`` (normal approximation, tie-corrected,
    no continuity correction) and ``r_z = z/√N``; ``hl_shift``; ``median_a``, ``median_b``,
    ``median_ratio = median_a / median_b`` (nan when ``median_b`` is 0); ``p_exact`` (nan when not
    computed: ties, or ``n₁n₂ > EXACT_MAX_PAIRS``), ``p_asymptotic`` (scipy's normal
    approximation with tie and continuity correction); ``pvalue_method`` ("exact" or "asymptotic": which
    one ``pvalue`` is); ``alternative``; ``prob_less`` = P(a < b) + ½·P(a = b) over all (i, j) pairs
    = 1 − U₁/(n₁n₂) = (1 − r)/2, the probability that a unit of a is below one of b (the probability of
    improvement for a metric where lower is better), beside r.
    """

    u1: float = math.nan
    rank_biserial: float = math.nan
    prob_less: float = math.nan
    z: float = math.nan
    r_z: float = math.nan
    hl_shift: float = math.nan
    median_a: float = math.nan
    median_b: float = math.nan
    median_ratio: float = math.nan
    p_exact: float = math.nan
    p_asymptotic: float = math.nan
    pvalue_method: str = ""
    alternative: str = "two-sided"

    _FIELDS = ("rank_biserial", "prob_less", "r_z", "z", "hl_shift", "median_a", "median_b", "median_ratio",
               "p_exact", "p_asymptotic", "pvalue_method", "alternative")

    def summary(self) -> str:
        return self.summary_with(self._FIELDS)


def mann_whitney(
    a,
    b,
    alternative: str = "two-sided",
    method: str = "auto",
    *,
    confidence_level: float = 0.95,
) -> MannWhitneyResult:
    """Mann–Whitney U test of ``a`` against ``b`` with effect sizes, shift estimate and both p-values.

    Wraps ``scipy.stats.mannwhitneyu``. H0: ``P(a > b) = P(a < b)`` (for continuous data, equal
    distributions). ``alternative="less"`` means a tends to be smaller.

    Effect sizes (module docstring): rank-biserial ``r = 2U₁/(n₁n₂) − 1`` — **negative when a tends to be
    smaller** (equivalently ``1 − 2U₂/(n₁n₂)`` with the other sample's U) — and ``r_Z = Z/√N`` with
    ``Z = (U₁ − n₁n₂/2)/σ_U``, ``σ_U² = n₁n₂/12·((N + 1) − Σ(t³ − t)/(N(N − 1)))`` (tie-corrected).

    Args:
        a, b: 1-D samples (no NaN).
        alternative: "two-sided", "less" or "greater" (about a relative to b).
        method: "auto" (exact when there are no ties and ``n₁n₂ ≤ EXACT_MAX_PAIRS``, else asymptotic),
            "exact" (refused with ties, since the exact null assumes none, and above ``EXACT_MAX_PAIRS``) or
            "asymptotic" (scipy's normal approximation with tie and continuity correction). The exact null
            is computed by :func:`_mwu_exact_cdf` (Gaussian-binomial product, rescaled: no overflow at any
            size); the result's ``pvalue_method`` says which p-value ``pvalue`` is.
        confidence_level: level of the Hodges–Lehmann CI (computed for n₁n₂ ≤ ``HL_MAX_PAIRS``; above, the shift
            and its CI are nan and ``ci_of`` says why — the p-value and the effect sizes are computed at any size).
    """
    a, b = _sample(a, "a"), _sample(b, "b")
    level = _check_level(confidence_level)
    check_alternative(alternative)
    if method not in ("auto", "exact", "asymptotic"):
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', got {method!r}")
    n1, n2 = a.size, b.size
    pooled = np.concatenate([a, b])
    ties = np.unique(pooled).size < pooled.size
    exact_ok = not ties and n1 * n2 <= EXACT_MAX_PAIRS
    if method == "exact" and ties:
        raise ValueError("method='exact' needs samples without ties (the exact null distribution of U assumes "
                         f"none); a and b share or repeat {pooled.size - np.unique(pooled).size} value(s): "
                         "use method='asymptotic'")
    if method == "exact" and not exact_ok:
        raise ValueError(f"method='exact' is limited to n1*n2 <= {EXACT_MAX_PAIRS} (float64 accuracy of the exact "
                         f"null), got n1={n1}, n2={n2}: use method='asymptotic'")
    asym = scipy.stats.mannwhitneyu(a, b, alternative=alternative, method="asymptotic")
    p_exact = _mwu_exact_pvalue(float(asym.statistic), n1, n2, alternative) if exact_ok else math.nan
    use_exact = method == "exact" or (method == "auto" and exact_ok)
    u1 = float(asym.statistic)
    sigma = _tie_sigma(n1, n2, pooled)
    z = (u1 - n1 * n2 / 2.0) / sigma if sigma > 0 else 0.0
    rb = 2.0 * u1 / (n1 * n2) - 1.0
    if n1 * n2 <= HL_MAX_PAIRS:
        shift, ci, ci_how = hodges_lehmann(a, b, confidence_level=level)
        ci_of = f"Hodges-Lehmann shift a - b ({ci_how} critical value)"
    else:  # the p-value and r are cheap at any size; the shift needs every pairwise difference
        shift, ci = math.nan, (math.nan, math.nan)
        ci_of = (f"Hodges-Lehmann shift a - b: not computed, n1*n2 = {n1 * n2} > HL_MAX_PAIRS = {HL_MAX_PAIRS} "
                 "(every pairwise difference would be held); call hodges_lehmann on a subsample for it")
    med_a, med_b = float(np.median(a)), float(np.median(b))
    pvalue = p_exact if use_exact else float(asym.pvalue)
    how = "exact" if use_exact else "asymptotic"
    return MannWhitneyResult(
        statistic=u1,
        pvalue=pvalue,
        method=f"Mann-Whitney U ({how}{', tie-corrected' if ties and not use_exact else ''})",
        null_hypothesis="P(a > b) = P(a < b)" if alternative == "two-sided" else
        ("P(a > b) >= P(a < b)" if alternative == "less" else "P(a > b) <= P(a < b)"),
        n=(n1, n2),
        effect_size=rb,
        effect_size_name="rank-biserial r = 2*U1/(n1*n2) - 1",
        confidence_interval=ci,
        ci_of=ci_of,
        confidence_level=level,
        u1=u1,
        rank_biserial=rb,
        prob_less=1.0 - u1 / (n1 * n2),
        z=z,
        r_z=z / math.sqrt(n1 + n2),
        hl_shift=shift,
        median_a=med_a,
        median_b=med_b,
        median_ratio=med_a / med_b if med_b != 0 else math.nan,
        p_exact=p_exact,
        p_asymptotic=float(asym.pvalue),
        pvalue_method=how,
        alternative=alternative,
    )
