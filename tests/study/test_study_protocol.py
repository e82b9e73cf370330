"""The typed study protocol: Claim records checked when made, and Study.main running declared sweeps."""

from __future__ import annotations

import json

import pytest

from kvstats import study
from kvstats.measure import verdicts
from kvstats.study.claims import Claim, listing, measurement
from kvstats.study.report import read_claims, write_claims
from kvstats.study.sweep import grid

RULED = verdicts.identity([1.0], 1.0, rtol=1e-9, what="values")


def _claim(**changes) -> Claim:
    fields = dict(id="x-1", claim="x is 1.", source="Paper, arXiv 0000.00000, §1", measurement="x = 1.",
                  data="a closed form", verdict=RULED)
    return Claim(**(fields | changes))


def test_a_claim_is_checked_when_it_is_made():
    with pytest.raises(TypeError, match="verdict must be a kvstats.measure.verdicts.Verdict"):
        _claim(verdict="reproduced")
    with pytest.raises(ValueError, match=r"\['measurement'\] must be a non-empty string"):
        _claim(measurement=" ")
    with pytest.raises(ValueError, match="needs a verdict by a rule"):
        _claim(verdict=verdicts.Verdict("measured", "measured", "our own number"))
    assert _claim(source="kvstats", verdict=verdicts.Verdict("measured", "measured", "ours")).source == "kvstats"
    with pytest.raises(TypeError, match=r"\['figure'\] must be a string or None"):
        _claim(figure=3)


def test_write_claims_takes_claims_and_writes_what_a_dict_would(tmp_path):
    c = _claim(figure="x.png")
    write_claims("proto_a", [c], scale="quick", position=5, figures_dir=tmp_path)
    write_claims("proto_b", [c.to_dict()], scale="quick", position=5, figures_dir=tmp_path)
    a = json.loads((tmp_path / "data" / "proto_a_claims.json").read_text())
    b = json.loads((tmp_path / "data" / "proto_b_claims.json").read_text())
    assert a == b and a[0]["rule"] == "identity" and a[0]["verdict"] == "reproduced" and a[0]["figure"] == "x.png"


def test_templates():
    assert listing({2: 0.5, 8: 0.25}.items(), "d = {}: {:.2f}") == "d = 2: 0.50, d = 8: 0.25"
    assert measurement("a = 1", "", "b = 2") == "a = 1; b = 2."
    assert measurement("done.") == "done."


def square_cell(x: int) -> list[dict]:
    return [{"square": x * x}]


class Squares(study.Study):
    name, version, position = "proto_squares", "1", 3
    seen: dict = {}

    def cells(self, scale):
        return {"proto_squares": (square_cell, grid(x=[1, 2, 3] if scale == "quick" else [1, 2, 3, 4]))}

    def analyse(self, tables, scale):
        return {"total": int(tables["proto_squares"]["square"].sum()), "scale": scale}

    def figures(self, tables, analysis):
        self.seen["figures"] = analysis

    def claims(self, analysis):
        total = analysis["total"]
        return [Claim(id="squares-sum", claim="1 + 4 + 9 = 14.", source="arithmetic", measurement=f"sum {total}.",
                      data="three cells", verdict=verdicts.identity([total], 14, atol=0.5, what="sums"))]

    def definitions(self, analysis):
        return {"square": "x·x"}


def test_a_study_on_the_protocol_runs_its_sweeps_and_writes_its_claims(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    assert Squares().main(["--scale", "quick", "--n-jobs", "1", "--no-progress"]) == 0
    assert Squares.seen["figures"] == {"total": 14, "scale": "quick"}
    claims = read_claims(tmp_path / "figures" / "data" / "proto_squares_claims.json")
    assert [(c["id"], c["verdict"], c["position"], c["scale"]) for c in claims] == [
        ("squares-sum", "reproduced", 3, "quick")]
    assert "proto_squares done in" in capsys.readouterr().out
    # the paper scale sweeps other cells: 1 + 4 + 9 + 16 = 30 is not 14, and the rule says so
    assert Squares().main(["--scale", "paper", "--n-jobs", "1", "--no-progress"]) == 0
    again = read_claims(tmp_path / "figures" / "data" / "proto_squares_claims.json")
    assert again[0]["verdict"] == "not reproduced" and again[0]["scale"] == "paper"
