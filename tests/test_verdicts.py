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


@pytest.mark.parametrize("published, ci, verdict", [
    (2.25, (2.0, 2.5), "reproduced"),
    (2.25, (2.255, 2.6), "reproduced"),  # within half a unit of the last printed digit (0.005)
    (2.25, (4.05, 4.33), "partly"),      # direction holds (ratio > 1), number does not
    (2.25, (0.8, 1.3), "not reproduced"),  # CI meets 1: the direction is not established
])
def test_number_rule(published, ci, verdict):
    v = V.number(published, ci, null=1.0, expected_sign=1, half_unit=0.005, estimate=sum(ci) / 2)
    assert v.verdict == verdict and v.rule == "number"
    assert ("inside" in v.reason) == (verdict == "reproduced")


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
