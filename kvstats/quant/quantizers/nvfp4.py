"""NVFP4: 4-bit E2M1 values, an E4M3 scale per block of 16 values and an fp32 global scale (4.5 bits + the global).

The format is NVIDIA's NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference",
NVIDIA Technical Blog, June 2025; "Pretraining Large Language Models with NVFP4", arXiv 2509.25149, §2), whose
element type is the E2M1 of the OCP Microscaling Formats (MX) Specification v1.0 (§5.3.3) and whose block scale is
the E4M3 of the OCP 8-bit Floating Point Specification (OFP8) rev. 1.0 (``torch.float8_e4m3fn``: bias 7, no
infinities, largest finite 448, subnormals down to 2^-9):

* E2M1 (1 sign, 2 exponent, 1 mantissa bit, bias 1): code c = s·8 + m, magnitudes m = 0..7 ->
  {0, 0.5, 1, 1.5, 2, 3, 4, 6} (:data:`E2M1_VALUES`); code 8 is −0.
* x [..., n, d] is cut into blocks of 16 consecutive values along d (d must be a multiple of 16).
* Global scale g (fp32), one per ``granularity``: ``"head"`` (default) — over all n·d values of each leading index
  of one encode call (each KV head of each batch row in a cache; stored x.shape[:-2]); ``"token"`` — one per vector
  (stored x.shape[:-1]). g = amax |x| / 2688 (2688 = 6 · 448, so every block scale fits e4m3).
* Block scale s_b = e4m3(amax_b / 6 / g): round to nearest, ties to even, saturating at 448 (torch's cast).
  Where g = 0 (x all zero there) s_b = 0.
* Codes: m = RNE_E2M1(|x| / (s_b · g)) — to the nearest grid value, a tie going to the even code (the midpoints
  0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 go to 0, 1, 1, 2, 2, 4, 4: codes 0, 2, 2, 4, 4, 6, 6, as IEEE round half to
  even on the mantissa bit), saturating at 6 above it; the sign bit is
  signbit(x) (−0 and negatives that round to 0 keep it). A block whose s_b · g is 0 (a zero block, or one whose
  scale underflows e4m3) gets m = 0: it decodes to ±0.
* Decode: x̂ = e2m1(c) · (s_b · g), cast to x's dtype.

Every step is one IEEE operation in fp32 (fp64 for fp64 x, the oracles' path), in this order: g = amax / 2688;
r = (amax_b / 6) / g; s_b = e4m3(r) (torch's cast; fp64 r is first rounded to fp32 to odd, so that it is rounded
once: :func:`kvstats.quant.quantizers.fp8.fp8_codes`); p = fp32(s_b) · g;
v = |x| / p; x̂ = e2m1 · p. That is what
tests/quant/test_nvfp4.py reproduces bit for bit from explicit E2M1 and E4M3 tables.

Stored: ``payload["codes"]`` [..., n, d/2] uint8 — two E2M1 codes per byte, the first (even index) in the low
nibble (:func:`kvstats.quant.packing.pack_bits` at 4 bits, least significant first); ``payload["scales"]``
[..., n, d/16] uint8 — the e4m3 bit pattern of each block scale (a byte, as stored; read back through
``view(torch.float8_e4m3fn)``); ``scalars["global_scale"]`` g in fp32 (fp64 for fp64 x). Bits per coordinate:
payload 4, side 8/16 = 0.5 + 32/(n·d) (``"head"``: g over the n tokens of one encode) or + 32/d (``"token"``).
Inner products: decode-then-dot.
"""

from __future__ import annotations

import functools

import torch

from kvstats._validation import check_int_range
from kvstats.quant.packing import pack_bits
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import NVFP4Config
from kvstats.quant.quantizers.fp8 import E4M3 as E4M3_FORMAT
from kvstats.quant.quantizers.fp8 import fp8_codes
from kvstats.quant.quantizers.numerics import acc_dtype

__all__ = ["NVFP4Quantizer", "E2M1_VALUES", "BLOCK", "E2M1_MAX", "E4M3_MAX", "e2m1_magnitude_codes",
           "e2m1_values"]

#: the magnitudes of the E2M1 codes 0..7 (OCP MX v1.0 §5.3.3); codes 8..15 are their negatives
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: values per block (one e4m3 scale each)
BLOCK = 16
E2M1_MAX = 6.0
#: largest finite float8_e4m3fn
E4M3_MAX = 448.0
#: the midpoints between consecutive E2M1 magnitudes, and those whose tie rounds up (to the even code above)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIES_UP = (0.75, 1.75, 3.5)


def e2m1_magnitude_codes(v: torch.Tensor) -> torch.Tensor:
    """The E2M1 magnitude codes 0..7 of v ≥ 0 (inf allowed): round to the nearest of :data:`E2M1_VALUES`, a tie
    to the even code, saturating at 6 (code 7) above it. int64, v's shape."""
    mids = torch.tensor(_MIDPOINTS, dtype=v.dtype, device=v.device)
    codes = torch.bucketize(v, mids)  # how many midpoints lie strictly below v
    for tie in _TIES_UP:
        codes += v == tie
    return codes


def e2m1_values(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The signed E2M1 value of each 4-bit code (0..15; 8..15 negative, 8 is −0) in dtype."""
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    table = torch.cat([table, -table])
    return table[codes]


@functools.lru_cache(maxsize=16)
def _byte_values(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 2]: the E2M1 values of the two codes a packed byte holds (its low nibble first, as
    :func:`kvstats.quant.packing.pack_bits` packs them), so that decoding is one lookup per byte."""
    byte = torch.arange(256, device=device)
    return torch.stack([e2m1_values(byte & 15, dtype), e2m1_values(byte >> 4, dtype)], dim=-1)


class NVFP4Quantizer(Quantizer):
    """NVIDIA's NVFP4 (module docstring): E2M1 codes, an e4m3 scale per 16 values along d, an fp32 global scale.

    Args:
        bits: 4 (the E2M1 code width; anything else is refused). dim: d, a multiple of 16 (refused otherwise).
        seed: unused (deterministic). granularity: ``"head"`` (default; one global scale per leading index over the
            tokens of one encode call — codes_per_vector is then False: a token's code depends on the tokens
            encoded with it) or ``"token"`` (one per vector; codes per vector).
    """

    name = "nvfp4"
    min_bits = max_bits = 4
    storage_options = {}

    Config = NVFP4Config

    @property
    def codes_per_vector(self) -> bool:
        """Per-token global scales: each vector's code is its own; per-head ones span the tokens of an encode."""
        return self.granularity == "token"

    def _global_scale(self, blocks_amax: torch.Tensor) -> torch.Tensor:
        """g = amax / 2688 from the blocks' amax [..., n, d/16]: one per leading index, x.shape[:-2] ("head"), or
        one per vector, x.shape[:-1] ("token")."""
        amax = blocks_amax.amax(-1)
        if self.granularity == "head" and amax.dim() > 0:
            amax = amax.amax(-1)
        return amax / (E2M1_MAX * E4M3_MAX)

    def _per_block(self, g: torch.Tensor, ndim: int) -> torch.Tensor:
        """g as stored, viewed to broadcast over the blocks [..., n, d/16] of an x with ndim axes."""
        if self.granularity == "head" and ndim >= 2:
            return g.reshape(*g.shape, 1, 1)
        return g.unsqueeze(-1) if ndim >= 2 else g

    def _encode(self, x: torch.Tensor) -> Code:
        acc = acc_dtype(x.dtype)
        xa = x.to(acc)
        blocks = xa.reshape(*x.shape[:-1], self.dim // BLOCK, BLOCK)
        blocks_amax = blocks.abs().amax(-1)                       # [..., n, d/16]
        g = self._global_scale(blocks_amax)
        gb = self._per_block(g, x.dim())
        ratio = torch.where(gb > 0, blocks_amax / E2M1_MAX / torch.where(gb > 0, gb, 1), 0)
        scales = fp8_codes(ratio, E4M3_FORMAT)                   # e4m3 bytes, RNE, saturating at 448
        p = (scales.view(torch.float8_e4m3fn).to(acc) * gb).unsqueeze(-1)  # s_b · g [..., n, d/16, 1]
        v = blocks.abs() / torch.where(p > 0, p, 1)
        mag = torch.where(p > 0, e2m1_magnitude_codes(v), 0)
        codes = (mag + 8 * torch.signbit(blocks)).reshape(x.shape)
        return Code(x.shape, x.dtype, payload={"codes": pack_bits(codes, 4), "scales": scales},
                    scalars={"global_scale": g})

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        packed = code.payload["codes"]
        values = _byte_values(acc, packed.device)[packed.long()]  # [..., d/2, 2]: unpack and look up at once
        values = values.reshape(*code.shape[:-1], self.dim // BLOCK, BLOCK)
        scales = code.payload["scales"].view(torch.float8_e4m3fn).to(acc)
        p = scales * self._per_block(code.scalars["global_scale"].to(acc), len(code.shape))
        return (values * p.unsqueeze(-1)).reshape(code.shape)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        """payload 4 (E2M1), side 8/16 (the e4m3 block scales) + the fp32 global scale over what it covers: 32/d per
        token (``"token"``), 32/(n·d) for n tokens encoded at once (``"head"``; n_tokens=None counts one token, the
        cost of a decode step, an upper bound)."""
        if n_tokens is not None:
            check_int_range(n_tokens, "n_tokens", 1, 1 << 62)
        covered = 1 if self.granularity == "token" or n_tokens is None else int(n_tokens)
        return BitBudget(payload=4.0, side=8 / BLOCK + 32 / (covered * self.dim))

    def __repr__(self) -> str:
        return f"NVFP4Quantizer(dim={self.dim}, granularity={self.granularity!r})"
