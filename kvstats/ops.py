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
    "qjl_scores", "turbo_prod_encode", "turbo_prod_scores", "minmax_encode", "minmax_decode",
)

__all__ = ["HAS_EXTENSION", "EXTENSION_ERROR", "OPS", "kernel_devices", "use_reference", "using_reference",
           *OPS, *(f"{op}_reference" for op in OPS)]

try:
    from kvstats import _C  # noqa: F401  (loading the library registers torch.ops.kvstats.*)

    HAS_EXTENSION = True
    EXTENSION_ERROR: str | None = None
except ImportError as exc:  # no compiler on this machine, or an incompatible torch
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
    from kvstats.packing import pack_bits as pack

    return pack(codes, bits)


def unpack_bits_reference(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """packed uint8 [N, ceil(d·bits/8)] -> codes uint8 [N, d]."""
    from kvstats.packing import unpack_bits as unpack

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
    threshold falls in the lower cell); a zero vector gets u = 0.
    """
    xa = x.to(thresholds.dtype)
    norm = torch.linalg.vector_norm(xa, dim=-1)
    u = rotate_reference(xa, signs) / torch.where(norm > 0, norm, torch.ones_like(norm)).unsqueeze(-1)
    idx = torch.bucketize(u, thresholds).to(torch.uint8)
    return pack_bits_reference(idx, bits), norm.to(_storage(x, norm_dtype))


def lloyd_decode_reference(packed, norm, signs, levels, bits: int, d: int):
    """x̂ = Πᵀ(‖x‖ · levels[idx]) [N, d] in levels' dtype."""
    idx = unpack_bits_reference(packed, bits, d).long()
    return unrotate_reference(levels[idx] * norm.to(levels.dtype).unsqueeze(-1), signs)


def lloyd_scores_reference(q, packed, norm, levels, bits: int):
    """scores[g, i, j] = ‖k_j‖ · ⟨q_i, levels[idx_j]⟩: q [G, n_q, d], packed [G, n_k, nb], norm [G, n_k]."""
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
    xa = x.to(sketch.dtype)
    return _sign_bits(xa @ sketch.T), torch.linalg.vector_norm(xa, dim=-1).to(_storage(x, norm_dtype))


def qjl_scores_reference(q_sketch, packed, norm, scale: float):
    """scores[g, i, j] = scale · norm[g, j] · ⟨q_sketch[g, i], b[g, j]⟩, b = ±1 unpacked signs."""
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
    """
    packed, norm = lloyd_encode_reference(x, signs, thresholds, bits, norm_dtype)
    y = rotate_reference(x.to(thresholds.dtype), signs)
    residual = y - lloyd_decode_reference(packed, norm, signs[:0], levels, bits, x.shape[-1])
    gamma = torch.linalg.vector_norm(residual, dim=-1).to(_storage(x, norm_dtype))
    return packed, norm, _sign_bits(residual @ sketch.T), gamma


def turbo_prod_scores_reference(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma, scale: float):
    """lloyd_scores(q, ...) + qjl_scores(q_sketch, ...): the TurboQuant_prod estimate from the codes."""
    return lloyd_scores_reference(q, packed, norm, levels, bits) + qjl_scores_reference(
        q_sketch, signs_packed, gamma, scale)


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
    clamp(round((x − lo)/step), 0, 2^bits − 1) (round half to even), 0 where step = 0.
    """
    n, d = x.shape
    acc = _acc(x)
    side = _storage(x, side_dtype)
    grouped = x.to(acc).reshape(n, d // group, group)
    lo = grouped.amin(-1)
    top = (1 << bits) - 1
    lo_s = lo.to(side)
    step_s = ((grouped.amax(-1) - lo) / top).to(side)
    step = step_s.to(acc).unsqueeze(-1)
    codes = torch.clamp(torch.round((grouped - lo_s.to(acc).unsqueeze(-1)) / torch.where(step > 0, step, 1.0)), 0, top)
    codes = torch.where(step > 0, codes, torch.zeros_like(codes)).reshape(n, d).to(torch.uint8)
    return pack_bits_reference(codes, bits), lo_s, step_s


def minmax_decode_reference(packed, lo, scale, group: int, bits: int, d: int):
    """x̂ = lo + step · code, [N, d] in fp32 (fp64 for fp64 side values)."""
    acc = torch.float64 if lo.dtype == torch.float64 else torch.float32
    codes = unpack_bits_reference(packed, bits, d).to(acc).reshape(packed.shape[0], d // group, group)
    return (lo.to(acc).unsqueeze(-1) + scale.to(acc).unsqueeze(-1) * codes).reshape(packed.shape[0], d)


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
