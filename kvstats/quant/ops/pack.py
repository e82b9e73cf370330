"""Dense bit packing of codes (layout: :mod:`kvstats.quant.packing`, the one definition; C++: bitpack.h).

Kernels: ``cuda_ext/csrc/cpu/pack_cpu.cpp``, ``cuda_ext/csrc/cuda/pack_cuda.cu``, ``cuda_ext/csrc/shared/``.
"""

from __future__ import annotations

import torch

from kvstats.quant.ops import _library as lib

__all__ = ["pack_bits", "pack_bits_reference", "unpack_bits", "unpack_bits_reference"]


@lib.register_fake("pack_bits")
def pack_bits_fake(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes uint8 [N, d] -> an empty uint8 [N, ceil(d·bits/8)]."""
    lib.check_bits(bits, "pack_bits")
    if codes.dim() != 2:
        raise ValueError(f"pack_bits: codes must be [N, d], got {tuple(codes.shape)}")
    lib.check_dtype(codes, torch.uint8, "pack_bits", "codes")
    return codes.new_empty(codes.shape[0], lib.packed_nbytes(codes.shape[1], bits))


@lib.register_fake("unpack_bits")
def unpack_bits_fake(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """packed uint8 [N, ceil(d·bits/8)] -> an empty uint8 [N, d]."""
    lib.check_bits(bits, "unpack_bits")
    if d < 1:
        raise ValueError(f"unpack_bits: d must be positive, got {d}")
    lib.check_packed(packed, 2, bits, d, "unpack_bits")
    return packed.new_empty(packed.shape[0], d)


def pack_bits_reference(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes uint8 [N, d] (< 2^bits) -> packed uint8 [N, ceil(d·bits/8)]."""
    from kvstats.quant.packing import pack_bits as pack

    pack_bits_fake(codes, bits)
    return pack(codes, bits)


def unpack_bits_reference(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """packed uint8 [N, ceil(d·bits/8)] -> codes uint8 [N, d]."""
    from kvstats.quant.packing import unpack_bits as unpack

    unpack_bits_fake(packed, bits, d)
    return unpack(packed, bits, d).to(torch.uint8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes uint8 [N, d] (< 2^bits) -> packed uint8 [N, ceil(d·bits/8)] (:func:`pack_bits_reference`)."""
    op = lib.kernel("pack_bits", codes.device)
    return op(codes, bits) if op is not None else pack_bits_reference(codes, bits)


def unpack_bits(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """packed uint8 [N, ceil(d·bits/8)] -> codes uint8 [N, d] (:func:`unpack_bits_reference`)."""
    op = lib.kernel("unpack_bits", packed.device)
    return op(packed, bits, d) if op is not None else unpack_bits_reference(packed, bits, d)


def sign_bits(x: torch.Tensor) -> torch.Tensor:
    """Packed sign bits of the rows of x [..., m] (bit 1 for x >= 0): [rows, ceil(m/8)], in pure torch."""
    return pack_bits_reference((x >= 0).to(torch.uint8).reshape(-1, x.shape[-1]), 1)
