"""Two-sample statistics for comparing quantizers: Mann–Whitney with effect sizes, multiple testing, bootstrap.

Conventions (REFERENCE §5):

* ``U₁`` is the Mann–Whitney statistic of the *first* sample as scipy reports it,
  ``U₁ = #{(i, j): aᵢ > bⱼ} + ½·#{(i, j): aᵢ = bⱼ}``.
* The rank-biserial correlation is ``r = 2·U₁/(n₁n₂) − 1 = P(a > b) − P(a < b)``: **negative when the
  first sample tends to be smaller** (e.g. ``mann_whitney(kl_kqv, kl_qkqv)`` gives ``r < 0`` when KQV has
  the lower KL). The often quoted ``1 − 2U/(n₁n₂)`` is the same number when ``U`` is the *other*
  sample's statistic (``U₂ = n₁n₂ − U₁``). |r| ≤ 1; ±1 means complete separation.
* ``r_Z = Z/√N`` (``N = n₁ + n₂``, Z from the normal approximation with tie correction, no continuity
  correction) has the same sign; it cannot reach ±1 (at 70 vs 70 its maximum is ≈ 0.86), which is why a
  published ``r = −0.983`` at that size must be the rank-biserial one.
* In the far tail the exact null distribution of U and its normal approximation differ by many orders of
  magnitude (complete separation at 70 vs 70: exact p ≈ 2e−41, normal p ≈ 1e−23). Results always state
  which p-value is reported (``pvalue_method``) and carry both when the exact one is computable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.stats
from statsmodels.stats.multitest import multipletests

from kvstats._validation import check_int_range
from kvstats.results import TestResult

__all__ = [
    "BootstrapResult",
    "MannWhitneyResult",
    "bootstrap_ci",
    "compare",
    "hodges_lehmann",
    "mann_whitney",
    "mwu_null_cdf",
    "ratio_ci",
]

#: Largest n₁·n₂ for which the exact (no-ties) p-value of U is computed (:func:`mwu_exact_cdf`): up to
#: here its float64 result agrees with exact rational arithmetic to ~1e-11 relative (tests), and costs
#: ≤ 0.1 s. Larger samples get the asymptotic p (normal approximation), which is also what scipy's
#: ``method="auto"`` uses there.
EXACT_MAX_PAIRS = 100_000
#: Largest n₁·n₂ for which the Hodges–Lehmann CI uses the exact null distribution of U.
EXACT_CI_MAX_PAIRS = 10_000
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


def _check_level(confidence_level: float) -> float:
    if not 0.0 < float(confidence_level) < 1.0:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}")
    return float(confidence_level)


# ----------------------------------------------------------------------------------------------------------
# Mann–Whitney


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
        p = 1.0 - float(_mwu_exact_cdf(n1, n2, total - tail - 1)[-1])
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
    one ``pvalue`` is); ``alternative``.
    """

    u1: float = math.nan
    rank_biserial: float = math.nan
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

    _FIELDS = ("rank_biserial", "r_z", "z", "hl_shift", "median_a", "median_b", "median_ratio", "p_exact",
               "p_asymptotic", "pvalue_method", "alternative")

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
        confidence_level: level of the Hodges–Lehmann CI.
    """
    a, b = _sample(a, "a"), _sample(b, "b")
    level = _check_level(confidence_level)
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(f"alternative must be 'two-sided', 'less' or 'greater', got {alternative!r}")
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
    shift, ci, ci_how = hodges_lehmann(a, b, confidence_level=level)
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
        ci_of=f"Hodges-Lehmann shift a - b ({ci_how} critical value)",
        confidence_level=level,
        u1=u1,
        rank_biserial=rb,
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


# ----------------------------------------------------------------------------------------------------------
# all pairwise comparisons in a table


def compare(
    table: pd.DataFrame,
    metric: str,
    by: str,
    within: list[str] | None = None,
    correction: str = "holm",
    *,
    alternative: str = "two-sided",
    levels: Sequence | None = None,
    family: str = "all",
    confidence_level: float = 0.95,
) -> pd.DataFrame:
    """All pairwise Mann–Whitney comparisons of the levels of ``by``, within each cell of ``within``.

    For every cell (a combination of the ``within`` columns; the whole table when ``within`` is None)
    and every pair of levels ``(A, B)`` of ``by`` (in the order of ``levels``, default sorted; A before
    B), runs ``mann_whitney(table[metric] | A, table[metric] | B)``. Pairs where either group is empty
    are skipped.

    Multiple testing: p-values are adjusted over the family of all rows returned (``family="all"``,
    default) or within each cell (``family="cell"``) with Holm (``p_holm``) and Benjamini–Hochberg
    (``p_bh``) through ``statsmodels.stats.multitest.multipletests``; ``p_adj`` repeats the one named by
    ``correction`` (any multipletests method name).

    Returns:
        Tidy DataFrame: the ``within`` columns, ``level_a``, ``level_b``, ``n_a``, ``n_b``, ``u1``,
        ``p`` (raw), ``p_method``, ``p_exact``, ``p_asymptotic``, ``p_holm``, ``p_bh``, ``p_adj``,
        ``rank_biserial``, ``r_z``, ``hl_shift``, ``hl_ci_low``, ``hl_ci_high``, ``median_a``,
        ``median_b``, ``median_ratio``.
    """
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a pandas.DataFrame, got {type(table).__name__}")
    within = list(within or [])
    for col, name in [(metric, "metric"), (by, "by")] + [(w, "within") for w in within]:
        if col not in table.columns:
            raise ValueError(f"{name} column {col!r} is not in table (columns: {list(table.columns)})")
    if family not in ("all", "cell"):
        raise ValueError(f"family must be 'all' or 'cell', got {family!r}")
    if levels is None:
        levels = sorted(table[by].dropna().unique().tolist())
    levels = list(levels)
    columns = within + ["level_a", "level_b", "n_a", "n_b", "u1", "p", "p_method", "p_exact", "p_asymptotic",
                        "p_holm", "p_bh", "p_adj", "rank_biserial", "r_z", "hl_shift", "hl_ci_low", "hl_ci_high",
                        "median_a", "median_b", "median_ratio"]
    rows = []
    cells = table.groupby(within, sort=True, dropna=False) if within else [((), table)]
    for key, cell in cells:
        key = key if isinstance(key, tuple) else (key,)
        for la, lb in itertools.combinations(levels, 2):
            xa = cell.loc[cell[by] == la, metric].to_numpy(dtype=np.float64)
            xb = cell.loc[cell[by] == lb, metric].to_numpy(dtype=np.float64)
            if xa.size == 0 or xb.size == 0:
                continue
            r = mann_whitney(xa, xb, alternative=alternative, confidence_level=confidence_level)
            rows.append(dict(zip(within, key)) | {
                "level_a": la, "level_b": lb, "n_a": xa.size, "n_b": xb.size, "u1": r.u1, "p": r.pvalue,
                "p_method": r.pvalue_method, "p_exact": r.p_exact, "p_asymptotic": r.p_asymptotic,
                "rank_biserial": r.rank_biserial, "r_z": r.r_z, "hl_shift": r.hl_shift,
                "hl_ci_low": r.confidence_interval[0], "hl_ci_high": r.confidence_interval[1],
                "median_a": r.median_a, "median_b": r.median_b, "median_ratio": r.median_ratio,
                "_cell": key,
            })
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=columns)
    groups = [np.arange(len(out))] if family == "all" else [np.flatnonzero(out["_cell"].map(lambda c, k=k: c == k))
                                                            for k in dict.fromkeys(out["_cell"])]
    for col, how in (("p_holm", "holm"), ("p_bh", "fdr_bh"), ("p_adj", correction)):
        adjusted = np.empty(len(out))
        for idx in groups:
            adjusted[idx] = multipletests(out["p"].to_numpy()[idx], method=how)[1]
        out[col] = adjusted
    return out[columns]


# ----------------------------------------------------------------------------------------------------------
# bootstrap


@dataclass(frozen=True)
class BootstrapResult(TestResult):
    """Result of :func:`bootstrap_ci` / :func:`ratio_ci`: ``statistic`` is the estimate on the data,
    ``confidence_interval`` its bootstrap CI, ``standard_error`` the bootstrap standard error; no test
    (``pvalue`` is nan)."""

    standard_error: float = math.nan
    n_resamples: int = 0

    def summary(self) -> str:
        return self.summary_with(("standard_error", "n_resamples"))


def _bootstrap(samples, stat, level, n_resamples, method, seed, name, what) -> BootstrapResult:
    res = scipy.stats.bootstrap(
        samples, stat, confidence_level=level, n_resamples=n_resamples, method=method,
        rng=np.random.default_rng(seed), vectorized=True, paired=False,
    )
    estimate = float(stat(*samples, axis=-1))
    return BootstrapResult(
        statistic=estimate,
        pvalue=math.nan,
        method=f"bootstrap ({method}, {n_resamples} resamples) of {name}",
        null_hypothesis="none (estimate with confidence interval)",
        n=tuple(s.size for s in samples) if len(samples) > 1 else samples[0].size,
        confidence_interval=(float(res.confidence_interval.low), float(res.confidence_interval.high)),
        ci_of=what,
        confidence_level=level,
        standard_error=float(res.standard_error),
        n_resamples=n_resamples,
    )


def _stat_name(statistic: Callable) -> str:
    return getattr(statistic, "__name__", type(statistic).__name__)


def bootstrap_ci(
    data,
    statistic: Callable = np.mean,
    confidence_level: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    *,
    method: str = "BCa",
) -> BootstrapResult:
    """Bootstrap CI of ``statistic(data)`` through ``scipy.stats.bootstrap`` (BCa by default).

    ``statistic`` must accept ``axis`` (numpy reductions do: ``np.mean``, ``np.median``, ``np.std``).
    """
    x = _sample(data, "data", min_size=2)
    level = _check_level(confidence_level)
    n_resamples = check_int_range(n_resamples, "n_resamples", 1, 10**8)
    name = _stat_name(statistic)

    def stat(s, axis=-1):
        return statistic(s, axis=axis)

    return _bootstrap((x,), stat, level, n_resamples, method, seed, name, name)


def ratio_ci(
    a,
    b,
    statistic: Callable = np.median,
    confidence_level: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    *,
    method: str = "BCa",
) -> BootstrapResult:
    """Bootstrap CI of ``statistic(a) / statistic(b)`` for two independent samples (e.g. ratio of medians).

    Each sample is resampled independently (``paired=False``). If ``statistic(b)`` can be 0 the ratio
    is undefined; this is refused for the data itself and shows up as inf/nan in resamples.
    """
    xa, xb = _sample(a, "a", min_size=2), _sample(b, "b", min_size=2)
    level = _check_level(confidence_level)
    n_resamples = check_int_range(n_resamples, "n_resamples", 1, 10**8)
    if float(statistic(xb)) == 0.0:
        raise ValueError(f"{_stat_name(statistic)}(b) is 0: the ratio is undefined")
    name = f"{_stat_name(statistic)}(a) / {_stat_name(statistic)}(b)"

    def stat(sa, sb, axis=-1):
        return statistic(sa, axis=axis) / statistic(sb, axis=axis)

    return _bootstrap((xa, xb), stat, level, n_resamples, method, seed, name, name)
