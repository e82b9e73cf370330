"""A claim's sample size planned by power (kvstats.study.claims.SampleSize): made from the exact power tools'
SamplePlan, checked when made and when read, written with the claim and printed by the report (issue 50, item 1)."""

from __future__ import annotations

import math

import pytest

from kvstats import stats
from kvstats.measure import verdicts
from kvstats.study.claims import Claim, SampleSize, validate_claim
from kvstats.study.report import build_report, read_claims, sample_text, write_claims


def _claim(cid: str, sample: SampleSize | None) -> Claim:
    return Claim(id=cid, claim="a claim", source="kvstats", measurement="m", data="d",
                 verdict=verdicts.measured("our own measurement"), sample=sample)


def test_a_sample_size_from_a_plan_carries_its_numbers():
    plan = stats.mcnemar_sample_size(0.15, 0.05, n_achieved=100)
    sample = SampleSize.from_plan(plan, effect="p_a − p_b = 0.10 at 20% discordance", mde_of="p_a − p_b")
    assert (sample.planned_n, sample.achieved_n, sample.power) == (plan.n_planned, 100, 0.8)
    assert sample.mde == pytest.approx(stats.mcnemar_mde(0.2, 100)) and sample.under_powered
    assert plan.n_planned == 168  # docs/statistics.md's example
    with pytest.raises(ValueError, match="n_achieved"):
        SampleSize.from_plan(stats.mcnemar_sample_size(0.15, 0.05), effect="e", mde_of="m")
    nothing = SampleSize.from_plan(stats.tost_sample_size(0.0, 1.0, margin=0.5, n_achieved=2), effect="±0.5 sd",
                                   mde_of="|Δ| shown equivalent")
    assert nothing.mde is None  # no |Δ| is shown equivalent with 80% power at 2 pairs


@pytest.mark.parametrize("field, value, match", [
    ("planned_n", 0, "planned_n.*>= 1"), ("achieved_n", 2.5, "achieved_n"), ("achieved_n", True, "achieved_n"),
    ("mde", math.nan, "mde"), ("mde", math.inf, "mde"), ("power", 1.0, "power"), ("test", " ", "test"),
    ("unit", None, "unit"),
])
def test_a_bad_sample_size_is_refused_naming_the_field(field, value, match):
    good = dict(test="exact McNemar test", effect="0.1", planned_n=168, achieved_n=100, mde=0.2, mde_of="d")
    with pytest.raises(ValueError, match=match):
        SampleSize(**(good | {field: value}))
    with pytest.raises(ValueError, match=match):  # the same check when a stored claim is read
        validate_claim(_claim("c", None).to_dict() | {"sample": dict(good, power=0.8, unit="trials") | {field: value}})
    with pytest.raises(ValueError, match="exactly the fields"):
        validate_claim(_claim("c", None).to_dict() | {"sample": {"test": "t"}})


def test_the_report_prints_planned_and_achieved_n_and_the_mde(tmp_path):
    figures = tmp_path / "figures"
    enough = SampleSize(test="exact binomial test", effect="p = 0.6 against ½", planned_n=210, achieved_n=240,
                        mde=0.0952, mde_of="p − ½")
    short = SampleSize(test="paired TOST", effect="margin ±0.05 nats", planned_n=52, achieved_n=30, mde=None,
                       mde_of="|Δ| shown equivalent", unit="documents")
    exact = Claim(id="exact", claim="a closed form", source="kvstats", measurement="m", data="d",
                  verdict=verdicts.identity([1.0], [1.0], atol=1e-12), sample="none planned: computed by quadrature")
    unplanned = Claim(id="unplanned", claim="a direction", source="kvstats", measurement="m", data="d",
                      verdict=verdicts.direction([1]))
    write_claims("mine", [_claim("enough", enough), _claim("short", short), _claim("none", None), exact, unplanned],
                 figures_dir=figures)
    stored = read_claims(figures / "data" / "mine_claims.json")
    assert stored[0]["sample"] == {**enough.__dict__} and stored[2]["sample"] is None
    assert stored[3]["sample"] == "none planned: computed by quadrature"
    text = build_report(figures, studies=["mine"]).read_text()
    assert ("Sample sizes: 2 of 5 claims planned by power (1 got fewer than planned: short); 1 without sampling; 1 "
            "measurements or labels that test nothing; **1 verdicts by a test with no plan recorded**: unplanned."
            ) in text
    assert "- **Sample size:** none planned: computed by quadrature." in text
    assert "- **Sample size:** none planned: a measurement of our own, held to no test." in text
    assert "- **Sample size:** **no plan recorded** for a verdict by a test." in text
    with pytest.raises(ValueError, match="non-empty reason"):
        validate_claim(_claim("c", None).to_dict() | {"sample": "  "})
    assert ("- **Sample size:** 240 trials achieved, 210 planned (exact binomial test, 80% power for p = 0.6 against "
            "½); minimum detectable p − ½ there 0.0952.") in text
    assert sample_text(stored[1]["sample"]).endswith("no effect is detectable with that power there — **fewer than "
                                                     "planned**.")
