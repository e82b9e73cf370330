"""KIVI-style min-max quantization along the vector, in groups of ``group`` coordinates (arXiv 2402.02750).

Kernels: ``cuda_ext/csrc/cpu/minmax_cpu.cpp``, ``cuda_ext/csrc/cuda/minmax_cuda.cu``, ``cuda_ext/csrc/shared/``.
"""

from __future__ import annotations

import torch

from kvstats.quant.ops import _library as lib
from kvstats.quant.ops.pack import pack_bits_reference, unpack_bits_reference

__all__ = ["minmax_decode", "minmax_decode_reference", "minmax_encode", "minmax_encode_reference",
           "minmax_weighted_sum", "minmax_weighted_sum_reference"]


@lib.register_fake("minmax_encode")
def minmax_encode_fake(x, group: int, bits: int, side_dtype: torch.dtype):
    """x [N, d] float, group dividing d -> empty (packed codes [N, ceil(d·bits/8)], lo and step
    [N, d/group] in side_dtype)."""
    op = "minmax_encode"
    lib.check_bits(bits, op)
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [N, d], got {tuple(x.shape)}")
    lib.check_float(x, op, "x")
    if group < 1 or x.shape[1] % group:
        raise ValueError(f"{op}: group must divide d = {x.shape[1]}, got {group}")
    lib.check_storage(side_dtype)
    n, d = x.shape
    side = lib.storage_dtype(x, side_dtype)
    return (x.new_empty(n, lib.packed_nbytes(d, bits), dtype=torch.uint8), x.new_empty(n, d // group, dtype=side),
            x.new_empty(n, d // group, dtype=side))


@lib.register_fake("minmax_decode")
def minmax_decode_fake(packed, lo, scale, group: int, bits: int, d: int) -> torch.Tensor:
    """packed [N, ceil(d·bits/8)], lo and scale [N, d/group] float -> an empty [N, d] in fp32 (fp64 for fp64
    side values)."""
    op = "minmax_decode"
    lib.check_bits(bits, op)
    if group < 1 or d % group:
        raise ValueError(f"{op}: group must divide d = {d}, got {group}")
    lib.check_packed(packed, 2, bits, d, op)
    for t in (lo, scale):
        lib.check_device(packed, t, op, "lo/scale")
        if t.dim() != 2 or t.shape[0] != packed.shape[0] or t.shape[1] != d // group:
            raise ValueError(f"{op}: lo and scale must be [{packed.shape[0]}, {d // group}], got {tuple(t.shape)}")
        lib.check_float(t, op, "lo and scale")
    return lo.new_empty(packed.shape[0], d, dtype=lib.acc_dtype(lo))


@lib.register_fake("minmax_weighted_sum")
def minmax_weighted_sum_fake(w, packed, lo, scale, group: int, bits: int, d: int) -> torch.Tensor:
    """w [G, n_q, n_k] fp32/fp64, packed [G, n_k, ceil(d·bits/8)], lo and scale [G, n_k, d/group] float -> an
    empty [G, n_q, d] in w's dtype."""
    op = "minmax_weighted_sum"
    lib.check_bits(bits, op)
    if group < 1 or d % group:
        raise ValueError(f"{op}: group must divide d = {d}, got {group}")
    # lo's [G, n_k] face (a view of its first group) for the rules shared with the other weighted sums
    lo_keys = lo.as_strided(lo.shape[:2], lo.stride()[:2]) if lo.dim() == 3 else lo
    lib.check_weighted_keys(w, packed, lo_keys, bits, d, op, "lo")
    for name, t in (("lo", lo), ("scale", scale)):
        lib.check_device(w, t, op, name)
        if t.dim() != 3 or tuple(t.shape) != (*packed.shape[:2], d // group):
            raise ValueError(f"{op}: {name} must be [G, n_k, d/group] = [{packed.shape[0]}, {packed.shape[1]}, "
                             f"{d // group}], got {tuple(t.shape)}")
        lib.check_float(t, op, name)
    return lib.weighted_like(w, d)


def minmax_encode_reference(x, group: int, bits: int, side_dtype: torch.dtype):
    """x [N, d] -> (packed codes, lo [N, d/group], step [N, d/group] in side_dtype).

    Per group: lo = min, step = (max − min)/(2^bits − 1), both rounded to side_dtype; codes =
    clamp(round((x − lo)/step), 0, 2^bits − 1) (round half to even), 0 where step = 0. Where max − min
    (or x − lo) overflows for finite values, max/top − min/top (x/step − lo/step) instead, as the kernels.
    """
    minmax_encode_fake(x, group, bits, side_dtype)
    n, d = x.shape
    acc = lib.acc_dtype(x)
    side = lib.storage_dtype(x, side_dtype)
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


def minmax_decode_reference(packed, lo, scale, group: int, bits: int, d: int) -> torch.Tensor:
    """x̂ = lo + step · code, [N, d] in fp32 (fp64 for fp64 side values), without overflow of step · code."""
    minmax_decode_fake(packed, lo, scale, group, bits, d)
    acc = lib.acc_dtype(lo)
    codes = unpack_bits_reference(packed, bits, d).to(acc).reshape(packed.shape[0], d // group, group)
    lo_a, step = lo.to(acc).unsqueeze(-1), scale.to(acc).unsqueeze(-1)
    x_hat = lo_a + step * codes
    # A range wider than the dtype's maximum: step · code overflows where x̂ does not (as the kernels).
    x_hat = torch.where(torch.isfinite(x_hat), x_hat, (lo_a * 0.5 + step * (codes * 0.5)) * 2)
    return x_hat.reshape(packed.shape[0], d)


def minmax_weighted_sum_reference(w, packed, lo, scale, group: int, bits: int, d: int) -> torch.Tensor:
    """out[g, i, :] = Σ_j w[g, i, j] · x̂_j [G, n_q, d], x̂_j = lo + step · code (:func:`minmax_decode_reference`),
    decoded then multiplied, in w's dtype."""
    minmax_weighted_sum_fake(w, packed, lo, scale, group, bits, d)
    g, nk, nb = packed.shape
    x_hat = minmax_decode_reference(packed.reshape(-1, nb), lo.reshape(g * nk, d // group).to(w.dtype),
                                    scale.reshape(g * nk, d // group).to(w.dtype), group, bits, d)
    return w @ x_hat.reshape(g, nk, d).to(w.dtype)


def minmax_encode(x, group: int, bits: int, side_dtype: torch.dtype):
    """(packed codes, lo, step) of x [N, d] (:func:`minmax_encode_reference`)."""
    op = lib.kernel("minmax_encode", x.device)
    return op(x, group, bits, side_dtype) if op is not None else minmax_encode_reference(x, group, bits, side_dtype)


def minmax_decode(packed, lo, scale, group: int, bits: int, d: int) -> torch.Tensor:
    """x̂ [N, d] from the packed codes, offsets and steps (:func:`minmax_decode_reference`)."""
    op = lib.kernel("minmax_decode", packed.device)
    if op is not None:
        return op(packed, lo, scale, group, bits, d)
    return minmax_decode_reference(packed, lo, scale, group, bits, d)


def minmax_weighted_sum(w, packed, lo, scale, group: int, bits: int, d: int) -> torch.Tensor:
    """Σ_j w_ij x̂_j [G, n_q, d] straight from the packed codes, offsets and steps
    (:func:`minmax_weighted_sum_reference`)."""
    op = lib.kernel("minmax_weighted_sum", w.device)
    if op is not None:
        return op(w, packed, lo, scale, group, bits, d)
    return minmax_weighted_sum_reference(w, packed, lo, scale, group, bits, d)
