"""One quantizer per KV head, for whole caches [..., H_kv, S, d] (e.g. calibrated NOVA-KV heads)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import PerHeadConfig

__all__ = ["PerHeadQuantizer"]


class PerHeadQuantizer(Quantizer):
    """One quantizer per KV head for caches [..., H_kv, S, d]: head h of x goes through ``heads[h]``.

    The heads must share bits, dim and code layout (e.g. calibrated :class:`NovaQuantizer`\\ s). The code
    stacks the heads' payloads and scalars on the head axis (payload [..., H_kv, S, bytes], scalars
    [..., H_kv, S]); ``inner`` takes queries [..., H_kv, n_q, d] and returns [..., H_kv, n_q, S].
    """

    def __init__(self, heads: Sequence[Quantizer]):
        heads = list(heads)
        if not heads:
            raise ValueError("heads is empty: need one quantizer per KV head")
        first = heads[0]
        if any(h.dim != first.dim or h.bits != first.bits or type(h) is not type(first) for h in heads):
            raise ValueError("heads must all be quantizers of the same type, bits and dim")
        super().__init__(config=PerHeadConfig(bits=first.bits, dim=first.dim, seed=first.seed,
                                              heads=tuple(h._qconfig for h in heads)))
        self.heads = heads
        self.name = first.name

    Config = PerHeadConfig

    @property
    def codes_per_vector(self) -> bool | None:
        flags = {getattr(h, "codes_per_vector", None) for h in self.heads}
        return flags.pop() if len(flags) == 1 else None

    def _check_heads(self, x: torch.Tensor, name: str) -> None:
        if x.dim() < 3 or x.shape[-3] != len(self.heads):
            raise ValueError(f"{name} must be [..., {len(self.heads)} (KV heads), n, {self.dim}], "
                             f"got shape {tuple(x.shape)}")

    def _encode(self, x: torch.Tensor) -> Code:
        self._check_heads(x, "x")
        codes = [h.encode(x[..., i, :, :]) for i, h in enumerate(self.heads)]
        return Code(x.shape, x.dtype,
                    payload={n: torch.stack([c.payload[n] for c in codes], -3) for n in codes[0].payload},
                    scalars={n: torch.stack([c.scalars[n] for c in codes], -2) for n in codes[0].scalars})

    def head_code(self, code: Code, i: int) -> Code:
        """The code of head i alone (views into ``code``)."""
        return Code(torch.Size((*code.shape[:-3], *code.shape[-2:])), code.dtype,
                    payload={n: t[..., i, :, :] for n, t in code.payload.items()},
                    scalars={n: t[..., i, :] for n, t in code.scalars.items()},
                    source=None if code.source is None else self.heads[i].provenance())

    def _decode(self, code: Code) -> torch.Tensor:
        return torch.stack([h.decode(self.head_code(code, i)) for i, h in enumerate(self.heads)], -3)

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        self._check_heads(query, "query")
        return torch.stack([h.inner(query[..., i, :, :], self.head_code(code, i))
                            for i, h in enumerate(self.heads)], -3)

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        if weights.dim() < 3 or weights.shape[-3] != len(self.heads):
            raise ValueError(f"weights must be [..., {len(self.heads)} (KV heads), n_q, n_k], got shape "
                             f"{tuple(weights.shape)}")
        return torch.stack([h.weighted_sum(weights[..., i, :, :], self.head_code(code, i))
                            for i, h in enumerate(self.heads)], -3)

    def options(self) -> dict:
        return {"heads": [h.provenance().fingerprint for h in self.heads]}

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        return self.heads[0].bits_per_coordinate(n_tokens=n_tokens)

    def __repr__(self) -> str:
        return f"PerHeadQuantizer({len(self.heads)} × {self.heads[0]!r})"
