"""A word list for tiny tokenizers and the tiny Llama the capture tests run (no download)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

WORDS = "we the people of united states in order to form a more perfect union establish justice".split()


def _tiny_llama(attn="eager"):
    cfg = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
        attn_implementation=attn, initializer_range=0.2,  # large enough weights for peaked attention
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()
