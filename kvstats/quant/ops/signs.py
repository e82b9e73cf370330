"""The sign decode from byte tables: Bᵀ b for packed sign rows b ∈ {±1}^m (the QJL reconstruction).

Kernels: ``cuda_ext/csrc/cpu/sign_decode_cpu.cpp``, ``cuda_ext/csrc/cuda/sign_decode_cuda.cu``,
``cuda_ext/csrc/shared/``.
"""

from __future__ import annotations

import torch

from kvstats.quant.ops import _library as lib

__all__ = ["SIGN_TABLE_LIMIT", "sign_decode", "sign_decode_reference", "sign_tables"]

#: Largest byte-table size (values) that :func:`sign_tables` builds: 32× the sketch, capped at 64 MiB of fp32.
SIGN_TABLE_LIMIT = 1 << 24
_SIGN_DECODE_BLOCK = 16384


def sign_tables(s: torch.Tensor) -> torch.Tensor | None:
    """Byte tables of a sketch s [m, d']: T[256·p + v] = Σ_t (bit t of v ? +1 : −1) · s[8p + t] over the rows
    8p + t < m, [ceil(m/8)·256, d'] in s's dtype (summed in fp64, rounded once). For packed signs (LSB first,
    kvstats.quant.packing) Σ_p T[256·p + byte_p] = sᵀ b. None when larger than :data:`SIGN_TABLE_LIMIT` values."""
    m, d = s.shape
    mb = (m + 7) // 8
    if mb * 256 * d > SIGN_TABLE_LIMIT:
        return None
    wide = torch.float32 if s.device.type == "mps" else torch.float64
    rows = torch.zeros(mb * 8, d, dtype=wide, device=s.device)
    rows[:m] = s.to(wide)  # rows past m are zero: padding bits add nothing
    v = torch.arange(256, device=s.device)
    bits = ((v.unsqueeze(1) >> torch.arange(8, device=s.device)) & 1).to(wide) * 2 - 1  # [256, 8]
    tables = torch.einsum("vt,ptd->pvd", bits, rows.view(mb, 8, d))
    return tables.reshape(mb * 256, d).to(s.dtype).contiguous()


@lib.register_fake("sign_decode")
def sign_decode_fake(packed, tables, weight, base=None) -> torch.Tensor:
    """packed uint8 [N, mb]; tables [mb·256, d'] fp32/fp64; weight [N] float; base None or [N, d'] of the
    tables' dtype, all on packed's device -> an empty [N, d'] in the tables' dtype."""
    op = "sign_decode"
    lib.check_dtype(packed, torch.uint8, op, "packed")
    if packed.dim() != 2 or packed.shape[1] < 1:
        raise ValueError(f"{op}: packed must be [N, mb] with mb >= 1, got {tuple(packed.shape)}")
    lib.check_device(packed, tables, op, "tables")
    lib.check_dtype(tables, (torch.float32, torch.float64), op, "tables")
    if tables.dim() != 2 or tables.shape[0] != packed.shape[1] * 256 or tables.shape[1] < 1:
        raise ValueError(f"{op}: tables must be [256 * packed.size(1), d] = [{packed.shape[1] * 256}, d], "
                         f"got {tuple(tables.shape)}")
    lib.check_device(packed, weight, op, "weight")
    lib.check_float(weight, op, "weight")
    if weight.dim() != 1 or weight.shape[0] != packed.shape[0]:
        raise ValueError(f"{op}: weight must be [{packed.shape[0]}], got {tuple(weight.shape)}")
    if base is not None:
        lib.check_device(packed, base, op, "base")
        lib.check_dtype(base, tables.dtype, op, "base")
        if base.dim() != 2 or tuple(base.shape) != (packed.shape[0], tables.shape[1]):
            raise ValueError(f"{op}: base must be [{packed.shape[0]}, {tables.shape[1]}], got {tuple(base.shape)}")
    return tables.new_empty(packed.shape[0], tables.shape[1])


def sign_decode_reference(packed, tables, weight, base=None) -> torch.Tensor:
    """out[n] = base[n] + weight[n] · Σ_p tables[256·p + packed[n, p]]: packed [N, mb] uint8, tables
    [mb·256, d'] = :func:`sign_tables` (B) in fp32/fp64, weight [N], base [N, d'] or None (0) -> [N, d'] in
    the tables' dtype. With tables of B this is base + weight · Bᵀ b for the packed ±1 signs b.
    ``embedding_bag`` over blocks of rows (bounded memory)."""
    sign_decode_fake(packed, tables, weight, base)
    n, mb = packed.shape
    w = weight.to(tables.dtype).unsqueeze(-1)
    out = torch.empty(n, tables.shape[1], dtype=tables.dtype, device=tables.device)
    offsets = torch.arange(mb, device=packed.device) * 256  # int64: embedding_bag's own index type
    for r0 in range(0, n, _SIGN_DECODE_BLOCK):
        r1 = min(n, r0 + _SIGN_DECODE_BLOCK)
        summed = torch.nn.functional.embedding_bag(torch.add(packed[r0:r1], offsets), tables, mode="sum")
        if base is None:
            torch.mul(summed, w[r0:r1], out=out[r0:r1])
        else:
            torch.addcmul(base[r0:r1], summed, w[r0:r1], out=out[r0:r1])
    return out


def sign_decode(packed, tables, weight, base=None) -> torch.Tensor:
    """base + weight · Bᵀ b from the byte tables of B (:func:`sign_decode_reference`); the kernel sums each
    vector's mb table rows in registers (cuda_ext/csrc/cpu/sign_decode_cpu.cpp)."""
    op = lib.kernel("sign_decode", packed.device)
    return op(packed, tables, weight, base) if op is not None else sign_decode_reference(packed, tables, weight, base)
