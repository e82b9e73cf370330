"""A quantizer as a user writes one: plain torch on the protocol (no kvstats subclass, no plans, no weighted_sum),
for the retrieval command's tests and the cache benchmark's "user quantizer" row."""

from __future__ import annotations

import torch

from kvstats.quant.packing import pack_bits, packed_nbytes, unpack_bits
from kvstats.quantizers import BitBudget, Code


class GroupAbsmax:
    """Symmetric group absmax: groups of 32 coordinates, scale = max|x|/(2^(b−1) − 1) (fp16), codes
    round(x/scale) + 2^(b−1) − 1 in [0, 2^b − 2], packed to b bits. ``inner`` is decode-then-dot."""

    group = 32

    def __init__(self, bits: int, dim: int, seed: int = 0):
        if dim % self.group:
            raise ValueError(f"dim must be a multiple of {self.group}, got {dim}")
        self.bits, self.max_bits, self.dim, self.seed = bits, 8, dim, seed

    def _check(self, x, name: str) -> None:
        if (not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1 or x.shape[-1] != self.dim
                or x.numel() == 0):
            raise ValueError(f"{name} must be a non-empty float tensor [..., {self.dim}]")
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} must be finite")

    def encode(self, x: torch.Tensor) -> Code:
        self._check(x, "x")
        levels = 2 ** (self.bits - 1) - 1
        g = x.float().unflatten(-1, (self.dim // self.group, self.group))
        scale = (g.abs().amax(-1) / levels).half()
        safe = torch.where(scale > 0, scale.float(), torch.ones_like(scale.float()))
        codes = (torch.round(g / safe.unsqueeze(-1)).clamp(-levels, levels) + levels).to(torch.int64)
        return Code(x.shape, x.dtype, payload={"codes": pack_bits(codes.flatten(-2), self.bits)},
                    scalars={"scale": scale})

    def decode(self, code: Code) -> torch.Tensor:
        if not isinstance(code, Code) or "codes" not in code.payload or code.shape[-1] != self.dim:
            raise TypeError(f"code must be a Code of this quantizer (dim {self.dim}), got {type(code).__name__}")
        levels = 2 ** (self.bits - 1) - 1
        codes = unpack_bits(code.payload["codes"], self.bits, self.dim).float() - levels
        g = codes.unflatten(-1, (self.dim // self.group, self.group)) * code.scalars["scale"].float().unsqueeze(-1)
        return g.flatten(-2).to(code.dtype)

    def inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        self._check(query, "query")
        acc = torch.float64 if query.dtype == torch.float64 else torch.float32
        return query.to(acc) @ self.decode(code).to(acc).transpose(-1, -2)

    def bits_per_coordinate(self, n_tokens=None) -> BitBudget:
        return BitBudget(payload=8 * packed_nbytes(self.dim, self.bits) / self.dim, side=16 / self.group)
