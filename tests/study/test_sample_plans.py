"""kvstats.study.sample_plans: a claim's planned n, achieved n and MDE from its test, held to independent oracles
(statsmodels' power solution, a closed form, a Wilcoxon power simulation with scipy, the exact binomial tail)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from statsmodels.stats.power import TTestPower

from kvstats import stats
from kvstats.study import sample_plans as P
from kvstats.study.claims import SampleSize


@pytest.mark.parametrize("effect, sd, alpha", [(0.5, 1.0, 0.05), (0.1, 0.3, 0.01), (2.0, 1.0, 0.001)])
def test_wilcoxon_n_is_the_t_tests_n_times_pi_over_3(effect, sd, alpha):
    n_t = TTestPower().solve_power(effect_size=effect / sd, alpha=alpha, power=0.8)
    floor = next(n for n in range(2, 100) if stats.wilcoxon_min_pvalue(n) < alpha)
    assert P.wilcoxon_n(effect, sd, alpha=alpha) == max(floor, math.ceil(n_t * math.pi / 3))


def test_wilcoxon_n_at_holm_levels_and_far_out_is_the_exact_t_solution():
    # at α = 0.05/1530 statsmodels' solve_power stops at 74.2 pairs for d_z = 0.5, where the power is 0.46; the exact
    # noncentral-t power (scipy) reaches 0.8 only at ≈ 108.4 pairs. At d_z = 0.002 (≈ 2·10⁶ pairs) the exact
    # solution agrees with Guenther's ((z_{α/2} + z_β)/d)² + z²_{α/2}/2 to a few pairs (his formula drops
    # O(1/n) terms).
    alpha = 0.05 / 1530

    def power(d, n, a):
        t = scipy.stats.t.isf(a / 2, n - 1)
        return scipy.stats.nct.sf(t, n - 1, d * math.sqrt(n)) + scipy.stats.nct.sf(t, n - 1, -d * math.sqrt(n))

    n_t = next(n for n in range(50, 200) if power(0.5, n, alpha) >= 0.8)
    assert power(0.5, n_t - 1, alpha) < 0.8 <= power(0.5, n_t, alpha) and n_t == 109
    assert P.wilcoxon_n(0.5, 1.0, alpha=alpha) in (math.ceil((n_t - 1) * math.pi / 3), math.ceil(n_t * math.pi / 3))
    z = scipy.stats.norm.isf(0.025) + scipy.stats.norm.ppf(0.8)
    guenther = (z / 0.002) ** 2 + scipy.stats.norm.isf(0.025) ** 2 / 2
    assert abs(P.wilcoxon_n(0.002, 1.0, alpha=0.05) - guenther * math.pi / 3) <= 10


@pytest.mark.parametrize("effect", [5.0, 6.0, 20.0, 1e6])
def test_wilcoxon_n_of_an_effect_many_sds_large_is_the_wilcoxon_floor(effect):
    # statsmodels' root finder returns nan where fewer than 3 pairs would do: the floor decides there
    floor = next(n for n in range(2, 100) if stats.wilcoxon_min_pvalue(n) < 0.05)
    assert P.wilcoxon_n(effect, 1.0, alpha=0.05) == floor == 6


def test_the_planned_wilcoxon_n_reaches_its_power_in_simulation():
    # normal differences d_z = 0.5 at α = 0.05: planned n ≈ 35. 20,000 simulated samples estimate the power with sd
    # ≤ 0.0035; the band [0.78, 0.86] is ≥ 5.7 sd from 0.8 on both sides (the planned n is rounded up, so the true
    # power lies in about [0.80, 0.82]): a correct plan fails with probability < 1e-8. Fixed seed.
    n = P.wilcoxon_n(0.5, 1.0, alpha=0.05)
    rng = np.random.default_rng(20261207)
    draws = rng.normal(0.5, 1.0, size=(20_000, n))
    power = float(np.mean(scipy.stats.wilcoxon(draws, axis=1).pvalue < 0.05))
    assert 0.78 <= power <= 0.86, (n, power)


def test_wilcoxon_mde_is_detectable_shift_from_the_sd_alone():
    d = np.random.default_rng(3).normal(0.2, 0.7, size=40)
    sd = float(np.std(d, ddof=1))
    assert P.wilcoxon_mde(40, sd, alpha=0.01) == pytest.approx(
        stats.detectable_shift(d, alpha=0.01).extra["shift"], rel=1e-12)
    assert P.wilcoxon_mde(5, sd, alpha=0.01) is None  # 5 pairs: the smallest p is 0.0625


def test_paired_sample_takes_the_hardest_cell():
    cells = [P.PairedCell(n=40, sd=0.1, scale=1.0), P.PairedCell(n=30, sd=0.5, scale=2.0)]
    s = P.paired_sample(cells, effect=0.1, effect_words="10% of the median", alpha=0.01, unit="trials")
    assert s.planned_n == max(P.wilcoxon_n(0.1, 0.1, alpha=0.01), P.wilcoxon_n(0.2, 0.5, alpha=0.01))
    assert s.achieved_n == 30
    assert s.mde == pytest.approx(max(P.wilcoxon_mde(40, 0.1, alpha=0.01), P.wilcoxon_mde(30, 0.5, alpha=0.01) / 2))
    absolute = P.paired_sample(cells, effect=0.1, effect_words="0.1", alpha=0.01, unit="trials", relative=False)
    assert absolute.planned_n == P.wilcoxon_n(0.1, 0.5, alpha=0.01)
    with pytest.raises(ValueError, match="cells must hold"):
        P.paired_sample([], effect=0.1, effect_words="e", alpha=0.01, unit="trials")
    with pytest.raises(ValueError, match=r"cells\[0\].scale"):
        P.paired_sample([P.PairedCell(10, 1.0, 0.0)], effect=0.1, effect_words="e", alpha=0.01, unit="trials")


def test_paired_cells_read_a_compare_table():
    rng = np.random.default_rng(0)
    import pandas as pd
    rows = [{"unit": u, "scheme": s, "x": rng.normal(1.0 if s == "a" else 1.2, 0.1)} for u in range(12) for s in "ab"]
    table = stats.compare(pd.DataFrame(rows), "x", "scheme", paired_by="unit")
    (cell,) = P.paired_cells(table)
    a = np.array([r["x"] for r in rows if r["scheme"] == "a"])
    b = np.array([r["x"] for r in rows if r["scheme"] == "b"])
    assert cell.n == 12 and cell.sd == pytest.approx(np.std(a - b, ddof=1)) and cell.scale == pytest.approx(
        abs(np.median(b)))
    with pytest.raises(ValueError, match="sd_difference"):
        P.paired_cells(table.drop(columns="sd_difference"))


def test_interval_sample_is_the_normal_theory_closed_form():
    s = P.interval_sample((-1.959963984540054, 1.959963984540054), 100, effect=2.8, effect_words="2.8",
                          test="normal CI", unit="samples")
    mde = scipy.stats.norm.isf(0.025) + scipy.stats.norm.ppf(0.8)  # se = 1
    assert s.mde == pytest.approx(mde, rel=1e-12) and s.planned_n == math.ceil(100 * (mde / 2.8) ** 2)
    with pytest.raises(ValueError, match="ci must be"):
        P.interval_sample((1.0, 0.0), 10, effect=1.0, effect_words="e", test="t", unit="u")
    with pytest.raises(ValueError, match="effect must be"):
        P.interval_sample((0.0, 1.0), 10, effect=0.0, effect_words="e", test="t", unit="u")


def test_tost_and_mcnemar_samples_are_the_exact_planners():
    s = P.tost_sample(0.2, 60, margin=0.1, effect_words="±0.1", unit="documents")
    plan = stats.tost_sample_size(0.0, 0.2, margin=0.1, n_achieved=60)
    assert (s.planned_n, s.achieved_n, s.mde) == (plan.n_planned, 60, plan.mde_achieved)
    assert 0 < s.mde < 0.1 and P.tost_sample(0.2, 30, margin=0.1, effect_words="e", unit="u").mde is None
    m = P.mcnemar_sample(0.15, 0.05, 100, effect_words="0.10", unit="prompts")
    assert m.planned_n == 168 and m.achieved_n == 100  # docs/statistics.md's example


def test_binomial_sample_of_a_bound_with_no_failures_expected():
    # H0: rate = 0.05 against less; with none expected the test rejects at 0 failures once 0.95ⁿ ≤ 0.05: n = 59
    s = P.binomial_sample(0, 40, limit=0.05, expected=0.0, effect_words="no failure", unit="trials")
    assert s.planned_n == math.ceil(math.log(0.05) / math.log(0.95)) == 59 and s.achieved_n == 40
    assert s.mde is None  # 40 trials cannot show any rate below 0.05
    with pytest.raises(ValueError, match="failures"):
        P.binomial_sample(41, 40, limit=0.05, expected=0.0, effect_words="e", unit="trials")


def test_hardest_part_and_reasons():
    a = SampleSize(test="t", effect="e", planned_n=10, achieved_n=20, mde=0.1, mde_of="m")
    b = SampleSize(test="t", effect="e", planned_n=30, achieved_n=20, mde=0.2, mde_of="m")
    assert P.hardest([a, P.EXACT, b, None]) is b
    assert P.hardest([P.EXACT, None]) == P.EXACT
    with pytest.raises(ValueError, match="samples must hold"):
        P.hardest([None])


def test_signed_rank_shift_se_is_the_hodges_lehmann_spread():
    # normal differences: se² → πσ²/(3n) (the Wilcoxon test's efficiency 3/π); at n = 400, σ = 2 the interval's
    # order statistics estimate it within a few percent (sd of the width's estimate ≈ 5% at this n; seed fixed)
    d = np.random.default_rng(11).normal(0.3, 2.0, 400)
    assert stats.signed_rank_shift_se(d) == pytest.approx(2.0 * math.sqrt(math.pi / (3 * 400)), rel=0.1)
    # independent oracle: the interval from every Walsh average by brute force (n = 30)
    small = np.random.default_rng(12).standard_t(2, 30)
    walsh = np.sort([(small[i] + small[j]) / 2 for i in range(30) for j in range(i, 30)])
    z = scipy.stats.norm.isf(0.025)
    k = math.floor(walsh.size / 2 - z * math.sqrt(30 * 31 * 61 / 24))
    assert stats.signed_rank_shift_se(small) == pytest.approx((walsh[-1 - k] - walsh[k]) / (2 * z), rel=1e-12)
    # beyond SHIFT_SE_MAX_N differences: evenly spaced order statistics, scaled by √(thinned/n)
    big = np.random.default_rng(13).normal(0.0, 1.0, 20_000)
    assert stats.signed_rank_shift_se(big) == pytest.approx(math.sqrt(math.pi / (3 * 20_000)), rel=0.05)
    with pytest.raises(ValueError, match="differences"):
        stats.signed_rank_shift_se([1.0])


def test_the_rank_plan_ignores_heavy_tails_the_sd_plan_inflates():
    # Cauchy differences: the sd plan needs orders of magnitude more pairs than the rank plan. The rank plan is
    # asymptotic (Pitman): from a 4,000-draw pilot it plans ≈ 105 pairs for a shift of 0.5, where simulation gives
    # power ≈ 0.76 (normal differences: ≈ 0.80). 20,000 simulated samples: sd of a power estimate ≤ 0.0035, so the
    # band [0.72, 0.88] is > 10 sd from the values expected; a correct plan fails with probability < 1e-20. Seeded.
    rng = np.random.default_rng(5)
    for draw in (rng.standard_cauchy, lambda size: rng.normal(0.0, 1.0, size)):
        cell = P.PairedCell.from_differences(draw(4000))
        rank = P.paired_sample([cell], effect=0.5, effect_words="0.5", alpha=0.05, unit="u", relative=False)
        z = scipy.stats.norm.isf(0.025) + scipy.stats.norm.ppf(0.8)
        assert rank.mde == pytest.approx(z * cell.shift_se) and "Hodges–Lehmann" in rank.test
        power = float(np.mean(scipy.stats.wilcoxon(0.5 + draw((20_000, rank.planned_n)), axis=1).pvalue < 0.05))
        assert 0.72 <= power <= 0.88, (rank.planned_n, power)
    pilot = P.PairedCell.from_differences(rng.standard_cauchy(200))
    sd_plan = P.paired_sample([P.PairedCell(pilot.n, pilot.sd)], effect=0.5, effect_words="0.5", alpha=0.05,
                              unit="u", relative=False)
    rank_plan = P.paired_sample([pilot], effect=0.5, effect_words="0.5", alpha=0.05, unit="u", relative=False)
    assert sd_plan.planned_n > 50 * rank_plan.planned_n


def test_ks_plans_against_kolmogorovs_limit_law():
    """The KS plans against their closed forms in Kolmogorov's limit law (K = √n·D_n): equivalence at true distance
    0, n ≈ ((K_{0.95} + K_{0.8})/margin)²; exceedance at a true distance ``gap`` beyond the margin,
    n ≈ ((K_{0.95} + z_{0.8}/2)/gap)² — within 1% at these n (10⁴ draws). The MDEs at the planned n are the effects
    planned for."""
    k, margin = scipy.stats.kstwobign, 0.02
    fit = P.ks_equivalence_sample(32768, margin=margin, effect_words="x")
    assert fit.planned_n == pytest.approx(((k.isf(0.05) + k.ppf(0.8)) / margin) ** 2, rel=0.01)
    gap = 1 / 32 - margin
    off = P.ks_exceedance_sample(32768, margin=margin, gap=gap, effect_words="x")
    assert off.planned_n == pytest.approx(((k.isf(0.05) + scipy.stats.norm.ppf(0.8) / 2) / gap) ** 2, rel=0.01)
    assert P.ks_equivalence_sample(fit.planned_n, margin=margin, effect_words="x").mde == pytest.approx(0, abs=1e-4)
    assert P.ks_exceedance_sample(off.planned_n, margin=margin, gap=gap, effect_words="x").mde == pytest.approx(
        gap, rel=1e-3)
    assert P.ks_equivalence_sample(64, margin=margin, effect_words="x").mde is None  # too few to show a fit
    with pytest.raises(ValueError, match="margin"):
        P.ks_equivalence_sample(64, margin=0.0, effect_words="x")


def test_ks_equivalence_plan_is_the_fewest_draws_by_kolmogorovs_exact_law():
    """The fewest draws at which a sample of the law itself (true distance 0) is shown within the margin with power
    0.8, D + kstwo.isf(α, n) < margin, by Kolmogorov's exact law; asymptotically ((K_{1−α} + K_{0.8})/margin)² with K
    the quantiles of sup|Brownian bridge| (kstwobign): ≈ 14,770 at 0.02."""
    s = P.ks_equivalence_sample(20_000, margin=0.02, effect_words="x")

    def power(n):
        return scipy.stats.kstwo.cdf(0.02 - scipy.stats.kstwo.isf(0.05, n), n)

    assert power(s.planned_n) >= 0.8 > power(s.planned_n - 1)
    asymptotic = ((scipy.stats.kstwobign.isf(0.05) + scipy.stats.kstwobign.ppf(0.8)) / 0.02) ** 2
    assert s.planned_n == pytest.approx(asymptotic, rel=0.01) and s.achieved_n == 20_000
    assert s.mde == pytest.approx(0.02 - scipy.stats.kstwo.isf(0.05, 20_000) - scipy.stats.kstwo.ppf(0.8, 20_000))
