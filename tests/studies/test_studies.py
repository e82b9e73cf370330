"""Each study's cell function on a tiny sweep, and the claims/report machinery on synthetic claims."""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pytest
import torch

from kvstats.measure import verdicts as V
from kvstats.study.report import (
    VERDICTS,
    build_report,
    fmt_p,
    read_claims,
    read_definitions,
    study_order,
    validate_claim,
    write_claims,
    write_definitions,
)
from kvstats.study.sweep import cell_seed, grid
from tests.helpers.studies import STUDIES, load_study, run_tiny, study_paths, tiny_run  # noqa: E402, F401

# ------------------------------------------------------------------------------------------- studies' cells


def test_budget_sweep_cell_synthetic_and_minmax(tmp_path):
    bs = load_study("budget_sweep")
    cells = grid(data=["gaussian", "low_rank_r1"], layer=[None], scheme_name=["kqv", "qkqv"], sketch="srht", n=3,
                 d=16, seq=32, n_q=4, trials=2) + grid(data=["gaussian", "low_rank_r1"], layer=[None],
                                                       scheme_name=["kv", "minmax"], sketch="none", n=3, d=16,
                                                       seq=32, n_q=4, trials=2)
    df = tiny_run("budget_sweep", bs.cell, cells, tmp_path)
    assert len(df) == 16 * len(bs.QUERY_MODELS) and set(df["queries"]) == set(bs.QUERY_MODELS)
    assert (df["attention_kl"] >= 0).all() and df["top5"].between(0, 1).all() and (df["k_direction"] >= 0).all()
    assert set(bs.E6) <= set(df.columns) and np.isfinite(df[list(bs.E6)].to_numpy()).all()
    # common random numbers: the data of a trial do not depend on the scheme
    q1, k1, _, _ = bs.trial_data("gaussian", None, 16, 32, 4, 1)
    q2, k2, _, _ = bs.trial_data.__wrapped__("gaussian", None, 16, 32, 4, 1)
    assert torch.equal(k1, k2) and all(torch.equal(q1[m], q2[m]) for m in bs.QUERY_MODELS)
    # the 6D distance and the analysis helpers work on the tiny table
    df = df.rename(columns={"scheme_name": "scheme"})
    df["label"] = df.apply(bs.data_label, axis=1)
    assert np.isfinite(bs.add_d6(df)["distance_6d"]).all()


def test_budget_sweep_cell_real_branch(monkeypatch):
    """The real-data branch (causal, GQA 9/3, disjoint windows) on stand-in tensors of SmolLM2's shape."""
    bs = load_study("budget_sweep")
    gen = torch.Generator().manual_seed(0)
    fake = (torch.randn(1, 9, 80, 64, generator=gen), torch.randn(1, 3, 80, 64, generator=gen),
            torch.randn(1, 3, 80, 64, generator=gen))
    monkeypatch.setattr(bs.cells, "_real", lambda doc, layer, data="smollm2": fake)
    monkeypatch.setattr(bs.cells, "document_tokens", lambda data="smollm2": [80])
    bs.trial_data.cache_clear()
    try:
        rows = bs.cell("smollm2", 7, "kqv", "srht", 4, 64, 32, 8, 2)
    finally:
        bs.trial_data.cache_clear()
    assert len(rows) == 2 and all(r["seq_len"] == 32 and r["queries"] == "model" for r in rows)
    assert all(r["attention_kl"] >= 0 and 0 <= r["top5"] <= 1 for r in rows)


@pytest.mark.parametrize("data, scheme_name", [("gaussian", "kqv"), ("gaussian", "qkqv"), ("heavy_tail_df3", "kv"),
                                              ("low_rank_r8", "minmax")])
def test_budget_sweep_cell_equals_the_public_api(data, scheme_name):
    """Issue 14 "done when": a budget_sweep cell and the same quantities through kvstats.scheme, kvstats.metrics
    and kvstats.error6d give identical numbers (==, not approx), and the 6D columns bear the library's names."""
    import kvstats
    from kvstats.data.synthetic import generate
    from kvstats.measure import metrics
    from kvstats.measure.error6d import ERROR6D_COMPONENTS, error6d
    from kvstats.study.sweep import cell_seed

    bs = load_study("budget_sweep")
    assert bs.E6 == ERROR6D_COMPONENTS
    n, d, seq, n_q, trials = 3, 32, 48, 4, 2
    sketch = "srht" if scheme_name in bs.QJL_SCHEMES else "none"
    rows = [r for r in bs.cell(data, None, scheme_name, sketch, n, d, seq, n_q, trials) if r["queries"] == "peaked"]
    kind, params = bs.SYNTHETIC[data]
    for t, row in enumerate(rows):
        # the trial's data and quantizer seed, rebuilt from their documented recipes
        q, k, v = generate(kind, 1, 2, seq, d, cell_seed("budget_sweep", "data", data, None, d, seq, n_q, t),
                           q_heads=4, n_q=n_q, **params)
        s = kvstats.scheme(scheme_name, bits=n, dim=d, seed=cell_seed("budget_sweep", "quant", scheme_name, n, t),
                           rows="srht")
        code = s.encode(k, v)
        k_hat, v_hat = s.decode(code)
        est = s.scores(q, code) / math.sqrt(d)
        e6 = error6d(q, k, v, k_hat, v_hat, scores_hat=est)[0].tolist()
        assert [row[c] for c in ERROR6D_COMPONENTS] == e6
        ref = metrics.attention_scores(q, k)
        assert row["top5"] == metrics.topk_recall_from_scores(ref, est, top_k=5)
        assert row["k_rel_mse"] == metrics.mse(k, k_hat, relative=True)
        ref64 = metrics.attention_scores(q, k, double=True)  # the 6D error works in fp64
        assert row["attention_kl"] == metrics.attention_kl_from_scores(ref64, est, double=True)
        assert row["output_error"] == metrics.attention_output_error_from_scores(ref64, est, v, v_hat, double=True)
        # and the output error is that of the attention the scheme computes (Scheme.attention, fp32)
        o_ref = torch.softmax(ref.double(), -1).reshape(1, 2, 2 * n_q, seq) @ v.double()
        o_hat = s.attention(q, code).double().reshape(1, 2, 2 * n_q, d)
        rel = ((o_ref - o_hat).norm(dim=-1) / o_ref.norm(dim=-1)).mean().item()
        assert rel == pytest.approx(row["output_error"], rel=1e-4)


def test_beta_figures_cell(tmp_path):
    bf = load_study("beta_figures")
    cells = grid(d=[2, 8], kind=["gaussian", "low_rank"], bits=4, seq=32, n_q=4, trials=2)
    df = tiny_run("beta_figures", bf.cell, cells, tmp_path)
    # 4 cells × 2 trials × 3 methods (MSE; MSE + QJL with the Hadamard and with the Gaussian sketch)
    assert len(df) == 24 and (df["kl"] >= 0).all() and np.isfinite(df["kl"]).all()
    assert set(zip(df["method"], df["sketch"])) == {("turbo_mse", "none"), ("turbo_prod", "srht"),
                                                    ("turbo_prod", "gaussian")}
    x = bf.rotated_coordinates("gaussian", 8, 64)
    assert x.shape == (64, 8) and np.allclose((x**2).sum(1), 1.0)


def test_turboquant_distortion_cells(tmp_path):
    td = load_study("turboquant_distortion")
    df = tiny_run("td", td.cell, grid(method=["turbo_mse", "turbo_prod"], bits=[1, 2], d=64, vectors=400, rep=0),
                  tmp_path)
    mse = df[df["method"] == "turbo_mse"].set_index("bits")["d_mse"]
    assert mse[1] == pytest.approx(td.exact_dmse(64, 1), rel=0.1) and mse[2] == pytest.approx(td.exact_dmse(64, 2),
                                                                                                rel=0.15)
    assert df[df["method"] == "turbo_prod"]["residual_parallel2"].notna().all()
    worst = tiny_run("tdw", td.worst_cell, grid(rotation=["wht", "haar"], vector="e1", bits=2, d=128, rep=[0, 1]),
                     tmp_path)
    wht = worst[worst["rotation"] == "wht"]["sq_error"]
    assert wht.iloc[0] == pytest.approx(0.255, abs=0.01) and wht.nunique() == 1  # the same for every sign pattern


def test_qjl_variance_cells(tmp_path):
    qv = load_study("qjl_variance")
    q, k = qv.unit_pairs(50, 16, 0.6, seed=3)
    assert torch.allclose((q * k).sum(-1), torch.full((50,), 0.6, dtype=torch.float64))
    assert torch.allclose(q.norm(dim=-1), torch.ones(50, dtype=torch.float64))
    df = tiny_run("qv", qv.cell, grid(rows=["gaussian", "orthogonal"], m=32, cos=0.3, d=16, sketches=3, pairs=20),
                  tmp_path)
    assert len(df) == 6 and (df["mse"] > 0).all()
    err = tiny_run("qve", qv.error_cell, grid(method=["turbo_mse", "turbo_prod"], bits=1, d=32, vectors=200),
                   tmp_path)
    assert len(err.iloc[0]["errors"]) == 200
    assert err.set_index("method").loc["turbo_mse", "mean"] < 0  # biased towards 0: underestimates ⟨y, x⟩ = 0.5


def test_jensen_cells(tmp_path):
    js = load_study("jensen")
    curves = tiny_run("jc", js.curve_cell, grid(mode=["uniform", "correlated"], sigma2=0.5, queries=2, draws=200),
                      tmp_path)
    assert len(curves) == 4 and (curves["kl"] > 0).all()
    assert curves[curves["mode"] == "uniform"]["kl_mean_field"].max() < 1e-9
    pts = tiny_run("js", js.scheme_cell, grid(scheme_name=["kqv", "qkqv"], n=3, trials=1), tmp_path)
    s2 = pts.set_index("scheme_name")["sigma2"]
    assert s2["qkqv"] > s2["kqv"] > 0


# ------------------------------------------------------------------------------------- claims and the report


def _claim(i: int, verdict: str = "reproduced", figure: str | None = None) -> dict:
    """A claim whose verdict comes from a rule (``measured``: our own, source kvstats)."""
    ours = verdict == "measured"
    v = V.measured(f"our number {i}") if ours else V.Verdict(verdict, "number", f"computed for claim {i}")
    return {"id": f"c{i}", "claim": f"claim {i}", "source": "kvstats" if ours else "paper, §1",
            "measurement": f"x = {i} [0, 1], p = 0.01", "data": "tiny", "verdict": v, "figure": figure}


def _old_claim(i: int) -> dict:
    """A claim as files written before verdict rules existed hold it: a bare verdict string, no rule."""
    return {"id": f"c{i}", "claim": f"claim {i}", "source": "paper, §1", "measurement": f"x = {i}", "data": "tiny",
            "verdict": "reproduced", "figure": None}


def test_verdicts_must_come_from_a_rule(tmp_path):
    with pytest.raises(ValueError, match="kvstats.measure.verdicts.Verdict"):
        write_claims("alpha", [_claim(1) | {"verdict": "reproduced"}], figures_dir=tmp_path)
    with pytest.raises(ValueError, match="not 'measured'"):
        write_claims("alpha", [_claim(1) | {"verdict": V.measured("x")}], figures_dir=tmp_path)
    path = write_claims("alpha", [_claim(1), _claim(2) | {"verdict": V.not_testable("needs a 8B model")}],
                        figures_dir=tmp_path)
    back = read_claims(path)
    assert back[0]["rule"] == "number" and back[0]["reason"] == "computed for claim 1"
    assert back[1]["verdict"] == "not testable here" and back[1]["reason"] == "needs a 8B model"
    text = build_report(tmp_path, studies=["alpha"]).read_text()
    assert "⊘ not testable here" in text and "Verdict by the number rule:** computed for claim 1" in text


def test_definitions_reach_the_report(tmp_path):
    write_claims("alpha", [_claim(1)], figures_dir=tmp_path)
    write_definitions("alpha", {"sketch": "srht, m = d", "queries": "isotropic N(0, I)"}, figures_dir=tmp_path)
    assert read_definitions(tmp_path / "data" / "alpha_definitions.json")["sketch"] == "srht, m = d"
    text = build_report(tmp_path, studies=["alpha"]).read_text()
    assert "## Definitions" in text and "| sketch | srht, m = d |" in text
    with pytest.raises(ValueError, match="definitions"):
        write_definitions("alpha", {"sketch": ""}, figures_dir=tmp_path)


def test_write_and_read_claims(tmp_path):
    path = write_claims("alpha", [_claim(1), _claim(2, "measured") | {"details": "| a |\n|---|"}],
                        figures_dir=tmp_path)
    assert path == tmp_path / "data" / "alpha_claims.json"
    back = read_claims(path)
    assert [c["id"] for c in back] == ["c1", "c2"] and back[0]["details"] is None
    assert json.loads(path.read_text())[1]["details"].startswith("| a |")


@pytest.mark.parametrize("bad, match", [
    ({"verdict": "maybe"}, "verdict"),
    ({"claim": ""}, "claim"),
    ({"extra": 1}, "unknown key"),
    ({"figure": 3}, "figure"),
    ({"scale": "huge"}, "scale"),
])
def test_claims_are_validated(tmp_path, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        write_claims("alpha", [_claim(1) | bad], figures_dir=tmp_path)
    c = _claim(1)
    del c["source"]
    with pytest.raises(ValueError, match="source"):
        validate_claim(c)
    with pytest.raises(ValueError, match="unique"):
        write_claims("alpha", [_claim(1), _claim(1)], figures_dir=tmp_path)
    assert not (tmp_path / "data" / "alpha_claims.json").exists()


def test_build_report_assembles_claims_in_study_order(tmp_path):
    (tmp_path / "budget_sweep_kl.png").write_bytes(b"png")
    (tmp_path / "sphere_law_density.png").write_bytes(b"png")
    write_claims("budget_sweep", [_claim(1, "partly", "budget_sweep_kl.png"), _claim(2, "not reproduced")],
                 position=70, figures_dir=tmp_path)
    write_claims("sphere_law", [_claim(3)], position=10, figures_dir=tmp_path)
    write_claims("zzz_new", [_claim(4, "measured")], figures_dir=tmp_path)  # no position: after the others
    out = build_report(tmp_path, scale="quick", timings={"sphere_law": 3.0, "budget_sweep": 60.0},
                       preamble="## Conventions\n\nrank-biserial", date=dt.datetime(2026, 1, 2, 3, 4),
                       failed=["nova"])
    text = out.read_text()
    assert out == tmp_path / "REPORT.md"
    assert "Failed in this run: nova" in text
    assert "2026-01-02 03:04" in text and "**Scale: quick.**" in text and "## Conventions" in text
    assert text.index("## sphere_law") < text.index("## budget_sweep") < text.index("## zzz_new")
    assert "![budget_sweep_kl](budget_sweep_kl.png)" in text and "![sphere_law_density](sphere_law_density.png)" in text
    assert "1 reproduced, 1 partly, 1 not reproduced, 1 measured" in text
    assert "| **total** | **63** |" in text
    assert "Known discrepancies" not in text  # no claim carries one
    assert study_order(["zzz", "budget_sweep", "sphere_law", "aaa"], tmp_path) == ["sphere_law", "budget_sweep",
                                                                                   "aaa", "zzz"]


@pytest.mark.slow
def test_study_order_comes_from_the_studies(tmp_path):
    """Every study script declares POSITION; the order is theirs (report.py lists no study)."""
    import kvstats.study.report as report

    assert not hasattr(report, "STUDY_ORDER")
    scripts = study_paths()
    positions = {name: report.script_position(path) for name, path in scripts.items()}
    assert all(isinstance(p, int) for p in positions.values()), positions
    assert len(set(positions.values())) == len(positions)  # no ties: the order is defined
    assert study_order(scripts) == sorted(scripts, key=positions.get)
    assert study_order(scripts)[:2] == ["sphere_law", "kv_anatomy"]
    assert study_order(scripts)[-5:] == ["end_to_end", "model_damage", "recipe", "retrieval", "formats"]
    (tmp_path / "late.py").write_text("POSITION = 5\n")
    (tmp_path / "plain.py").write_text("x = 1\n")
    assert study_order({"plain": tmp_path / "plain.py", "late": tmp_path / "late.py",
                        "sphere_law": scripts["sphere_law"]}) == ["late", "sphere_law", "plain"]
    (tmp_path / "packaged").mkdir()  # a study package declares its POSITION in its __init__.py
    (tmp_path / "packaged" / "__init__.py").write_text("POSITION = 3\n")
    assert study_order({"late": tmp_path / "late.py", "packaged": tmp_path / "packaged"}) == ["packaged", "late"]


def test_reproduce_runs_study_packages_beside_scripts_in_report_order(tmp_path, capfd):
    """A study that outgrew one file is a package studies/<name>/ with a __main__.py (docs/studies.md)."""
    from kvstats.cli import main

    studies, figures = tmp_path / "studies", tmp_path / "figures"
    (studies / "packaged").mkdir(parents=True)
    (studies / "packaged" / "__init__.py").write_text("POSITION = 1\n")
    (studies / "packaged" / "__main__.py").write_text("import sys\nprint('packaged ran', sys.argv[1:])\n")
    (studies / "_helper").mkdir()  # not a study: a leading underscore
    (studies / "_helper" / "__main__.py").write_text("raise SystemExit(3)\n")
    (studies / "notes").mkdir()  # not a study: no __main__.py
    (studies / "script.py").write_text("POSITION = 2\nprint('script ran')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSTATS_FIGURES_DIR", str(figures))
        assert main(["reproduce", "--studies-dir", str(studies), "--isolate"]) == 0
        out = capfd.readouterr().out  # --isolate: each study a subprocess writing to the file descriptor
        assert main(["reproduce", "--studies-dir", str(studies)]) == 0  # in this process (runpy) too
    assert out.index("[1/2] packaged") < out.index("packaged ran ['--scale', 'quick']") < out.index("[2/2] script")
    assert "script ran" in out and "_helper" not in out and "notes" not in out
    assert "packaged ran ['--scale', 'quick']" in capfd.readouterr().out


def test_known_discrepancies_are_generated_from_the_claims(tmp_path):
    write_claims("beta", [_claim(1) | {"discrepancy": "The printed value 0.03 is 11.7% below the exact 0.034."},
                          _claim(2)], position=2, figures_dir=tmp_path)
    write_claims("alpha", [_claim(3, "partly") | {"discrepancy": "Ratios range 2.1–9.0, wider than 3–5.6."}],
                 position=1, figures_dir=tmp_path)
    text = build_report(tmp_path, preamble=report_preamble()).read_text()
    section = text[text.index("## Known discrepancies"):text.index("## Summary")]
    assert section.index("Ratios range 2.1–9.0") < section.index("11.7% below")  # in study order
    # GitHub anchors: lower case, symbols (— ◐ ✅) dropped, spaces to hyphens
    assert "[alpha: c3](#c3---partly)" in section and "[beta: c1](#c1---reproduced)" in section
    assert text.index("## How to read this report") < text.index("## Known discrepancies")


def test_claims_files_without_the_new_keys_still_read(tmp_path):
    """Backward compatibility: a claims file written before position/discrepancy/scale existed."""
    path = tmp_path / "data" / "old_claims.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([_old_claim(1) | {"details": None}]))
    back = read_claims(path)
    assert back[0]["position"] is None and back[0]["discrepancy"] is None and back[0]["scale"] is None
    assert "## old" in build_report(tmp_path).read_text()
    with pytest.raises(TypeError, match="position"):
        write_claims("alpha", [_claim(1)], position="first", figures_dir=tmp_path)


def test_preamble_numbers_are_computed():
    """The conventions quote Mann–Whitney extremes at 70 vs 70; oracle: scipy on completely separated samples."""
    import scipy.stats

    from kvstats.study.report import _mann_whitney_extremes

    r_max, p_exact, p_normal = _mann_whitney_extremes(70)
    exact = scipy.stats.mannwhitneyu(np.arange(70), np.arange(70, 140), method="exact").pvalue
    asym = scipy.stats.mannwhitneyu(np.arange(70), np.arange(70, 140), method="asymptotic").pvalue
    assert p_exact == pytest.approx(exact, rel=1e-9) and p_normal == pytest.approx(asym, rel=1e-9)
    assert r_max == pytest.approx(scipy.stats.norm.isf(asym / 2) / math.sqrt(140), rel=1e-9)
    assert f"{r_max:.2f}" in report_preamble() and f"{p_exact:.0e}" in report_preamble()


def report_preamble() -> str:
    from kvstats.study.report import DEFAULT_PREAMBLE

    return DEFAULT_PREAMBLE


def test_report_states_each_studys_scale(tmp_path):
    write_claims("sphere_law", [_claim(1)], scale="paper", figures_dir=tmp_path)
    write_claims("budget_sweep", [_claim(2)], scale="paper", figures_dir=tmp_path)
    assert read_claims(tmp_path / "data" / "budget_sweep_claims.json")[0]["scale"] == "paper"
    text = build_report(tmp_path, scale="paper").read_text()
    assert "**Scale: paper.**" in text and "Quick-scale sample sizes" not in text
    write_claims("end_to_end", [_claim(3)], scale="quick", figures_dir=tmp_path)
    text = build_report(tmp_path, scale="paper").read_text()
    assert "**Scale: paper, except end_to_end (quick).**" in text and "Quick-scale sample sizes" in text
    assert text.count("Scale: paper.") == 2 and "Scale: quick." in text
    with pytest.raises(ValueError, match="scale"):
        write_claims("alpha", [_claim(1)], scale="medium", figures_dir=tmp_path)


def test_fmt_p_and_verdicts():
    assert fmt_p(0.0312) == "p = 0.031" and fmt_p(2.1e-8) == "p = 2.1e-08" and fmt_p(0.0) == "p < 1e-300"
    assert fmt_p(math.nan) == "p = n/a"
    assert VERDICTS == ("reproduced", "partly", "not reproduced", "inconclusive", "measured", "not testable here",
                        "implementation check", "check failed")


def test_reproduce_runs_studies_and_builds_the_report(tmp_path, monkeypatch):
    from kvstats.cli.parser import main

    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "alpha.py").write_text(
        "import sys\nfrom kvstats.study.report import write_claims\nfrom kvstats.measure.verdicts import measured\n"
        "if __name__ == '__main__':\n"
        "    assert sys.argv[1:] == ['--scale', 'quick'], sys.argv\n"
        "    write_claims('alpha', [{'id': 'a', 'claim': 'c', 'source': 'kvstats', 'measurement': 'm', 'data': 'd',"
        " 'verdict': measured('m'), 'figure': None}])\n")
    (studies / "broken.py").write_text("import sys\nif __name__ == '__main__':\n    sys.exit(3)\n")
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    assert main(["reproduce", "--studies-dir", str(studies)]) == 3
    text = (tmp_path / "figures" / "REPORT.md").read_text()
    assert "Failed in this run: broken" in text and "## alpha" in text and "| alpha |" in text


# ------------------------------------------------------------------------------- whole studies, tiny scale


@pytest.mark.slow
def test_turboquant_distortion_runs_through_the_shell_and_states_its_discrepancies(tmp_path, monkeypatch, capsys):
    tiny = {"vectors": 200, "reps": 3, "worst_reps": 3, "outlier_reps": 3}
    claims = {c["id"]: c for c in run_tiny("turboquant_distortion", tiny, tmp_path, monkeypatch)}
    assert "turboquant_distortion done in" in capsys.readouterr().out
    # computed from the exact codebook (not sampled): printed 0.03 at b = 3 vs exact D_mse(128, 3)
    td = load_study("turboquant_distortion")
    gap = 100 * (td.exact_dmse(128, 3) - 0.03) / td.exact_dmse(128, 3)
    assert f"b = 3 (0.03) is {gap:.1f}% below" in claims["turboquant-dmse-values"]["discrepancy"]
    assert "inherits the rounding" in claims["turboquant-dmse-values"]["discrepancy"]
    # the WHT maps e1 to its worst case deterministically (the same error for every sign pattern)
    assert "worst case: squared error 0.25" in claims["kvstats-wht-worst-case"]["discrepancy"]
    text = build_report(tmp_path / "figures").read_text()
    assert "## Known discrepancies" in text and f"{gap:.1f}% below" in text
    # every claim's sample size: a plan, the reason none applies, or a label that tests nothing
    assert all(isinstance(c["sample"], (dict, str)) or c["rule"] == "measured" for c in claims.values())
    assert claims["turboquant-dmse-values"]["sample"].startswith("none planned")


@pytest.mark.slow
def test_sphere_law_runs_through_the_shell(tmp_path, monkeypatch):
    tiny = {"n_vectors": 500, "max_dim": 64, "n_dims": 4, "max_codebook_dim": 16}
    claims = {c["id"]: c for c in run_tiny("sphere_law", tiny, tmp_path, monkeypatch)}
    assert claims["lloyd-max-gaussian-table"]["verdict"] == "reproduced"
    figs = tmp_path / "figures"
    for name in ("sphere_law_density.png", "sphere_law_gaussian_distance.png", "sphere_law_codebook_convergence.png",
                 "data/sphere_law_turboquant_dmse_table.csv",
                 "data/sphere_law_codebook_convergence.csv"):
        assert (figs / name).is_file(), name
    import pandas as pd

    from kvstats.quant.codebooks import beta_codebook

    dmse = pd.read_csv(figs / "data" / "sphere_law_turboquant_dmse_table.csv").set_index("bits")
    assert dmse.loc[3, "exact_d_mse"] == pytest.approx(beta_codebook(128, 3).d_mse, rel=1e-5)  # CSV keeps 6 digits


@pytest.mark.slow
def test_kv_anatomy_runs_through_the_shell_on_a_stand_in_capture(tmp_path, monkeypatch):
    """kv_anatomy's layer cells and claims on stand-in tensors of each model's layout — SmolLM2's (4 layers, d = 64,
    3 KV heads: keys with channel 22 scaled ×8, an outlier channel the study must find, ratio outside 3–5.6) and
    Gemma 3's (3 layers, d = 256, one KV head, no outlier) — then with Gemma 3's package missing: its row says so."""
    import kvstats.study.models as study_models

    ka = load_study("kv_anatomy")

    def stand_in(n_layers, kv_heads, q_heads, d, outlier, seed):
        gen = torch.Generator().manual_seed(seed)
        scale = torch.ones(d)
        if outlier is not None:
            scale[outlier] = 8.0
        keys = {i: torch.randn(1, kv_heads, 40, d, generator=gen) * scale for i in range(n_layers)}
        values = {i: torch.randn(1, kv_heads, 40, d, generator=gen) for i in range(n_layers)}
        queries = {i: torch.randn(1, q_heads, 40, d, generator=gen) for i in range(n_layers)}

        class Capture:
            layers = list(range(n_layers))
            metadata = {"head_dim": d}

            def keys(self, i):
                return keys[i]

            def values(self, i):
                return values[i]

            def queries(self, i):
                return queries[i]

        return Capture(), keys

    (smol, keys), (gemma, _) = stand_in(4, 3, 9, 64, 22, 5), stand_in(3, 1, 4, 256, None, 6)
    monkeypatch.setattr(ka, "_capture", lambda tokens, model="smollm2": smol if model == "smollm2" else gemma)
    monkeypatch.setattr(study_models, "missing_reason", lambda model: None)
    claims = {c["id"]: c for c in run_tiny("kv_anatomy", {"tokens": 40}, tmp_path, monkeypatch)}
    tested = [c for c in claims.values() if c["rule"] not in ("measured", "not testable")]
    assert len(tested) == 7 and all(c["sample"] for c in tested)  # a plan, or the reason none applies (issue 50)
    assert claims["smollm2-wht-sphere-law"]["sample"]["achieved_n"] == 3 * 40  # one draw per key: 3 KV heads
    prof = np.stack([keys[i].abs().mean(dim=(0, 1, 2)).numpy() for i in range(4)])
    kr = prof.max(1) / np.median(prof, 1)
    assert f"keys max/median {kr.min():.1f}–{kr.max():.1f}" in claims["smollm2-key-outliers"]["measurement"]
    assert f"range {kr.min():.1f}–{kr.max():.1f}" in claims["smollm2-key-outliers"]["discrepancy"]
    assert claims["gemma3-key-outliers"]["verdict"] == "measured" and "Gemma-3-270M" in claims["gemma3-key-outliers"][
        "measurement"]
    for gemma_id in ("qjl-outlier-channels-gemma3", "gemma3-wht-sphere-law", "qjl-outlier-sketch-gemma3"):
        assert gemma_id in claims and "Gemma-3-270M" in claims[gemma_id]["measurement"]
    assert "f_256" in claims["gemma3-wht-sphere-law"]["measurement"]
    compared = claims["kv-anatomy-models"]
    assert compared["verdict"] == "measured" and "of 3 claims" in compared["measurement"]
    assert "head dim 64 vs 256" in compared["details"] and "QK-norm False vs True" in compared["details"]
    import pandas as pd

    out = pd.read_csv(tmp_path / "figures" / "data" / "kv_anatomy_outliers.csv")
    smol_keys = out[(out["tensor"] == "keys") & (out["model"] == "smollm2")]
    assert len(smol_keys) == 4 and (smol_keys["top_channels"].str.split().str[0] == "22").all()
    assert set(out["model"]) == {"smollm2", "gemma3-270m"}
    assert (tmp_path / "figures" / "kv_anatomy_wht.png").is_file()
    assert (tmp_path / "figures" / "kv_anatomy_wht_gemma3.png").is_file()
    # without Gemma 3's package: SmolLM2's rows, and one row that says Gemma 3 did not run and why
    monkeypatch.setattr(study_models, "missing_reason", lambda model: None if model == "smollm2" else "no package")
    claims = {c["id"]: c for c in run_tiny("kv_anatomy", {"tokens": 40}, tmp_path / "two", monkeypatch)}
    assert "smollm2-key-outliers" in claims and not any("gemma3" in i and i != "kv-anatomy-gemma3-rows" for i in claims)
    assert claims["kv-anatomy-gemma3-rows"]["verdict"] == "not testable here"
    assert "no package" in claims["kv-anatomy-gemma3-rows"]["measurement"]


@pytest.mark.slow
def test_qjl_variance_runs_through_the_shell_and_states_the_scale_factor(tmp_path, monkeypatch):
    from kvstats.quant.rotations import spherical_sign_scale

    tiny = {"sketches": 3, "pairs": 16, "scale_sketches": 4, "err_vectors": 64, "tail_trials": 3, "outlier_reps": 3,
            "spiky_sketches": 2, "theorem_trials": 4, "scaling_trials": 4}
    claims = {c["id"]: c for c in run_tiny("qjl_variance", tiny, tmp_path, monkeypatch)}
    factor = math.sqrt(math.pi / 2) / spherical_sign_scale(64)  # closed form, not sampled
    assert f"over-scales by the factor {factor:.4f} at d = 64" in claims["qjl-orthogonal-scale-factor"]["discrepancy"]
    scaling = claims["qjl-theorem-3.6-scaling"]
    assert scaling["rule"] == "combine" and "per log n, n = 4096 over n = 64: d = 64: " in scaling["measurement"]
    assert "n = 4096, d = 256: " in scaling["details"] and "a constant m also gives" in scaling["details"]
    assert claims["qjl-theorem-3.6"]["rule"] == "bound" and "/4 sketches" in claims["qjl-theorem-3.6"]["measurement"]
    assert claims["qjl-longbench-lmeval-speed"]["verdict"] == "not testable here"
    # D'Alberto's √(π/2) claim is verdicted on his Hadamard sketch, Gaussian rows beside it
    assert "Hadamard sketch" in claims["dalberto-sqrt-pi-2"]["measurement"]
    assert claims["dalberto-sqrt-pi-2-sketch-gaussian"]["rule"] == "number"
    # every claim's sample size: a plan, the reason none applies, or a label that tests nothing
    assert all(isinstance(c["sample"], (dict, str)) or c["rule"] == "not testable" for c in claims.values())
    assert claims["qjl-theorem-3.6"]["sample"]["planned_n"] == 943 and claims["qjl-bits"]["sample"].startswith("none")


@pytest.mark.slow
def test_nova_cell_attention_from_kvstats_attention(monkeypatch):
    """nova's cell on stand-in tensors of SmolLM2's layout (9 query / 3 KV heads, d = 64): its causal mask is
    kvstats.quant.attention's, and its reference output the float64 GQA attention (explicit head repetition)."""
    nv = load_study("nova")
    gen = torch.Generator().manual_seed(8)
    # 260 tokens: nova's key codebook (2^8 entries at n = 2) needs at least 256 calibration tokens
    fake = {name: (torch.randn(1, 9, 260, 64, generator=gen), torch.randn(1, 3, 260, 64, generator=gen),
                   torch.randn(1, 3, 260, 64, generator=gen)) for name in nv.TEXTS}
    monkeypatch.setattr(nv.cells, "layer_qkv", lambda name, layer, model="smollm2": fake[name])
    monkeypatch.setattr(nv.cells, "layer_window", lambda name, layer, model="smollm2": None)  # full attention
    for module in (nv, nv.cells):  # one budget keeps the test short
        monkeypatch.setattr(module, "BUDGETS", (2,))
    ref = nv.cells.metrics.AttentionReference(torch.zeros(1, 1, 3, 5), causal=True)  # the cell's mask
    assert ref.visible.tolist() == [[j <= 2 + i for j in range(5)] for i in range(3)]
    rows = [r for r in nv.cell(0, 0, 4, False) if r["kind"] == "unit"]
    assert {r["scheme"] for r in rows} == {"nova", *nv.OBLIVIOUS}
    assert len(rows) == 9 * len(nv.BUDGETS) * (1 + len(nv.OBLIVIOUS))  # one row per query head
    assert all(math.isfinite(r["output_error"]) and r["output_error"] > 0 for r in rows)
    # one row recomputed by hand: kqv at the first budget, head 0
    q, k, v = fake[nv.TEXTS[1]]
    n, name = nv.BUDGETS[0], "kqv"
    s = nv.make_scheme(name, n, 64, cell_seed(nv.STUDY, name, n, 0, 0))
    code = s.encode(k, v)
    qn = q[:, :, -4:]
    vis = np.array([[j <= 256 + i for j in range(260)] for i in range(4)])
    ref = np.einsum("bhnd,bhsd->bhns", qn.double().numpy(), np.repeat(k.double().numpy(), 3, axis=1)) / 8.0
    w = np.exp(np.where(vis, ref, -np.inf) - ref.max(-1, keepdims=True))
    o_ref = np.einsum("bhns,bhsd->bhnd", w / w.sum(-1, keepdims=True), np.repeat(v.double().numpy(), 3, axis=1))
    o_hat = s.attention(qn, code, causal=True).double().numpy()
    want = (np.linalg.norm(o_ref - o_hat, axis=-1) / np.linalg.norm(o_ref, axis=-1))[0, 0].mean()
    got = next(r for r in rows if r["scheme"] == name and r["n"] == n and r["head"] == 0)["output_error"]
    assert got == pytest.approx(want, rel=1e-9)


def test_old_claims_files_are_ordered_by_the_scripts_beside_them(tmp_path):
    """Claims files without `position` (written before it existed) take the POSITION of studies/<name>.py."""
    figs, studies = tmp_path / "figures", tmp_path / "studies"
    studies.mkdir()
    (studies / "late.py").write_text("POSITION = 90\n")
    (studies / "early.py").write_text("POSITION = 10\n")
    for name in ("late", "early", "orphan"):
        path = figs / "data" / f"{name}_claims.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([_old_claim(1)]))
    assert study_order(["late", "orphan", "early"], figs) == ["early", "late", "orphan"]
    text = build_report(figs).read_text()
    assert text.index("## early") < text.index("## late") < text.index("## orphan")


def test_every_committed_figure_and_data_file_is_named_after_its_study():
    # docs/studies.md, "Writing a study": figures/<study>_*.png and figures/data/<study>[_*].csv|json, so a
    # file says which script regenerates it
    # — in both tiers' folders; each tier's timings.json (kvstats reproduce's record of the run) is the report's own
    from kvstats.study.report import timings_path

    names = sorted(study_paths())
    files = []
    for figures in (STUDIES.parent / "figures", STUDIES.parent / "figures" / "full"):
        files += [*figures.glob("*.png"), *(figures / "data").glob("*.csv"), *(figures / "data").glob("*.json")]
    assert files
    files = [p for p in files if p.name != timings_path().name]
    stray = [p.name for p in files if not any(p.stem == n or p.stem.startswith(n + "_") for n in names)]
    assert not stray, f"not named after a study ({names}): {stray}"
