"""The two tiers (docs/studies.md, "Tiers"): the everyday paper report and the full tier in figures/full.

A study declares the scales it runs at (``SCALES``); ``kvstats reproduce`` skips it at the others and names it; the
full scale writes into figures/full and never into the everyday folder; the paper report sets the full tier's rows
that its own claims lack beside its own, each row naming its tier, with that tier's timing table and code status.
"""

from __future__ import annotations

import json

import pytest

from kvstats.measure import verdicts as V
from kvstats.study import paths
from kvstats.study.report import build_report, read_timings, script_scales, write_claims, write_timings

STUDY_SCRIPT = """
import sys
from kvstats import study
from kvstats.measure.verdicts import measured
SCALES = {scales!r}
POSITION = {position}
if __name__ == "__main__":
    run = study.start({name!r}, None, sys.argv[1:], position=POSITION, scales=SCALES)
    ids = ["shared", "{name}-" + run.scale]
    run.finish([{{"id": i, "claim": "c", "source": "kvstats", "measurement": "at " + run.scale, "data": "d",
                  "verdict": measured("m"), "figure": None}} for i in ids], echo=False)
"""


def _script(folder, name, scales, position):
    (folder / f"{name}.py").write_text(STUDY_SCRIPT.format(name=name, scales=scales, position=position))


def _claim(i: str, figure: str | None = None) -> dict:
    return {"id": i, "claim": f"claim {i}", "source": "kvstats", "measurement": f"m {i}", "data": "d",
            "verdict": V.measured("m"), "figure": figure}


@pytest.fixture
def studies(tmp_path, monkeypatch):
    folder = tmp_path / "studies"
    folder.mkdir()
    _script(folder, "everyday", ("quick", "paper", "full"), 1)
    _script(folder, "synthetic", ("quick", "paper"), 2)
    _script(folder, "descriptive", ("quick", "full"), 3)
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    return folder


def test_each_scale_runs_the_studies_that_declare_it_and_the_full_one_writes_its_own_folder(studies, tmp_path, capsys):
    from kvstats.cli.parser import main

    figures = tmp_path / "figures"
    assert main(["reproduce", "--studies-dir", str(studies), "--scale", "full", "--n-jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "skipping synthetic: it runs at quick, paper scale" in out
    assert sorted(p.name for p in (figures / "full" / "data").glob("*_claims.json")) == [
        "descriptive_claims.json", "everyday_claims.json"]
    assert not (figures / "data").exists()  # the everyday folder untouched
    assert read_timings(figures / "full")["scale"] == "full"
    assert set(read_timings(figures / "full")["studies"]) == {"everyday", "descriptive"}

    assert main(["reproduce", "--studies-dir", str(studies), "--scale", "paper", "--n-jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "skipping descriptive: it runs at quick, full scale (the report takes its rows from the full tier)" in out
    assert sorted(p.name for p in (figures / "data").glob("*_claims.json")) == [
        "everyday_claims.json", "synthetic_claims.json"]
    text = (figures / "REPORT.md").read_text()
    # everyday: its own two rows (the shared id is this run's), then the full tier's row this run lacks
    section = text[text.index("## everyday"):text.index("## synthetic")]
    assert section.index("### shared") < section.index("### everyday-paper") < section.index("### everyday-full")
    assert section.count("### shared") == 1 and "- **Measured:** at paper" in section
    assert "- **Tier:** full" in section and "- **Tier:** paper" in section
    # a study only the full tier runs is in the report whole, after the others (its position)
    assert text.index("## synthetic") < text.index("## descriptive")
    assert "| [descriptive](#descriptive) | claim c | full |" not in text  # the claim text is "c"
    assert "| [descriptive](#descriptive) | c | full | · measured | at full |" in text
    assert "**Tiers.** 4 rows come from this run; 3 from the full tier" in text
    assert "Wall time of this run (paper scale)" in text and "Wall time of the full tier's run" in text


def test_a_study_refuses_a_scale_it_does_not_declare(studies, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(studies / "descriptive.py"), "--scale", "paper"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "invalid choice: 'paper' (choose from 'quick', 'full')" in done.stderr


def test_the_full_tiers_rows_name_their_figures_under_full_and_are_never_refused_as_stale(tmp_path):
    from kvstats.study.fingerprint import study_fingerprint

    full, now = tmp_path / "full", study_fingerprint("sphere_law")
    write_claims("sphere_law", [_claim("a1", "sphere_law_x.png")], scale="paper", figures_dir=tmp_path, code=now)
    # the full tier's claims record no code fingerprint (written before fingerprints, or by a cluster's older run)
    write_claims("sphere_law", [_claim("a1"), _claim("a2", "sphere_law_gemma3.png")], scale="full", figures_dir=full)
    (full / "sphere_law_gemma3.png").write_bytes(b"png")
    (tmp_path / "sphere_law_x.png").write_bytes(b"png")
    text = build_report(tmp_path, scale="paper", require_current=True).read_text()  # named, not refused
    assert "- **Figure:** [full/sphere_law_gemma3.png](full/sphere_law_gemma3.png)" in text
    assert "![sphere_law_gemma3](full/sphere_law_gemma3.png)" in text and "![sphere_law_x](sphere_law_x.png)" in text
    assert "1 row(s) from the full tier (figures/full): code **not recorded**" in text
    assert "The full tier's rows of sphere_law were not computed by this commit's code" in text
    # the sample sizes are counted per tier: the paper tier's labels, the full tier's row; a full-tier verdict by a
    # test without a plan says why
    write_claims("sphere_law", [_claim("a1"), {**_claim("a3"), "verdict": V.direction([1])}], scale="full",
                 figures_dir=full)
    text = build_report(tmp_path, scale="paper").read_text()
    assert "- **Sample size:** **no plan recorded**: the full tier's run predates sample plans" in text
    assert ("Sample sizes, paper tier: 0 of 1 claims planned by power; 0 without sampling; 1 measurements or labels "
            "that test nothing; full tier: 0 of 1 claims planned by power;") in text
    assert "**1 verdicts by a test with no plan recorded**: a3" in text
    # this folder's own claims are refused when another code computed them
    write_claims("sphere_law", [_claim("a1")], scale="paper", figures_dir=tmp_path, code="other")
    with pytest.raises(ValueError, match=r"sphere_law \(stale\)"):
        build_report(tmp_path, scale="paper", require_current=True)


def test_script_scales_reads_the_declaration_and_refuses_a_bad_one(tmp_path):
    (tmp_path / "a.py").write_text('SCALES = ("quick", "full")\n')
    (tmp_path / "b.py").write_text("POSITION = 3\n")
    (tmp_path / "c.py").write_text('SCALES = ("quick", "huge")\n')
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "__init__.py").write_text('SCALES = ("paper",)\n')
    assert script_scales(tmp_path / "a.py") == ("quick", "full")
    assert script_scales(tmp_path / "b.py") == ("quick", "paper", "full")
    assert script_scales(tmp_path / "d") == ("paper",)
    with pytest.raises(ValueError, match="SCALES must be a non-empty tuple"):
        script_scales(tmp_path / "c.py")


def test_tier_dir_and_use_tier(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path))
    assert paths.tier_dir("paper") == tmp_path and paths.tier_dir("quick") == tmp_path
    assert paths.tier_dir("full") == tmp_path / "full"
    with pytest.raises(ValueError, match="scale must be one of"):
        paths.tier_dir("huge")
    assert paths.use_tier("full") == tmp_path / "full" and paths.figures_dir() == tmp_path / "full"
    from kvstats.study.sweep import cells_dir

    monkeypatch.delenv("KVSTATS_CELLS_DIR", raising=False)
    assert cells_dir() == tmp_path / ".cells"  # one cells store for every tier
    assert paths.use_tier("paper") == tmp_path and paths.figures_dir() == tmp_path


def test_write_timings_refuses_bad_seconds_and_records_the_run(tmp_path):
    path = write_timings({"a": 1.25, "b": 3}, scale="paper", figures_dir=tmp_path, note="2 CPUs")
    payload = json.loads(path.read_text())
    assert payload["studies"] == {"a": 1.2, "b": 3.0} and payload["scale"] == "paper" and payload["note"] == "2 CPUs"
    with pytest.raises(ValueError, match=r"timings\['a'\]"):
        write_timings({"a": float("nan")}, scale="paper", figures_dir=tmp_path)
    with pytest.raises(ValueError, match="scale"):
        write_timings({"a": 1.0}, scale="huge", figures_dir=tmp_path)
    assert read_timings(tmp_path / "nowhere") is None


@pytest.mark.parametrize("edit, match", [
    (lambda p: p.pop("scale"), "'scale' must be one of"),
    (lambda p: p.update(scale="huge"), "'scale' must be one of"),
    (lambda p: p["studies"].update(a="slow"), r"studies\['a'\] must be finite seconds"),
    (lambda p: p["studies"].update(a=-1.0), r"studies\['a'\] must be finite seconds"),
    (lambda p: p["studies"].update(a=True), r"studies\['a'\] must be finite seconds"),
    (lambda p: p.pop("commit"), "'commit' must be a string"),
    (lambda p: p.update(studies=[1.0]), "'studies' object"),
])
def test_read_timings_refuses_a_bad_record_by_name(tmp_path, edit, match):
    path = write_timings({"a": 1.0}, scale="paper", figures_dir=tmp_path)
    payload = json.loads(path.read_text())
    edit(payload)
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=match):
        read_timings(tmp_path)
