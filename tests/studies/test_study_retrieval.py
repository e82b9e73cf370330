"""studies/retrieval/: its statistics against scipy/statsmodels on designed trials, its pass rule, its prompts
(answers where the chunk says), and a tiny run through the shell in which the lossless scheme must reproduce the fp
model's every outcome (the oracle of the protocol: full-precision prefill, codes, questions through the cache)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from kvstats.study.report import read_claims
from tests.helpers.studies import load_study


@pytest.fixture(scope="module")
def rt():
    return load_study("retrieval")


def _trials(outcomes: dict[tuple[str, int], list[bool]]) -> pd.DataFrame:
    rows = []
    for (scheme, n), passed in outcomes.items():
        for i, ok in enumerate(passed):
            rows.append({"task": "lookup", "length": 256 if i < 10 else 1024, "prompt": i // 5, "needle": i % 5,
                         "depth": 0.1, "scheme": scheme, "n": n, "success": ok, "attn_kl": np.nan if scheme == "fp"
                         else 0.1 * n, "bits_per_element": np.nan})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_accuracy_and_paired_tests_on_designed_trials(rt):
    """20 trials: fp passes 18; kqv at n = 2 passes 6 of them (12 fp-only, 0 kqv-only); minmax passes 16 of fp's and
    2 fp misses. Wilson intervals are statsmodels', McNemar's exact p is the binomial test on the discordant
    pairs, Holm is statsmodels' over the family."""
    fp = [True] * 18 + [False] * 2
    kqv = [True] * 6 + [False] * 14
    minmax = [True] * 16 + [False] * 2 + [True] * 2
    t = _trials({("fp", 16): fp, ("kqv", 2): kqv, ("minmax", 2): minmax})
    acc = rt.accuracy_table(t, ["task", "scheme", "n"]).set_index("scheme")
    low, high = proportion_confint(18, 20, method="wilson")
    assert acc.loc["fp", "passed"] == 18 and acc.loc["fp", "ci_low"] == pytest.approx(low)
    assert acc.loc["fp", "ci_high"] == pytest.approx(high)
    tests = rt.tests_table(t, (2,))
    vs = tests[(tests["length"] == "all") & (tests["family"] == "vs fp")].set_index("a")
    assert (vs.loc["kqv", "a_only"], vs.loc["kqv", "b_only"]) == (0, 12)
    assert vs.loc["kqv", "p"] == pytest.approx(scipy.stats.binomtest(0, 12, 0.5).pvalue)
    assert vs.loc["kqv", "difference"] == pytest.approx((6 - 18) / 20)
    assert (vs.loc["minmax", "a_only"], vs.loc["minmax", "b_only"]) == (2, 2) and vs.loc["minmax", "p"] == 1.0
    assert list(vs["p_holm"]) == pytest.approx(list(multipletests(vs["p"], method="holm")[1]))
    per_length = tests[(tests["length"] == "256") & (tests["family"] == "vs fp")]
    assert set(per_length["trials"]) == {10}  # the first 10 trials are the 256-token ones
    between = tests[(tests["family"] == "between") & (tests["length"] == "all")]
    assert between.empty  # no PAIRS among kqv, minmax


def test_pass_rule_is_every_answer_token_greedy(rt):
    p = rt.Prompt(context=[1, 2], chunk=[5, 6, 7, 8, 9], depths=(0.5, 0.9), answers=((2, (7, 8)), (4, (9,))))
    logits = torch.zeros(5, 12)
    logits[1, 7] = logits[2, 8] = logits[3, 9] = 1.0  # logits at offset - 1 + j predict answer token j
    assert rt.passed(logits, p) == [True, True]
    logits[2, 3] = 2.0
    assert rt.passed(logits, p) == [False, True]


def test_prompts_hold_their_answers_where_the_chunk_says(rt, smollm2):
    for task, length in (("passkey", 256), ("induction", 512), ("lookup", 256)):
        p = rt.build_prompt(task, length, 1)
        assert abs(len(p.context) - length) <= 5 * 12 + 2 and len(p.answers) == len(p.depths)
        for offset, answer in p.answers:
            assert tuple(p.chunk[offset:offset + len(answer)]) == answer
        if task == "induction":  # each needle's cue and answer sit in the context, once
            text = " ".join(map(str, p.context))
            for offset, answer in p.answers:
                span = p.chunk[offset - rt.INDUCTION_CUE:offset] + list(answer)
                assert text.count(" ".join(map(str, span))) == 1
    assert rt.build_prompt("lookup", 256, 1) == rt.build_prompt("lookup", 256, 1)  # its own seed
    assert rt.build_prompt("lookup", 256, 1) != rt.build_prompt("lookup", 256, 2)
    with pytest.raises(ValueError, match="task must be"):
        rt.build_prompt("ruler", 256, 0)


@pytest.mark.slow
def test_retrieval_runs_through_the_shell_and_the_lossless_scheme_is_the_fp_model(tmp_path, monkeypatch, rt,
                                                                                     smollm2):
    # the formats sweep: int2 per token-head, and the lossless scheme as a "format" (its oracle: the fp outcomes)
    monkeypatch.setitem(rt.SCALE, "quick", {"tasks": {"lookup": {160: 1}, "induction": {160: 1}}, "bits": (2,),
                                            "calibration_tokens": 300,
                                            "formats": (("int_token", 2), ("identity", 32))})
    monkeypatch.setattr(rt.cells, "SCHEMES", ("identity", "kqv"))
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    assert rt.main(["--scale", "quick", "--n-jobs", "1", "--no-progress"]) == 0
    data = tmp_path / "figures" / "data"
    trials = pd.read_csv(data / "retrieval_trials.csv")
    assert len(trials[trials["scheme"] == "fp"]) == 10  # 5 needles × 2 prompts
    fp = trials[trials["scheme"] == "fp"].set_index(["task", "needle"])["success"]
    identity = trials[trials["scheme"] == "identity"]
    lossless = identity[identity["n"] == 2].set_index(["task", "needle"])["success"]
    assert fp.sum() >= 5 and lossless.equals(fp)
    assert trials.loc[trials["scheme"] == "identity", "attn_kl"].max() < 1e-5
    assert trials.loc[trials["scheme"] == "kqv", "attn_kl"].min() > 1e-3
    # the formats sweep read the same prompts and prefill: its lossless row passes exactly where fp does; int2 per
    # token-head holds 2 + 32/64 bits per element (an fp16 scale and zero per token and head, d = 64)
    assert identity[identity["n"] == 32].set_index(["task", "needle"])["success"].equals(fp)
    assert trials.loc[trials["scheme"] == "int_token", "bits_per_element"].eq(2.5).all()
    tests = pd.read_csv(data / "retrieval_tests.csv")
    vs_fp = tests[tests["family"] == "formats vs fp"]
    assert len(vs_fp) == 4 and (vs_fp[vs_fp["a"] == "identity"]["p"] == 1.0).all()  # 2 formats × 2 tasks
    assert set(tests[tests["family"] == "formats vs quanto"]["a"]) <= {"int_token"}  # quanto at n = 2 only
    claims = {c["id"]: c for c in read_claims(data / "retrieval_claims.json")}
    # no NOVA-KV and no n = 4: those claims are absent
    ours = {"retrieval-fp", "retrieval-schemes", "retrieval-formats"}
    assert "int_token@2 (2.5 bits)" in claims["retrieval-formats"]["measurement"]
    assert (tmp_path / "figures" / "retrieval_heatmap_n2.png").is_file()
    from kvstats.study.models import missing_reason

    if missing_reason("gemma3-270m") is not None:  # a row that says so, never a silent gap
        assert set(claims) == ours | {"retrieval-gemma3-rows"}
        assert claims["retrieval-gemma3-rows"]["verdict"] == "not testable here"
        return
    # Gemma 3 270M: the same prompts in its tokens; its lossless scheme passes exactly where its fp model does (the
    # oracle on a model with sliding-window layers, QK-norm and one KV head of d = 256), as a scheme and as a format
    assert set(claims) == ours | {c + "-gemma3" for c in ours}  # only measured rows: no comparison row
    gemma = pd.read_csv(data / "retrieval_gemma3_trials.csv")
    g_fp = gemma[gemma["scheme"] == "fp"].set_index(["task", "needle"])["success"]
    g_identity = gemma[gemma["scheme"] == "identity"]
    assert len(g_fp) == 10 and g_fp.sum() >= 3
    for n in (2, 32):
        assert g_identity[g_identity["n"] == n].set_index(["task", "needle"])["success"].equals(g_fp)
    assert g_identity["attn_kl"].max() < 1e-5 and gemma.loc[gemma["scheme"] == "kqv", "attn_kl"].min() > 1e-3
    # int2 per token-head on d = 256: 2 + 32/256 bits per element
    assert gemma.loc[gemma["scheme"] == "int_token", "bits_per_element"].eq(2.125).all()
    assert "Gemma-3-270M fp32" in claims["retrieval-fp-gemma3"]["measurement"]
    assert "head dim 256" in claims["retrieval-fp-gemma3"]["data"]
    # transformers' QuantizedCache refuses a model with sliding-window layers: no quanto rows, and the claims say why
    assert rt.cells.BASELINE not in set(gemma["scheme"])
    assert "only full attention layers" in claims["retrieval-schemes-gemma3"]["measurement"]
    assert (tmp_path / "figures" / "retrieval_gemma3_heatmap_n2.png").is_file()


def test_model_tasks_go_past_a_context_only_where_the_model_holds_it(rt):
    """``long`` lengths join a model's tasks below its context: SmolLM2 (8,192 tokens) gets none, Gemma 3 270M
    (32,768) the 16,384-token induction prompts; the scale's own tasks are every model's."""
    cfg = rt.SCALE["full"]  # the tier that runs the second model and long contexts (docs/studies.md, "Tiers")
    smol, gemma = rt.model_tasks(cfg, "smollm2"), rt.model_tasks(cfg, "gemma3-270m")
    assert smol == cfg["tasks"] and cfg["long"] == {"induction": {16384: 2}}
    assert gemma["induction"] == {**cfg["tasks"]["induction"], 16384: 2}
    assert {t: v for t, v in gemma.items() if t != "induction"} == {t: v for t, v in smol.items() if t != "induction"}
    assert rt.model_tasks({"tasks": {}, "long": {"lookup": {32768: 1}}}, "gemma3-270m") == {}


def test_recovered_fraction_and_its_interval(rt):
    """fp passes all 40 trials (8 prompts × 5 needles), the scalar method none, NOVA-KV 3 of each prompt's 5: it
    recovers 60% of what the scalar method loses. The interval (prompts, then needles within them) holds it and
    is about that of a proportion of 40 needles (± 2·√(0.24/40) ≈ ± 0.15): resampled needles vary, prompts do not."""
    rows = []
    for prompt in range(8):
        for needle in range(5):
            for scheme, ok in (("fp", True), ("minmax", False), ("nova", needle < 3)):
                rows.append({"task": "lookup", "length": 256, "prompt": prompt, "needle": needle, "scheme": scheme,
                             "n": 16 if scheme == "fp" else 2, "success": ok})
    estimate, (low, high) = rt.recovered_fraction(pd.DataFrame(rows), "minmax")
    assert estimate == pytest.approx(0.6) and 0.35 < low < 0.6 < high < 0.85


@pytest.mark.slow
def test_cells_run_on_the_kvstats_path_or_are_refused(monkeypatch, smollm2):
    """NOVA-KV's calibration capture (run inside a cell, after the cell set the "kvstats" attention) gives the shared
    model its attention implementation back: it left sdpa behind, so the chunk ran on the dense path without records
    (attn_kl NaN for the first NOVA-KV cells of a cold run). A cell whose chunk did not reach the kvstats path now
    raises instead of reporting it; one that did has a finite attention KL."""
    import kvstats.hf.baselines as baselines
    import kvstats.studies.retrieval as ret
    from kvstats.evaluation.layer_schemes import calibration_capture
    from kvstats.evaluation.model_engine import set_attention, shared_model

    model, _, _ = shared_model()
    set_attention(model, "kvstats")
    calibration_capture.cache_clear()
    try:
        calibration_capture(64)
        assert model.config._attn_implementation == "kvstats"
    finally:
        calibration_capture.cache_clear()
    monkeypatch.setattr(ret.cells, "SCHEMES", ("mse",))
    monkeypatch.setattr(baselines, "available_backends", lambda: ())
    rows = ret.cell("passkey", 256, 0, (2,), None)
    mse = [r for r in rows if r["scheme"] == "mse"]
    assert mse and all(np.isfinite(r["attn_kl"]) and r["attn_kl"] > 0 for r in mse)
    build = ret.cells.layer_schemes

    def leaves_sdpa(*args, **kwargs):  # what the capture did before
        set_attention(model, "sdpa")
        return build(*args, **kwargs)

    monkeypatch.setattr(ret.cells, "layer_schemes", leaves_sdpa)
    # the run sets the kvstats attention right before its forward: a build that leaves sdpa behind changes nothing
    again = [r for r in ret.cell("passkey", 256, 0, (2,), None) if r["scheme"] == "mse"]
    assert [r["attn_kl"] for r in again] == [r["attn_kl"] for r in mse]
    import kvstats.evaluation.model_engine as engine

    switch = engine.set_attention
    monkeypatch.setattr(engine, "set_attention", lambda m, name: switch(m, "sdpa"))  # a forward off the path
    with pytest.raises(ValueError, match=r"the estimator path did not run on layers 0 \(model\)"):
        ret.cell("passkey", 256, 0, (2,), None)


def test_transformers_quantized_cache_is_refused_on_sliding_window_layers_only(rt):
    """transformers' QuantizedCache holds a model with full attention on every layer (a tiny Llama) and refuses one
    with sliding-window layers (a tiny Gemma 3 270M): the retrieval cell then runs no baseline and says why."""
    pytest.importorskip("transformers")
    from kvstats.hf.baselines import available_backends

    if rt.cells.BASELINE not in available_backends():
        pytest.skip("optimum-quanto is not installed (the [baselines] extra)")
    from tests.helpers.architectures import _tiny

    assert rt.cells.baseline_refusal(_tiny("llama")) is None
    why = rt.cells.baseline_refusal(_tiny("gemma3_270m"))
    assert "only full attention layers" in why and "sliding_attention" in why


def test_the_paper_tier_runs_what_its_two_verdicts_read(rt):
    """The everyday tier's cells run only the (scheme, n) pairs its verdicts read (docs/studies.md, "Tiers"): NOVA-KV
    and every scalar method at NOVA-KV's budget (the best scalar method is chosen among them) and KQV at 4 bits (the
    neutrality claim); the pass key keeps its planned trials; an unknown scheme is refused before a model loads."""
    from kvstats.studies.retrieval import analysis

    runs = set(rt.SCALE["paper"]["runs"])
    assert {("nova", analysis.NOVA_BITS), ("kqv", 4)} | {(s, analysis.NOVA_BITS) for s in analysis.SCALAR} == runs
    assert sum(rt.SCALE["paper"]["tasks"]["passkey"].values()) >= rt.cells.EQUIVALENCE_TRIALS
    assert all(n in rt.SCALE["paper"]["bits"] for _, n in runs)
    with pytest.raises(ValueError, match=r"runs names unknown schemes \['bogus'\]"):
        rt.cells.cell("passkey", 256, 0, (2,), None, runs=[["bogus", 2]])


def test_the_verdicts_plan_their_sample_sizes(rt):
    """Issue 50. NOVA-KV's McNemar part, planned for p10 − p01 = NOVA_EFFECT at the run's discordance (0.3 here),
    against the exact power by brute force (scipy's binomtest on every discordant count): below 0.8 one trial before
    the plan, at least 0.8 from the plan on; with the recovered fraction's interval the bound part, ⌈n·(mde/Δ)²⌉
    prompts, is the harder. The neutrality claim: per task the paired TOST at δ = MARGIN for a true difference 0 (about
    the normal approximation ((z_.95 + z_.9)·sd/δ)², a few trials more for the t), never below the Newcombe floor."""
    import math

    rc = rt.claims
    row = {"trials": 60, "a_only": 15, "b_only": 3}
    sample = rc.nova_sample(row, (math.nan, math.nan), 12)
    p10, p01 = (0.3 + rc.NOVA_EFFECT) / 2, (0.3 - rc.NOVA_EFFECT) / 2
    top = sample.planned_n + 30
    reject = [[False]] + [[scipy.stats.binomtest(k, m, 0.5).pvalue < rc.ALPHA for k in range(m + 1)]
                          for m in range(1, top + 1)]

    def power(n: int) -> float:
        return sum(scipy.stats.binom.pmf(m, n, p10 + p01)
                   * sum(scipy.stats.binom.pmf(k, m, p10 / (p10 + p01)) for k in range(m + 1) if reject[m][k])
                   for m in range(n + 1))

    assert power(sample.planned_n - 1) < 0.8 <= min(power(n) for n in range(sample.planned_n, top + 1))
    assert sample.achieved_n == 60 and sample.unit == "trials" and "McNemar" in sample.test
    bound = rc.nova_sample(row, (0.3, 0.9), 12)
    mde = (scipy.stats.norm.isf(0.025) + scipy.stats.norm.ppf(0.8)) * 0.6 / (2 * scipy.stats.norm.isf(0.025))
    assert bound.unit == "prompts" and bound.achieved_n == 12
    assert bound.planned_n == math.ceil(12 * (mde / (rc.RECOVERED_EXPECTED - rc.RECOVERED_LIMIT)) ** 2)
    rows = [{"task": "passkey", "trials": 30, "difference": 0.0, "a_only": 0, "b_only": 0},
            {"task": "lookup", "trials": 60, "difference": -0.05, "a_only": 1, "b_only": 4}]
    plans = {r["task"]: rc.neutral_sample([r]) for r in rows}
    for r in rows:
        n = r["trials"]
        sd = math.sqrt(max((r["a_only"] + r["b_only"] - n * r["difference"] ** 2) / (n - 1), 1 / n))
        normal = ((scipy.stats.norm.isf(0.05) + scipy.stats.norm.isf(0.1)) * sd / rc.MARGIN) ** 2
        assert normal <= plans[r["task"]].planned_n <= normal + 3 and plans[r["task"]].planned_n >= 52
    assert plans["passkey"].mde is None  # 30 trials: below the 52 at which any outcome can be shown equivalent
    assert rc.neutral_sample(rows) == plans["lookup"]  # the harder task: 283 planned for 60
