"""kvstats retrieval (Python and CLI): prompts for any tokenizer, the lossless oracle, the statistics against scipy
and statsmodels, the plan against its definition and a simulation, strict JSON, resume, the heat map."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from kvstats.evaluation import retrieval_stats as rs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    """The tests' tiny Llama (tests/helpers/texts.py) with 1,024 positions, saved with a word-level tokenizer."""
    transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.helpers.texts import WORDS

    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=1024, rope_theta=10000.0, attn_implementation="sdpa",
                                   initializer_range=0.2)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_long")
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize("alpha,family", [(0.05, 1), (0.05, 3), (0.05, 9), (0.01, 4), (0.1, 2), (0.05, 40)])
def test_min_discordant_is_the_fewest_one_sided_discordant_pairs_scipy_rejects_with(alpha, family):
    b = rs.min_discordant(alpha, family)
    assert sps.binomtest(b, b, 0.5).pvalue < alpha / family
    assert sps.binomtest(b - 1, b - 1, 0.5).pvalue >= alpha / family


def test_equivalence_trials_reach_the_planned_power_in_a_simulation():
    """At the planned n, a Wald TOST of two equally accurate caches disagreeing on 10% of trials concludes in about
    80% of runs: 20,000 simulated runs (seeded) give the power to ±0.009 (3 sd), and the normal approximation
    is within a few points of the truth at n ~ 340."""
    margin, alpha, pd_ = 0.05, 0.05, 0.1
    n = rs.equivalence_trials(margin, alpha=alpha, power=0.8, discordance=pd_)
    assert n == int(np.ceil((sps.norm.ppf(0.95) + sps.norm.ppf(0.9)) ** 2 * pd_ / margin ** 2))
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, [pd_ / 2, pd_ / 2, 1 - pd_], size=20000)  # a only, b only, agree
    diff = (counts[:, 0] - counts[:, 1]) / n
    var = ((counts[:, 0] + counts[:, 1]) / n - diff ** 2) / n
    half = sps.norm.ppf(1 - alpha) * np.sqrt(var)
    power = np.mean((diff - half > -margin) & (diff + half < margin))
    assert 0.78 < power < 0.86


def test_equivalence_trials_refuse_values_outside_their_range():
    with pytest.raises(ValueError, match="margin must be in"):
        rs.equivalence_trials(0.0)
    with pytest.raises(ValueError, match="discordance must be in"):
        rs.equivalence_trials(0.05, discordance=1.5)


def _frame(outcomes: dict[str, list[bool]], task="t", length=256):
    rows = []
    for scheme, out in outcomes.items():
        rows += [{"task": task, "length": length, "prompt": i, "needle": 0, "scheme": scheme, "n": 4,
                  "success": bool(o), "attn_kl": np.nan, "bits_per_element": np.nan} for i, o in enumerate(out)]
    return pd.DataFrame(rows)


def test_tests_table_matches_statsmodels_mcnemar_and_holm():
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(1)
    base = rng.random(60) < 0.7
    out = {"fp": base, "A": base & (rng.random(60) < 0.6), "B": base ^ (rng.random(60) < 0.1)}
    trials = pd.concat([_frame(out, "x"), _frame({k: v[::-1] for k, v in out.items()}, "y")], ignore_index=True)
    pairs = [(("A", 4), ("fp", 4)), (("B", 4), ("fp", 4))]
    t = rs.tests_table(trials, pairs)
    main = t[t["length"] == "all"]
    ps = []
    for _, r in main.iterrows():
        g = trials[trials["task"] == r["task"]]
        a = g[g["scheme"] == r["a"]]["success"].to_numpy()
        b = g[g["scheme"] == r["b"]]["success"].to_numpy()
        table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
        ps.append(mcnemar(table, exact=True).pvalue)
        assert r["difference"] == pytest.approx(a.mean() - b.mean(), abs=1e-12)
    assert main["p"].to_numpy() == pytest.approx(ps, rel=1e-12)
    assert main["p_holm"].to_numpy() == pytest.approx(multipletests(ps, method="holm")[1], rel=1e-12)
    assert main.iloc[0]["significant"] and main.iloc[0]["p_holm"] < 0.05  # A loses 40% of fp's passes


def test_verdicts():
    row = {"significant": False, "difference": 0.0, "eq_low": -0.03, "eq_high": 0.04}
    assert rs.verdict(row, 0.05) == "equivalent"
    assert rs.verdict(row | {"eq_high": 0.06}, 0.05) == "undecided"
    assert rs.verdict(row | {"significant": True, "difference": -0.2}, 0.05) == "worse"
    assert rs.verdict(row | {"significant": True, "difference": 0.2}, 0.05) == "better"


# ------------------------------------------------------------------------------------------ prompts


def test_prompts_put_each_answer_where_its_logits_predict_it(long_tiny):
    from transformers import AutoTokenizer

    from kvstats.evaluation.retrieval_tasks import RetrievalTasks, passed

    tasks = RetrievalTasks(AutoTokenizer.from_pretrained(long_tiny), {"doc": "we the people of the united states "
                                                                             "in order to form " * 40})
    for task in ("passkey", "induction", "lookup"):
        p = tasks.build(task, 200, np.random.default_rng(3), depth=0.5)
        assert len(p.context) >= 200 and len(p.answers) == (1 if task == "passkey" else 5)
        logits = torch.full((len(p.chunk), 100), -1.0)
        for offset, answer in p.answers:  # a model that predicts every answer token
            assert p.chunk[offset:offset + len(answer)] == list(answer)
            for j, a in enumerate(answer):
                logits[offset - 1 + j, a] = 1.0
        assert passed(logits, p) == [True] * len(p.answers)
        offset, answer = p.answers[-1]
        logits[offset - 1 + len(answer) - 1] = -1.0
        logits[offset - 1 + len(answer) - 1, (answer[-1] + 1) % 100] = 1.0  # its last token wrong
        assert passed(logits, p)[-1] is False


# ------------------------------------------------------------------------------------------ the engine


def test_a_lossless_cache_passes_exactly_the_trials_fp_passes(long_tiny):
    from kvstats.evaluation.retrieval import evaluate_retrieval
    from kvstats.hf.cache import IdentityScheme

    ev = evaluate_retrieval(IdentityScheme(32), bits=8, model=str(long_tiny), tasks=["induction"], lengths=[128],
                            prompts=2, check=False)
    for u in ev.units:
        assert all(t["A"] == t["fp"] for t in u["trials"])
    main = [t for t in ev.tests if t["length"] == "all"]
    assert [(t["a"], t["b"], t["a_only"], t["b_only"], t["p"]) for t in main] == [("A", "fp", 0, 0, 1.0)]
    assert 0 <= ev.config["lossless_check"]["max_logit_gap"] < 1e-4  # the oracle's own gap, recorded


def test_a_model_the_cache_cannot_hold_exactly_is_refused(long_tiny, monkeypatch):
    from kvstats.evaluation import retrieval

    def shifted(run, head_dim):
        return run.exact()["logits"] + torch.linspace(0, 5, 100)  # as a wrong position would

    monkeypatch.setattr(retrieval, "_lossless_logits", shifted)
    with pytest.raises(ValueError, match="cannot hold this model's prefill exactly"):
        retrieval.evaluate_retrieval("kqv", bits=4, model=str(long_tiny), tasks=["lookup"], lengths=[128],
                                     prompts=1)


def test_lengths_beyond_the_model_are_refused_by_name(long_tiny):
    from kvstats.evaluation.retrieval import evaluate_retrieval

    with pytest.raises(ValueError, match="lengths: induction at 1024 tokens"):
        evaluate_retrieval("kqv", bits=4, model=str(long_tiny), tasks=["induction"], lengths=[1024], prompts=1)
    with pytest.raises(ValueError, match="tasks must name"):
        evaluate_retrieval("kqv", bits=4, model=str(long_tiny), tasks=["needle"], lengths=[128])


def test_cli_runs_a_user_quantizer_with_the_fp_control_json_figure_and_resume(long_tiny, tmp_path, capsys):
    from kvstats.cli.parser import main

    out, fig = tmp_path / "r.json", tmp_path / "r.png"
    args = ["retrieval", "--model", str(long_tiny), "--quantizer", "tests.helpers.user_quantizers:GroupAbsmax",
            "--bits", "3", "--compare", "kqv", "--tasks", "lookup", "passkey", "--lengths", "128", "--prompts", "2",
            "--out", str(out), "--figure", str(fig), "--no-progress"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "exact McNemar" in table and "A = tests.helpers.user_quantizers:GroupAbsmax at 3 bits" in table
    data = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert data["schema"] == "kvstats-retrieval/1" and data["provenance"]["command"]
    assert {(t["a"], t["b"]) for t in data["tests"]} == {("A", "fp"), ("B", "fp"), ("A", "B")}
    assert data["config"]["checks"]["quantizer"]["fresh process"] == "passed"
    assert fig.stat().st_size > 1000 and not (tmp_path / "r.json.units").exists()
    # resume: the finished prompts of an interrupted run are reused, not computed again
    from kvstats.evaluation.retrieval import evaluate_retrieval

    store = tmp_path / "store"
    kw = dict(bits=3, model=str(long_tiny), tasks=["lookup"], lengths=[128], prompts=2, store=store)
    first = evaluate_retrieval("tests.helpers.user_quantizers:GroupAbsmax", **kw)
    again = evaluate_retrieval("tests.helpers.user_quantizers:GroupAbsmax", **kw)
    assert first.config["units_reused"] == 0 and again.config["units_reused"] == 2
    assert again.units == first.units


def test_cli_refuses_bad_options_before_any_work(tmp_path, capsys):
    from kvstats.cli.parser import main

    missing = str(tmp_path / "nowhere")
    for extra, message in ((["--margin", "0"], "--margin must be in (0, 1)"),
                           (["--lengths", "10"], "--lengths"),
                           (["--match-bits"], "--match-bits has no effect without --compare"),
                           (["--figure", str(tmp_path / "f.txt")], "--figure must end in .png")):
        assert main(["retrieval", "--quantizer", "kqv", "--bits", "4", "--model", missing, *extra]) == 2
        assert message in capsys.readouterr().err


def test_smollm2_retrieval_end_to_end_with_a_user_quantizer(smollm2, capsys):
    """The issue's command on SmolLM2: a user quantizer at 3 bits, the fp control and McNemar in table and JSON."""
    from kvstats.cli.parser import main

    assert main(["retrieval", "--quantizer", "tests.helpers.user_quantizers:GroupAbsmax", "--bits", "3",
                 "--tasks", "passkey", "--lengths", "256", "--prompts", "2", "--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    fp = [a for a in data["pooled"] if a["side"] == "fp"]
    assert fp and fp[0]["trials"] == 2
    assert [(t["a"], t["b"]) for t in data["tests"] if t["length"] == "all"] == [("A", "fp")]


def test_a_prompt_run_prefills_every_token_of_a_sliding_window_model():
    """PromptRun on a tiny Gemma 3 (the shipped 270M's attention: one KV head, d = 256, a 16-token window on its
    sliding layers) with a 96-token context, six windows long: the prefill holds every token of every layer (a
    model's default cache keeps only a sliding layer's window, which KVStatsCache.prefill refuses); a lossless
    cache answers as the exact cache does; the context's bits are counted before the questions — KIVI-4 over 96
    tokens holds exactly 5 bits per element (K per channel in groups of 32 tokens: 4 + 32/32; V per token: 4 + 1),
    and the questions' 5 tokens, a partial group, then add to it."""
    from kvstats.evaluation.retrieval import PromptRun
    from kvstats.evaluation.retrieval_tasks import Prompt
    from kvstats.hf.cache import IdentityScheme
    from kvstats.quant.schemes import scheme
    from tests.helpers.architectures import _tiny

    model = _tiny("gemma3_270m")
    assert model.config.sliding_window == 16 and "sliding_attention" in model.config.layer_types
    gen = torch.Generator().manual_seed(3)
    context = torch.randint(1, 128, (96,), generator=gen).tolist()
    chunk = torch.randint(1, 128, (5,), generator=gen).tolist()
    with torch.inference_mode():
        run = PromptRun(model, Prompt(context, chunk, (0.5,), ((2, (chunk[2],)),)))
        assert all(layer.keys.shape[-2] == 96 for layer in run.past.layers)
        lossless = run.quantized(IdentityScheme(256), record=False)
        kivi = run.quantized(scheme("kivi", bits=4, dim=256, group_size=32), record=False)
        exact = run.exact()
    torch.testing.assert_close(lossless["logits"], exact["logits"], rtol=0, atol=1e-4)
    assert lossless["success"] == exact["success"]
    assert kivi["context_bits_per_element"] == 5.0
    assert kivi["bits_per_element"] > 5.0  # the 5 question tokens: a partial group of K's per-channel ranges
