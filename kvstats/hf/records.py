"""What a :class:`~kvstats.hf.cache.KVStatsCache` reports: the bytes it holds and, per layer and forward,
the attention damage of its logits (``record_attention=True``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheMemory:
    """Bytes a :class:`KVStatsCache` holds between forwards, against an fp16 cache of the same tokens.

    code_bytes: Σ ``Code.nbytes`` over the quantized tokens of all layers (K and V);
    window_bytes: the exact tokens (K and V) at their stored dtype: the full-precision window and the sinks
    (``sink_tokens``);
    fp16_bytes: 2 bytes × 2 tensors × B × H_kv × tokens × d summed over layers;
    elements: number of cached K and V elements (2 × B × H_kv × tokens × d summed over layers);
    exact_elements: those of them held exact (the window and the sinks), the rest held as codes.
    """

    code_bytes: int
    window_bytes: int
    fp16_bytes: int
    elements: int
    tokens: int
    layers: int
    exact_elements: int

    @property
    def total_bytes(self) -> int:
        return self.code_bytes + self.window_bytes

    @property
    def ratio(self) -> float:
        """total_bytes / fp16_bytes (0.25 means a 4× smaller cache)."""
        return self.total_bytes / self.fp16_bytes if self.fp16_bytes else math.nan

    @property
    def compression(self) -> float:
        """fp16_bytes / total_bytes: how many times smaller than an fp16 cache of the same tokens (4.0 = 4×)."""
        return self.fp16_bytes / self.total_bytes if self.total_bytes else math.nan

    @property
    def bits_per_element(self) -> float:
        """8 · total_bytes / elements: everything counted (payload, norms, side data, window)."""
        return 8 * self.total_bytes / self.elements if self.elements else math.nan

    @property
    def code_bits_per_element(self) -> float:
        """8 · code_bytes / (elements − exact_elements): the bits per element of the quantized tokens alone, what a
        quantizer's budget is about (nan when every token is held exact)."""
        coded = self.elements - self.exact_elements
        return 8 * self.code_bytes / coded if coded else math.nan

    def to_dict(self) -> dict:
        return {"code_bytes": self.code_bytes, "window_bytes": self.window_bytes, "total_bytes": self.total_bytes,
                "fp16_bytes": self.fp16_bytes, "ratio": self.ratio, "compression": self.compression,
                "bits_per_element": self.bits_per_element, "code_bits_per_element": self.code_bits_per_element,
                "elements": self.elements, "exact_elements": self.exact_elements, "tokens": self.tokens,
                "layers": self.layers}


@dataclass(frozen=True)
class AttentionRecord:
    """Attention-level damage of one layer in one forward (``record_attention=True``).

    kl: ``[B, H_q, N]`` KL(p_exact ‖ p_used) per query (nats), p = softmax of the logits with the causal mask;
    recall: ``[B, H_q, N]`` top-k recall of the used logits against the exact ones (k = ``top_k``);
    both float64 on the CPU. ``query_offset``: cache position of the first query.
    """

    layer: int
    query_offset: int
    kl: torch.Tensor
    recall: torch.Tensor
    top_k: int
