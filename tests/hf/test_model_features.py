"""Model features kvstats takes exactly or refuses by name (tiny random models from transformers' configs, no
download; the oracle is the model's own eager attention in fp32):

* a prefill from a cache whose layers do not hold every token (the sliding layers of Mistral, Qwen2, Gemma 2 and
  Gemma 3's ``DynamicCache``, a partly filled static cache, layers of unequal length or batch) is refused naming the
  layer; from a cache that holds every token it continues with the model's own logits (≤ 1e-4), dense and kvstats;
* a model whose attention does not go through transformers' AttentionInterface (Bloom, MPT) is refused by
  ``use_estimator_attention`` and by the evaluation engine; a forward whose layers did not reach the kvstats path is
  reported by ``attention_paths`` and refused by ``require_estimator_path``;
* KV sharing (Gemma 3n: the last layers read an earlier layer's K/V) runs exactly on the kvstats path, reading the
  shared layer's codes;
* multi-head latent attention (DeepSeek-V3) is refused naming MLA;
* an estimator replaced on the quantizer instance is the one the cache uses.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from transformers import DynamicCache, StaticCache  # noqa: E402

from kvstats.evaluation.model_engine import ModelSource, model_unit  # noqa: E402
from kvstats.hf.cache import (  # noqa: E402
    IdentityScheme,
    KVStatsCache,
    cache_kwargs,
    kvstats_cache,
    model_dims,
    use_estimator_attention,
)
from kvstats.hf.capture import capture_qkv  # noqa: E402
from kvstats.quant.schemes import scheme  # noqa: E402
from tests.helpers.architectures import COMMON, _head_dim, _tiny  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

CONTEXT, STEPS = 30, 6  # the sliding windows of the tiny configs are 16 tokens: a 30-token context overflows them


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 128, (1, CONTEXT + STEPS), generator=torch.Generator().manual_seed(3))


def _continue(model, ids, cache, start: int) -> torch.Tensor:
    """Logits of tokens ``start..`` fed one at a time into ``cache`` (which holds the first ``start``)."""
    with torch.inference_mode():
        return torch.cat([model(ids[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits
                          for t in range(start, ids.shape[1])], dim=1)


# ------------------------------------------------------------------------------------ prefill of a model's cache
@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma2", "gemma3"])
def test_a_sliding_window_cache_is_refused_naming_the_layer(family, ids):
    model = _tiny(family)
    with torch.inference_mode():
        own = model(ids[:, :CONTEXT], use_cache=True).past_key_values  # sliding layers keep the last 15 tokens
    sliding = next(i for i, layer in enumerate(own.layers) if layer.keys.shape[-2] < CONTEXT)
    with pytest.raises(ValueError, match=rf"past layer {sliding} \(DynamicSlidingWindowLayer\) holds 15 token "
                                         rf"states but has seen {CONTEXT} tokens.*DynamicCache\(\)"):
        KVStatsCache(IdentityScheme(_head_dim(model))).prefill(own)


@pytest.mark.parametrize("path", ["dense", "kvstats"])
@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma2", "gemma3"])
def test_a_prefill_from_a_cache_of_every_token_continues_with_the_models_own_logits(family, path, ids):
    model = _tiny(family)
    with torch.inference_mode():
        reference = model(ids).logits[:, CONTEXT:]
        past = model(ids[:, :CONTEXT], use_cache=True, **cache_kwargs(model, DynamicCache())).past_key_values
    if path == "kvstats":
        use_estimator_attention(model)
    cache = KVStatsCache(IdentityScheme(_head_dim(model))).prefill(past)
    assert cache.get_seq_length() == CONTEXT and cache.attention_paths() == [None] * len(cache.layers)
    got = _continue(model, ids, cache, CONTEXT)
    gap = float((got - reference).abs().max())
    assert gap <= 1e-4, f"{family} {path}: max |Δlogit| = {gap:.3g}"
    if path == "kvstats":
        cache.require_estimator_path(model)


def test_a_short_context_in_the_models_own_sliding_cache_is_taken(ids):
    """12 tokens < the window: every sliding layer still holds every token, so the model's own cache is complete."""
    model, short = _tiny("gemma2"), 12
    with torch.inference_mode():
        reference = model(ids[:, :short + STEPS]).logits[:, short:]
        own = model(ids[:, :short], use_cache=True).past_key_values
    cache = KVStatsCache(IdentityScheme(_head_dim(model))).prefill(own)
    assert float((_continue(model, ids[:, :short + STEPS], cache, short) - reference).abs().max()) <= 1e-4


def test_pasts_whose_layers_disagree_are_refused_naming_the_layer():
    def states(b, s):
        return torch.randn(b, 2, s, 16), torch.randn(b, 2, s, 16)

    with pytest.raises(ValueError, match=r"past layer 1 holds batch 1 and 7 tokens, layer 0 batch 1 and 16 tokens"):
        KVStatsCache(IdentityScheme(16)).prefill([states(1, 16), states(1, 7)])
    with pytest.raises(ValueError, match=r"past layer 2 holds batch 2 and 16 tokens, layer 0 batch 1"):
        KVStatsCache(IdentityScheme(16)).prefill([states(1, 16), states(1, 16), states(2, 16)])
    k, v = states(1, 16)
    with pytest.raises(ValueError, match=r"past\[0\] keys \(1, 2, 16, 16\) and values \(1, 2, 15, 16\)"):
        KVStatsCache(IdentityScheme(16)).prefill([(k, v[..., 1:, :])])


def test_a_partly_filled_static_cache_is_refused(ids):
    model = _tiny("llama")
    static = StaticCache(config=model.config, max_cache_len=48)
    with torch.inference_mode():
        model(ids[:, :CONTEXT], use_cache=True, **cache_kwargs(model, static))
    with pytest.raises(ValueError, match=rf"past layer 0 \(StaticLayer\) holds 48 token states but has seen "
                                         rf"{CONTEXT} tokens"):
        KVStatsCache(IdentityScheme(_head_dim(model))).prefill(static)


# --------------------------------------------------------------------- attention outside the AttentionInterface
def _bloom():
    cfg = transformers.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4, pad_token_id=0,
                                   bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return transformers.BloomForCausalLM(cfg).eval()


def _mpt():
    cfg = transformers.MptConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    torch.manual_seed(0)
    return transformers.MptForCausalLM(cfg).eval()


@pytest.mark.parametrize("build", [_bloom, _mpt], ids=["bloom", "mpt"])
def test_a_model_outside_the_attention_interface_is_refused_by_name(build, ids):
    model = build()
    with pytest.raises(ValueError, match=rf"{type(model).__name__} does not compute its attention through "
                                         r"transformers' AttentionInterface"):
        use_estimator_attention(model)


def test_a_forward_that_missed_the_kvstats_path_is_reported_and_refused(ids):
    """Bloom forced past the refusal: its forward runs its own attention, which the cache reports per layer."""
    model = _bloom()
    model.config._attn_implementation = "kvstats"
    cache = KVStatsCache(IdentityScheme(16))
    with torch.inference_mode():
        model(ids[:, :8], **cache_kwargs(model, cache), use_cache=True)
    assert cache.attention_paths() == ["model", "model"]
    with pytest.raises(ValueError, match=r"BloomForCausalLM: the estimator path did not run on layers "
                                         r"0 \(model\), 1 \(model\) of 2"):
        cache.require_estimator_path(model)


def test_the_evaluation_engine_refuses_a_model_outside_the_attention_interface(ids):
    """An 8-bit quantizer whose scores are halved: on Bloom its estimator would silently be replaced by the model's
    own attention over decoded keys (the finding: KL 2.45e-05 there against 0.261 on a model where it runs)."""
    model = _bloom()
    source = ModelSource(model, None, "tiny bloom", model_dims(model.config), [(0, "a", ids[:, :16])], [], {})
    with pytest.raises(ValueError, match=r"BloomForCausalLM does not compute its attention through"):
        model_unit(source, scheme("kv", bits=8, dim=16, seed=0), ids[:, :16])


def test_a_cache_whose_model_switched_away_from_kvstats_is_refused(ids):
    model = use_estimator_attention(_tiny("llama"))
    cache = KVStatsCache(scheme("kqv", bits=4, dim=64, seed=0))
    with torch.inference_mode():
        model(ids[:, :8], **cache_kwargs(model, cache), use_cache=True)
        cache.require_estimator_path(model)
        model.set_attn_implementation("sdpa")  # its attention would now read only this forward's exact states
        model(ids[:, 8:9], **cache_kwargs(model, cache), use_cache=True)
        assert set(cache.attention_paths()) == {"model"}
        with pytest.raises(ValueError, match="LlamaForCausalLM: the estimator path did not run on layers 0"):
            cache.require_estimator_path(model)
        with pytest.raises(ValueError, match=r"layer 0: the last forward's attention did not go through "
                                             r"kvstats_attention"):
            model(ids[:, 9:10], **cache_kwargs(model, cache), use_cache=True)


# ------------------------------------------------------------------------------------ KV sharing (Gemma 3n)
def _gemma3n():
    cfg = transformers.Gemma3nTextConfig(
        **{**COMMON, "num_hidden_layers": 6}, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        sliding_window=16, num_kv_shared_layers=2, vocab_size_per_layer_input=128, hidden_size_per_layer_input=8,
        laurel_rank=4, activation_sparsity_pattern=[0.0] * 6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.Gemma3nForCausalLM(cfg).eval()


def _through(model, ids, cache) -> torch.Tensor:
    with torch.inference_mode():
        first = model(ids[:, :CONTEXT], **cache_kwargs(model, cache), use_cache=True).logits
    return torch.cat([first, _continue(model, ids, cache, CONTEXT)], dim=1)


def test_kv_sharing_layers_read_the_shared_layers_codes_exactly(ids):
    model = _gemma3n()
    shared = [layer.self_attn.is_kv_shared_layer for layer in model.model.layers]
    assert shared == [False] * 4 + [True] * 2
    with torch.inference_mode():
        reference = model(ids).logits
    dense = _through(model, ids, KVStatsCache(IdentityScheme(32)))
    use_estimator_attention(model)
    lossless = KVStatsCache(IdentityScheme(32), record_attention=True)
    estimator = _through(model, ids, lossless)
    for path, got in (("dense", dense), ("kvstats", estimator)):
        gap = float((got - reference).abs().max())
        assert gap <= 1e-4, f"{path}: max |Δlogit| = {gap:.3g}"
    lossless.require_estimator_path(model)
    # every layer records, the sharing ones under their own index, and a lossless cache loses nothing
    assert sorted({r.layer for r in lossless.attention_records}) == list(range(6))
    assert max(float(r.kl.max()) for r in lossless.attention_records) < 1e-9
    # a lossy linear scheme: the sharing layers read the shared layer's codes on both paths (decode-then-dot)
    lossy = scheme("kqv", bits=3, dim=32, seed=1)
    quantized = _through(model, ids, KVStatsCache(lossy))
    model.set_attn_implementation("eager")
    decoded = _through(model, ids, KVStatsCache(lossy))
    assert float((quantized - decoded).abs().max()) <= 1e-4
    assert float((quantized - reference).abs().max()) > 1e-2  # the codes were read, not exact states


# ------------------------------------------------------------------------------------------------ MLA
def test_multi_head_latent_attention_is_refused_naming_it(ids):
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=1, topk_group=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match=r"DeepseekV3Config uses multi-head latent attention \(kv_lora_rank=16\)"):
        kvstats_cache(model, "kqv")
    with pytest.raises(ValueError, match=r"multi-head latent attention \(kv_lora_rank=16\)"):
        capture_qkv(model, input_ids=ids[:, :8])  # its per-head K/V are formed by attention, cached by nobody
    with pytest.raises(ValueError, match=r"multi-head latent attention \(DeepSeek-V2/V3"), torch.inference_mode():
        model(ids[:, :8], **cache_kwargs(model, KVStatsCache(IdentityScheme(16))), use_cache=True)


# -------------------------------------------------------------------------- an estimator set on the instance
def test_an_estimator_replaced_on_the_instance_is_the_one_the_cache_uses(ids):
    """Oracle: the same estimator as a subclass's method, which the cache has always called."""
    model = use_estimator_attention(_tiny("llama"))
    on_instance = scheme("kv", bits=8, dim=64, seed=0)
    plain_inner = on_instance.k.inner
    on_instance.k.inner = lambda q, code: 0.5 * plain_inner(q, code)

    class Halved(type(on_instance.k)):
        def inner(self, q, code):
            return 0.5 * super().inner(q, code)

    by_class = scheme("kv", bits=8, dim=64, seed=0)
    by_class.k.__class__ = Halved
    plain = scheme("kv", bits=8, dim=64, seed=0)
    got = {name: _through(model, ids, KVStatsCache(s)) for name, s in
           (("instance", on_instance), ("class", by_class), ("plain", plain))}
    assert float((got["instance"] - got["class"]).abs().max()) <= 1e-5
    assert float((got["instance"] - got["plain"]).abs().max()) > 1e-2
