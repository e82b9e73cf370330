"""Planned sample sizes and minimum detectable effects for pass/fail outcomes and for the paired TOST.

A study claim plans its n by power: it declares its test, its margin or minimum effect of interest and the
proportions / sd it expects; the planned n is the smallest at which the test reaches the target power, and the
report prints the planned n, the achieved n and the minimum detectable effect (MDE) at the achieved n. The exact
powers are :mod:`kvstats.measure.stats._exact_power`'s.

* :func:`plan_sample_size` — the smallest n whose power, and that of the next ``window`` sample sizes, is at least
  the target (exact power is saw-toothed in n); :func:`binomial_sample_size`, :func:`mcnemar_sample_size` and
  :func:`tost_sample_size` plan one claim as a :class:`SamplePlan`.
* :func:`binomial_mde`, :func:`mcnemar_mde`, :func:`tost_mde` — the minimum detectable effect at a given n.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import check_alternative
from kvstats.measure.stats._exact_power import (
    EXACT_POWER_MAX_N,
    _binomial_region,
    _finite,
    _level,
    _mass,
    _mcnemar_power,
    _mcnemar_probabilities,
    _number,
    _probability,
    _target,
    _tost_arguments,
    _tost_power,
    mcnemar_critical_values,
)
from kvstats.results import TestResult

__all__ = ["SamplePlan", "plan_sample_size", "binomial_sample_size", "mcnemar_sample_size", "tost_sample_size",
           "binomial_mde", "mcnemar_mde", "tost_mde", "binomial_window", "mcnemar_window"]


# --------------------------------------------------------------------------------------------------- the planner
def plan_sample_size(power_fn: Callable[[int], float], *, target: float = 0.8, n_min: int = 2,
                     n_max: int = 10**6, window: int = 0) -> int:
    """The smallest n in [n_min, n_max] with ``power_fn(n') ≥ target`` at n and at every n' in [n, n + window]
    (up to n_max), and power below target at n − 1.

    Exact power of a discrete test is saw-toothed in n: it can reach the target at some n and fall below it at
    n + 1 (the critical value moves up). The literature uses two definitions of "the" n; this planner gives the
    conservative one (Chernick & Liu 2002, Am. Stat. 56:149): the n beyond which the power never again falls
    below the target. The power is checked on ``window`` further sample sizes; with ``window`` at least one period
    of the saw-tooth (the per-test planners choose it) the lower envelope only rises after that, so power ≥ target
    for every n' ≥ n. ``window=0`` is the plain "smallest n with power ≥ target" for a power that rises with n.

    Search: doubling from n_min until the power reaches the target, bisection down to a crossing (power < target
    at n − 1, ≥ target at n), then a scan of the next ``window`` sizes that restarts after any n' that falls below.
    Each n is evaluated once. ValueError when no n ≤ n_max qualifies.
    """
    if not callable(power_fn):
        raise ValueError(f"power_fn must be a callable n -> power, got {power_fn!r}")
    target = _number(target, "target")
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be a power in (0, 1), got {target!r}")
    n_min = check_int_range(n_min, "n_min", 1, 10**12)
    n_max = check_int_range(n_max, "n_max", n_min, 10**12)
    window = check_int_range(window, "window", 0, 10**9)
    powers: dict[int, float] = {}

    def reaches(m: int) -> bool:
        if m not in powers:
            value = float(power_fn(m))
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"power_fn({m}) must return a probability in [0, 1], got {value!r}")
            powers[m] = value
        return powers[m] >= target

    def none_reaches() -> ValueError:
        best = max(powers, key=powers.get)
        return ValueError(f"no n ≤ n_max={n_max} reaches power target={target:g} (the highest power seen is "
                          f"{powers[best]:.4g}, at n = {best})")

    lo, hi = n_min - 1, n_min  # power < target at lo (n_min − 1 counts as below), ≥ target at hi
    while not reaches(hi):
        if hi == n_max:
            raise none_reaches()
        lo, hi = hi, min(n_max, 2 * hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    n, m = hi, hi + 1  # power ≥ target at n..m − 1
    while m <= min(n + window, n_max):
        if reaches(m):
            m += 1
        elif m == n_max:
            raise none_reaches()
        else:
            n = m = m + 1  # below the target at m: start again after it
    return n


def binomial_window(p0: float) -> int:
    """The planner's window for the binomial test at p0: two periods of its saw-tooth, ⌈2/min(p0, 1 − p0)⌉ (the
    critical count moves by one about every 1/p0 trials, the failures' by one every 1/(1 − p0))."""
    p0 = _probability(p0, "p0")
    return math.ceil(2.0 / min(p0, 1.0 - p0))


def mcnemar_window(discordant: float) -> int:
    """The planner's window for the McNemar test at discordance rate p10 + p01: ⌈4/(p10 + p01)⌉, two periods of the
    conditional test's saw-tooth (its critical count moves every ~2 discordant pairs, one every 1/(p10 + p01)
    trials)."""
    return math.ceil(4.0 / discordant)


# ----------------------------------------------------------------------------------------- minimum detectable effect
def _first_crossing(f: Callable[[float], float], low: float, high: float, points: int = 64) -> float:
    """The smallest x in [low, high] where f rises through 0 (f(low) < 0 ≤ f(high)): a grid locates the first
    sign change, brentq solves it (xtol 1e-13)."""
    grid = np.linspace(low, high, points + 1)
    prev = grid[0]
    for x in grid[1:]:
        if f(float(x)) >= 0:
            return float(scipy.optimize.brentq(f, float(prev), float(x), xtol=1e-13, rtol=4 * np.finfo(float).eps))
        prev = x
    raise AssertionError("f(high) < 0")  # callers check f(high) >= 0 first


def binomial_mde(p0: float, n: int, *, alpha: float = 0.05, target: float = 0.8, alternative: str = "two-sided",
                 direction: str | None = None) -> float:
    """The minimum detectable effect of ``binomtest`` at n trials: the smallest |p1 − p0| at which its exact power
    (:func:`binomial_power`) reaches ``target``, returned as p1 − p0 (negative for ``direction="less"``).

    ``direction`` is the side of p0 the effect lies on: the alternative's for a one-sided test, "greater" by default
    for the two-sided one. The rejection region is fixed by (p0, n, α); the power is a polynomial in p1, and the
    first p1 beyond p0 where it reaches the target is located on a grid and solved with ``scipy.optimize.brentq``.
    nan when even p1 = 1 (p1 = 0) does not reach the target, i.e. n trials can detect no effect on that side.
    """
    p0, alpha = _probability(p0, "p0"), _level(alpha)
    n = check_int_range(n, "n", 1, EXACT_POWER_MAX_N)
    target, alternative = _target(target, alpha), check_alternative(alternative)
    side = direction if direction is not None else ("greater" if alternative == "two-sided" else alternative)
    if side not in ("greater", "less") or (alternative != "two-sided" and side != alternative):
        raise ValueError(f"direction must be 'greater' or 'less' (the alternative's side for a one-sided test, "
                         f"{alternative!r} here), got {direction!r}")
    region = _binomial_region(n, p0, alpha, alternative)
    sign = 1.0 if side == "greater" else -1.0
    end = 1.0 if side == "greater" else 0.0

    def shortfall(effect: float) -> float:
        return _mass(region, n, min(1.0, max(0.0, p0 + sign * effect))) - target

    if shortfall(abs(end - p0)) < 0:
        return math.nan
    return sign * _first_crossing(shortfall, 0.0, abs(end - p0))


def mcnemar_mde(discordant: float, n: int, *, alpha: float = 0.05, target: float = 0.8) -> float:
    """The minimum detectable effect of the exact McNemar test at n paired trials and discordance rate
    ``discordant`` = p10 + p01: the smallest p10 − p01 (> 0; the test is symmetric) at which
    :func:`mcnemar_power` reaches ``target``, p10 = (discordant + e)/2, p01 = (discordant − e)/2. Located on a
    grid of e in [0, discordant] and solved with ``scipy.optimize.brentq``; nan when even e = discordant (every
    discordant pair one way) does not reach the target."""
    pd = _number(discordant, "discordant")
    if not 0.0 < pd <= 1.0:
        raise ValueError(f"discordant must be a probability in (0, 1] (p10 + p01), got {discordant!r}")
    n = check_int_range(n, "n", 1, EXACT_POWER_MAX_N)
    alpha = _level(alpha)
    target = _target(target, alpha)
    critical = mcnemar_critical_values(n, alpha)

    def shortfall(e: float) -> float:
        return _mcnemar_power((pd + e) / 2, max(0.0, (pd - e) / 2), n, critical) - target

    if shortfall(pd) < 0:
        return math.nan
    return _first_crossing(shortfall, 0.0, pd)


def tost_mde(sd: float, n: int, *, margin: float, alpha: float = 0.05, target: float = 0.8) -> float:
    """The equivalence counterpart of a minimum detectable effect: the largest |Δ| (true mean difference) at which
    the paired TOST at n pairs still declares equivalence within ±margin with probability ``target``
    (:func:`tost_power` falls as |Δ| grows, from its maximum at Δ = 0 to ≤ α at |Δ| = margin; solved with
    ``scipy.optimize.brentq`` on [0, margin]). nan when even Δ = 0 does not reach the target: at n pairs the test
    cannot be expected to show equivalence at all."""
    sd, n, margin, alpha = _tost_arguments(sd, n, margin, alpha)
    target = _target(target, alpha)

    def excess(d: float) -> float:
        return _tost_power(d, sd, n, margin, alpha) - target

    if excess(0.0) < 0:
        return math.nan
    return float(scipy.optimize.brentq(excess, 0.0, margin, xtol=1e-13 * margin, rtol=4 * np.finfo(float).eps))


# ------------------------------------------------------------------------------------------------ the plan of a claim
@dataclass(frozen=True)
class SamplePlan(TestResult):
    """The planned sample size of one claim (:func:`binomial_sample_size`, :func:`mcnemar_sample_size`,
    :func:`tost_sample_size`). ``statistic`` and ``n`` are the planned n (``n_planned``); ``pvalue`` is nan;
    ``effect_size`` is the effect of interest the plan is for (``effect_size_name``); ``assumptions`` what the power
    calculation takes as true (p0/p1, p10/p01, delta/sd/margin; merged into ``to_dict()``); ``power_planned`` the
    exact power at ``n_planned`` (≥ ``target_power``, and so at every larger n: :func:`plan_sample_size` with
    ``window``). Given the achieved n, ``power_achieved`` is the power there and ``mde_achieved`` the minimum
    detectable effect there (``mde_name``; nan where no effect reaches the target power at that n)."""

    test: str = ""
    assumptions: dict[str, float] = field(default_factory=dict)
    alpha: float = 0.05
    alternative: str = "two-sided"
    target_power: float = 0.8
    n_planned: int = 0
    power_planned: float = math.nan
    n_achieved: int | None = None
    power_achieved: float = math.nan
    mde_achieved: float = math.nan
    mde_name: str = ""
    window: int = 0

    def summary(self) -> str:
        return self.summary_with(("test", "alpha", "alternative", "target_power", "n_planned", "power_planned",
                                  "n_achieved", "power_achieved", "mde_achieved", "mde_name", "window"),
                                 **self.assumptions)

    def to_dict(self) -> dict[str, Any]:
        """Flat dict (:meth:`TestResult.to_dict`) with the assumptions as their own keys."""
        out = super().to_dict()
        out.update(out.pop("assumptions"))
        return out


def _achieved(n_achieved, low: int, high: int) -> int | None:
    return None if n_achieved is None else check_int_range(n_achieved, "n_achieved", low, high)


def binomial_sample_size(p0: float, p1: float, *, alpha: float = 0.05, target: float = 0.8,
                         alternative: str = "two-sided", n_achieved: int | None = None, n_max: int = 10**6,
                         window: int | None = None) -> SamplePlan:
    """Plan a pass/fail claim tested with ``scipy.stats.binomtest`` (H0: p = p0) expecting the true rate p1: the
    smallest n with exact power (:func:`binomial_power`) ≥ ``target`` there and at every larger n (the conservative
    saw-tooth definition of :func:`plan_sample_size`, checked on ``window`` further sizes, by default
    :func:`binomial_window`). With ``n_achieved``: the power there and the MDE there (:func:`binomial_mde`, on p1's
    side of p0)."""
    p0, p1, alpha = _probability(p0, "p0"), _probability(p1, "p1", closed=True), _level(alpha)
    target, alternative = _target(target, alpha), check_alternative(alternative)
    if p1 == p0 or (alternative == "greater" and p1 < p0) or (alternative == "less" and p1 > p0):
        raise ValueError(f"p1 must lie on the alternative's side of p0 ({alternative}): got p0={p0!r}, p1={p1!r}; "
                         "there the power never exceeds alpha")
    n_max = check_int_range(n_max, "n_max", 1, EXACT_POWER_MAX_N)
    window = binomial_window(p0) if window is None else check_int_range(window, "window", 0, 10**9)
    n_achieved = _achieved(n_achieved, 1, EXACT_POWER_MAX_N)

    def power(n: int) -> float:
        return _mass(_binomial_region(n, p0, alpha, alternative), n, p1)

    n = plan_sample_size(power, target=target, n_min=1, n_max=n_max, window=window)
    side = "greater" if p1 > p0 else "less"
    return SamplePlan(
        statistic=float(n), pvalue=math.nan, method=f"exact power of scipy's binomtest ({alternative})",
        null_hypothesis=f"p = {p0:g}", n=n, effect_size=p1 - p0, effect_size_name="p1 − p0",
        test="binomial", assumptions={"p0": p0, "p1": p1}, alpha=alpha, alternative=alternative,
        target_power=target, n_planned=n, power_planned=power(n), n_achieved=n_achieved,
        power_achieved=math.nan if n_achieved is None else power(n_achieved),
        mde_achieved=math.nan if n_achieved is None else binomial_mde(p0, n_achieved, alpha=alpha, target=target,
                                                                      alternative=alternative, direction=side),
        mde_name="p1 − p0 detected with the target power", window=window)


def mcnemar_sample_size(p10: float, p01: float, *, alpha: float = 0.05, target: float = 0.8,
                        n_achieved: int | None = None, n_max: int = 10**6, window: int | None = None) -> SamplePlan:
    """Plan a paired pass/fail claim tested with the exact McNemar test (:func:`mcnemar`) expecting
    p10 = P(a passes, b fails) and p01 = P(a fails, b passes): the smallest n with exact power
    (:func:`mcnemar_power`) ≥ ``target`` there and at every larger n (:func:`plan_sample_size`, ``window`` by default
    :func:`mcnemar_window`). With ``n_achieved``: the power there and the MDE p10 − p01 there at the same
    discordance rate (:func:`mcnemar_mde`, signed like p10 − p01)."""
    p10, p01 = _mcnemar_probabilities(p10, p01)
    alpha = _level(alpha)
    target = _target(target, alpha)
    if p10 == p01:
        raise ValueError(f"p10 must differ from p01 (the effect of interest is p10 − p01), got p10 = p01 = {p10!r}")
    n_max = check_int_range(n_max, "n_max", 1, EXACT_POWER_MAX_N)
    window = mcnemar_window(p10 + p01) if window is None else check_int_range(window, "window", 0, 10**9)
    n_achieved = _achieved(n_achieved, 1, EXACT_POWER_MAX_N)
    cache: dict[int, np.ndarray] = {}

    def power(n: int) -> float:
        if "c" not in cache or cache["c"].size <= n:  # one table of critical values, grown when n outgrows it
            grown = min(EXACT_POWER_MAX_N, 2 * (cache["c"].size if "c" in cache else 0))
            cache["c"] = mcnemar_critical_values(max(n, grown), alpha)
        return _mcnemar_power(p10, p01, n, cache["c"])

    n = plan_sample_size(power, target=target, n_min=1, n_max=n_max, window=window)
    mde = math.nan
    if n_achieved is not None:
        mde = math.copysign(mcnemar_mde(p10 + p01, n_achieved, alpha=alpha, target=target), p10 - p01)
    return SamplePlan(
        statistic=float(n), pvalue=math.nan, method="exact power of the exact McNemar test",
        null_hypothesis="P(a succeeds, b fails) = P(a fails, b succeeds)", n=n, effect_size=p10 - p01,
        effect_size_name="p10 − p01 = p_a − p_b", test="mcnemar", assumptions={"p10": p10, "p01": p01},
        alpha=alpha, alternative="two-sided", target_power=target, n_planned=n, power_planned=power(n),
        n_achieved=n_achieved, power_achieved=math.nan if n_achieved is None else power(n_achieved),
        mde_achieved=mde, mde_name=f"p10 − p01 detected with the target power at p10 + p01 = {p10 + p01:g}",
        window=window)


def tost_sample_size(delta: float, sd: float, *, margin: float, alpha: float = 0.05, target: float = 0.8,
                     n_achieved: int | None = None, n_max: int = 10**6) -> SamplePlan:
    """Plan an equivalence claim ("a and b within ±margin") tested with the paired TOST (:func:`equivalence`),
    expecting a true mean difference ``delta`` (|delta| < margin; 0 for "no difference") and differences of sd
    ``sd``: the smallest n ≥ 2 with :func:`tost_power` ≥ ``target``. The TOST power is continuous in the data and
    rises with n where it can reach a target (no saw-tooth; see :func:`tost_power` for the dip at 2–4 pairs), so
    the planner's window is 0. With ``n_achieved``: the power there and the largest
    |delta| still shown equivalent with the target power there (:func:`tost_mde`)."""
    delta = _finite(delta, "delta", "the true mean difference a − b")
    sd, _, margin, alpha = _tost_arguments(sd, 2, margin, alpha)
    target = _target(target, alpha)
    if not abs(delta) < margin:
        raise ValueError(f"|delta| must be below the margin (else the power never exceeds alpha), got "
                         f"delta={delta!r}, margin={margin!r}")
    n_max = check_int_range(n_max, "n_max", 2, 10**12)
    n_achieved = _achieved(n_achieved, 2, 10**12)

    def power(n: int) -> float:
        return _tost_power(delta, sd, n, margin, alpha)

    n = plan_sample_size(power, target=target, n_min=2, n_max=n_max, window=0)
    return SamplePlan(
        statistic=float(n), pvalue=math.nan, method="power of the paired TOST (two one-sided t tests)",
        null_hypothesis=f"|mean(a) − mean(b)| ≥ {margin:g}", n=n, effect_size=delta,
        effect_size_name="true mean difference a − b (delta)", test="tost",
        assumptions={"delta": delta, "sd": sd, "margin": margin}, alpha=alpha, alternative="equivalence",
        target_power=target, n_planned=n, power_planned=power(n), n_achieved=n_achieved,
        power_achieved=math.nan if n_achieved is None else power(n_achieved),
        mde_achieved=math.nan if n_achieved is None else tost_mde(sd, n_achieved, margin=margin, alpha=alpha,
                                                                  target=target),
        mde_name="largest |delta| shown equivalent with the target power", window=0)
