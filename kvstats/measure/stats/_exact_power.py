"""Exact power of the pass/fail tests and of the paired TOST that kvstats' claims rest on (every test rejects when
p < α, the rule of the functions whose power is computed: ``conclusion = p < alpha``).

* :func:`binomial_power` — scipy's exact ``binomtest`` of H0: p = p0 when the truth is p1: the Binomial(n, p1) mass
  of the rejection region {k : p(k) < α}, p(k) computed for every k = 0..n by scipy's own rule.
* :func:`mcnemar_power` — the exact McNemar test of :func:`mcnemar` (conditional on the m discordant pairs),
  unconditionally over m ~ Binomial(n, p10 + p01).
* :func:`tost_power` — the paired TOST of :func:`equivalence`, by one integral over the sample sd.

Planned sample sizes and minimum detectable effects built on them: :mod:`kvstats.measure.stats._planning`.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.integrate
import scipy.stats

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import check_alternative
from kvstats.measure.stats._equivalence import _alpha as _tost_alpha
from kvstats.measure.stats._equivalence import _margin

__all__ = ["binomial_power", "binomtest_pvalues", "mcnemar_critical_values", "mcnemar_power", "tost_power"]

#: Largest n for which the exact binomial / McNemar power is computed (it enumerates every outcome k = 0..n).
EXACT_POWER_MAX_N = 10**7
#: scipy's binomtest: a pmf within this relative tolerance of the observed one counts as "as likely" (minlike)
_BINOMTEST_RERR = 1 + 1e-7


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
    alternative = check_alternative(alternative)
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
    return _mass(_binomial_region(n, p0, _level(alpha), check_alternative(alternative)), n, p1)


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
