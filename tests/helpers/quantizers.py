"""Quantizers from outside kvstats for the tests: symmetric per-token int4 on the protocol (the kit's and evaluate's
tests) and the dequantized store of any quantizer (the cache's oracle)."""

from __future__ import annotations

import torch

from kvstats.quant.packing import pack_bits, packed_nbytes, unpack_bits
from kvstats.quant.quantizers import BitBudget, Code, Quantizer


# ------------------------------------------------------------------------- an external int4 quantizer
class Int4PerToken(Quantizer):
    """Symmetric per-token int4: scale = max|x|/7 (fp32), codes round(x/scale) + 8 in [0, 15], packed."""

    name = "int4_per_token"
    min_bits = max_bits = 4

    def _encode(self, x):
        xa = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        scale = xa.abs().amax(-1) / 7
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = (torch.round(xa / safe.unsqueeze(-1)).clamp(-8, 7) + 8).to(torch.int64)
        return Code(x.shape, x.dtype, payload={"codes": pack_bits(codes, 4)}, scalars={"scale": scale.float()})

    def _decode(self, code):
        codes = unpack_bits(code.payload["codes"], 4, self.dim).float() - 8
        return (codes * code.scalars["scale"].unsqueeze(-1)).to(code.dtype)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=8 * packed_nbytes(self.dim, 4) / self.dim, side=32 / self.dim)


class Dequantized(Quantizer):
    """The oracle's store: ``decode(encode(x))`` of the wrapped quantizer, kept in fp32."""

    name = "dequantized"
    min_bits, max_bits = 32, 32

    def __init__(self, inner: Quantizer):
        super().__init__(32, inner.dim, 0)
        self.inner_quantizer = inner

    def _encode(self, x):
        return Code(x.shape, x.dtype, payload={"x_hat": self.inner_quantizer.decode(self.inner_quantizer.encode(x))
                                               .float()})

    def _decode(self, code):
        return code.payload["x_hat"].to(code.dtype)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=32.0)


def supported_bits(name: str, bits: int) -> int:
    """``bits`` within what the registered quantizer ``name`` takes (a format of one width, fp8 or nvfp4, only its
    own): the tests that sweep every quantizer at a low budget build each at the nearest width it has."""
    from kvstats.quant.quantizers import QUANTIZERS

    cls = QUANTIZERS[name]
    return min(max(bits, cls.min_bits), cls.max_bits)
