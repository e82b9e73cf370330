"""Every supported architecture is exact on the kvstats path, or refused: tiny random models built from transformers'
configs (no download), one per family.

For each family — Llama, Mistral (sliding window), Qwen2 (sliding window on some layers), Qwen3 (q/k norms), Gemma
(head dim 256), Gemma2 (soft capping, alternating sliding windows, query_pre_attn_scalar), Gemma3 (q/k norms,
sliding windows), Phi3 (fused qkv, partial rotary), gpt-oss (attention sinks, mixture of experts) — with GQA ratios
1 to 8 and head dims 16 to 256:

* a lossless scheme through KVStatsCache on the estimator path ("kvstats") and on the dense path reproduces the
  model's own eager logits (fp32, |Δlogit| ≤ 1e-4) in a prefill and in one-token decode steps;
* the capture's queries, keys and values reproduce the model's own attention weights, soft cap and window
  included, and ``kvstats capture`` + ``kvstats evaluate`` run on it (a window shorter than the evaluation window
  is refused, naming the layer);
* what kvstats does not implement is refused with an error naming it: an unknown attention keyword on the
  kvstats path, attention sinks in a capture.
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.evaluation.evaluator import evaluate  # noqa: E402
from kvstats.hf.cache import IdentityScheme, KVStatsCache, cache_kwargs, kvstats_attention, use_estimator_attention  # noqa: E402
from kvstats.hf.capture import capture_qkv  # noqa: E402
from kvstats.measure.stats import InferenceOptions  # noqa: E402
from kvstats.quant.attention import soft_cap, window_visible  # noqa: E402
from tests.helpers.architectures import COMMON, FAMILIES, _head_dim, _tiny  # noqa: E402, F401

PREFILL, DECODE = 30, 10


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 128, (1, PREFILL + DECODE), generator=torch.Generator().manual_seed(0))


def _through_cache(model, ids, cache) -> torch.Tensor:
    with torch.inference_mode():
        steps = [model(ids[:, :PREFILL], **cache_kwargs(model, cache), use_cache=True).logits]
        for t in range(PREFILL, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits)
    return torch.cat(steps, dim=1)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_lossless_scheme_reproduces_the_models_own_logits(family, ids):
    model = _tiny(family)
    with torch.inference_mode():
        reference = model(ids).logits  # the model's own eager attention, no cache
    dense = _through_cache(model, ids, KVStatsCache(IdentityScheme(_head_dim(model))))
    estimator = _through_cache(use_estimator_attention(model), ids, KVStatsCache(IdentityScheme(_head_dim(model))))
    for path, got in (("dense", dense), ("kvstats", estimator)):
        for part, cols in (("prefill", slice(0, PREFILL)), ("decode", slice(PREFILL, None))):
            gap = float((got[:, cols] - reference[:, cols]).abs().max())
            assert gap <= 1e-4, f"{family} {path} {part}: max |Δlogit| = {gap:.3g}"


def _weights_from_capture(q, k, rule, window):
    """Independent oracle: softmax(softcap(scale · q kᵀ) + causal/window mask), written out in float64."""
    g = q.shape[1] // k.shape[1]
    logits = (q.double() @ k.double().repeat_interleave(g, dim=1).transpose(-1, -2)) * rule["scaling"]
    if rule["softcap"] is not None:
        logits = torch.tanh(logits / rule["softcap"]) * rule["softcap"]
    t = q.shape[2]
    visible = torch.ones(t, t, dtype=torch.bool).tril()
    if window is not None:
        visible &= ~torch.ones(t, t, dtype=torch.bool).tril(-window)
    return logits.masked_fill(~visible, float("-inf")).softmax(-1)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])
def test_capture_reproduces_the_models_attention_weights(family, ids):
    model = _tiny(family)
    cap = capture_qkv(model, input_ids=ids, model_name=family)
    with torch.inference_mode():
        out = model(ids, output_attentions=True)
    windows = []
    for i, rule in enumerate(cap.metadata["attention"]):
        windows.append(rule["sliding_window"])
        weights = _weights_from_capture(cap.queries(i), cap.keys(i), rule, rule["sliding_window"])
        torch.testing.assert_close(weights.float(), out.attentions[i].float(), rtol=1e-4, atol=1e-5)
        assert cap.keys(i).shape[2] == ids.shape[1]  # every token, also on sliding-window layers
    types = getattr(model.config, "layer_types", None)
    if types is not None:  # a sliding window is recorded exactly on the layers the config makes sliding
        assert [w is not None for w in windows] == [t == "sliding_attention" for t in types]
    if family == "gemma2":
        assert all(r["softcap"] == 5.0 for r in cap.metadata["attention"])
        assert cap.metadata["attention"][0]["scaling"] == pytest.approx(48 ** -0.5)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])
def test_capture_then_evaluate(family, ids, tmp_path):
    model = _tiny(family)
    path = capture_qkv(model, input_ids=ids, model_name=family).save(tmp_path / "cap.safetensors")
    ev = evaluate("kqv", bits=4, data=path, window=16, inference=InferenceOptions(n_resamples=999))
    assert len(ev.units) == ids.shape[1] // 16 and ev.summary["attention_kl"].statistic > 0
    if family == "gemma2":
        assert ev.config["softcap"] == [5.0] * 4
    if family in ("mistral", "qwen2", "gemma2", "gemma3"):
        with pytest.raises(ValueError, match="sliding window of 16 tokens, shorter than the evaluation window of 20"):
            evaluate("kqv", bits=4, data=path, window=20)


def test_softcapped_attention_kl_is_computed_on_the_capped_logits(ids, tmp_path):
    """Oracle: attention KL of a unit written out in float64 on softcap(scale · q kᵀ) for Gemma2's first layer."""
    model = _tiny("gemma2")
    path = capture_qkv(model, input_ids=ids).save(tmp_path / "g2.safetensors")
    ev = evaluate("turbo_mse", bits=2, data=path, window=16, layers=[1], inference=InferenceOptions(n_resamples=999))
    from kvstats.data.io import load_qkv
    from kvstats.evaluation.evaluator import resolve_scheme

    f = load_qkv(path)
    q, k, v = (t[:, :, :16].float() for t in (f.queries(1), f.keys(1), f.values(1)))
    from kvstats._random import unit_seed

    scheme = resolve_scheme("turbo_mse", bits=2, dim=64, seed=unit_seed(0, 0))  # unit 0's spawned seed
    est = scheme.scores(q, scheme.encode(k, v)).double() * 48 ** -0.5
    est = torch.tanh(est / 5.0) * 5.0
    ref = torch.tanh((q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) * 48 ** -0.5 / 5.0) * 5.0
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    lp = ref.masked_fill(~mask, -math.inf).log_softmax(-1)
    lq = est.masked_fill(~mask, -math.inf).log_softmax(-1)
    kl = torch.nan_to_num(lp.exp() * (lp - lq)).sum(-1).mean().item()
    assert ev.units[0]["attention_kl"] == pytest.approx(kl, rel=1e-6)
    assert soft_cap(torch.tensor([100.0]), 5.0).item() == pytest.approx(5.0 * math.tanh(20.0))


def test_what_kvstats_does_not_implement_is_refused_by_name(ids):
    model = _tiny("llama")
    attn = model.model.layers[0].self_attn
    q, k = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 3, 64)
    with pytest.raises(ValueError, match=r"does not implement position_bias=Tensor \(passed by LlamaAttention\)"):
        kvstats_attention(attn, q, k, k, None, position_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="attention sinks"):
        capture_qkv(_tiny("gpt_oss"), input_ids=ids)


def test_without_a_mask_the_sliding_window_is_applied_by_kvstats():
    """kvstats_attention with no mask and sliding_window=W equals eager attention under transformers' window mask."""
    model = _tiny("mistral")
    attn = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 8, 24, 64, generator=gen), torch.randn(1, 1, 24, 64, generator=gen), \
        torch.randn(1, 1, 24, 64, generator=gen)
    out, weights = kvstats_attention(attn, q, k, v, None, scaling=0.125, sliding_window=5)
    visible = window_visible(24, 24, 5)
    logits = (q @ k.transpose(-1, -2)) * 0.125
    expected = logits.masked_fill(~visible, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, (expected @ v).transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family", ["mistral", "gemma2", "phi3", "qwen3"])
def test_cli_capture_of_a_saved_model_folder(family, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from kvstats.cli.parser import main
    from kvstats.data.io import load_qkv

    folder = tmp_path / family
    _tiny(family).save_pretrained(folder)
    words = [f"w{i}" for i in range(120)]
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    texts = []
    for j in range(2):  # two documents into one file
        texts.append(tmp_path / f"doc{j}.txt")
        texts[-1].write_text(" ".join(words[(7 * i + j) % 120] for i in range(40)))
    out = tmp_path / "cap.safetensors"
    assert main(["capture", "--model", str(folder), "--text", *map(str, texts), "--out", str(out),
                 "--no-progress"]) == 0
    f = load_qkv(out)
    assert f.metadata["n_tokens"] == 80 and [(d["start"], d["stop"]) for d in f.metadata["documents"]] == [(0, 40),
                                                                                                       (40, 80)]
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "4", "--data", str(out), "--window", "16",
                 "--no-progress"]) == 0
    assert "(2 documents, 4 windows: disjoint windows of 16 tokens within 2 documents" in capsys.readouterr().out
    assert main(["capture", "--model", str(folder), "--text", str(texts[0]), "--out", str(out), "--dtype", "bf16",
                 "--force", "--no-progress"]) == 0
    f = load_qkv(out)
    assert f.metadata["dtype"] == "bfloat16" and f.keys(0).dtype == torch.bfloat16
