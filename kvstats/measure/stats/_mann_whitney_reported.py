"""Mann–Whitney p-values from reported numbers instead of data: the smallest p a group size allows, the group size a
target p needs, the p of a given U₁, and what a published (rank-biserial r, p, n) implies.

All two-sided and without ties (continuous data). U₁ = #{aᵢ > bⱼ} is the first sample's statistic, the
rank-biserial r = 2U₁/(n₁n₂) − 1 (the conventions of :func:`kvstats.stats.mann_whitney`). In the far tail the exact
null distribution of U and its normal approximation differ by many orders of magnitude (complete separation at
70 vs 70: exact 2.1e−41, normal 1.8e−24), so each function says which p it gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import EXACT_MAX_PAIRS
from kvstats.results import TestResult

__all__ = ["RankBiserialReport", "mann_whitney_min_n", "mann_whitney_min_pvalue", "mann_whitney_u_pvalue",
           "rank_biserial_report"]

_METHODS = ("auto", "exact", "asymptotic")


def _method(method: str, n1: int, n2: int) -> str:
    if method not in _METHODS:
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', got {method!r}")
    if method == "auto":
        return "exact" if n1 * n2 <= EXACT_MAX_PAIRS else "asymptotic"
    return method


def mann_whitney_min_pvalue(n1: int, n2: int | None = None, *, method: str = "auto") -> float:
    """The smallest two-sided p the Mann–Whitney test can give at n₁ vs n₂ (complete separation, no ties).

    ``method="exact"``: ``2/C(n₁ + n₂, n₁)`` (the exact null gives the one extreme arrangement probability
    1/C(n₁ + n₂, n₁) per side); ``"asymptotic"``: scipy's normal approximation (``mannwhitneyu(...,
    method="asymptotic")``: continuity correction ½, the p-value ``kvstats.stats.mann_whitney`` reports as
    ``p_asymptotic``) on two separated samples; ``"auto"``: exact up to ``n₁n₂ ≤ EXACT_MAX_PAIRS``, as
    :func:`kvstats.stats.mann_whitney` decides. A family of m tests corrected by Holm or Bonferroni needs
    ``m·p_min < α``. ``n2`` defaults to ``n1``.
    """
    n1 = check_int_range(n1, "n1", 1, 10**7)
    n2 = n1 if n2 is None else check_int_range(n2, "n2", 1, 10**7)
    if _method(method, n1, n2) == "exact":
        return 2.0 / math.comb(n1 + n2, n1)
    a, b = np.arange(n1, dtype=float), np.arange(n1, n1 + n2, dtype=float)
    return float(scipy.stats.mannwhitneyu(a, b, method="asymptotic").pvalue)


def mann_whitney_min_n(target: float, *, method: str, n_max: int = 1000) -> int:
    """The fewest units per group (n vs n) at which complete separation gives a two-sided p below ``target``
    (:func:`mann_whitney_min_pvalue` with ``method``, "exact" or "asymptotic"): no data on fewer units can reach
    ``target``. Raises when no n ≤ ``n_max`` does."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target!r}")
    if method not in ("exact", "asymptotic"):
        raise ValueError(f"method must be 'exact' or 'asymptotic', got {method!r}")
    for n in range(2, n_max + 1):
        if mann_whitney_min_pvalue(n, method=method) < target:
            return n
    raise ValueError(f"no n <= n_max={n_max} reaches p < {target}")


def mann_whitney_u_pvalue(u: float, n1: int, n2: int, *, method: str) -> float:
    """The two-sided Mann–Whitney p of U₁ = ``u`` at n₁ vs n₂, no ties.

    ``method="asymptotic"``: the normal approximation without continuity correction,
    ``z = (u − n₁n₂/2)/√(n₁n₂(n₁ + n₂ + 1)/12)``, ``p = 2Φ(−|z|)`` (``u`` may be fractional: a U₁ computed from a
    rounded r); ``"exact"``: scipy's exact null distribution (``mannwhitneyu(..., method="exact")``, which depends
    on the samples only through U₁) for an integer ``0 ≤ u ≤ n₁n₂``, on samples built with exactly u pairs aᵢ > bⱼ.
    """
    n1, n2 = check_int_range(n1, "n1", 1, 10**7), check_int_range(n2, "n2", 1, 10**7)
    if method == "asymptotic":
        z = (u - n1 * n2 / 2.0) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0)
        return float(2.0 * scipy.stats.norm.sf(abs(z)))
    if method != "exact":
        raise ValueError(f"method must be 'exact' or 'asymptotic', got {method!r}")
    if u != int(u) or not 0 <= u <= n1 * n2:
        raise ValueError(f"the exact p needs an integer u in [0, n1·n2] = [0, {n1 * n2}], got {u!r}")
    # bⱼ = (j + 1)(n₁ + 1); aᵢ = cᵢ(n₁ + 1) + i + 1 lies above exactly the cᵢ smallest b's, Σcᵢ = u; no ties
    above = np.minimum(np.maximum(int(u) - n2 * np.arange(n1), 0), n2)[::-1]
    a = above * (n1 + 1.0) + np.arange(1, n1 + 1)
    b = np.arange(1, n2 + 1) * (n1 + 1.0)
    return float(scipy.stats.mannwhitneyu(a, b, method="exact").pvalue)


@dataclass(frozen=True)
class RankBiserialReport(TestResult):
    """Result of :func:`rank_biserial_report`: ``statistic`` U₁ = (r + 1)/2·n₁n₂ at the reported r, ``pvalue``
    its normal-approximation p (:func:`mann_whitney_u_pvalue`, "asymptotic"), ``effect_size`` r.

    Over the interval of r a printed value stands for (``r_interval``, e.g. r ± half a unit of its last digit):
    ``p_asymptotic_at_ends`` the normal p at U₁ of its low and its high end, ``u_integers`` the integer U₁ inside
    it (the counts the data could have had) and ``p_exact_max`` the largest exact p over them (nan when none)."""

    r_interval: tuple[float, float] = (math.nan, math.nan)
    p_asymptotic_at_ends: tuple[float, float] = (math.nan, math.nan)
    u_integers: tuple[int, ...] = ()
    p_exact_max: float = math.nan

    def summary(self) -> str:
        return self.summary_with(("r_interval", "p_asymptotic_at_ends", "u_integers", "p_exact_max"))


def _u_of_r(r: float, n1: int, n2: int) -> float:
    """U₁ of n₁ vs n₂ samples with rank-biserial r = 2U₁/(n₁n₂) − 1."""
    return (r + 1.0) / 2.0 * n1 * n2


def rank_biserial_report(r: float, n1: int, n2: int, *,
                         r_interval: tuple[float, float] | None = None) -> RankBiserialReport:
    """What a reported rank-biserial r at n₁ vs n₂ implies for the Mann–Whitney p: the normal-approximation p at
    U₁ = (r + 1)/2·n₁n₂, the same at the ends of ``r_interval`` (default: r itself), and the exact p at each
    integer U₁ in that interval (a test of real data has an integer U₁). A published "p < x" holds with the normal
    approximation when ``pvalue < x``, and can hold with the exact p at most when ``p_exact_max`` is below x."""
    n1, n2 = check_int_range(n1, "n1", 1, 10**7), check_int_range(n2, "n2", 1, 10**7)
    if not -1.0 <= r <= 1.0:
        raise ValueError(f"r must be in [-1, 1], got {r!r}")
    lo_r, hi_r = (r, r) if r_interval is None else (float(r_interval[0]), float(r_interval[1]))
    if not lo_r <= r <= hi_r:
        raise ValueError(f"r_interval {r_interval} must contain r = {r}")
    u_lo, u_hi = _u_of_r(lo_r, n1, n2), _u_of_r(hi_r, n1, n2)
    integers = tuple(range(math.ceil(u_lo), math.floor(u_hi) + 1))
    u = _u_of_r(r, n1, n2)
    return RankBiserialReport(
        statistic=u, pvalue=mann_whitney_u_pvalue(u, n1, n2, method="asymptotic"),
        method="Mann-Whitney U from a reported rank-biserial r (normal approximation, no continuity correction)",
        null_hypothesis="P(a > b) = P(a < b)", n=(n1, n2), effect_size=r, effect_size_name="rank-biserial r",
        r_interval=(lo_r, hi_r),
        p_asymptotic_at_ends=(mann_whitney_u_pvalue(u_lo, n1, n2, method="asymptotic"),
                              mann_whitney_u_pvalue(u_hi, n1, n2, method="asymptotic")),
        u_integers=integers,
        p_exact_max=max(mann_whitney_u_pvalue(k, n1, n2, method="exact") for k in integers) if integers else math.nan)
