"""Asymmetric b-bit integers per token and head (``int_token``): the simple baseline of KV-cache quantization.

Each cached vector x ∈ ℝ^d (one token of one KV head) gets its own offset and step:

    lo = min_i x_i,  s = (max_i x_i − lo) / (2^b − 1)     (both stored in ``side_dtype``, fp16 by default)
    code_i = clamp(round((x_i − lo) / s), 0, 2^b − 1)     (round half to even, from the *stored* lo and s)
    x̂_i = lo + s · code_i                                  (a constant vector, s = 0, decodes exactly to lo)

It is min-max (:class:`~kvstats.quant.quantizers.minmax.MinMaxQuantizer`) with ``axis="token"`` and one group of
all d coordinates, fixed by its config (:class:`~kvstats.quant.quantizers.config.IntTokenConfig`): KIVI's value
quantization (arXiv 2402.02750 §3) with the group widened to the whole head. Bits per element, exactly:
b + 2·bits(side_dtype)/d payload and side, i.e. b + 32/d with fp16 lo and s (d = 128: 8.25, 4.25, 2.25), plus
byte padding when d·b is not a multiple of 8 (``Code.nbytes`` is the ground truth).
"""

from __future__ import annotations

from kvstats.quant.quantizers.config import IntTokenConfig
from kvstats.quant.quantizers.minmax import MinMaxQuantizer

__all__ = ["IntTokenQuantizer"]


class IntTokenQuantizer(MinMaxQuantizer):
    """b-bit asymmetric min-max per token and head (one lo and one step per vector).

    Args:
        bits: b in [1, 8] (int8, int4, int2: 8, 4, 2). dim: d. seed: unused (deterministic method).
        side_dtype: precision of lo and s (``torch.float16`` default; ``bfloat16`` or ``float32``).
    The axis ("token") and the group (all d coordinates) are fixed: passing ``axis`` or ``group_size`` is a
    TypeError naming the options it has.
    """

    name = "int_token"
    codes_per_vector = True
    Config = IntTokenConfig

    def __repr__(self) -> str:
        return f"IntTokenQuantizer(bits={self.bits}, dim={self.dim}, side_dtype={self.side_dtype})"
