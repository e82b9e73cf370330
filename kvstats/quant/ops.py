"""The one door to the compiled op library ``torch.ops.kvstats``.

Each op has three things side by side here:

* ``<op>_reference`` — a pure-torch implementation: the oracle in tests and the fallback when the
  extension is not built;
* a fake (meta) implementation registered with ``torch.library.register_fake`` so the op works under
  ``torch.compile`` and ``torch.library.opcheck``;
* ``<op>`` — the typed wrapper that the rest of kvstats calls. It dispatches to the compiled kernel
  (the dispatcher picks CPU or CUDA by device) unless the extension is missing or the caller asked for
  the references with ``with kvstats.ops.use_reference(): ...``.

No other module touches ``torch.ops.kvstats``. Wrappers here assume validated inputs; argument checks
that name the user's argument live in the public functions (e.g. :func:`kvstats.rotations.fwht`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from collections.abc import Iterator

import torch

OPS = (
    "fwht", "pack_bits", "unpack_bits", "lloyd_encode", "lloyd_decode", "lloyd_scores", "qjl_encode",
    "qjl_scores", "turbo_prod_encode", "turbo_prod_scores", "minmax_encode", "minmax_decode", "sign_decode",
    "turbo_prod_decode",
)

__all__ = ["HAS_EXTENSION", "EXTENSION_ERROR", "OPS", "kernel_devices", "use_reference", "using_reference",
           "shared_path", "using_shared_path", "SIGN_TABLE_LIMIT", "sign_tables",
           *OPS, *(f"{op}_reference" for op in OPS)]

try:
    from kvstats import _C  # loading the library registers torch.ops.kvstats.*

    HAS_EXTENSION = True
    EXTENSION_ERROR: str | None = None
except ImportError as exc:  # no compiler on this machine, or an incompatible torch
    _C = None
    HAS_EXTENSION = False
    EXTENSION_ERROR = str(exc)
    warnings.warn(
        f"kvstats: the compiled extension kvstats._C is not available ({exc}); "
        "using the pure-torch reference implementations (correct, slower). "
        "Rebuild with `pip install --no-build-isolation -e .` to get the kernels.",
        RuntimeWarning,
        stacklevel=2,
    )

_FORCE_REFERENCE: contextvars.ContextVar[bool] = contextvars.ContextVar("kvstats_force_reference", default=False)


@contextlib.contextmanager
def use_reference(enabled: bool = True) -> Iterator[None]:
    """Run every op on its pure-torch reference inside the block (for timing and debugging)."""
    token = _FORCE_REFERENCE.set(enabled)
    try:
        yield
    finally:
        _FORCE_REFERENCE.reset(token)


def using_reference() -> bool:
    """True when ops run on the references: forced by :func:`use_reference` or no extension."""
    return _FORCE_REFERENCE.get() or not HAS_EXTENSION


@contextlib.contextmanager
def shared_path(enabled: bool = True) -> Iterator[None]:
    """Inside the block, every CPU kernel runs the GPU's code path instead of its CPU fast path.

    The CUDA kernels and the CPU kernels call the same arithmetic (``cuda_ext/csrc/quant_math.h``); the
    CPU also has fast paths of its own (SIMD twins, counting cell search, lookup-table and GEMM scores).
    Here the CPU runs the row programs the GPU runs, one serial lane for a thread block, so a test on CPU
    checks the lines the GPU executes. Slower; for tests. The switch is process-wide (not per thread);
    ``KVSTATS_SHARED_PATH=1`` in the environment turns it on from import. Needs the extension.
    """
    if not HAS_EXTENSION:
        raise RuntimeError(f"kvstats.ops.shared_path needs the compiled extension: {EXTENSION_ERROR}")
    previous = _C._set_shared_path(bool(enabled))
    try:
        yield
    finally:
        _C._set_shared_path(previous)


def using_shared_path() -> bool:
    """True when the CPU kernels take the shared (GPU) code path: :func:`shared_path` or KVSTATS_SHARED_PATH=1."""
    return HAS_EXTENSION and _C._shared_path()


def _use_kernel(op: str, device: torch.device) -> bool:
    """Whether the compiled kernel of `op` serves tensors on `device` (else the reference runs)."""
    if using_reference():
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"kvstats::{op}", device.type.upper())


def _storage(x: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """Stored scalars keep fp64 for fp64 inputs (oracles), else the requested dtype."""
    return torch.float64 if x.dtype == torch.float64 else dtype


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------------------- input checks
# The same rules, messages and exception types as the check_* functions of cuda_ext/csrc/ops.cpp
# (TORCH_CHECK_TYPE -> TypeError, TORCH_CHECK_VALUE -> ValueError), run by every reference, so that a
# malformed input is rejected alike on both paths.

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MAX_FWHT_DIM = 32768


def _check_bits(bits: int, op: str) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"{op}: bits must be in [1, 8], got {bits}")


def _check_device(ref: torch.Tensor, t: torch.Tensor, op: str, name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} must be on {ref.device}, got {t.device}")


def _check_float(t: torch.Tensor, op: str, name: str) -> None:
    if t.dtype not in _FLOATS:
        raise TypeError(f"{op}: {name} must be a float tensor, got {t.dtype}")


def _check_dtype(t: torch.Tensor, allowed, op: str, name: str) -> None:
    allowed = allowed if isinstance(allowed, tuple) else (allowed,)
    if t.dtype not in allowed:
        raise TypeError(f"{op}: {name} must be {' or '.join(map(str, allowed))}, got {t.dtype}")


def _check_signs(ref: torch.Tensor, signs: torch.Tensor, d: int, acc: torch.dtype, op: str) -> None:
    _check_device(ref, signs, op, "signs")
    if signs.dim() != 2:
        raise ValueError(f"{op}: signs must be [passes, block], got {tuple(signs.shape)}")
    _check_dtype(signs, acc, op, "signs")
    passes, block = signs.shape
    if passes not in (0, 1, 3):
        raise ValueError(f"{op}: signs must have 0, 1 or 3 passes, got {passes}")
    if passes > 0 and not (1 <= block <= _MAX_FWHT_DIM and block & (block - 1) == 0 and block <= d
                           and (passes == 3 or block == d) and 2 * block > d):
        raise ValueError(f"{op}: rotation block {block} does not fit d = {d} with {passes} pass(es)")


def _check_table(ref: torch.Tensor, table: torch.Tensor, expected: int, op: str, name: str) -> None:
    _check_device(ref, table, op, name)
    if table.dim() != 1 or table.shape[0] != expected:
        raise ValueError(f"{op}: {name} must be 1-D of length {expected}, got {tuple(table.shape)}")
    _check_dtype(table, _acc(ref), op, name)


def _check_packed(packed: torch.Tensor, rows_dim: int, bits: int, d: int, op: str) -> None:
    _check_dtype(packed, torch.uint8, op, "packed")
    if packed.dim() != rows_dim:
        raise ValueError(f"{op}: packed must have {rows_dim} dimensions, got {tuple(packed.shape)}")
    nb = (d * bits + 7) // 8
    if packed.shape[-1] != nb:
        raise ValueError(f"{op}: packed.size(-1) must be ceil({d}*{bits}/8) = {nb}, got {packed.shape[-1]}")


def _check_storage(dtype: torch.dtype) -> None:
    if dtype not in _FLOATS:
        raise TypeError(f"norm/side dtype must be float16, bfloat16, float32 or float64, got {dtype}")


def _check_fwht(x: torch.Tensor) -> None:
    if x.dim() < 1:
        raise ValueError("fwht: x must have at least one dimension, got a 0-d tensor")
    _check_dtype(x, _FLOATS, "fwht", "x")
    d = x.shape[-1]
    if not (2 <= d <= _MAX_FWHT_DIM and d & (d - 1) == 0):
        raise ValueError(f"fwht: the last dimension must be a power of two in [2, {_MAX_FWHT_DIM}], got {d}")


def _check_pack(codes: torch.Tensor, bits: int) -> None:
    _check_bits(bits, "pack_bits")
    if codes.dim() != 2:
        raise ValueError(f"pack_bits: codes must be [N, d], got {tuple(codes.shape)}")
    _check_dtype(codes, torch.uint8, "pack_bits", "codes")


def _check_unpack(packed: torch.Tensor, bits: int, d: int) -> None:
    _check_bits(bits, "unpack_bits")
    if d < 1:
        raise ValueError(f"unpack_bits: d must be positive, got {d}")
    _check_packed(packed, 2, bits, d, "unpack_bits")


def _check_lloyd_encode(x, signs, thresholds, bits: int, op: str = "lloyd_encode") -> None:
    _check_bits(bits, op)
    if x.dim() != 2 or x.shape[1] < 2:
        raise ValueError(f"{op}: x must be [N, d] with d >= 2, got {tuple(x.shape)}")
    _check_float(x, op, "x")
    _check_signs(x, signs, x.shape[1], _acc(x), op)
    _check_table(x, thresholds, (1 << bits) - 1, op, "thresholds")


def _check_lloyd_decode(packed, norm, signs, levels, bits: int, d: int) -> None:
    op = "lloyd_decode"
    _check_bits(bits, op)
    if d < 2:
        raise ValueError(f"{op}: d must be >= 2, got {d}")
    _check_packed(packed, 2, bits, d, op)
    _check_device(packed, norm, op, "norm")
    if norm.dim() != 1 or norm.shape[0] != packed.shape[0]:
        raise ValueError(f"{op}: norm must be [{packed.shape[0]}], got {tuple(norm.shape)}")
    _check_float(norm, op, "norm")
    _check_dtype(levels, (torch.float32, torch.float64), op, "levels")
    _check_device(packed, levels, op, "levels")
    if levels.dim() != 1 or levels.shape[0] != 1 << bits:
        raise ValueError(f"{op}: levels must have {1 << bits} entries, got {tuple(levels.shape)}")
    _check_signs(packed, signs, d, levels.dtype, op)


def _check_scores_keys(q, packed, norm, bits: int, op: str, what: str) -> None:
    """q [G, n_q, ·] float32/64; packed [G, n_k, ·] of width ceil(q.size(2)·bits/8); norm [G, n_k] float."""
    if q.dim() != 3:
        raise ValueError(f"{op}: {what} must be [G, n_q, {'d' if bits > 1 or what == 'q' else 'm'}], "
                         f"got {tuple(q.shape)}")
    _check_dtype(q, (torch.float32, torch.float64), op, what)
    _check_packed(packed, 3, bits, q.shape[2], op)
    _check_device(q, packed, op, "packed")
    _check_device(q, norm, op, "norm")
    if packed.shape[0] != q.shape[0]:
        raise ValueError(f"{op}: packed.size(0) must equal {what}.size(0) = {q.shape[0]}, got {packed.shape[0]}")
    if norm.dim() != 2 or tuple(norm.shape) != tuple(packed.shape[:2]):
        raise ValueError(f"{op}: norm must be [G, n_k] = {list(packed.shape[:2])}, got {tuple(norm.shape)}")
    _check_float(norm, op, "norm")


def _check_lloyd_scores(q, packed, norm, levels, bits: int, op: str = "lloyd_scores") -> None:
    _check_bits(bits, op)
    _check_scores_keys(q, packed, norm, bits, op, "q")
    _check_table(q, levels, 1 << bits, op, "levels")


def _check_qjl_encode(x, sketch, op: str = "qjl_encode") -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [N, d], got {tuple(x.shape)}")
    _check_float(x, op, "x")
    _check_device(x, sketch, op, "sketch")
    if sketch.dim() != 2 or sketch.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: sketch must be [m, {x.shape[1]}], got {tuple(sketch.shape)}")
    _check_dtype(sketch, _acc(x), op, "sketch")


def _check_qjl_scores(q_sketch, packed, norm) -> None:
    _check_scores_keys(q_sketch, packed, norm, 1, "qjl_scores", "q_sketch")


def _check_turbo_prod_encode(x, signs, thresholds, levels, bits: int, sketch) -> None:
    _check_lloyd_encode(x, signs, thresholds, bits)
    _check_qjl_encode(x, sketch)
    if levels.dim() != 1 or levels.shape[0] != 1 << bits:
        raise ValueError(f"turbo_prod_encode: levels must be 1-D of length {1 << bits}, got {tuple(levels.shape)}")
    _check_dtype(levels, thresholds.dtype, "turbo_prod_encode", "levels")


def _check_turbo_prod_scores(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma) -> None:
    _check_lloyd_scores(q, packed, norm, levels, bits)
    _check_qjl_scores(q_sketch, signs_packed, gamma)
    if q_sketch.shape[:2] != q.shape[:2] or signs_packed.shape[1] != packed.shape[1]:
        raise ValueError("turbo_prod_scores: q_sketch [G, n_q, m] and signs_packed [G, n_k, m/8] must match q "
                         "and packed")
    if q_sketch.dtype != q.dtype:
        raise TypeError("turbo_prod_scores: q_sketch must have q's dtype")


def _check_minmax_encode(x, group: int, bits: int) -> None:
    _check_bits(bits, "minmax_encode")
    if x.dim() != 2:
        raise ValueError(f"minmax_encode: x must be [N, d], got {tuple(x.shape)}")
    _check_float(x, "minmax_encode", "x")
    if group < 1 or x.shape[1] % group:
        raise ValueError(f"minmax_encode: group must divide d = {x.shape[1]}, got {group}")


def _check_minmax_decode(packed, lo, scale, group: int, bits: int, d: int) -> None:
    op = "minmax_decode"
    _check_bits(bits, op)
    if group < 1 or d % group:
        raise ValueError(f"{op}: group must divide d = {d}, got {group}")
    _check_packed(packed, 2, bits, d, op)
    for t in (lo, scale):
        _check_device(packed, t, op, "lo/scale")
        if t.dim() != 2 or t.shape[0] != packed.shape[0] or t.shape[1] != d // group:
            raise ValueError(f"{op}: lo and scale must be [{packed.shape[0]}, {d // group}], got {tuple(t.shape)}")
        _check_float(t, op, "lo and scale")


# ------------------------------------------------------------------------------ overflow-free norms


def _scale_exponents(x: torch.Tensor) -> torch.Tensor:
    """Per row of x [..., d]: e with max|x| = f · 2^e, f in [0.5, 1) (0 for a zero or non-finite row),
    clamped to ±120 (fp32) or ±1000 (fp64) so that 2^±e is a normal number. As quant_math.h."""
    max_abs = x.abs().amax(dim=-1).double()
    _, e = torch.frexp(max_abs)
    e = torch.where((max_abs > 0) & torch.isfinite(max_abs), e, torch.zeros_like(e))
    limit = 1000 if x.dtype == torch.float64 else 120
    return e.clamp(-limit, limit)


def _pow2(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.exp2(e.double()).to(dtype)


def _scaled_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x · 2^-e per row, e): the scaled rows lie in [-1, 1], so their squares never overflow, and the
    scaling by a power of two is exact."""
    e = _scale_exponents(x)
    return x * _pow2(-e, x.dtype).unsqueeze(-1), e


def _row_norm(x: torch.Tensor) -> torch.Tensor:
    """‖x‖ per row without overflow for finite x (fp32 rows of norm > 1.8e19 included)."""
    xs, e = _scaled_rows(x)
    return torch.linalg.vector_norm(xs, dim=-1) * _pow2(e, x.dtype)


def kernel_devices() -> dict[str, list[str]]:
    """Which dispatch keys have a compiled kernel, per op: ``{"fwht": ["CPU", "CUDA"], ...}``."""
    if not HAS_EXTENSION:
        return {op: [] for op in OPS}
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return {op: [key for key in ("CPU", "CUDA") if has_kernel(f"kvstats::{op}", key)] for op in OPS}


# ---------------------------------------------------------------------------------------------- fwht


def fwht_reference(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last axis, in pure torch.

    y = x · H_d / √d with H_d the Sylvester–Hadamard matrix (H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]]),
    the same order as ``scipy.linalg.hadamard``. O(d log d): log2(d) butterfly stages, each one
    reshape of x to [..., d/(2h), 2, h]. Arithmetic in fp32 (fp64 for fp64 input); returns x's dtype.

    Shapes: x [..., d] with d a power of two -> [..., d].
    """
    _check_fwht(x)
    d = x.shape[-1]
    y = x.to(_acc(x)).reshape(-1, d)
    h = 1
    while h < d:
        pairs = y.view(-1, d // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).view(-1, d)
        h *= 2
    return (y / math.sqrt(d)).to(x.dtype).view(x.shape)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh–Hadamard transform: x [..., d], d a power of two (see :func:`fwht_reference`)."""
    if _use_kernel("fwht", x.device):
        return torch.ops.kvstats.fwht.default(x)
    return fwht_reference(x)


# ------------------------------------------------------------------------------------------ packing
# Layout: kvstats/packing.py (the one definition; the C++ side is cuda_ext/csrc/bitpack.h).


def pack_bits_reference(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes uint8 [N, d] (< 2^bits) -> packed uint8 [N, ceil(d·bits/8)]."""
    from kvstats.quant.packing import pack_bits as pack

    _check_pack(codes, bits)
    return pack(codes, bits)


def unpack_bits_reference(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """packed uint8 [N, ceil(d·bits/8)] -> codes uint8 [N, d]."""
    from kvstats.quant.packing import unpack_bits as unpack

    _check_unpack(packed, bits, d)
    return unpack(packed, bits, d).to(torch.uint8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if _use_kernel("pack_bits", codes.device):
        return torch.ops.kvstats.pack_bits.default(codes, bits)
    return pack_bits_reference(codes, bits)


def unpack_bits(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    if _use_kernel("unpack_bits", packed.device):
        return torch.ops.kvstats.unpack_bits.default(packed, bits, d)
    return unpack_bits_reference(packed, bits, d)


def _sign_bits(x: torch.Tensor) -> torch.Tensor:
    return pack_bits_reference((x >= 0).to(torch.uint8).reshape(-1, x.shape[-1]), 1)


# Sign decode: Bᵀ b for packed sign rows b ∈ {±1}^m (QJL reconstruction), from per-byte tables.

#: Largest byte-table size (values) that :func:`sign_tables` builds: 32× the sketch, capped at 64 MiB of fp32.
SIGN_TABLE_LIMIT = 1 << 24
_SIGN_DECODE_BLOCK = 16384


def sign_tables(s: torch.Tensor) -> torch.Tensor | None:
    """Byte tables of a sketch s [m, d']: T[256·p + v] = Σ_t (bit t of v ? +1 : −1) · s[8p + t] over the rows
    8p + t < m, [ceil(m/8)·256, d'] in s's dtype (summed in fp64, rounded once). For packed signs (LSB first,
    kvstats.packing) Σ_p T[256·p + byte_p] = sᵀ b. None when larger than :data:`SIGN_TABLE_LIMIT` values."""
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


def _check_sign_decode(packed, tables, weight, base) -> None:
    op = "sign_decode"
    _check_dtype(packed, torch.uint8, op, "packed")
    if packed.dim() != 2 or packed.shape[1] < 1:
        raise ValueError(f"{op}: packed must be [N, mb] with mb >= 1, got {tuple(packed.shape)}")
    _check_device(packed, tables, op, "tables")
    _check_dtype(tables, (torch.float32, torch.float64), op, "tables")
    if tables.dim() != 2 or tables.shape[0] != packed.shape[1] * 256 or tables.shape[1] < 1:
        raise ValueError(f"{op}: tables must be [256 * packed.size(1), d] = [{packed.shape[1] * 256}, d], "
                         f"got {tuple(tables.shape)}")
    _check_device(packed, weight, op, "weight")
    _check_float(weight, op, "weight")
    if weight.dim() != 1 or weight.shape[0] != packed.shape[0]:
        raise ValueError(f"{op}: weight must be [{packed.shape[0]}], got {tuple(weight.shape)}")
    if base is not None:
        _check_device(packed, base, op, "base")
        _check_dtype(base, tables.dtype, op, "base")
        if base.dim() != 2 or tuple(base.shape) != (packed.shape[0], tables.shape[1]):
            raise ValueError(f"{op}: base must be [{packed.shape[0]}, {tables.shape[1]}], got {tuple(base.shape)}")


def sign_decode_reference(packed, tables, weight, base=None):
    """out[n] = base[n] + weight[n] · Σ_p tables[256·p + packed[n, p]]: packed [N, mb] uint8, tables
    [mb·256, d'] = :func:`sign_tables` (B) in fp32/fp64, weight [N], base [N, d'] or None (0) -> [N, d'] in
    the tables' dtype. With tables of B this is base + weight · Bᵀ b for the packed ±1 signs b.
    ``embedding_bag`` over blocks of rows (bounded memory)."""
    _check_sign_decode(packed, tables, weight, base)
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


def sign_decode(packed, tables, weight, base=None):
    """base + weight · Bᵀ b from the byte tables of B (:func:`sign_decode_reference`); the kernel sums each
    vector's mb table rows in registers (cuda_ext/csrc/cpu/sign_decode_cpu.cpp)."""
    if _use_kernel("sign_decode", packed.device):
        return torch.ops.kvstats.sign_decode.default(packed, tables, weight, base)
    return sign_decode_reference(packed, tables, weight, base)


# ----------------------------------------------------------------------------- rotation + Lloyd–Max
# signs: [P, B] random ±1 of the randomized Hadamard rotation (kvstats.rotations.RandomizedHadamard):
# P = 0 (no rotation), 1 (B = d) or 3 (blocks [0, B), [d − B, d), [0, B)).


def _spans(signs: torch.Tensor, d: int) -> list[slice]:
    block = signs.shape[1]
    return [slice(d - block, d) if k == 1 else slice(0, block) for k in range(signs.shape[0])]


def rotate_reference(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Π x along the last axis, pass by pass: y[span] = fwht(y[span] · s_k)."""
    y = x.clone()
    for k, span in enumerate(_spans(signs, x.shape[-1])):
        y[..., span] = fwht_reference(y[..., span] * signs[k])
    return y


def unrotate_reference(y: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Πᵀ y: the passes in reverse, x[span] = fwht(x[span]) · s_k."""
    x = y.clone()
    spans = _spans(signs, y.shape[-1])
    for k in reversed(range(len(spans))):
        x[..., spans[k]] = fwht_reference(x[..., spans[k]]) * signs[k]
    return x


def lloyd_encode_reference(x, signs, thresholds, bits: int, norm_dtype: torch.dtype):
    """x [N, d] -> (packed cell indices of (Π x)/‖x‖ [N, ceil(d·bits/8)], ‖x‖ [N] in norm_dtype).

    Arithmetic in thresholds' dtype (fp32, or fp64). Cells as torch.bucketize (a value equal to a
    threshold falls in the lower cell); a zero vector gets u = 0. Each row is scaled by a power of two
    (its max |x|) first, so the norm does not overflow for finite input (as the kernels, quant_math.h).
    """
    _check_lloyd_encode(x, signs, thresholds, bits)
    _check_storage(norm_dtype)
    xs, e = _scaled_rows(x.to(thresholds.dtype))
    norm_s = torch.linalg.vector_norm(xs, dim=-1)
    u = rotate_reference(xs, signs) / torch.where(norm_s > 0, norm_s, torch.ones_like(norm_s)).unsqueeze(-1)
    idx = torch.bucketize(u, thresholds).to(torch.uint8)
    norm = norm_s * _pow2(e, norm_s.dtype)
    return pack_bits_reference(idx, bits), norm.to(_storage(x, norm_dtype))


def lloyd_decode_reference(packed, norm, signs, levels, bits: int, d: int):
    """x̂ = Πᵀ(‖x‖ · levels[idx]) [N, d] in levels' dtype."""
    _check_lloyd_decode(packed, norm, signs, levels, bits, d)
    idx = unpack_bits_reference(packed, bits, d).long()
    return unrotate_reference(levels[idx] * norm.to(levels.dtype).unsqueeze(-1), signs)


def lloyd_scores_reference(q, packed, norm, levels, bits: int):
    """scores[g, i, j] = ‖k_j‖ · ⟨q_i, levels[idx_j]⟩: q [G, n_q, d], packed [G, n_k, nb], norm [G, n_k]."""
    _check_lloyd_scores(q, packed, norm, levels, bits)
    g, nk, nb = packed.shape
    d = q.shape[-1]
    k_hat = levels[unpack_bits_reference(packed.reshape(-1, nb), bits, d).long()].reshape(g, nk, d)
    return (q @ k_hat.transpose(-1, -2)) * norm.to(q.dtype).unsqueeze(-2)


def lloyd_encode(x, signs, thresholds, bits: int, norm_dtype: torch.dtype):
    if _use_kernel("lloyd_encode", x.device):
        return torch.ops.kvstats.lloyd_encode.default(x, signs, thresholds, bits, norm_dtype)
    return lloyd_encode_reference(x, signs, thresholds, bits, norm_dtype)


def lloyd_decode(packed, norm, signs, levels, bits: int, d: int):
    if _use_kernel("lloyd_decode", packed.device):
        return torch.ops.kvstats.lloyd_decode.default(packed, norm, signs, levels, bits, d)
    return lloyd_decode_reference(packed, norm, signs, levels, bits, d)


def lloyd_scores(q, packed, norm, levels, bits: int):
    if _use_kernel("lloyd_scores", q.device):
        return torch.ops.kvstats.lloyd_scores.default(q, packed, norm, levels, bits)
    return lloyd_scores_reference(q, packed, norm, levels, bits)


# ---------------------------------------------------------------------------------------------- QJL


def qjl_encode_reference(x, sketch, norm_dtype: torch.dtype):
    """x [N, d], S [m, d] -> (packed sign(S x) [N, ceil(m/8)], ‖x‖ [N] in norm_dtype)."""
    _check_qjl_encode(x, sketch)
    _check_storage(norm_dtype)
    xa = x.to(sketch.dtype)
    return _sign_bits(xa @ sketch.T), _row_norm(xa).to(_storage(x, norm_dtype))


def qjl_scores_reference(q_sketch, packed, norm, scale: float):
    """scores[g, i, j] = scale · norm[g, j] · ⟨q_sketch[g, i], b[g, j]⟩, b = ±1 unpacked signs."""
    _check_qjl_scores(q_sketch, packed, norm)
    g, nk, mb = packed.shape
    m = q_sketch.shape[-1]
    b = unpack_bits_reference(packed.reshape(-1, mb), 1, m).reshape(g, nk, m).to(q_sketch.dtype) * 2 - 1
    return (q_sketch @ b.transpose(-1, -2)) * (norm.to(q_sketch.dtype) * scale).unsqueeze(-2)


def qjl_encode(x, sketch, norm_dtype: torch.dtype):
    if _use_kernel("qjl_encode", x.device):
        return torch.ops.kvstats.qjl_encode.default(x, sketch, norm_dtype)
    return qjl_encode_reference(x, sketch, norm_dtype)


def qjl_scores(q_sketch, packed, norm, scale: float):
    if _use_kernel("qjl_scores", q_sketch.device):
        return torch.ops.kvstats.qjl_scores.default(q_sketch, packed, norm, scale)
    return qjl_scores_reference(q_sketch, packed, norm, scale)


# -------------------------------------------------------------------------------------- TurboQuant_prod


def turbo_prod_encode_reference(x, signs, thresholds, levels, bits: int, sketch, norm_dtype: torch.dtype):
    """x [N, d] -> (packed `bits`-bit indices, ‖x‖, packed sign(S r), γ = ‖r‖), r = Π x − ‖x‖·levels[idx].

    The residual uses ‖x‖ rounded to norm_dtype, as decode will. ``bits`` is the MSE stage's (b − 1).
    Computed on the row scaled by 2^-e (as the kernels): r' = r · 2^-e has r's sign bits, γ = ‖r'‖ · 2^e.
    """
    _check_turbo_prod_encode(x, signs, thresholds, levels, bits, sketch)
    packed, norm = lloyd_encode_reference(x, signs, thresholds, bits, norm_dtype)
    xs, e = _scaled_rows(x.to(thresholds.dtype))
    y = rotate_reference(xs, signs)
    idx = unpack_bits_reference(packed, bits, x.shape[-1]).long()
    w = norm.to(levels.dtype) * _pow2(-e, levels.dtype)
    residual = y - levels[idx] * w.unsqueeze(-1)
    gamma = (torch.linalg.vector_norm(residual, dim=-1) * _pow2(e, levels.dtype)).to(_storage(x, norm_dtype))
    return packed, norm, _sign_bits(residual @ sketch.T), gamma


def turbo_prod_scores_reference(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma, scale: float):
    """lloyd_scores(q, ...) + qjl_scores(q_sketch, ...): the TurboQuant_prod estimate from the codes."""
    _check_turbo_prod_scores(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma)
    return lloyd_scores_reference(q, packed, norm, levels, bits) + qjl_scores_reference(
        q_sketch, signs_packed, gamma, scale)


def _check_turbo_prod_decode(packed, norm, signs, levels, bits: int, d: int, signs_packed, tables, weight) -> None:
    op = "turbo_prod_decode"
    _check_lloyd_decode(packed, norm, signs, levels, bits, d)
    _check_sign_decode(signs_packed, tables, weight, None)
    _check_device(packed, signs_packed, op, "signs_packed")
    if signs_packed.shape[0] != packed.shape[0]:
        raise ValueError(f"{op}: signs_packed must have {packed.shape[0]} rows (as packed), "
                         f"got {signs_packed.shape[0]}")
    if tables.dtype != levels.dtype:
        raise TypeError(f"{op}: tables must be {levels.dtype} (as levels), got {tables.dtype}")
    if tables.shape[1] != d:
        raise ValueError(f"{op}: tables must have d = {d} columns, got {tables.shape[1]}")


def turbo_prod_decode_reference(packed, norm, signs, levels, bits: int, d: int, signs_packed, tables, weight):
    """TurboQuant_prod decode in one call: Πᵀ(‖x‖·levels[idx]) + weight · Bᵀ b, with tables = sign_tables(B)
    and B = S·Π (rows of S de-rotated), so that the sum is Πᵀ(ŷ + weight · Sᵀ b). [N, d] in levels' dtype."""
    _check_turbo_prod_decode(packed, norm, signs, levels, bits, d, signs_packed, tables, weight)
    mse = lloyd_decode_reference(packed, norm, signs, levels, bits, d)
    return sign_decode_reference(signs_packed, tables, weight, mse)


def turbo_prod_decode(packed, norm, signs, levels, bits: int, d: int, signs_packed, tables, weight):
    if _use_kernel("turbo_prod_decode", packed.device):
        return torch.ops.kvstats.turbo_prod_decode.default(packed, norm, signs, levels, bits, d, signs_packed, tables,
                                                           weight)
    return turbo_prod_decode_reference(packed, norm, signs, levels, bits, d, signs_packed, tables, weight)


def turbo_prod_encode(x, signs, thresholds, levels, bits: int, sketch, norm_dtype: torch.dtype):
    if _use_kernel("turbo_prod_encode", x.device):
        return torch.ops.kvstats.turbo_prod_encode.default(x, signs, thresholds, levels, bits, sketch, norm_dtype)
    return turbo_prod_encode_reference(x, signs, thresholds, levels, bits, sketch, norm_dtype)


def turbo_prod_scores(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma, scale: float):
    if _use_kernel("turbo_prod_scores", q.device):
        return torch.ops.kvstats.turbo_prod_scores.default(q, q_sketch, packed, norm, levels, bits, signs_packed,
                                                           gamma, scale)
    return turbo_prod_scores_reference(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma, scale)


# ------------------------------------------------------------------------------------------- min-max


def minmax_encode_reference(x, group: int, bits: int, side_dtype: torch.dtype):
    """x [N, d] -> (packed codes, lo [N, d/group], step [N, d/group] in side_dtype).

    Per group: lo = min, step = (max − min)/(2^bits − 1), both rounded to side_dtype; codes =
    clamp(round((x − lo)/step), 0, 2^bits − 1) (round half to even), 0 where step = 0. Where max − min
    (or x − lo) overflows for finite values, max/top − min/top (x/step − lo/step) instead, as the kernels.
    """
    _check_minmax_encode(x, group, bits)
    _check_storage(side_dtype)
    n, d = x.shape
    acc = _acc(x)
    side = _storage(x, side_dtype)
    grouped = x.to(acc).reshape(n, d // group, group)
    lo, hi = grouped.amin(-1), grouped.amax(-1)
    top = (1 << bits) - 1
    lo_s = lo.to(side)
    span = hi - lo
    step_s = torch.where(torch.isfinite(span), span / top, hi / top - lo / top).to(side)
    step = step_s.to(acc).unsqueeze(-1)
    lo_a = lo_s.to(acc).unsqueeze(-1)
    safe = torch.where(step > 0, step, 1.0)
    diff = grouped - lo_a
    ratio = torch.where(torch.isfinite(diff), diff / safe, grouped / safe - lo_a / safe)
    codes = torch.clamp(torch.round(ratio), 0, top)
    codes = torch.where(step > 0, codes, torch.zeros_like(codes)).reshape(n, d).to(torch.uint8)
    return pack_bits_reference(codes, bits), lo_s, step_s


def minmax_decode_reference(packed, lo, scale, group: int, bits: int, d: int):
    """x̂ = lo + step · code, [N, d] in fp32 (fp64 for fp64 side values), without overflow of step · code."""
    _check_minmax_decode(packed, lo, scale, group, bits, d)
    acc = torch.float64 if lo.dtype == torch.float64 else torch.float32
    codes = unpack_bits_reference(packed, bits, d).to(acc).reshape(packed.shape[0], d // group, group)
    lo_a, step = lo.to(acc).unsqueeze(-1), scale.to(acc).unsqueeze(-1)
    x_hat = lo_a + step * codes
    # A range wider than the dtype's maximum: step · code overflows where x̂ does not (as the kernels).
    x_hat = torch.where(torch.isfinite(x_hat), x_hat, (lo_a * 0.5 + step * (codes * 0.5)) * 2)
    return x_hat.reshape(packed.shape[0], d)


def minmax_encode(x, group: int, bits: int, side_dtype: torch.dtype):
    if _use_kernel("minmax_encode", x.device):
        return torch.ops.kvstats.minmax_encode.default(x, group, bits, side_dtype)
    return minmax_encode_reference(x, group, bits, side_dtype)


def minmax_decode(packed, lo, scale, group: int, bits: int, d: int):
    if _use_kernel("minmax_decode", packed.device):
        return torch.ops.kvstats.minmax_decode.default(packed, lo, scale, group, bits, d)
    return minmax_decode_reference(packed, lo, scale, group, bits, d)


# ------------------------------------------------------------------------------ fake implementations


def _register_fakes() -> None:
    """Shape/dtype rules of every op, so they trace under torch.compile and pass opcheck."""

    def fake(name):
        return torch.library.register_fake(f"kvstats::{name}")

    def nbytes(d, bits):
        return (d * bits + 7) // 8

    @fake("fwht")
    def _(x):
        torch._check(x.dim() >= 1, lambda: "fwht: x must have at least one dimension")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @fake("pack_bits")
    def _(codes, bits):
        return codes.new_empty(codes.shape[0], nbytes(codes.shape[1], bits))

    @fake("unpack_bits")
    def _(packed, bits, d):
        return packed.new_empty(packed.shape[0], d)

    @fake("lloyd_encode")
    def _(x, signs, thresholds, bits, norm_dtype):
        n, d = x.shape
        return (x.new_empty(n, nbytes(d, bits), dtype=torch.uint8), x.new_empty(n, dtype=_storage(x, norm_dtype)))

    @fake("lloyd_decode")
    def _(packed, norm, signs, levels, bits, d):
        return levels.new_empty(packed.shape[0], d)

    @fake("lloyd_scores")
    def _(q, packed, norm, levels, bits):
        return q.new_empty(q.shape[0], q.shape[1], packed.shape[1])

    @fake("qjl_encode")
    def _(x, sketch, norm_dtype):
        n = x.shape[0]
        return (x.new_empty(n, nbytes(sketch.shape[0], 1), dtype=torch.uint8),
                x.new_empty(n, dtype=_storage(x, norm_dtype)))

    @fake("qjl_scores")
    def _(q_sketch, packed, norm, scale):
        return q_sketch.new_empty(q_sketch.shape[0], q_sketch.shape[1], packed.shape[1])

    @fake("turbo_prod_encode")
    def _(x, signs, thresholds, levels, bits, sketch, norm_dtype):
        n, d = x.shape
        stored = _storage(x, norm_dtype)
        return (x.new_empty(n, nbytes(d, bits), dtype=torch.uint8), x.new_empty(n, dtype=stored),
                x.new_empty(n, nbytes(sketch.shape[0], 1), dtype=torch.uint8), x.new_empty(n, dtype=stored))

    @fake("turbo_prod_scores")
    def _(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma, scale):
        return q.new_empty(q.shape[0], q.shape[1], packed.shape[1])

    @fake("minmax_encode")
    def _(x, group, bits, side_dtype):
        n, d = x.shape
        side = _storage(x, side_dtype)
        return (x.new_empty(n, nbytes(d, bits), dtype=torch.uint8), x.new_empty(n, d // group, dtype=side),
                x.new_empty(n, d // group, dtype=side))

    @fake("sign_decode")
    def _(packed, tables, weight, base):
        return tables.new_empty(packed.shape[0], tables.shape[1])

    @fake("turbo_prod_decode")
    def _(packed, norm, signs, levels, bits, d, signs_packed, tables, weight):
        return levels.new_empty(packed.shape[0], d)

    @fake("minmax_decode")
    def _(packed, lo, scale, group, bits, d):
        acc = torch.float64 if lo.dtype == torch.float64 else torch.float32
        return lo.new_empty(packed.shape[0], d, dtype=acc)

    def fwht_backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # H_d/√d is symmetric and orthogonal: the transform is its own adjoint.
        return torch.ops.kvstats.fwht.default(grad)

    torch.library.register_autograd("kvstats::fwht", fwht_backward)


if HAS_EXTENSION:
    _register_fakes()
