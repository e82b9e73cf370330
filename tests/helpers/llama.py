"""The tiny grouped-query Llama of the cache's tests (4 query heads, 2 KV heads, d = 16; no download)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")


D, HQ, HKV, T = 16, 4, 2, 32


def _tiny(attn="sdpa", init=0.1):
    cfg = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=HQ,
        num_key_value_heads=HKV, head_dim=D, max_position_embeddings=256, rope_theta=10000.0,
        attn_implementation=attn, initializer_range=init, pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def logits(model, ids, cache=None, **kw):
    """The model's logits over ``ids``, through ``cache`` when one is given."""
    from kvstats.hf.cache import cache_kwargs

    with torch.inference_mode():
        return model(ids, **cache_kwargs(model, cache), use_cache=cache is not None, **kw).logits
