"""Tiny random models of every supported architecture family, built from transformers' configs (no download)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, max_position_embeddings=512,
              pad_token_id=0, bos_token_id=None, eos_token_id=None, initializer_range=0.2)


#: family -> (config class, model class, config options). GQA ratio, head dim: llama 2, 64; mistral 8, 64;
#: qwen2 1, 16; qwen3 2, 128; gemma 4, 256; gemma2 2, 64; gemma3 2, 64; gemma3_270m 4, 256; phi3 2, 16; gpt_oss 2, 16.
#: gemma3_270m has the shipped Gemma 3 270M's attention (kvstats.hf.models.GEMMA3) at a tiny width: one KV head of
#: d = 256, QK-norm, query_pre_attn_scalar 256, sliding-window layers (16 tokens here, 512 there) before a global one,
#: each kind with its own RoPE base.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(num_attention_heads=8, num_key_value_heads=1, head_dim=64, sliding_window=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=4,
                                                      use_sliding_window=True, sliding_window=16,
                                                      max_window_layers=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=128)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=256)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=16,
                    query_pre_attn_scalar=48, attn_logit_softcapping=5.0, final_logit_softcapping=30.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=16,
                    query_pre_attn_scalar=48)),
    "gemma3_270m": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=16,
                         query_pre_attn_scalar=256,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                   partial_rotary_factor=0.5)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                     num_experts_per_tok=2, sliding_window=16)),
}


def _tiny(family: str):
    config_name, model_name, options = FAMILIES[family]
    cfg = getattr(transformers, config_name)(**COMMON, **options)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, model_name)(cfg).eval()


def _head_dim(model) -> int:
    cfg = model.config
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
