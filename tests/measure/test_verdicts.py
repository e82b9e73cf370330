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
    ([0, 0], "not reproduced"),
    ([-1, 0], "not reproduced"),
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
    (2.25, (0.8, 1.3), 0.0, "not reproduced"),  # CI meets 1: the direction is not established
])
def test_number_rule(published, ci, rtol, verdict):
    v = V.number(published, ci, null=1.0, expected_sign=1, rtol=rtol, estimate=sum(ci) / 2)
    assert v.verdict == verdict and v.rule == "number"
    assert ("inside" in v.reason) == (verdict == "reproduced")


def test_number_rule_severity_is_monotone_in_the_gap():
    """TurboQuant's printed D_mse against the exact values at d = 128 (issue 28, item 4): with one relative
    tolerance the coarsely printed 0.03 (−11.7%) fails while 0.117 (+0.5%) passes — half a unit of the printed
    digit would have done the opposite."""
    exact = {2: 0.116405, 3: 0.033966}
    rule = {b: V.number(p, (exact[b], exact[b]), null=0.0, expected_sign=1, rtol=0.05).verdict
            for b, p in ((2, 0.117), (3, 0.03))}
    assert rule == {2: "reproduced", 3: "partly"}
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
    ([0.9, 1.05], [(0.8, 1.0), (0.95, 1.15)], "partly"),     # above, not significantly
    ([0.9, 1.2], [(0.8, 1.0), (1.1, 1.3)], "not reproduced"),  # CI wholly above the bound
])
def test_bound_rule(estimates, cis, verdict):
    assert V.bound(estimates, cis, 1.0).verdict == verdict


def test_bound_rule_lower():
    assert V.bound([1.1], [(1.05, 1.2)], 1.0, upper=False).verdict == "reproduced"
    assert V.bound([0.9], [(0.8, 0.95)], 1.0, upper=False).verdict == "not reproduced"
    assert V.bound([0.99], [(0.9, 1.05)], 1.0, upper=False).verdict == "partly"


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
    r, p, n = (V.Verdict(v, "identity", "x") for v in ("reproduced", "partly", "not reproduced"))
    assert V.combine([r, r]).verdict == "reproduced"
    assert V.combine([n, n]).verdict == "not reproduced"
    assert V.combine([r, n]).verdict == "partly"
    assert V.combine([r, p]).verdict == "partly"
    with pytest.raises(ValueError, match="measured"):
        V.combine([r, V.measured("ours")])


def test_labels():
    assert V.measured("our own number").verdict == "measured"
    assert V.not_testable("needs LongBench").verdict == "not testable here"
    with pytest.raises(ValueError, match="reason"):
        V.not_testable("")
    with pytest.raises(ValueError, match="verdict"):
        V.Verdict("matches", "x", "y")
