"""Bit packing of quantization codes — the one place that defines the layout.

Layout (the same in the pure-torch code here and in the C++/CUDA kernels):

* A vector of d codes of ``bits`` bits each is one bit stream of d·bits bits: code i occupies stream
  bits [i·bits, (i+1)·bits), its least significant bit first.
* The stream is cut into bytes, least significant bit first: stream bit p lives in byte p // 8 at
  bit position p % 8. A vector takes ceil(d·bits / 8) bytes; the last byte is zero-padded.
* Signs (1-bit codes): bit 1 means +1, bit 0 means −1 (sign(0) is taken as +1). So 8 signs per byte,
  LSB first, as in the QJL kernels.

Vectors live on the last axis: codes [..., d] (integers in [0, 2^bits)) <-> packed [..., nbytes] uint8.
"""

from __future__ import annotations

import torch

__all__ = ["packed_nbytes", "pack_bits", "unpack_bits", "pack_signs", "unpack_signs"]


def packed_nbytes(d: int, bits: int) -> int:
    """Bytes one vector of d codes of `bits` bits takes: ceil(d·bits/8)."""
    return (d * bits + 7) // 8


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in [1, 8], got {bits}")


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes [..., d] in [0, 2^bits) into uint8 [..., ceil(d·bits/8)] (layout above)."""
    _check_bits(bits)
    if 8 % bits:
        return _pack_stream(codes, bits)
    # 1, 2, 4 or 8 bits: whole codes per byte, code i at bit (i mod 8/bits)·bits of byte i // (8/bits)
    per, d = 8 // bits, codes.shape[-1]
    nbytes = packed_nbytes(d, bits)
    c = codes.to(torch.int32) & ((1 << bits) - 1)
    if nbytes * per != d:
        c = torch.nn.functional.pad(c, (0, nbytes * per - d))
    c = c.reshape(*codes.shape[:-1], nbytes, per)
    shifts = torch.arange(0, 8, bits, device=codes.device, dtype=torch.int32)
    return (c << shifts).sum(-1, dtype=torch.int32).to(torch.uint8)


def _pack_stream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`pack_bits` as the layout states it, one bit at a time (any width; the reference of the fast path)."""
    d = codes.shape[-1]
    lead = codes.shape[:-1]
    shifts = torch.arange(bits, device=codes.device, dtype=torch.int32)
    stream = ((codes.to(torch.int32).unsqueeze(-1) >> shifts) & 1).to(torch.uint8).reshape(*lead, d * bits)
    nbytes = packed_nbytes(d, bits)
    pad = nbytes * 8 - d * bits
    if pad:
        stream = torch.nn.functional.pad(stream, (0, pad))
    weights = (1 << torch.arange(8, device=codes.device, dtype=torch.int32)).to(torch.uint8)
    return (stream.reshape(*lead, nbytes, 8) * weights).sum(-1, dtype=torch.int32).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: uint8 [..., nbytes] -> int64 codes [..., d]."""
    _check_bits(bits)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    nbytes = packed_nbytes(d, bits)
    if packed.shape[-1] != nbytes:
        raise ValueError(f"packed.shape[-1] must be ceil(d*bits/8) = {nbytes} for d={d}, bits={bits}, "
                         f"got {packed.shape[-1]}")
    if 8 % bits:
        return _unpack_stream(packed, bits, d)
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.int32)
    codes = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], nbytes * (8 // bits))[..., :d].to(torch.int64)


def _unpack_stream(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """:func:`unpack_bits` one bit at a time (any width; the reference of the fast path)."""
    nbytes = packed_nbytes(d, bits)
    lead = packed.shape[:-1]
    shifts = torch.arange(8, device=packed.device, dtype=torch.int32)
    stream = ((packed.to(torch.int32).unsqueeze(-1) >> shifts) & 1).reshape(*lead, nbytes * 8)
    stream = stream[..., : d * bits].reshape(*lead, d, bits)
    weights = 1 << torch.arange(bits, device=packed.device, dtype=torch.int64)
    return (stream.to(torch.int64) * weights).sum(-1)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Signs of x [..., m] packed 8 per byte, LSB first: bit 1 for x ≥ 0, 0 for x < 0."""
    return pack_bits((x >= 0).to(torch.int32), 1)


def unpack_signs(packed: torch.Tensor, m: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`pack_signs`: uint8 [..., ceil(m/8)] -> ±1 of `dtype` [..., m]."""
    return unpack_bits(packed, 1, m).to(dtype) * 2 - 1
