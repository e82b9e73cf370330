"""Exact power, sample size and minimum detectable effect for the binomial test, the exact McNemar test and the
paired TOST (kvstats.measure.stats._exact_power and _planning) — every number against an independent oracle:
scipy's binomtest on every outcome, kvstats' own mcnemar / equivalence on every table or on simulated data, closed
forms (tiny n by hand, the Beta form of the one-sided binomial power), statsmodels' one-sided t power, a second
quadrature, brute force.

Monte Carlo checks: the simulated power of R draws has standard error se = √(P(1 − P)/R) around the exact power P;
each check allows 5.3·se (two-sided normal tail 1.2e-7), and the file has 6 of them, so a correct implementation
fails one with probability < 1e-6 (union bound)."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import scipy.integrate
import scipy.stats
from statsmodels.stats.power import TTestPower

from kvstats import stats
from kvstats.measure.stats import _exact_power, _planning

MC_SIGMAS = 5.3  # P(|Z| > 5.3) = 1.2e-7 per check


def mc_tolerance(power: float, draws: int) -> float:
    return MC_SIGMAS * math.sqrt(power * (1 - power) / draws)


# ------------------------------------------------------------------------------------------------------- binomial
@pytest.mark.parametrize("n, p0", [(1, 0.5), (2, 0.5), (10, 0.3), (20, 0.25), (17, 0.5), (40, 0.05), (63, 0.9),
                                   (100, 1 / 3), (150, 0.71)])
@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_binomtest_pvalues_are_scipys_on_every_outcome_to_the_last_bit(n, p0, alternative):
    # 20·0.25 = 5 exactly (the k = n·p0 shortcut); 10·0.3 = 3.0000000000000004 (it is not taken, in scipy neither)
    ours = stats.binomtest_pvalues(n, p0, alternative)
    ref = np.array([scipy.stats.binomtest(k, n, p0, alternative=alternative).pvalue for k in range(n + 1)])
    assert ours.shape == (n + 1,)
    np.testing.assert_array_equal(ours, ref)


def _binomtest_region(n: int, p0: float, alpha: float, alternative: str) -> list[int]:
    return [k for k in range(n + 1) if scipy.stats.binomtest(k, n, p0, alternative=alternative).pvalue < alpha]


@pytest.mark.parametrize("p0, n, alternative", [(0.5, 30, "two-sided"), (0.2, 45, "two-sided"),
                                                (0.85, 25, "two-sided"), (0.3, 40, "greater"), (0.6, 35, "less")])
@pytest.mark.parametrize("p1", [0.0, 0.1, 0.45, 0.5, 0.72, 1.0])
def test_binomial_power_is_the_mass_of_binomtests_rejections(p0, n, alternative, p1):
    region = _binomtest_region(n, p0, 0.05, alternative)  # scipy decides every outcome
    expected = sum(scipy.stats.binom.pmf(k, n, p1) for k in region)
    assert stats.binomial_power(p0, p1, n, alternative=alternative) == pytest.approx(expected, abs=1e-14)


def test_binomial_power_at_tiny_n_is_the_hand_computed_polynomial():
    p1 = np.linspace(0, 1, 11)
    # n = 1 two-sided at ½: both outcomes have p = 1 — no power at all
    assert all(stats.binomial_power(0.5, p, 1) == 0 for p in p1)
    # n = 5 at ½, α = 0.1: only 0 and 5 successes give p = 2/32 = 0.0625 < 0.1 (4 of 5: p = 12/32)
    for p in p1:
        assert stats.binomial_power(0.5, p, 5, alpha=0.1) == pytest.approx(p**5 + (1 - p) ** 5, abs=1e-15)
    # one-sided at ½, n = 3, α = 0.2: only 3 of 3 (p = 1/8; 2 of 3 has p = 4/8)
    for p in p1:
        assert stats.binomial_power(0.5, p, 3, alpha=0.2, alternative="greater") == pytest.approx(p**3, abs=1e-15)
    # n = 1, p0 = 0.01, greater: one success has p = 0.01 < 0.05, so the power is p1 itself
    for p in p1:
        assert stats.binomial_power(0.01, p, 1, alternative="greater") == pytest.approx(p, abs=1e-15)


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_the_exact_binomial_tests_size_never_exceeds_alpha(alternative):
    for p0 in (0.03, 0.2, 0.5, 0.77):
        for n in (1, 5, 12, 37, 100, 400):
            for alpha in (0.01, 0.05, 0.1):
                assert stats.binomial_power(p0, p0, n, alpha=alpha, alternative=alternative) <= alpha


def test_binomial_power_rises_toward_one_with_n_for_a_true_effect():
    powers = [stats.binomial_power(0.3, 0.4, n) for n in (10, 100, 1000, 10_000)]
    assert powers[0] < powers[1] < powers[2] < powers[3] and powers[3] > 1 - 1e-12 and powers[0] < 0.2


def test_binomial_power_is_fast_at_ten_thousand_trials():
    import time

    start = time.perf_counter()
    stats.binomial_power(0.3, 0.31, 10_000)
    assert time.perf_counter() - start < 1.0  # ~10 ms: every outcome, vectorised


def test_binomial_power_matches_a_simulation_of_binomtest():
    rng = np.random.default_rng(20240501)
    n, p0, p1, draws = 80, 0.4, 0.55, 400_000
    x = rng.binomial(n, p1, size=draws)
    values, counts = np.unique(x, return_counts=True)
    rejected = sum(c for k, c in zip(values, counts) if scipy.stats.binomtest(int(k), n, p0).pvalue < 0.05)
    exact = stats.binomial_power(p0, p1, n)
    assert abs(rejected / draws - exact) < mc_tolerance(exact, draws)  # se 7.1e-4 around P ≈ 0.71


# ------------------------------------------------------------------------------------------------------- McNemar
def _mcnemar_rejects(n10: int, n01: int, n: int, alpha: float = 0.05) -> bool:
    """kvstats' own mcnemar on outcome vectors with this table (the concordant pairs all (1, 1))."""
    rest = n - n10 - n01
    a = np.array([1] * n10 + [0] * n01 + [1] * rest)
    b = np.array([0] * n10 + [1] * n01 + [1] * rest)
    return stats.mcnemar(a, b).pvalue < alpha


@pytest.mark.parametrize("n", [1, 6, 9, 12])
def test_mcnemar_power_is_the_multinomial_mass_of_mcnemars_rejections(n):
    # every table (n10, n01, rest) decided by kvstats.mcnemar itself, weighted by its multinomial probability
    tables = [(i, j) for i in range(n + 1) for j in range(n + 1 - i) if _mcnemar_rejects(i, j, n)]
    for p10, p01 in [(0.3, 0.1), (0.2, 0.2), (0.4, 0.0), (0.05, 0.6), (0.5, 0.5)]:
        probs = [p10, p01, max(0.0, 1 - p10 - p01)]
        expected = sum(scipy.stats.multinomial.pmf([i, j, n - i - j], n, probs) for i, j in tables)
        assert stats.mcnemar_power(p10, p01, n) == pytest.approx(expected, abs=1e-13)


def test_mcnemar_critical_values_decide_like_mcnemar_on_every_split():
    c = stats.mcnemar_critical_values(40, 0.05)
    for m in range(41):
        for j in range(m + 1):
            # one concordant pair more (mcnemar needs a trial; concordant pairs do not enter its p)
            assert (min(j, m - j) <= c[m]) == _mcnemar_rejects(j, m - j, m + 1), (m, j)
    assert list(c[:7]) == [-1] * 6 + [0]  # 2·(½)⁶ = 0.031 < 0.05 is the first significant split


def test_mcnemar_with_every_pair_discordant_is_the_binomial_power_of_the_split():
    for n in (1, 5, 6, 7, 20, 33, 100, 301):
        for p10 in (0.5, 0.62, 0.93, 1.0):
            assert stats.mcnemar_power(p10, 1 - p10, n) == pytest.approx(stats.binomial_power(0.5, p10, n),
                                                                           abs=1e-13)


def test_mcnemar_size_never_exceeds_alpha_and_power_rises_with_n():
    for p in (0.01, 0.1, 0.3, 0.5):
        for n in (1, 10, 50, 300, 2000):
            assert stats.mcnemar_power(p, p, n) <= 0.05
    powers = [stats.mcnemar_power(0.15, 0.05, n) for n in (20, 100, 500, 3000)]
    assert powers[0] < powers[1] < powers[2] < powers[3] and powers[3] > 1 - 1e-9


def test_mcnemar_power_matches_a_simulation_of_mcnemar():
    rng = np.random.default_rng(7)
    n, p10, p01, draws = 60, 0.2, 0.08, 200_000
    counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=draws)[:, :2]
    tables, inverse = np.unique(counts, axis=0, return_inverse=True)
    decided = np.array([_mcnemar_rejects(int(i), int(j), n) for i, j in tables])
    simulated = decided[inverse.ravel()].mean()
    exact = stats.mcnemar_power(p10, p01, n)
    assert abs(simulated - exact) < mc_tolerance(exact, draws)  # se 1.1e-3 around P ≈ 0.34


# ---------------------------------------------------------------------------------------------------------- TOST
def _tost_decisions(d: np.ndarray, margin: float, alpha: float) -> np.ndarray:
    """TOST on each row of d by statsmodels' arithmetic: p = max(P(T > t_low), P(T < t_upp)) < α."""
    n = d.shape[-1]
    mean, se = d.mean(axis=-1), d.std(axis=-1, ddof=1) / math.sqrt(n)
    p_low = scipy.stats.t.sf((mean + margin) / se, n - 1)
    p_upp = scipy.stats.t.cdf((mean - margin) / se, n - 1)
    return np.maximum(p_low, p_upp) < alpha


def test_the_vectorised_tost_decides_like_equivalence():
    rng = np.random.default_rng(3)
    seen = set()
    for n, delta, margin, alpha in [(5, 0.0, 1.0, 0.05), (12, 0.2, 0.6, 0.05), (30, -0.1, 0.4, 0.1)]:
        d = rng.normal(delta, 1.0, size=(100, n))
        ours = _tost_decisions(d, margin, alpha)
        theirs = [stats.equivalence(row, np.zeros(n), margin=margin, alpha=alpha).conclusion for row in d]
        assert list(ours) == theirs
        seen |= set(theirs)
    assert seen == {True, False}


def _tost_power_over_the_mean(delta, sd, n, margin, alpha) -> float:
    """The same probability integrated the other way: over Z = (x̄ − Δ)√n/σ, the chance that s is small enough,
    P(r < min(a − z, z − b)/t) = F_χ²(ν·(…)²), r = s/σ."""
    nu, c = n - 1, scipy.stats.t.isf(alpha, n - 1)
    a, b = (margin - delta) * math.sqrt(n) / sd, (-margin - delta) * math.sqrt(n) / sd
    lo, hi = max(b, -12.0), min(a, 12.0)
    if lo >= hi:
        return 0.0

    def f(z):
        return scipy.stats.norm.pdf(z) * scipy.stats.chi2.cdf(nu * (min(a - z, z - b) / c) ** 2, nu)

    points = [p for p in (0.0, (a + b) / 2) if lo < p < hi]
    return scipy.integrate.quad(f, lo, hi, points=points or None, epsabs=1e-13, epsrel=1e-12, limit=400)[0]


@pytest.mark.parametrize("delta, sd, n, margin, alpha", [
    (0.0, 1.0, 2, 0.5, 0.05), (0.0, 1.0, 2, 8.0, 0.05), (0.1, 1.0, 20, 0.5, 0.05), (-0.3, 2.0, 50, 1.0, 0.1),
    (0.25, 0.5, 200, 0.3, 0.025), (0.0, 1.0, 5000, 0.05, 0.05), (0.49, 1.0, 40, 0.5, 0.05), (1.0, 1.0, 30, 0.5, 0.05),
])
def test_tost_power_equals_the_integral_over_the_mean(delta, sd, n, margin, alpha):
    expected = _tost_power_over_the_mean(delta, sd, n, margin, alpha)
    assert stats.tost_power(delta, sd, n, margin=margin, alpha=alpha) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("delta, n", [(0.0, 10), (0.1, 25), (-0.2, 40), (0.15, 8)])
def test_tost_power_lies_within_statsmodels_one_sided_t_powers(delta, n):
    # TOST rejects when both one-sided t tests do: P(A) + P(B) − 1 ≤ power ≤ min(P(A), P(B)), with P(A), P(B)
    # statsmodels' noncentral-t power of each one-sided test
    sd, margin, alpha = 1.0, 0.5, 0.05
    pa = TTestPower().power(effect_size=(delta + margin) / sd, nobs=n, alpha=alpha, alternative="larger")
    pb = TTestPower().power(effect_size=(delta - margin) / sd, nobs=n, alpha=alpha, alternative="smaller")
    power = stats.tost_power(delta, sd, n, margin=margin, alpha=alpha)
    assert max(0.0, pa + pb - 1) - 1e-10 <= power <= min(pa, pb) + 1e-10


def test_tost_power_is_the_one_sided_power_where_the_other_side_is_certain():
    # Δ = 0.4 near the upper margin 0.5, σ = 0.1, n = 12: the lower test rejects with 1 − 1e-20, so the TOST power is
    # statsmodels' power of the upper one-sided t test
    delta, sd, n, margin = 0.4, 0.1, 12, 0.5
    pa = TTestPower().power(effect_size=(delta + margin) / sd, nobs=n, alpha=0.05, alternative="larger")
    pb = TTestPower().power(effect_size=(delta - margin) / sd, nobs=n, alpha=0.05, alternative="smaller")
    assert 1 - pa < 1e-12
    assert stats.tost_power(delta, sd, n, margin=margin) == pytest.approx(pb, abs=1e-9)


@pytest.mark.parametrize("delta, sd, n, margin, alpha", [(0.0, 1.0, 10, 0.8, 0.05), (0.2, 1.0, 40, 0.6, 0.05),
                                                          (-0.1, 0.5, 25, 0.3, 0.1)])
def test_tost_power_matches_a_simulation_of_the_tost_decision(delta, sd, n, margin, alpha):
    rng = np.random.default_rng(11)
    draws = 400_000
    simulated = np.mean([_tost_decisions(rng.normal(delta, sd, size=(draws // 4, n)), margin, alpha).mean()
                         for _ in range(4)])
    exact = stats.tost_power(delta, sd, n, margin=margin, alpha=alpha)
    assert 0.2 < exact < 0.95
    assert abs(simulated - exact) < mc_tolerance(exact, draws)  # se ≤ 7.9e-4


def test_tost_power_matches_a_simulation_of_equivalence_itself():
    rng = np.random.default_rng(5)
    n, delta, margin, draws = 15, 0.1, 0.6, 2000
    hits = sum(stats.equivalence(rng.normal(delta, 1.0, n), np.zeros(n), margin=margin).conclusion
               for _ in range(draws))
    exact = stats.tost_power(delta, 1.0, n, margin=margin)
    assert abs(hits / draws - exact) < mc_tolerance(exact, draws)  # se 0.011 around P ≈ 0.41


def test_tost_size_at_the_margin_is_at_most_alpha_and_power_rises_with_n():
    for n in (2, 5, 20, 100, 1000):
        for alpha in (0.025, 0.05, 0.1):
            for delta in (0.5, -0.5):
                assert stats.tost_power(delta, 1.0, n, margin=0.5, alpha=alpha) <= alpha + 1e-12
    powers = [stats.tost_power(0.1, 1.0, n, margin=0.3) for n in (20, 100, 400, 2000)]
    assert powers[0] < powers[1] < powers[2] < powers[3] and powers[3] > 1 - 1e-9
    # symmetric in Δ, falling as |Δ| grows
    grid = [stats.tost_power(d, 1.0, 60, margin=0.5) for d in np.linspace(0, 0.5, 11)]
    assert all(x > y for x, y in zip(grid, grid[1:]))
    assert stats.tost_power(-0.2, 1.0, 60, margin=0.5) == pytest.approx(stats.tost_power(0.2, 1.0, 60, margin=0.5),
                                                                         abs=1e-12)


# ------------------------------------------------------------------------------------------------------- planning
def _conservative_n(power, target: float, n_min: int, n_high: int) -> tuple[int, int]:
    """Brute force over n_min..n_high: (1 + the last n with power < target, the first n with power ≥ target)."""
    values = {n: power(n) for n in range(n_min, n_high + 1)}
    below = [n for n, v in values.items() if v < target]
    return (max(below) + 1 if below else n_min), min(n for n, v in values.items() if v >= target)


@pytest.mark.parametrize("p0, p1, alternative", [(0.5, 0.6, "two-sided"), (0.05, 0.12, "two-sided"),
                                                 (0.9, 0.8, "two-sided"), (0.2, 0.1, "less"), (0.1, 0.25, "greater")])
def test_binomial_plan_is_the_n_beyond_which_the_power_never_falls_below_target(p0, p1, alternative):
    plan = stats.binomial_sample_size(p0, p1, alternative=alternative)
    n = plan.n_planned
    last_below, first_above = _conservative_n(
        lambda m: stats.binomial_power(p0, p1, m, alternative=alternative), 0.8, 1, 3 * n)
    assert n == last_below and plan.n == n and plan.statistic == n
    assert plan.power_planned == stats.binomial_power(p0, p1, n, alternative=alternative) >= 0.8
    assert first_above < n  # the saw-tooth: a smaller n reaches 0.8 once, then falls below it again
    assert plan.window == math.ceil(2 / min(p0, 1 - p0)) == stats.binomial_window(p0)


def test_the_saw_tooth_at_one_half_and_sixty_percent():
    # two-sided binomtest of p = ½ when p = 0.6: 0.8 is first reached at 199 trials, for good at 210
    assert stats.binomial_power(0.5, 0.6, 199) >= 0.8 > stats.binomial_power(0.5, 0.6, 200)
    assert stats.binomial_power(0.5, 0.6, 209) < 0.8 and stats.binomial_sample_size(0.5, 0.6).n_planned == 210


@pytest.mark.parametrize("p10, p01", [(0.15, 0.05), (0.05, 0.15), (0.3, 0.1), (0.6, 0.4)])
def test_mcnemar_plan_is_the_n_beyond_which_the_power_never_falls_below_target(p10, p01):
    plan = stats.mcnemar_sample_size(p10, p01)
    n = plan.n_planned
    last_below, _ = _conservative_n(lambda m: stats.mcnemar_power(p10, p01, m), 0.8, 1, 3 * n)
    assert n == last_below and plan.power_planned == stats.mcnemar_power(p10, p01, n) >= 0.8
    assert plan.window == stats.mcnemar_window(p10 + p01) == math.ceil(4 / (p10 + p01))


@pytest.mark.parametrize("delta, sd, margin", [(0.0, 1.0, 0.5), (0.1, 1.0, 0.3), (0.2, 0.5, 0.3), (0.0, 1.0, 2.0)])
def test_tost_plan_is_the_smallest_n_reaching_target(delta, sd, margin):
    plan = stats.tost_sample_size(delta, sd, margin=margin)
    n = plan.n_planned
    last_below, first_above = _conservative_n(lambda m: stats.tost_power(delta, sd, m, margin=margin), 0.8, 2,
                                              2 * n + 10)
    assert n == last_below == first_above and plan.power_planned >= 0.8


def test_the_planner_on_a_hand_made_saw_tooth():
    powers = {1: 0.1, 2: 0.5, 3: 0.85, 4: 0.7, 5: 0.82, 6: 0.79, 7: 0.9, 8: 0.95}

    def power(n):
        return powers.get(n, 0.99)

    # conservative with a window that covers the teeth: 7 (power < 0.8 at 6, ≥ 0.8 from 7 on)
    assert stats.plan_sample_size(power, target=0.8, n_min=1, window=3) == 7
    # window 0 takes the crossing the bisection meets: doubling 1, 2, 4 (0.7), 8; bisection 6 (0.79), 7
    assert stats.plan_sample_size(power, target=0.8, n_min=1, window=0) == 7
    # from n_min = 3 the first n already reaches 0.84; the scan finds 4, 5 and 6 below it and restarts after each
    assert stats.plan_sample_size(power, target=0.84, n_min=3, window=2) == 7
    assert stats.plan_sample_size(power, target=0.84, n_min=3, window=0) == 3  # the non-conservative answer
    assert stats.plan_sample_size(power, target=0.8, n_min=7, window=3) == 7
    with pytest.raises(ValueError, match=r"no n ≤ n_max=6 reaches power target=0.8 \(the highest power seen is 0.79, "
                                         r"at n = 6\)"):
        stats.plan_sample_size(power, target=0.8, n_min=1, n_max=6, window=1)
    with pytest.raises(ValueError, match=r"power_fn\(1\) must return a probability in \[0, 1\], got 1.5"):
        stats.plan_sample_size(lambda n: 1.5, n_min=1)


# -------------------------------------------------------------------------------------------- detectable effects
@pytest.mark.parametrize("p0, n", [(0.3, 20), (0.3, 200), (0.05, 150), (0.8, 60)])
def test_binomial_mde_one_sided_is_the_beta_quantile(p0, n):
    # P(Bin(n, p) ≥ k) = P(Beta(k, n − k + 1) ≤ p): with k* binomtest's smallest significant count, the p1 of power
    # 0.8 is the Beta(k*, n − k* + 1) 0.8-quantile
    k_star = min(_binomtest_region(n, p0, 0.05, "greater"))
    expected = scipy.stats.beta.ppf(0.8, k_star, n - k_star + 1) - p0
    mde = stats.binomial_mde(p0, n, alternative="greater")
    assert mde == pytest.approx(expected, abs=1e-10)
    assert stats.binomial_power(p0, p0 + mde, n, alternative="greater") == pytest.approx(0.8, abs=1e-10)


@pytest.mark.parametrize("direction", ["greater", "less"])
def test_binomial_mde_two_sided_reaches_target_exactly_and_no_smaller_effect_does(direction):
    p0, n = 0.4, 120
    mde = stats.binomial_mde(p0, n, direction=direction)
    assert (mde > 0) == (direction == "greater")
    assert stats.binomial_power(p0, p0 + mde, n) == pytest.approx(0.8, abs=1e-10)
    assert all(stats.binomial_power(p0, p0 + f * mde, n) < 0.8 for f in np.linspace(0, 0.999, 40))


def test_mdes_are_nan_where_no_effect_reaches_the_target():
    assert math.isnan(stats.binomial_mde(0.5, 3))  # 3 trials: no two-sided p below 0.25
    assert math.isnan(stats.mcnemar_mde(0.2, 20))  # ~4 discordant pairs: 6 all one way are needed
    assert math.isnan(stats.tost_mde(1.0, 20, margin=0.3))  # even Δ = 0 has power 0.0084


def test_mcnemar_mde_at_full_discordance_is_twice_the_binomial_one():
    # every pair discordant: p10 − p01 = 2·p10 − 1, and the test is the two-sided binomial of the split at ½
    for n in (20, 75, 300):
        assert stats.mcnemar_mde(1.0, n) == pytest.approx(2 * stats.binomial_mde(0.5, n), abs=1e-10)


def test_mcnemar_mde_reaches_target_exactly():
    pd, n = 0.2, 150
    e = stats.mcnemar_mde(pd, n)
    assert stats.mcnemar_power((pd + e) / 2, (pd - e) / 2, n) == pytest.approx(0.8, abs=1e-10)
    assert stats.mcnemar_power((pd + 0.99 * e) / 2, (pd - 0.99 * e) / 2, n) < 0.8


def test_tost_mde_reaches_target_exactly_and_approaches_the_normal_approximation():
    d = stats.tost_mde(1.0, 100, margin=0.5)
    assert stats.tost_power(d, 1.0, 100, margin=0.5) == pytest.approx(0.8, abs=1e-10)
    assert stats.tost_power(1.01 * d, 1.0, 100, margin=0.5) < 0.8 < stats.tost_power(0.99 * d, 1.0, 100, margin=0.5)
    # large n, Δ near the margin: only the near side matters and s ≈ σ, so Δ ≈ δ − (z_{1−α} + z_{0.8})·σ/√n
    n, margin = 10_000, 0.1
    approx = margin - (scipy.stats.norm.isf(0.05) + scipy.stats.norm.isf(0.2)) / math.sqrt(n)
    assert stats.tost_mde(1.0, n, margin=margin) == pytest.approx(approx, abs=2e-4)


# ----------------------------------------------------------------------------------------------------- the plan
def test_a_plan_carries_the_achieved_n_its_power_and_mde():
    plan = stats.binomial_sample_size(0.5, 0.6, n_achieved=100)
    assert plan.power_achieved == stats.binomial_power(0.5, 0.6, 100)
    assert plan.mde_achieved == stats.binomial_mde(0.5, 100)
    assert plan.test == "binomial" and plan.assumptions == {"p0": 0.5, "p1": 0.6} and plan.target_power == 0.8
    row = plan.to_dict()
    assert row["p0"] == 0.5 and row["p1"] == 0.6 and row["n_planned"] == 210 and "assumptions" not in row
    assert row["n_achieved"] == 100 and row["mde_achieved"] == plan.mde_achieved
    text = plan.summary()
    assert "SamplePlan" in text and "n_planned" in text and "mde_achieved" in text and "p1" in text
    n, p = plan
    assert n == 210 and math.isnan(p)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.n_planned = 5

    m = stats.mcnemar_sample_size(0.05, 0.15, n_achieved=100)
    assert m.mde_achieved == -stats.mcnemar_mde(0.2, 100) and m.power_achieved == stats.mcnemar_power(0.05, 0.15, 100)
    assert m.effect_size == pytest.approx(-0.1) and m.to_dict()["p01"] == 0.15
    t = stats.tost_sample_size(0.0, 1.0, margin=0.5, n_achieved=50)
    assert t.mde_achieved == stats.tost_mde(1.0, 50, margin=0.5)
    assert t.power_achieved == stats.tost_power(0.0, 1.0, 50, margin=0.5) and t.n_planned == 36
    bare = stats.tost_sample_size(0.0, 1.0, margin=0.5)
    assert bare.n_achieved is None and math.isnan(bare.power_achieved) and math.isnan(bare.mde_achieved)


# ----------------------------------------------------------------------------------------------- hostile input
NAN = float("nan")
BAD = [
    (stats.binomial_power, dict(p0=0.0, p1=0.5, n=10), "p0 must be a probability in (0, 1), got 0.0"),
    (stats.binomial_power, dict(p0=1, p1=0.5, n=10), "p0 must be a probability in (0, 1), got 1"),
    (stats.binomial_power, dict(p0=NAN, p1=0.5, n=10), "p0 must be a probability in (0, 1), got nan"),
    (stats.binomial_power, dict(p0=-0.2, p1=0.5, n=10), "p0 must be a probability in (0, 1), got -0.2"),
    (stats.binomial_power, dict(p0=0.5, p1=1.5, n=10), "p1 must be a probability in [0, 1], got 1.5"),
    (stats.binomial_power, dict(p0=0.5, p1=NAN, n=10), "p1 must be a probability in [0, 1], got nan"),
    (stats.binomial_power, dict(p0=0.5, p1="0.6", n=10), "p1 must be a real number, got '0.6'"),
    (stats.binomial_power, dict(p0=0.5, p1=0.6, n=0), "n must be in [1, 10000000], got 0"),
    (stats.binomial_power, dict(p0=0.5, p1=0.6, n=-4), "n must be in [1, 10000000], got -4"),
    (stats.binomial_power, dict(p0=0.5, p1=0.6, n=10, alpha=0.0), "alpha must be in (0, 1), got 0.0"),
    (stats.binomial_power, dict(p0=0.5, p1=0.6, n=10, alpha=1.0), "alpha must be in (0, 1), got 1.0"),
    (stats.binomial_power, dict(p0=0.5, p1=0.6, n=10, alpha=NAN), "alpha must be in (0, 1), got nan"),
    (stats.binomial_power, dict(p0=0.5, p1=0.6, n=10, alternative="both"), "alternative must be 'two-sided', 'less'"),
    (stats.mcnemar_power, dict(p10=-0.1, p01=0.2, n=10), "p10 must be a probability in [0, 1], got -0.1"),
    (stats.mcnemar_power, dict(p10=0.1, p01=1.2, n=10), "p01 must be a probability in [0, 1], got 1.2"),
    (stats.mcnemar_power, dict(p10=NAN, p01=0.2, n=10), "p10 must be a probability in [0, 1], got nan"),
    (stats.mcnemar_power, dict(p10=0.7, p01=0.6, n=10), "p10 + p01 (the discordance rate) must be in (0, 1], got "
                                                        "p10=0.7, p01=0.6"),
    (stats.mcnemar_power, dict(p10=0.0, p01=0.0, n=10), "p10 + p01 (the discordance rate) must be in (0, 1]"),
    (stats.mcnemar_power, dict(p10=0.1, p01=0.2, n=0), "n must be in [1, 10000000], got 0"),
    (stats.mcnemar_power, dict(p10=0.1, p01=0.2, n=10, alpha=1.2), "alpha must be in (0, 1), got 1.2"),
    (stats.tost_power, dict(delta=0.0, sd=1.0, n=10, margin=0.0), "margin must be a finite number > 0"),
    (stats.tost_power, dict(delta=0.0, sd=1.0, n=10, margin=-1.0), "got -1.0"),
    (stats.tost_power, dict(delta=0.0, sd=1.0, n=10, margin=NAN), "margin must be a finite number > 0 (δ, in the "
                                                                  "metric's units), got nan"),
    (stats.tost_power, dict(delta=0.0, sd=0.0, n=10, margin=0.5), "sd must be a finite number > 0 (the sd of the "
                                                                  "paired differences), got 0.0"),
    (stats.tost_power, dict(delta=0.0, sd=-1.0, n=10, margin=0.5), "sd must be a finite number > 0"),
    (stats.tost_power, dict(delta=0.0, sd=NAN, n=10, margin=0.5), "sd must be a finite number > 0 (the sd of the "
                                                                  "paired differences), got nan"),
    (stats.tost_power, dict(delta=0.0, sd=math.inf, n=10, margin=0.5), "got inf"),
    (stats.tost_power, dict(delta=NAN, sd=1.0, n=10, margin=0.5), "delta must be a finite number (the true mean "
                                                                  "difference a − b), got nan"),
    (stats.tost_power, dict(delta=0.0, sd=1.0, n=1, margin=0.5), "n must be in [2, 1000000000000], got 1"),
    (stats.tost_power, dict(delta=0.0, sd=1.0, n=10, margin=0.5, alpha=0.5), "alpha must be in (0, 0.5), got 0.5"),
    (stats.binomial_sample_size, dict(p0=0.5, p1=0.6, target=0.05), "target must be a power in (alpha, 1) = "
                                                                    "(0.05, 1), got 0.05"),
    (stats.binomial_sample_size, dict(p0=0.5, p1=0.6, target=0.01), "target must be a power in (alpha, 1)"),
    (stats.binomial_sample_size, dict(p0=0.5, p1=0.6, target=1.0), "got 1.0"),
    (stats.binomial_sample_size, dict(p0=0.5, p1=0.5), "p1 must lie on the alternative's side of p0 (two-sided): "
                                                      "got p0=0.5, p1=0.5"),
    (stats.binomial_sample_size, dict(p0=0.5, p1=0.4, alternative="greater"), "p1 must lie on the alternative's"),
    (stats.binomial_sample_size, dict(p0=0.5, p1=0.6, n_achieved=0), "n_achieved must be in [1, 10000000], got 0"),
    (stats.mcnemar_sample_size, dict(p10=0.2, p01=0.1, target=0.03), "target must be a power in (alpha, 1) = "
                                                                     "(0.05, 1), got 0.03"),
    (stats.mcnemar_sample_size, dict(p10=0.2, p01=0.2), "p10 must differ from p01"),
    (stats.tost_sample_size, dict(delta=0.0, sd=1.0, margin=0.5, target=0.05), "target must be a power in (alpha, 1)"),
    (stats.tost_sample_size, dict(delta=0.5, sd=1.0, margin=0.5), "|delta| must be below the margin (else the power "
                                                                  "never exceeds alpha), got delta=0.5, margin=0.5"),
    (stats.tost_sample_size, dict(delta=0.0, sd=1.0, margin=-2.0), "margin must be a finite number > 0"),
    (stats.binomial_mde, dict(p0=0.5, n=50, target=0.04), "target must be a power in (alpha, 1)"),
    (stats.binomial_mde, dict(p0=0.5, n=50, direction="up"), "direction must be 'greater' or 'less'"),
    (stats.binomial_mde, dict(p0=0.5, n=50, alternative="greater", direction="less"), "got 'less'"),
    (stats.mcnemar_mde, dict(discordant=0.0, n=50), "discordant must be a probability in (0, 1] (p10 + p01), got 0.0"),
    (stats.mcnemar_mde, dict(discordant=1.5, n=50), "discordant must be a probability in (0, 1] (p10 + p01), got 1.5"),
    (stats.tost_mde, dict(sd=1.0, n=50, margin=0.5, target=0.05), "target must be a power in (alpha, 1)"),
    (stats.plan_sample_size, dict(power_fn=lambda n: 0.9, target=0.0), "target must be a power in (0, 1), got 0.0"),
    (stats.plan_sample_size, dict(power_fn=lambda n: 0.9, n_min=0), "n_min must be in [1, 1000000000000], got 0"),
    (stats.plan_sample_size, dict(power_fn=lambda n: 0.9, n_min=10, n_max=5), "n_max must be in [10, "),
    (stats.plan_sample_size, dict(power_fn=0.9), "power_fn must be a callable n -> power, got 0.9"),
]


@pytest.mark.parametrize("function, kwargs, message", BAD,
                         ids=[f"{f.__name__}-{'-'.join(f'{k}={v!r}' for k, v in kw.items())}" for f, kw, _ in BAD])
def test_bad_input_is_refused_naming_the_argument_and_value(function, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        function(**kwargs)


def test_the_planning_names_are_public_in_kvstats_stats():
    for module in (_exact_power, _planning):
        for name in module.__all__:
            assert getattr(stats, name) is getattr(module, name) and name in stats.__all__
        assert getattr(stats, name).__module__ == "kvstats.measure.stats"
