"""KIVI-style asymmetric min-max integer quantization (the usual baseline).

Within each group G of values (``axis="token"``: ``group_size`` consecutive coordinates of one vector;
``axis="channel"``: one coordinate over ``group_size`` consecutive tokens, as KIVI does for keys):

    lo = min G,  s = (max G − lo) / (2^b − 1)   (both stored in ``side_dtype``, fp16 by default)
    code = clamp(round((x − lo) / s), 0, 2^b − 1),   x̂ = lo + s·code

Codes are computed from the *stored* (rounded) lo and s, so decode is consistent with what is kept.
A constant group (s = 0) decodes exactly to lo. With ``axis="channel"`` x must be [..., n, d] with
tokens on axis −2; a last partial group of tokens gets its own lo and s. Inner products are
decode-then-dot. Side information: 2 scalars per group.

:class:`RotatedMinMax` (``rotated_minmax``) rotates first (randomized Hadamard or Haar, fixed by the
seed) and min-maxes Π x per token: the rotation spreads outlier coordinates over the whole vector, so
one (lo, step) pair per token fits every coordinate (NOVA-KV's value path).
"""

from __future__ import annotations

import math

import torch

from kvstats.quant import ops
from kvstats.quant.packing import pack_bits, packed_nbytes, unpack_bits
from kvstats.quant.quantizers._common import dtype_bits
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import MinMaxConfig, RotatedMinMaxConfig
from kvstats.quant.quantizers.numerics import acc_dtype
from kvstats.quant.quantizers.plans import broadcast_groups
from kvstats.quant.rotations import Rotation, make_rotation

__all__ = ["MinMaxQuantizer", "RotatedMinMax"]


class MinMaxQuantizer(Quantizer):
    """b-bit asymmetric min-max quantization per token group or per channel group.

    Args:
        bits: b in [1, 8]. dim: d. seed: unused (deterministic method).
        axis: ``"token"`` (default; groups along d) or ``"channel"`` (groups along tokens).
        group_size: values per group (default: d for ``"token"``, 32 for ``"channel"``); for
            ``"token"`` it must divide d.
        side_dtype: precision of lo and s (fp16 default, as in KIVI).
    """

    name = "minmax"
    storage_options = {"min": "side_dtype", "scale": "side_dtype"}

    Config = MinMaxConfig

    @property
    def codes_per_vector(self) -> bool:
        """Per token (groups along d): one code per vector; per channel (KIVI): groups across tokens."""
        return self.axis == "token"

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        """View x as [..., groups, group_size] (channel axis: groups over tokens, padded by replication)."""
        g = self.group_size
        if self.axis == "token":
            return x.reshape(*x.shape[:-1], self.dim // g, g)
        n = x.shape[-2]
        pad = -n % g
        xt = x.transpose(-1, -2)  # [..., d, n]
        if pad:
            xt = torch.cat([xt, xt[..., -1:].expand(*xt.shape[:-1], pad)], dim=-1)
        return xt.reshape(*xt.shape[:-1], (n + pad) // g, g)

    def _ungrouped(self, grouped: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        if self.axis == "token":
            return grouped.reshape(shape)
        n = shape[-2]
        return grouped.reshape(*grouped.shape[:-2], -1)[..., :n].transpose(-1, -2)

    def _encode(self, x: torch.Tensor) -> Code:
        if self.axis == "token":
            lead = x.shape[:-1]
            packed, lo, scale = ops.minmax_encode(x.reshape(-1, self.dim), self.group_size, self.bits, self.side_dtype)
            return Code(x.shape, x.dtype, payload={"indices": packed.reshape(*lead, -1)},
                        scalars={"min": lo.reshape(*lead, -1), "scale": scale.reshape(*lead, -1)})
        return self._encode_channel(x)

    def _encode_channel(self, x: torch.Tensor) -> Code:
        # Groups cut across vectors (one channel over group_size tokens): plain torch, no fused kernel.
        if x.dim() < 2:
            raise ValueError(f"x must be [..., n, d] for axis='channel', got shape {tuple(x.shape)}")
        acc = acc_dtype(x.dtype)
        grouped = self._grouped(x.to(acc))
        lo = grouped.amin(-1, keepdim=True)
        hi = grouped.amax(-1, keepdim=True)
        levels = (1 << self.bits) - 1
        side = acc if acc == torch.float64 else self.side_dtype
        lo_s = lo.to(side)
        scale_s = ((hi - lo) / levels).to(side)
        scale = scale_s.to(acc)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.clamp(torch.round((grouped - lo_s.to(acc)) / safe), 0, levels)
        codes = torch.where(scale > 0, codes, torch.zeros_like(codes))
        codes = self._ungrouped(codes, x.shape).to(torch.int64)
        return Code(x.shape, x.dtype, payload={"indices": pack_bits(codes, self.bits)},
                    scalars={"min": lo_s.squeeze(-1), "scale": scale_s.squeeze(-1)})

    def input_limit(self, dtype: torch.dtype) -> float:
        # x̂ = lo + step·q lies within its group's [min, max] (up to rounding): no sums that could outgrow max |x|
        return torch.finfo(acc_dtype(dtype)).max / 4

    def _decode(self, code: Code) -> torch.Tensor:
        if self.axis == "token":
            packed, lead = code.payload["indices"], code.shape[:-1]
            ng = self.dim // self.group_size
            x_hat = ops.minmax_decode(packed.reshape(-1, packed.shape[-1]), code.scalars["min"].reshape(-1, ng),
                                      code.scalars["scale"].reshape(-1, ng), self.group_size, self.bits, self.dim)
            return x_hat.reshape(*lead, self.dim)
        acc = acc_dtype(code.dtype)
        codes = unpack_bits(code.payload["indices"], self.bits, self.dim).to(acc)
        grouped = self._grouped(codes)
        x_hat = code.scalars["min"].to(acc).unsqueeze(-1) + code.scalars["scale"].to(acc).unsqueeze(-1) * grouped
        return self._ungrouped(x_hat, code.shape)

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        if self.axis != "token":  # groups cut across vectors: decode, then multiply
            return super()._weighted_sum(weights, code)
        lead, w3, (packed, lo, scale) = broadcast_groups(weights, code.payload["indices"], code.scalars["min"],
                                                         code.scalars["scale"], key_dims=(1, 1, 1))
        out = ops.minmax_weighted_sum(w3, packed, lo, scale, self.group_size, self.bits, self.dim)
        return out.reshape(*lead, *out.shape[-2:])

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        """Bits per coordinate; for ``axis="channel"`` pass n_tokens to count a partial last group."""
        per_group = 2 * dtype_bits(self.side_dtype)
        payload = 8 * packed_nbytes(self.dim, self.bits) / self.dim
        if self.axis == "token" or n_tokens is None:
            return BitBudget(payload=payload, side=per_group / self.group_size)
        groups = math.ceil(n_tokens / self.group_size)
        return BitBudget(payload=payload, side=per_group * groups / n_tokens)

    def __repr__(self) -> str:
        return f"MinMaxQuantizer(bits={self.bits}, dim={self.dim}, axis={self.axis!r}, group_size={self.group_size})"


class RotatedMinMax(Quantizer):
    """An orthogonal rotation Π, then b-bit min-max per token on Π x (NOVA-KV's value path).

    Args:
        bits, dim, seed: as usual; the seed fixes Π. rotation: ``"wht"`` (randomized Hadamard) or ``"haar"``.
        side_dtype: precision of the per-token lo and step (fp16).
    Inner products: ⟨q, Πᵀŷ⟩ = ⟨Πq, ŷ⟩ (decode-then-dot in the rotated domain).
    """

    name = "rotated_minmax"
    codes_per_vector = True
    storage_options = {"min": "side_dtype", "scale": "side_dtype"}

    Config = RotatedMinMaxConfig

    def _setup_from_config(self) -> None:
        self.rotation: Rotation = make_rotation(self._qconfig.rotation, self.dim, self.seed)
        self.minmax = MinMaxQuantizer(config=self._qconfig.minmax_stage())

    @property
    def rotation_kind(self) -> str:
        return self._qconfig.rotation

    def _encode(self, x: torch.Tensor) -> Code:
        inner = self.minmax.encode(self.rotation.forward(x.to(acc_dtype(x.dtype))))
        return Code(x.shape, x.dtype, parts={"minmax": inner})

    def _decode(self, code: Code) -> torch.Tensor:
        return self.rotation.inverse(self.minmax.decode(code.parts["minmax"]))

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        return self.rotation.inverse(self.minmax.weighted_sum(weights, code.parts["minmax"]))

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        acc = acc_dtype(query.dtype)
        y_hat = self.minmax.decode(code.parts["minmax"]).to(acc)
        return self.rotation.forward(query.to(acc)) @ y_hat.transpose(-1, -2)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        return self.minmax.bits_per_coordinate()

    def __repr__(self) -> str:
        return f"RotatedMinMax(bits={self.bits}, dim={self.dim}, seed={self.seed}, rotation={self.rotation_kind!r})"
