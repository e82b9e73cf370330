"""Exact power and sample size for pass/fail outcomes and for the paired TOST, and the minimum detectable effect.

A study claim plans its n by power: it declares its test, its margin or minimum effect of interest and the
proportions / sd it expects; the planned n is the smallest at which the test reaches the target power, and the
report prints the planned n, the achieved n and the minimum detectable effect (MDE) at the achieved n.

* :func:`binomial_power` — scipy's exact ``binomtest`` of H0: p = p0 when the truth is p1: the Binomial(n, p1) mass
  of the rejection region {k : p(k) < α}, p(k) computed for every k = 0..n by scipy's own rule.
* :func:`mcnemar_power` — the exact McNemar test of :func:`mcnemar` (conditional on the m discordant pairs),
  unconditionally over m ~ Binomial(n, p10 + p01).
* :func:`tost_power` — the paired TOST of :func:`equivalence`, by one integral over the sample sd.
* :func:`plan_sample_size` — the smallest n whose power, and that of the next ``window`` sample sizes, is at least
  the target (exact power is saw-toothed in n); :func:`binomial_sample_size`, :func:`mcnemar_sample_size` and
  :func:`tost_sample_size` plan one claim as a :class:`SamplePlan`.
* :func:`binomial_mde`, :func:`mcnemar_mde`, :func:`tost_mde` — the minimum detectable effect at a given n.

Every test here rejects when p < α, the rule of the functions whose power is computed (``conclusion = p < alpha``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.integrate
import scipy.optimize
import scipy.stats

from kvstats._validation import check_int_range
from kvstats.measure.stats._equivalence import _alpha as _tost_alpha
from kvstats.measure.stats._equivalence import _margin
from kvstats.results import TestResult

__all__ = ["SamplePlan", "binomial_power", "mcnemar_power", "tost_power", "plan_sample_size", "binomial_sample_size",
           "mcnemar_sample_size", "tost_sample_size", "binomial_mde", "mcnemar_mde", "tost_mde", "binomtest_pvalues",
           "mcnemar_critical_values", "binomial_window", "mcnemar_window"]

#: Largest n for which the exact binomial / McNemar power is computed (it enumerates every outcome k = 0..n).
EXACT_POWER_MAX_N = 10**7
#: scipy's binomtest: a pmf within this relative tolerance of the observed one counts as "as likely" (minlike)
_BINOMTEST_RERR = 1 + 1e-7
_ALTERNATIVES = ("two-sided", "less", "greater")


# ------------------------------------------------------------------------------------------------- argument checks
def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _probability(value, name: str, *, closed: bool = False) -> float:
    """value as a float in (0, 1) — [0, 1] with ``closed`` — else ValueError naming ``name`` and the value."""
    p = _number(value, name)
    inside = 0.0 <= p <= 1.0 if closed else 0.0 < p < 1.0
    if not inside:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a probability in {'[0, 1]' if closed else '(0, 1)'}, got {value!r}")
    return p


def _level(alpha) -> float:
    a = _number(alpha, "alpha")
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return a


def _target(target, alpha: float) -> float:
    t = _number(target, "target")
    if not alpha < t < 1.0:
        raise ValueError(f"target must be a power in (alpha, 1) = ({alpha:g}, 1), got {target!r}")
    return t


def _alternative(alternative) -> str:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be 'two-sided', 'less' or 'greater', got {alternative!r}")
    return alternative


def _positive_sd(sd) -> float:
    s = _number(sd, "sd")
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"sd must be a finite number > 0 (the sd of the paired differences), got {sd!r}")
    return s


def _finite(value, name: str, what: str) -> float:
    v = _number(value, name)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number ({what}), got {value!r}")
    return v


# --------------------------------------------------------------------------------------------------- binomial test
def _search_like_scipy(values: np.ndarray, target: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """scipy's ``_binary_search_for_binom_tst`` run for many targets at once: ``values`` is the function on
    −1..n+1 (index x + 1), ascending on each [lo, hi]; returns its answer, step for step the same (the same mids,
    the same early return on equality), so the two-sided p-values below are scipy's to the last bit."""
    lo, hi = lo.astype(np.int64), hi.astype(np.int64)
    found = np.full(lo.shape, np.iinfo(np.int64).min)
    active = lo < hi
    while active.any():
        mid = lo + (hi - lo) // 2
        midval = values[np.clip(mid, -1, values.size - 2) + 1]
        equal = active & (midval == target)
        found = np.where(equal, mid, found)
        lo = np.where(active & (midval < target), mid + 1, lo)
        hi = np.where(active & (midval > target), mid - 1, hi)
        active &= ~equal & (lo < hi)
    last = np.where(values[np.clip(lo, -1, values.size - 2) + 1] <= target, lo, lo - 1)
    return np.where(found != np.iinfo(np.int64).min, found, last)


def binomtest_pvalues(n: int, p0: float, alternative: str = "two-sided") -> np.ndarray:
    """The p-values of ``scipy.stats.binomtest(k, n, p0, alternative)`` for every k = 0..n, vectorised, by scipy's
    own rule: "less" ``F(k)``, "greater" ``1 − F(k − 1)``; two-sided (minlike) the probability of every outcome no
    more likely than k (pmf ≤ pmf(k)·(1 + 1e-7)), found by scipy's binary search on the other side of the mean,
    ``F(k) + S(n − y)`` below n·p0 and ``F(y − 1) + S(k − 1)`` above it, 1 at k = n·p0, capped at 1."""
    n = check_int_range(n, "n", 1, EXACT_POWER_MAX_N)
    p0 = _probability(p0, "p0")
    alternative = _alternative(alternative)
    binom = scipy.stats.binom
    k = np.arange(n + 1)
    if alternative == "less":
        return binom.cdf(k, n, p0)
    if alternative == "greater":
        return binom.sf(k - 1, n, p0)
    pmf = binom.pmf(k, n, p0)
    padded = np.concatenate(([0.0], pmf, [0.0]))  # the pmf at -1..n+1 (0 off the support, as scipy's)
    d = pmf * _BINOMTEST_RERR
    mean = p0 * n
    pval = np.ones(n + 1)
    below, above = k < mean, k > mean
    if below.any():  # the other tail: from ceil(n·p0) up, where the pmf falls (searched as −pmf, ascending)
        kb = k[below]
        ix = _search_like_scipy(-padded, -d[below], np.full(kb.size, math.ceil(mean)), np.full(kb.size, n))
        y = n - ix + (d[below] == padded[ix + 1])
        pval[below] = binom.cdf(kb, n, p0) + binom.sf(n - y, n, p0)
    if above.any():  # the other tail: from 0 up to floor(n·p0), where the pmf rises
        ka = k[above]
        ix = _search_like_scipy(padded, d[above], np.zeros(ka.size), np.full(ka.size, math.floor(mean)))
        y = ix + 1
        pval[above] = binom.cdf(y - 1, n, p0) + binom.sf(ka - 1, n, p0)
    return np.minimum(pval, 1.0)


def _binomial_region(n: int, p0: float, alpha: float, alternative: str) -> np.ndarray:
    """The outcomes k that ``binomtest`` rejects at level alpha (p < alpha)."""
    return np.flatnonzero(binomtest_pvalues(n, p0, alternative) < alpha)


def _mass(region: np.ndarray, n: int, p: float) -> float:
    # fsum of the pmf: within a few ulps of the true sum, clipped to [0, 1] (1 + 2e-16 is a power of 1)
    return min(1.0, math.fsum(scipy.stats.binom.pmf(region, n, p))) if region.size else 0.0


def binomial_power(p0: float, p1: float, n: int, *, alpha: float = 0.05, alternative: str = "two-sided") -> float:
    """Exact power of ``scipy.stats.binomtest`` of H0: p = p0 at n trials when the true proportion is p1.

    power = Σ_{k ∈ R} C(n, k)·p1ᵏ(1 − p1)ⁿ⁻ᵏ over the rejection region R = {k : p(k) < α}, p(k) scipy's p-value of
    k successes (:func:`binomtest_pvalues`, every k = 0..n; two-sided by scipy's "minlike" rule). No approximation:
    the region is the test's own. At p1 = p0 it is the test's exact size, ≤ α (the test is conservative); the power
    is saw-toothed in n (:func:`plan_sample_size`).

    Args:
        p0: the proportion under H0, in (0, 1).
        p1: the true proportion, in [0, 1].
        n: trials, 1 to ``EXACT_POWER_MAX_N``.
    """
    p0, p1 = _probability(p0, "p0"), _probability(p1, "p1", closed=True)
    n = check_int_range(n, "n", 1, EXACT_POWER_MAX_N)
    return _mass(_binomial_region(n, p0, _level(alpha), _alternative(alternative)), n, p1)


# ------------------------------------------------------------------------------------------------------- McNemar
def mcnemar_critical_values(m_max: int, alpha: float) -> np.ndarray:
    """c[m] for m = 0..m_max discordant pairs: the largest s with ``min(1, 2·F(s; m, ½)) < α`` (−1 where none).
    :func:`mcnemar` (statsmodels' exact p of min(n₁₀, n₀₁)) rejects a split (n₁₀, m − n₁₀) exactly when
    min(n₁₀, m − n₁₀) ≤ c[m]. Found from the normal approximation and corrected with the exact p on both sides."""
    m_max = check_int_range(m_max, "m_max", 0, EXACT_POWER_MAX_N)
    alpha = _level(alpha)
    m = np.arange(m_max + 1)
    cdf = scipy.stats.binom.cdf

    def significant(s: np.ndarray) -> np.ndarray:
        return (s >= 0) & (np.minimum(cdf(s, m, 0.5) * 2, 1) < alpha)

    z = float(scipy.stats.norm.isf(alpha / 2))
    c = np.clip(np.floor(m / 2 - z * np.sqrt(m) / 2), -1, (m - 1) // 2).astype(np.int64)
    while (bad := (c >= 0) & ~significant(c)).any():
        c[bad] -= 1
    while (up := significant(c + 1)).any():
        c[up] += 1
    return c


def _mcnemar_power(p10: float, p01: float, n: int, critical: np.ndarray) -> float:
    discordant = p10 + p01
    m = np.arange(n + 1)
    c = critical[: n + 1]
    share = min(1.0, p10 / discordant)
    rejects = c >= 0
    mr, cr = m[rejects], c[rejects]
    conditional = scipy.stats.binom.cdf(cr, mr, share) + scipy.stats.binom.sf(mr - cr - 1, mr, share)
    return min(1.0, math.fsum(scipy.stats.binom.pmf(mr, n, min(1.0, discordant)) * conditional))


def _mcnemar_probabilities(p10, p01) -> tuple[float, float]:
    p10, p01 = _probability(p10, "p10", closed=True), _probability(p01, "p01", closed=True)
    if not 0.0 < p10 + p01 <= 1.0:
        raise ValueError(f"p10 + p01 (the discordance rate) must be in (0, 1], got p10={p10!r}, p01={p01!r}")
    return p10, p01


def mcnemar_power(p10: float, p01: float, n: int, *, alpha: float = 0.05) -> float:
    """Exact power of the exact McNemar test of :func:`mcnemar` at n paired trials.

    p10 = P(a succeeds, b fails), p01 = P(a fails, b succeeds) (p10 + p01 ≤ 1, the discordance rate). Given m
    discordant pairs, n₁₀ ~ Binomial(m, π), π = p10/(p10 + p01), and the test rejects when min(n₁₀, m − n₁₀) ≤ c(m)
    (:func:`mcnemar_critical_values`: p = min(1, 2·F(min; m, ½)) < α), so

        power = Σ_{m=0..n} Binomial(n, p10 + p01)(m) · [F(c(m); m, π) + 1 − F(m − c(m) − 1; m, π)]

    (unconditional over m; the concordant pairs carry no information). At p10 = p01 it is the exact size, ≤ α.
    With p10 + p01 = 1 it is :func:`binomial_power` of the discordant split at p0 = ½.
    """
    p10, p01 = _mcnemar_probabilities(p10, p01)
    n = check_int_range(n, "n", 1, EXACT_POWER_MAX_N)
    return _mcnemar_power(p10, p01, n, mcnemar_critical_values(n, alpha))


# ------------------------------------------------------------------------------------------------------ TOST
def _normal_mass(low: float, high: float) -> float:
    """P(low < Z < high) for standard normal Z, without cancellation in either tail (0 when low ≥ high)."""
    if low >= high:
        return 0.0
    r = math.sqrt(0.5)
    if low >= 0:
        return 0.5 * (math.erfc(low * r) - math.erfc(high * r))
    if high <= 0:
        return 0.5 * (math.erfc(-high * r) - math.erfc(-low * r))
    return max(0.0, 1.0 - 0.5 * math.erfc(-low * r) - 0.5 * math.erfc(high * r))


def _tost_power(delta: float, sd: float, n: int, margin: float, alpha: float) -> float:
    nu = n - 1
    c = float(scipy.stats.t.isf(alpha, nu))  # t_{1−α, n−1} > 0 (α < ½)
    root_n = math.sqrt(n)
    high, low = (margin - delta) * root_n / sd, (-margin - delta) * root_n / sd
    r_max = margin * root_n / (c * sd)  # the acceptance band of the mean is empty beyond r = s/σ = r_max
    # r = s/σ = χ_ν/√ν: density 2(ν/2)^(ν/2) r^(ν−1) e^(−νr²/2) / Γ(ν/2); its mass off [r_lo, r_hi] is < 2e-17
    log_norm = math.log(2.0) + 0.5 * nu * math.log(0.5 * nu) - math.lgamma(0.5 * nu)
    r_lo = math.sqrt(float(scipy.stats.chi2.ppf(1e-17, nu)) / nu)
    r_hi = math.sqrt(float(scipy.stats.chi2.isf(1e-17, nu)) / nu)
    lo, hi = (r_lo if r_lo < r_max else 0.0), min(r_max, r_hi)
    if not lo < hi:
        return 0.0

    def integrand(r: float) -> float:
        if r <= 0:
            return 0.0
        density = math.exp(log_norm + (nu - 1) * math.log(r) - 0.5 * nu * r * r)
        return _normal_mass(low + c * r, high - c * r) * density

    value, _ = scipy.integrate.quad(integrand, lo, hi, epsabs=1e-13, epsrel=1e-11, limit=200)
    return min(1.0, max(0.0, value))


def _tost_arguments(sd, n, margin, alpha) -> tuple[float, int, float, float]:
    return _positive_sd(sd), check_int_range(n, "n", 2, 10**12), _margin(margin), _tost_alpha(alpha)


def tost_power(delta: float, sd: float, n: int, *, margin: float, alpha: float = 0.05) -> float:
    """Power of the paired TOST of :func:`equivalence` (``paired=True``): the probability that it declares the
    means equivalent within ±margin when the true mean difference is ``delta`` and the differences are
    N(delta, sd²), at n pairs.

    TOST rejects both one-sided nulls when −δ + t·s/√n < x̄ < δ − t·s/√n (t = t_{1−α, n−1}, δ the margin, s the
    sample sd); x̄ ~ N(Δ, σ²/n) is independent of s, and s/σ ~ χ_{n−1}/√(n − 1), so

        power = ∫₀^{r*} [Φ((δ − Δ)√n/σ − t·r) − Φ((−δ − Δ)√n/σ + t·r)] f(r) dr,   r* = δ√n/(t·σ),

    f the density of r = s/σ (the band is empty beyond r*): Owen's Q form, one ``scipy.integrate.quad``
    (absolute error ~1e-12). At |Δ| = δ it is ≤ α; it is symmetric in Δ and falls as |Δ| grows. It rises with n
    except at a handful of pairs, where it is small anyway (at Δ = 0, σ = 1, δ = 0.5: 0.024 at 2 pairs, 0.019 at
    3, 0.018 at 4 — with 1 df a lucky small s is likelier); such dips lie far below any target power.

    Args:
        delta: the true mean difference a − b (Δ).
        sd: the sd of the differences (σ > 0).
        n: pairs, ≥ 2.
        margin: δ > 0, as given to :func:`equivalence`.
        alpha: the level of each one-sided test, in (0, 0.5) as :func:`equivalence` takes it.
    """
    delta = _finite(delta, "delta", "the true mean difference a − b")
    sd, n, margin, alpha = _tost_arguments(sd, n, margin, alpha)
    return _tost_power(delta, sd, n, margin, alpha)


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
    target, alternative = _target(target, alpha), _alternative(alternative)
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
    target, alternative = _target(target, alpha), _alternative(alternative)
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
