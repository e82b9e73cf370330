"""The verdict rules: each rule is fed numbers for which it must return each verdict it can give."""

import pytest

from kvstats.measure import verdicts as V


def test_printed_half_unit():
    assert V.printed_half_unit("2.25") == pytest.approx(0.005)
    assert V.printed_half_unit("0.03") == pytest.approx(0.005)
    assert V.printed_half_unit("5") == pytest.approx(0.5)
    assert V.printed_half_unit("1e-23") == pytest.approx(0.5e-23)
    with pytest.raises(ValueError, match="printed"):
        V.printed_half_unit("about two")


def test_cell_direction():
    assert V.cell_direction(1e-5, -0.9, expected_sign=-1) == 1
    assert V.cell_direction(1e-5, +0.9, expected_sign=-1) == -1
    assert V.cell_direction(0.2, -0.9, expected_sign=-1) == 0
    assert V.cell_direction(0.049, 0.1, expected_sign=1, alpha=0.05) == 1
    assert V.cell_direction(0.05, 0.1, expected_sign=1, alpha=0.05) == 0  # p = alpha is not significant
    with pytest.raises(ValueError, match="expected_sign"):
        V.cell_direction(0.01, 1.0, expected_sign=0)
    with pytest.raises(ValueError, match="pvalue"):
        V.cell_direction(float("nan"), 1.0, expected_sign=1)


@pytest.mark.parametrize("cells, verdict", [
    ([1, 1, 1], "reproduced"),
    ([1, 0, 1], "partly"),
    ([1, -1], "partly"),
    ([0, 0], "inconclusive"),        # absence of evidence is not a refutation (issue 48, item 1)
    ([-1, 0], "not reproduced"),
    ([-1, -1], "not reproduced"),
])
def test_direction_rule(cells, verdict):
    v = V.direction(cells, what="data sets")
    assert v.verdict == verdict and v.rule == "direction"
    assert f"{cells.count(1)} of {len(cells)} data sets" in v.reason


def test_direction_rule_refuses_bad_cells():
    with pytest.raises(ValueError, match="cells"):
        V.direction([])
    with pytest.raises(ValueError, match="cell_direction"):
        V.direction([True, 2])


@pytest.mark.parametrize("published, ci, rtol, verdict", [
    (2.25, (2.0, 2.5), 0.0, "reproduced"),
    (2.25, (2.255, 2.6), 0.0, "partly"),     # the printed digits give no slack: 2.25 is outside [2.255, 2.6]
    (2.25, (2.255, 2.6), 0.01, "reproduced"),  # a declared 1% tolerance (0.0225) covers the 0.005 gap
    (2.25, (4.05, 4.33), 0.0, "partly"),     # direction holds (ratio > 1), number does not
    (2.25, (0.8, 1.3), 0.0, "not reproduced"),  # the CI excludes 2.25 and does not establish the direction
    (2.25, (0.5, 10.0), 0.0, "inconclusive"),   # the CI holds both the claim and the null (issue 48, item 1)
])
def test_number_rule(published, ci, rtol, verdict):
    v = V.number(published, ci, null=1.0, expected_sign=1, rtol=rtol, estimate=sum(ci) / 2)
    assert v.verdict == verdict and v.rule == "number"
    assert ("inside" in v.reason) == (verdict in ("reproduced", "inconclusive"))


def test_number_inconclusive_states_what_would_decide_it():
    v = V.number(2.25, (0.5, 10.0), null=1.0, expected_sign=1, n=40)
    assert v.verdict == "inconclusive"
    plan = V.plan_from_interval((0.5, 10.0), 40, distance=1.25)
    assert str(plan) in v.reason and "would decide it" in v.reason
    assert "no sample size given" in V.number(2.25, (0.5, 10.0), null=1.0, expected_sign=1).reason


def test_number_without_a_direction_part_can_fail():
    """A positive quantity (D_mse, a variance) has the trivial null 0: with null=None the number alone decides,
    so a CI excluding the published value is *not reproduced*, never *partly* on a direction that cannot fail."""
    assert V.number(0.03, (0.0339659, 0.0339659), null=None, rtol=0.05).verdict == "not reproduced"
    assert V.number(0.117, (0.1160001, 0.1160001), null=None, rtol=0.05).verdict == "reproduced"
    assert "no direction part" in V.number(0.03, (0.02, 0.04), null=None).reason


def test_number_refuses_a_published_value_on_the_null_side():
    with pytest.raises(ValueError, match="claimed side"):
        V.number(0.5, (0.4, 0.6), null=1.0, expected_sign=1)


def test_number_rule_severity_is_monotone_in_the_gap():
    """TurboQuant's printed D_mse against the exact values at d = 128 (issue 28, item 4): with one relative
    tolerance the coarsely printed 0.03 (−11.7%) fails while 0.117 (+0.9%) passes — half a unit of the printed
    digit would have done the opposite. The exact values are recomputed from the codebook of f_128."""
    from kvstats.quant.codebooks import beta_codebook
    exact = {b: beta_codebook(128, b).d_mse for b in (2, 3)}
    assert exact[2] == pytest.approx(0.1160001, abs=1e-7) and exact[3] == pytest.approx(0.0339659, abs=1e-7)
    rule = {b: V.number(p, (exact[b], exact[b]), null=None, rtol=0.05).verdict
            for b, p in ((2, 0.117), (3, 0.03))}
    assert rule == {2: "reproduced", 3: "not reproduced"}
    with pytest.raises(ValueError, match="rtol"):
        V.number(1.0, (1.0, 1.0), null=0.0, expected_sign=1, rtol=-0.1)


def test_rounding_is_stated_separately():
    assert V.rounding("0.03", 0.033966) == "0.03 is 0.033966 rounded to 2 decimals (printed -11.7% off)"
    assert V.rounding("0.117", 0.116405).startswith("0.117 is not 0.1164 rounded to 3 decimals (that is 0.116;")
    assert V.rounding("2", 2.4).startswith("2 is 2.4 rounded to 0 decimals")
    with pytest.raises(ValueError, match="printed"):
        V.rounding("two", 2.0)


def test_implementation_check_labels_what_cannot_fail():
    ok = V.implementation_check(V.identity([1.0], 1.0, atol=1e-9), "construction of the transform")
    assert ok.verdict == "implementation check" and "construction of the transform" in ok.reason
    bad = V.implementation_check(V.identity([1.5], 1.0, atol=1e-9), "Jensen's inequality")
    assert bad.verdict == "check failed"
    with pytest.raises(TypeError, match="check"):
        V.implementation_check(V.measured("x"), "a theorem")
    with pytest.raises(ValueError, match="combine"):
        V.combine([ok])


def test_number_rule_below_null():
    assert V.number(-0.5, (-0.6, -0.4), null=0.0, expected_sign=-1).verdict == "reproduced"
    assert V.number(-0.5, (-0.3, -0.1), null=0.0, expected_sign=-1).verdict == "partly"
    assert V.number(-0.5, (0.1, 0.3), null=0.0, expected_sign=-1).verdict == "not reproduced"
    with pytest.raises(ValueError, match="low <= high"):
        V.number(1.0, (2.0, 1.0), null=0.0, expected_sign=1)


@pytest.mark.parametrize("estimates, cis, verdict", [
    ([0.9, 0.95], [(0.8, 1.0), (0.9, 1.0)], "reproduced"),
    ([0.9, 1.05], [(0.8, 1.0), (0.95, 1.15)], "partly"),      # one met, one straddles the bound
    ([0.9, 1.2], [(0.8, 1.0), (1.1, 1.3)], "not reproduced"),  # CI wholly above the bound
    ([0.9, 0.95], [(0.8, 1.1), (0.9, 1.05)], "inconclusive"),  # both estimates within, both CIs across
    ([0.0], [(0.0, 9.27)], "inconclusive"),  # 0/100 failures whose CI allows a 9x violation (issue 48, item 1)
])
def test_bound_rule(estimates, cis, verdict):
    assert V.bound(estimates, cis, 1.0).verdict == verdict


def test_bound_is_met_by_the_far_end_not_the_point():
    v = V.bound([0.0], [(0.0, 9.27)], 1.0, n=100, unit="sketches")
    assert v.verdict == "inconclusive" and "0 of 1 cells within" in v.reason
    # the plan: the CI's far end reaches the bound 1 when its width shrinks by 9.27 -> 1, i.e. n x 9.27^2 / ...
    assert str(V.plan_from_interval((0.0, 9.27), 100, distance=1.0, unit="sketches")) in v.reason
    assert V.bound([0.5], [(0.4, 1.0)], 1.0).verdict == "reproduced"   # far end on the bound meets it


def test_bound_rule_lower():
    assert V.bound([1.1], [(1.05, 1.2)], 1.0, upper=False).verdict == "reproduced"
    assert V.bound([0.9], [(0.8, 0.95)], 1.0, upper=False).verdict == "not reproduced"
    assert V.bound([0.99], [(0.9, 1.05)], 1.0, upper=False).verdict == "inconclusive"
    assert V.bound([1.2, 1.05], [(1.1, 1.3), (0.99, 1.1)], 1.0, upper=False).verdict == "partly"


def test_bound_exact_values_never_inconclusive():
    assert V.bound([0.9], [(0.9, 0.9)], 1.0).verdict == "reproduced"
    assert V.bound([1.1], [(1.1, 1.1)], 1.0).verdict == "not reproduced"


@pytest.mark.parametrize("values, verdict", [
    ([1.0, 1.0000001], "reproduced"),
    ([1.0, 1.1], "partly"),
    ([1.2, 1.1], "not reproduced"),
])
def test_identity_rule(values, verdict):
    assert V.identity(values, 1.0, rtol=1e-6).verdict == verdict


def test_identity_needs_a_tolerance():
    with pytest.raises(ValueError, match="atol"):
        V.identity([1.0], 1.0)


def test_combine():
    r, p, n, u = (V.Verdict(v, "identity", "x") for v in ("reproduced", "partly", "not reproduced", "inconclusive"))
    assert V.combine([r, r]).verdict == "reproduced"
    assert V.combine([n, n]).verdict == "not reproduced"
    assert V.combine([r, n]).verdict == "partly"
    assert V.combine([r, p]).verdict == "partly"
    assert V.combine([u, u]).verdict == "inconclusive"
    assert V.combine([n, u]).verdict == "not reproduced"   # excluded in a part, supported in none
    assert V.combine([r, u]).verdict == "partly"
    with pytest.raises(ValueError, match="measured"):
        V.combine([r, V.measured("ours")])


def test_labels():
    assert V.measured("our own number").verdict == "measured"
    assert V.not_testable("needs LongBench").verdict == "not testable here"
    with pytest.raises(ValueError, match="reason"):
        V.not_testable("")
    with pytest.raises(ValueError, match="verdict"):
        V.Verdict("matches", "x", "y")


@pytest.mark.parametrize("cis, verdict", [
    ([(-0.02, 0.03), (-0.01, 0.01)], "reproduced"),
    ([(-0.02, 0.03), (0.06, 0.09)], "not reproduced"),
    ([(-0.02, 0.03), (-0.02, 0.08)], "partly"),
    ([(-0.083, 0.083)], "inconclusive"),   # a perfect 30-trial agreement against a 5-point margin (item 6)
])
def test_equivalence_rule(cis, verdict):
    assert V.equivalence(cis, 0.05).verdict == verdict


def test_equivalence_plan():
    v = V.equivalence([(-0.083, 0.083)], 0.05, n=30, unit="trials")
    plan = V.plan_from_interval((-0.083, 0.083), 30, distance=0.05, level=0.9, unit="trials")
    assert v.verdict == "inconclusive" and str(plan) in v.reason and plan.n_needed > 30


def test_plans_against_statsmodels_power():
    """Oracle: statsmodels' one-sample normal power (NormalIndPower, ratio=0) solved for the effect and for n."""
    from statsmodels.stats.power import NormalIndPower
    n, ci = 40, (0.5, 10.0)
    plan = V.plan_from_interval(ci, n, distance=1.25)
    sigma = (ci[1] - ci[0]) / (2 * 1.959963984540054) * n ** 0.5          # the standard deviation of one sample
    power = NormalIndPower()
    mde = power.solve_power(effect_size=None, nobs1=n, alpha=0.05, power=0.8, ratio=0) * sigma
    n_needed = power.solve_power(effect_size=1.25 / sigma, nobs1=None, alpha=0.05, power=0.8, ratio=0)
    assert plan.mde == pytest.approx(mde, rel=1e-4)
    assert abs(plan.n_needed - n_needed) <= 1
    test_plan = V.plan_from_test(0.2, 0.3, 50)      # z = 1.2816: se = 0.3 / 1.2816
    se = 0.3 / 1.2815515655446004
    assert test_plan.mde == pytest.approx(
        power.solve_power(effect_size=None, nobs1=50, alpha=0.05, power=0.8, ratio=0) * se * 50 ** 0.5, rel=1e-4)
    assert abs(test_plan.n_needed - power.solve_power(effect_size=0.3 / (se * 50 ** 0.5), nobs1=None, alpha=0.05,
                                                      power=0.8, ratio=0)) <= 1


def test_plan_refuses_bad_input():
    with pytest.raises(ValueError, match="n must be an int"):
        V.plan_from_interval((0, 1), 1, distance=0.5)
    with pytest.raises(ValueError, match="pvalue"):
        V.plan_from_test(1.0, 0.3, 50)
    with pytest.raises(ValueError, match="effect"):
        V.plan_from_test(0.5, 0.0, 50)
    with pytest.raises(TypeError, match="plan"):
        V.direction([0], plan="lots")
    assert V.plan_from_interval((0, 1), 10, distance=0.0).n_needed is None


def test_direction_inconclusive_quotes_its_plan():
    plan = V.plan_from_test(0.3, -0.2, 80, unit="trials")
    v = V.direction([0, 0], plan=plan)
    assert v.verdict == "inconclusive" and str(plan) in v.reason


def test_binomial_plan_against_closed_forms():
    """0 failures: the two-sided 95% Clopper–Pearson upper end is 1 − 0.025^{1/N}, at most p₀ from
    N = ⌈ln 0.025 / ln(1 − p₀)⌉ (943 at p₀ = 1/256). The detectable excess: at p₁ = p₀ + mde the count reaches the
    first x whose interval's low end (statsmodels' 'beta' interval) exceeds p₀ with probability 0.8 (scipy)."""
    import math

    from scipy import stats
    from statsmodels.stats.proportion import proportion_confint
    p0 = 1 / 256
    plan = V.plan_from_binomial(0, 100, p0, unit="sketches")
    assert plan.n_needed == math.ceil(math.log(0.025) / math.log(1 - p0)) == 943
    x_crit = next(x for x in range(101) if proportion_confint(x, 100, alpha=0.05, method="beta")[0] > p0)
    assert stats.binom.sf(x_crit - 1, 100, p0 + plan.mde) == pytest.approx(0.8, abs=1e-9)
    assert V.plan_from_binomial(0, 100, p0, scale=256).mde == pytest.approx(256 * plan.mde)
    assert V.plan_from_binomial(1, 100, 0.01).n_needed is None  # the observed rate sits on the bound
    with pytest.raises(ValueError, match="failures"):
        V.plan_from_binomial(101, 100, p0)
    v = V.bound([0.0], [(0.0, 9.27)], 1.0, plan=plan)
    assert v.verdict == "inconclusive" and "about 943 sketches would decide it" in v.reason


def test_chain_fails_on_any_broken_link():
    r, p, n, u = (V.Verdict(v, "direction", "x") for v in ("reproduced", "partly", "not reproduced", "inconclusive"))
    assert V.chain([r, r]).verdict == "reproduced"
    assert V.chain([r, n, r]).verdict == "not reproduced"  # combine would say partly
    assert V.combine([r, n, r]).verdict == "partly"
    assert V.chain([u, u]).verdict == "inconclusive"
    assert V.chain([r, u]).verdict == "partly" and V.chain([r, p]).verdict == "partly"
    assert V.chain([r, n]).rule == "chain" and "necessary link" in V.chain([r, n]).reason
