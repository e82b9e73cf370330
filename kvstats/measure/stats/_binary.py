"""Binary outcomes: a proportion's CI (Wilson, Clopper–Pearson) and the exact McNemar test of paired outcomes.

Retrieval pass/fail and top-1 agreement are binary per trial. For one method, ``proportion_ci`` gives the
accuracy with a score (Wilson) or exact (Clopper–Pearson) interval; for two methods on the same trials,
``mcnemar`` tests the discordant pairs exactly and gives the paired difference in accuracy with Newcombe's
hybrid score interval for paired data (Newcombe 1998, Stat. Med. 17:2635, method 10). statsmodels does the
arithmetic it has (``proportion_confint``, ``contingency_tables.mcnemar``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from statsmodels.stats import contingency_tables, proportion

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import _check_level
from kvstats.results import TestResult

__all__ = ["ProportionResult", "McNemarResult", "proportion_ci", "mcnemar", "binary_outcomes",
           "paired_equivalence_trials"]

#: kvstats' method names -> statsmodels' proportion_confint method
_PROPORTION_METHODS = {"wilson": "wilson", "clopper-pearson": "beta"}


def binary_outcomes(x, name: str) -> np.ndarray:
    """x as a 1-D bool array: bools, or 0/1 numbers; anything else is refused naming ``name``."""
    arr = np.asarray(x)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of outcomes, got shape {arr.shape}")
    if arr.dtype == bool:
        return arr
    if not np.issubdtype(arr.dtype, np.number) or not np.isin(arr, (0, 1)).all():
        bad = arr[~np.isin(arr, (0, 1))][0].item() if np.issubdtype(arr.dtype, np.number) else arr.dtype
        raise ValueError(f"{name} must hold binary outcomes (bool, or 0/1), got {bad!r}")
    return arr.astype(bool)


@dataclass(frozen=True)
class ProportionResult(TestResult):
    """Result of :func:`proportion_ci`: ``statistic`` is the proportion k/n, ``confidence_interval`` its interval
    (``ci_method``), ``successes`` k; ``pvalue`` is nan (an estimate)."""

    successes: int = 0
    ci_method: str = ""

    def summary(self) -> str:
        return self.summary_with(("successes", "ci_method"))


def proportion_ci(x, n: int | None = None, *, confidence_level: float = 0.95,
                  method: str = "wilson") -> ProportionResult:
    """The proportion of successes with its confidence interval.

    Args:
        x: the outcomes (1-D bools or 0/1), or, with ``n``, the number of successes k.
        n: trials (only when ``x`` is a count).
        method: ``"wilson"`` (score interval, the default: near nominal coverage at every p) or
            ``"clopper-pearson"`` (exact: inverts the binomial test, at least nominal coverage).

    Wilson: (p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n); Clopper–Pearson: the Beta(k, n−k+1) and
    Beta(k+1, n−k) quantiles at α/2 and 1 − α/2 (statsmodels' ``proportion_confint``).
    """
    level = _check_level(confidence_level)
    if method not in _PROPORTION_METHODS:
        raise ValueError(f"method must be one of {list(_PROPORTION_METHODS)}, got {method!r}")
    if n is None:
        outcomes = binary_outcomes(x, "x")
        k, n = int(outcomes.sum()), int(outcomes.size)
    else:
        n = check_int_range(n, "n", 1, 1 << 62)
        k = check_int_range(x, "x (successes)", 0, n)
    low, high = proportion.proportion_confint(k, n, alpha=1 - level, method=_PROPORTION_METHODS[method])
    low, high = (0.0 if k == 0 else float(low)), (1.0 if k == n else float(high))  # exact ends, not 1 − 1e-16
    return ProportionResult(statistic=k / n, pvalue=float("nan"), method=f"proportion ({method} interval)",
                            null_hypothesis="none (an estimate)", n=n, confidence_interval=(low, high),
                            ci_of="proportion of successes", confidence_level=level, successes=k, ci_method=method)


@dataclass(frozen=True)
class McNemarResult(TestResult):
    """Result of :func:`mcnemar`: ``statistic`` is min(n₁₀, n₀₁) (the exact test's), ``pvalue`` the exact two-sided
    binomial p of the discordant pairs, ``effect_size`` the paired difference of proportions p_a − p_b with its
    Newcombe interval as ``confidence_interval``; ``table`` is [[n₁₁, n₁₀], [n₀₁, n₀₀]] (a's outcome by row,
    1 = success first)."""

    table: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    proportions: tuple[float, float] = (float("nan"), float("nan"))

    def summary(self) -> str:
        return self.summary_with(("table", "proportions"))


def _paired_difference_ci(n11: int, n10: int, n01: int, n00: int, level: float) -> tuple[float, float]:
    """Newcombe's method 10: Wilson intervals of both margins, combined with the correlation of the pairs,
    φ = C/√(margins) where A = n₁₁n₀₀ − n₁₀n₀₁ and C = A − n/2 if A > n/2, 0 if 0 ≤ A ≤ n/2, A if A < 0
    (Newcombe 1998's adjusted estimate of φ)."""
    n = n11 + n10 + n01 + n00
    p1, p2 = (n11 + n10) / n, (n11 + n01) / n
    l1, u1 = proportion.proportion_confint(n11 + n10, n, alpha=1 - level, method="wilson")
    l2, u2 = proportion.proportion_confint(n11 + n01, n, alpha=1 - level, method="wilson")
    margins = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    a = n11 * n00 - n10 * n01
    adjusted = a - n / 2 if a > n / 2 else (a if a < 0 else 0.0)
    phi = 0.0 if margins == 0 else adjusted / math.sqrt(margins)
    delta = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    eps = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    d = p1 - p2
    return max(-1.0, d - delta), min(1.0, d + eps)


def mcnemar(a, b, *, confidence_level: float = 0.95) -> McNemarResult:
    """Exact McNemar test of paired binary outcomes a, b (same trials), with the difference p_a − p_b.

    H0: P(a succeeds, b fails) = P(a fails, b succeeds). Only the discordant pairs n₁₀ (a only) and n₀₁
    (b only) carry information: p = min(1, 2·P(Bin(n₁₀ + n₀₁, ½) ≤ min(n₁₀, n₀₁))), statsmodels'
    ``mcnemar(exact=True)``; p = 1 when there is no discordant pair. The difference (n₁₀ − n₀₁)/n gets
    Newcombe's hybrid score interval for paired data (method 10), which stays inside [−1, 1] and keeps
    near-nominal coverage where the Wald interval fails (small n, proportions near 0 or 1).

    Args:
        a, b: 1-D outcomes of one length (bools or 0/1), trial i of a paired with trial i of b.
    """
    level = _check_level(confidence_level)
    x, y = binary_outcomes(a, "a"), binary_outcomes(b, "b")
    if x.size != y.size:
        raise ValueError(f"a and b must pair trial for trial, got {x.size} and {y.size} outcomes")
    n11, n10 = int((x & y).sum()), int((x & ~y).sum())
    n01, n00 = int((~x & y).sum()), int((~x & ~y).sum())
    table = ((n11, n10), (n01, n00))
    test = contingency_tables.mcnemar(np.array(table), exact=True)
    pvalue = 1.0 if n10 + n01 == 0 else float(test.pvalue)
    n = x.size
    return McNemarResult(statistic=float(min(n10, n01)), pvalue=pvalue, method="McNemar (exact binomial)",
                         null_hypothesis="P(a succeeds, b fails) = P(a fails, b succeeds)", n=n,
                         effect_size=(n10 - n01) / n, effect_size_name="difference of proportions p_a − p_b",
                         confidence_interval=_paired_difference_ci(n11, n10, n01, n00, level),
                         ci_of="p_a − p_b (Newcombe's paired score interval)", confidence_level=level,
                         extra={"discordant": n10 + n01}, table=table, proportions=((n11 + n10) / n, (n11 + n01) / n))


def paired_equivalence_trials(margin: float, *, confidence_level: float = 0.9, accuracy: float = 1.0,
                              max_trials: int = 1_000_000) -> int:
    """The fewest paired trials at which two methods that agree on every trial, both at ``accuracy``, have a
    Newcombe interval of the difference (:func:`mcnemar`'s, at ``confidence_level``: 90% for TOST at α = 0.05)
    inside (−margin, margin): below it no outcome can establish equivalence within ``margin`` (a claim "within δ"
    could only be inconclusive or not reproduced). With no discordant pair the interval is ±(p − Wilson lower
    bound of p) (both margins' Wilson intervals, φ = 0 at ``accuracy`` = 1); at accuracy 1 that is
    z²/(n + z²), so n > z²(1 − δ)/δ (52 trials for δ = 0.05 at 90%).

    A planning floor, not a power calculation: discordant pairs widen the interval, so a claim expecting them
    needs more (:func:`kvstats.measure.verdicts.plan_from_interval` after a pilot)."""
    delta = float(margin)
    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ValueError(f"margin must be a difference of accuracies in (0, 1), got {margin!r}")
    acc = float(accuracy)
    if not (math.isfinite(acc) and 0.0 <= acc <= 1.0):
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")
    level = _check_level(confidence_level)
    max_trials = check_int_range(max_trials, "max_trials", 1, 2**62)

    def decided(n: int) -> bool:
        ones = round(acc * n)
        lo, hi = _paired_difference_ci(ones, 0, 0, n - ones, level)
        return -delta < lo and hi < delta

    if not decided(max_trials):
        raise ValueError(f"no n ≤ max_trials={max_trials} decides equivalence within margin={margin!r} at "
                         f"accuracy={accuracy!r}")
    low, high = 0, max_trials  # decided(high); find the smallest such n (the width shrinks with n)
    while high - low > 1:
        mid = (low + high) // 2
        if decided(mid):
            high = mid
        else:
            low = mid
    return high
