"""Power and detectable shifts of the paired t and Wilcoxon tests."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import scipy.stats

from kvstats._random import check_seed
from kvstats._validation import check_int_range
from kvstats.measure.stats._bootstrap import _stat_name
from kvstats.measure.stats._common import _check_level, _sample, check_alternative
from kvstats.measure.stats._wilcoxon import WILCOXON_EXACT_MAX_N
from kvstats.results import TestResult


@dataclass(frozen=True)
class PowerResult(TestResult):
    """Result of :func:`paired_t_power` / :func:`wilcoxon_power`. ``statistic`` is the quantity solved for
    (``solved_for``: "power", "n" or "effect_size"); ``power``, ``n_pairs`` (the real-valued solution when
    n was solved; ``n_required`` rounds it up, ignoring the root finder's 1e-6 slack), ``effect_size`` and
    ``alpha`` are all filled in. For the simulated power, ``confidence_interval`` is the Clopper–Pearson CI
    of the power over the simulations."""

    power: float = math.nan
    n_pairs: float = math.nan
    n_required: int = 0
    alpha: float = 0.05
    solved_for: str = ""
    alternative: str = "two-sided"
    n_simulations: int = 0

    def summary(self) -> str:
        return self.summary_with(("power", "n_pairs", "n_required", "alpha", "solved_for", "alternative",
                                  "n_simulations"))


_SM_ALTERNATIVE = {"two-sided": "two-sided", "greater": "larger", "less": "smaller"}


def paired_t_power(
    effect_size: float | None = None,
    n: float | None = None,
    power: float | None = None,
    *,
    alpha: float = 0.05,
    alternative: str = "two-sided",
) -> PowerResult:
    """Power, sample size or detectable effect of the paired (= one-sample) t test; give exactly two of
    ``effect_size``, ``n``, ``power``, the third is solved (Brent's method on the exact power, :func:`_t_power`;
    statsmodels' ``TTestPower`` computes the same power, but its ``solve_power`` misses the root below α ≈ 1e-3).

    ``effect_size`` is Cohen's ``d_z = mean(a − b)/sd(a − b)`` (standardised mean of the differences);
    power ``= P(|T| > t_{1−α/2, n−1})`` with T noncentral t, n − 1 df, noncentrality ``d_z·√n``.
    For the Wilcoxon test on normal differences multiply n by ``π/3 ≈ 1.05`` (its asymptotic relative
    efficiency 3/π), or simulate the actual design with :func:`wilcoxon_power`.
    """
    check_alternative(alternative)
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    given = {"effect_size": effect_size, "n": n, "power": power}
    missing = [k for k, v in given.items() if v is None]
    if len(missing) != 1:
        raise ValueError(f"give exactly two of effect_size, n, power (the third is solved), got {given}")
    if n is not None and not float(n) >= 2:
        raise ValueError(f"n must be >= 2 pairs, got {n}")
    if power is not None and not float(alpha) < float(power) < 1.0:
        raise ValueError(f"power must be in (alpha, 1) = ({alpha}, 1), got {power}")
    if effect_size is not None and (not math.isfinite(float(effect_size)) or float(effect_size) == 0):
        raise ValueError(f"effect_size must be finite and non-zero, got {effect_size}")
    solved = _solve_t_power(missing[0], effect_size, n, power, float(alpha), _SM_ALTERNATIVE[alternative])
    if not math.isfinite(solved):
        raise ValueError(f"the paired t test's power does not reach {power} for any {missing[0]} from {given}")
    values = {"effect_size": effect_size, "n": n, "power": power} | {missing[0]: solved}
    n_pairs = float(values["n"])
    return PowerResult(
        statistic=solved,
        pvalue=math.nan,
        method="power of the paired / one-sample t test (noncentral t, scipy.stats.nct; solved by brentq)",
        null_hypothesis="mean(a - b) = 0",
        n=math.ceil(n_pairs - 1e-6),
        effect_size=float(values["effect_size"]),
        effect_size_name="Cohen's d_z = mean(a - b) / sd(a - b)",
        power=float(values["power"]),
        n_pairs=n_pairs,
        n_required=math.ceil(n_pairs - 1e-6),
        alpha=float(alpha),
        solved_for="n" if missing[0] == "n" else missing[0],
        alternative=alternative,
    )


def _t_power(d: float, n: float, alpha: float, alternative: str) -> float:
    """Power of the one-sample t test at standardised effect ``d`` over ``n`` pairs: noncentral t (scipy.stats.nct)
    with n − 1 df and noncentrality d·√n; the lower tail as the upper tail at −d·√n (scipy's nct.cdf returns nan
    there where it underflows)."""
    df, nc = n - 1.0, d * math.sqrt(n)
    if alternative == "two-sided":
        t = scipy.stats.t.isf(alpha / 2, df)
        return float(scipy.stats.nct.sf(t, df, nc) + scipy.stats.nct.sf(t, df, -nc))
    t = scipy.stats.t.isf(alpha, df)
    return float(scipy.stats.nct.sf(t, df, nc if alternative == "larger" else -nc))


def _solve_t_power(missing: str, effect_size, n, power, alpha: float, alternative: str) -> float:
    """The one unknown of the paired t test's power (:func:`_t_power`) = ``power``, by Brent's method on the exact
    power. Not statsmodels' ``TTestPower.solve_power``: below α ≈ 1e-3 its root finder stops where the power is
    0.35–0.68, not the target (α = 0.05/1530, n = 19.1: d_z 1.118 at power 0.35), and its power is nan for large
    effects there."""
    def at(d: float, m: float) -> float:
        return _t_power(d, m, alpha, alternative)

    if missing == "power":
        return at(float(effect_size), float(n))
    target = float(power)
    if missing == "effect_size":  # power rises with |d| on the alternative's side ("smaller": negative d)
        sign = -1.0 if alternative == "smaller" else 1.0
        high = 1.0
        while at(sign * high, float(n)) < target:
            high *= 2.0
            if high > 1e6:
                return math.inf
        return sign * float(scipy.optimize.brentq(lambda d: at(sign * d, float(n)) - target, 0.0, high, xtol=1e-13,
                                                  rtol=1e-12))
    d = float(effect_size)
    if at(d, 2.0) >= target:
        return 2.0
    high = 4.0
    while at(d, high) < target:  # the power rises with n toward 1 for an effect on the alternative's side
        high *= 2.0
        if high > 1e12:
            return math.inf
    return float(scipy.optimize.brentq(lambda m: at(d, m) - target, high / 2, high, xtol=1e-10, rtol=1e-12))


def wilcoxon_power(
    differences: Callable[[np.random.Generator, tuple[int, int]], np.ndarray] | float,
    n: int,
    *,
    alpha: float = 0.05,
    alternative: str = "two-sided",
    n_simulations: int = 4000,
    seed: int = 0,
    confidence_level: float = 0.95,
) -> PowerResult:
    """Power of the Wilcoxon signed-rank test at ``n`` pairs, by simulation.

    ``differences`` draws paired differences: a callable ``(rng, (n_simulations, n)) -> array`` of that
    shape (e.g. resampling pilot differences: ``lambda rng, shape: rng.choice(pilot, size=shape)``), or a
    float δ for normal differences ``N(δ, 1)`` (δ is then Cohen's d_z, comparable with
    :func:`paired_t_power`). Each row is tested with :func:`scipy.stats.wilcoxon` under the rule of
    :func:`wilcoxon` ("exact" for ≤ 50 pairs without ties or zeros in the whole draw, else the normal
    approximation); power = fraction of rows with ``p < alpha``, with its Clopper–Pearson CI
    (binomial over ``n_simulations``: half-width ≤ 0.016 at the default 4000).
    """
    from statsmodels.stats.proportion import proportion_confint

    n = check_int_range(n, "n", 2, 10**7)
    n_simulations = check_int_range(n_simulations, "n_simulations", 10, 10**8)
    level = _check_level(confidence_level)
    check_alternative(alternative)
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(check_seed(seed))
    if callable(differences):
        d = np.asarray(differences(rng, (n_simulations, n)), dtype=np.float64)
        what = f"differences from {_stat_name(differences)}"
        shift = math.nan
    else:
        shift = float(differences)
        if not math.isfinite(shift):
            raise ValueError(f"differences must be a callable or a finite shift, got {differences}")
        d = rng.normal(shift, 1.0, size=(n_simulations, n))
        what = f"normal differences N({shift:g}, 1)"
    if d.shape != (n_simulations, n) or not np.isfinite(d).all():
        raise ValueError(f"differences must return finite values of shape {(n_simulations, n)}, got shape {d.shape}")
    if (d == 0).all(axis=1).any():
        raise ValueError("differences drew a simulation with every difference 0: the test is undefined there")
    sorted_abs = np.sort(np.abs(d), axis=1)
    clean = not (d == 0).any() and not (np.diff(sorted_abs, axis=1) == 0).any()
    how = "exact" if n <= WILCOXON_EXACT_MAX_N and clean else "asymptotic"
    p = scipy.stats.wilcoxon(d, axis=1, alternative=alternative, method=how).pvalue
    hits = int((p < alpha).sum())
    low, high = proportion_confint(hits, n_simulations, alpha=1 - level, method="beta")
    power = hits / n_simulations
    return PowerResult(
        statistic=power,
        pvalue=math.nan,
        method=f"simulated power of the Wilcoxon signed-rank test ({how} p, {n_simulations} simulations, {what})",
        null_hypothesis="a - b symmetric about 0",
        n=n,
        effect_size=shift,
        effect_size_name="shift of N(delta, 1) differences (Cohen's d_z)" if math.isfinite(shift) else "",
        confidence_interval=(float(low), float(high)),
        ci_of="power (Clopper-Pearson over the simulations)",
        confidence_level=level,
        power=power,
        n_pairs=float(n),
        n_required=n,
        alpha=float(alpha),
        solved_for="power",
        alternative=alternative,
        n_simulations=n_simulations,
    )


#: Above this many differences :func:`signed_rank_shift_se` reads the interval from this many evenly spaced order
#: statistics (n(n + 1)/2 Walsh averages would not fit in memory) and scales it by √(thinned / n).
SHIFT_SE_MAX_N = 4096


def signed_rank_shift_se(differences, *, confidence_level: float = 0.95) -> float:
    """The standard error of the paired Hodges–Lehmann shift (the median of the Walsh averages (dᵢ + dⱼ)/2, i ≤ j),
    read from the distribution-free interval the Wilcoxon signed-rank test inverts to: with N = n(n + 1)/2 Walsh
    averages in order, the interval is [W₍ₖ₊₁₎, W₍N₋ₖ₎], k = ⌊N/2 − z·√(n(n + 1)(2n + 1)/24)⌋ (the signed-rank
    statistic's normal approximation, z = z_{(1+level)/2}), and ``se = (W₍N₋ₖ₎ − W₍ₖ₊₁₎)/(2z)``.

    It is the spread a sample size of the signed-rank test is planned on: by the test's Pitman efficiency its power
    against a shift Δ is that of a z test of Δ/se, so a plan needs no normality of the differences (their sd, which
    the t-based plan reads, is inflated by heavy tails the ranks ignore). For normal differences se² → πσ²/(3n),
    the π/3 of the t-based plan. Above :data:`SHIFT_SE_MAX_N` differences it is read from that many evenly spaced
    order statistics and scaled by √(that / n)."""
    d = np.sort(_sample(differences, "differences", min_size=2))
    level = _check_level(confidence_level)
    n = d.size
    if n > SHIFT_SE_MAX_N:
        thin = d[np.round(np.linspace(0, n - 1, SHIFT_SE_MAX_N)).astype(np.int64)]
        return signed_rank_shift_se(thin, confidence_level=level) * math.sqrt(SHIFT_SE_MAX_N / n)
    i, j = np.triu_indices(n)
    walsh = (d[i] + d[j]) / 2.0
    total = walsh.size
    z = float(scipy.stats.norm.isf((1.0 - level) / 2.0))
    k = int(math.floor(total / 2.0 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)))
    k = min(max(k, 0), (total - 1) // 2)
    low, high = np.partition(walsh, (k, total - 1 - k))[[k, total - 1 - k]]
    return float(high - low) / (2.0 * z)


def wilcoxon_min_pvalue(n: int, alternative: str = "two-sided") -> float:
    """The smallest p-value the Wilcoxon signed-rank test can give at ``n`` pairs (every difference of one sign,
    no ties, no zeros), under the p-value rule of :func:`wilcoxon`: ``2/2ⁿ`` two-sided (``1/2ⁿ`` one-sided) from
    the exact null up to ``WILCOXON_EXACT_MAX_N`` pairs, the normal approximation's ``2Φ(−z_max)`` beyond,
    ``z_max = √(3n(n+1)/(2(2n+1)))`` (W⁺ at its maximum n(n+1)/2, mean n(n+1)/4, variance
    n(n+1)(2n+1)/24). No test on n pairs, whatever the effect, can
    reach a smaller p; a family of m tests corrected by Holm or Bonferroni needs ``m·p_min < α``."""
    n = check_int_range(n, "n", 1, 10**9)
    check_alternative(alternative)
    sides = 2.0 if alternative == "two-sided" else 1.0
    if n <= WILCOXON_EXACT_MAX_N:
        return min(1.0, sides * 2.0 ** -n)
    z = math.sqrt(3.0 * n * (n + 1) / (2.0 * (2 * n + 1)))
    return min(1.0, sides * float(scipy.stats.norm.sf(z)))


@functools.lru_cache(maxsize=4096)
def _detectable_d_z(n_eff: float, power: float, alpha: float, alternative: str) -> float:
    """The standardised effect the paired t test detects at ``n_eff`` pairs: it depends on the sample only through
    its size, so a study's thousands of comparisons of a few sizes solve it a few times (a root finder on the
    noncentral t's power, milliseconds a call)."""
    return paired_t_power(n=n_eff, power=power, alpha=alpha, alternative=alternative).effect_size


def detectable_shift(
    differences,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    alternative: str = "two-sided",
) -> PowerResult:
    """The minimum detectable effect of a paired comparison: the smallest mean difference that the Wilcoxon
    signed-rank test on these ``n`` pairs detects with probability ``power`` at level ``alpha``.

    Solved with the paired t test's exact power (:func:`paired_t_power`) for the standardised effect ``d_z`` at
    ``n·3/π`` pairs (the
    Wilcoxon test's asymptotic relative efficiency 3/π against the t test on normal differences), then
    expressed in the units of the differences: ``shift = d_z · sd(differences)`` (``extra["shift"]``). Where
    the test cannot reach ``alpha`` at n pairs at all (:func:`wilcoxon_min_pvalue`), or the differences have
    no spread, there is no such effect: ``effect_size`` and ``shift`` are inf and ``extra["reason"]`` says why.
    Give ``alpha`` already corrected for the family (e.g. α/m).
    """
    d = _sample(differences, "differences", min_size=2)
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not float(alpha) < float(power) < 1.0:
        raise ValueError(f"power must be in (alpha, 1) = ({alpha}, 1), got {power}")
    n = d.size
    sd = float(np.std(d, ddof=1))
    reason = ""
    floor = wilcoxon_min_pvalue(n, alternative)
    if floor >= alpha:
        reason = f"at {n} pairs no Wilcoxon p-value is below alpha = {alpha:.3g} (the smallest is {floor:.3g})"
    elif not sd > 0:
        reason = "the differences have no spread (sd 0): the t-based solution is undefined"
    n_eff = n * 3.0 / math.pi
    if reason or n_eff < 2:
        d_z = math.inf
        reason = reason or f"{n} pairs are too few for the power solution (n·3/π < 2)"
    else:
        d_z = _detectable_d_z(n_eff, float(power), float(alpha), alternative)
    return PowerResult(
        statistic=d_z,
        pvalue=math.nan,
        method="minimum detectable effect of the Wilcoxon signed-rank test (t-test power at n·3/π pairs, "
               "noncentral t)",
        null_hypothesis="a - b symmetric about 0",
        n=n,
        effect_size=d_z,
        effect_size_name="Cohen's d_z = mean(a - b) / sd(a - b)",
        power=float(power),
        n_pairs=float(n),
        n_required=n,
        alpha=float(alpha),
        solved_for="effect_size",
        alternative=alternative,
        extra={"shift": d_z * sd if math.isfinite(d_z) else math.inf, "sd_differences": sd, "reason": reason},
    )
