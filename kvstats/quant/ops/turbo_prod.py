"""TurboQuant_prod (arXiv 2504.19874, Alg. 2): the (b − 1)-bit MSE stage and the QJL sketch of its residual,
encoded, scored and decoded in one pass each.

Kernels: ``cuda_ext/csrc/cpu/lloyd_cpu.cpp`` (encode, scores), ``cuda_ext/csrc/cpu/sign_decode_cpu.cpp``
(decode), ``cuda_ext/csrc/cuda/turbo_prod_cuda.cu``, ``cuda_ext/csrc/shared/``.
"""

from __future__ import annotations

import torch

from kvstats.quant.ops import _library as lib
from kvstats.quant.ops._rows import pow2, rotate_reference, scaled_rows
from kvstats.quant.ops.lloyd import (
    lloyd_decode_fake,
    lloyd_decode_reference,
    lloyd_encode_fake,
    lloyd_encode_reference,
    lloyd_scores_fake,
    lloyd_scores_reference,
)
from kvstats.quant.ops.pack import sign_bits, unpack_bits_reference
from kvstats.quant.ops.qjl import qjl_encode_fake, qjl_scores_fake, qjl_scores_reference
from kvstats.quant.ops.signs import sign_decode_fake, sign_decode_reference

__all__ = [
    "turbo_prod_decode",
    "turbo_prod_decode_reference",
    "turbo_prod_encode",
    "turbo_prod_encode_reference",
    "turbo_prod_scores",
    "turbo_prod_scores_reference",
]


@lib.register_fake("turbo_prod_encode")
def turbo_prod_encode_fake(x, signs, thresholds, levels, bits: int, sketch, norm_dtype: torch.dtype):
    """lloyd_encode's and qjl_encode's inputs, levels [2^bits] of thresholds' dtype -> empty (packed indices,
    norm, packed signs [N, ceil(m/8)], γ [N])."""
    packed, norm = lloyd_encode_fake(x, signs, thresholds, bits, norm_dtype)
    signs_packed, _ = qjl_encode_fake(x, sketch, norm_dtype)
    if levels.dim() != 1 or levels.shape[0] != 1 << bits:
        raise ValueError(f"turbo_prod_encode: levels must be 1-D of length {1 << bits}, got {tuple(levels.shape)}")
    lib.check_dtype(levels, thresholds.dtype, "turbo_prod_encode", "levels")
    return packed, norm, signs_packed, norm.new_empty(norm.shape)


@lib.register_fake("turbo_prod_scores")
def turbo_prod_scores_fake(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma,
                           scale: float) -> torch.Tensor:
    """lloyd_scores' inputs and qjl_scores' (q_sketch [G, n_q, m] of q's dtype, signs_packed [G, n_k, ·], γ)
    -> an empty [G, n_q, n_k]."""
    out = lloyd_scores_fake(q, packed, norm, levels, bits)
    qjl_scores_fake(q_sketch, signs_packed, gamma, scale)
    if q_sketch.shape[:2] != q.shape[:2] or signs_packed.shape[1] != packed.shape[1]:
        raise ValueError("turbo_prod_scores: q_sketch [G, n_q, m] and signs_packed [G, n_k, m/8] must match q "
                         "and packed")
    if q_sketch.dtype != q.dtype:
        raise TypeError("turbo_prod_scores: q_sketch must have q's dtype")
    return out


@lib.register_fake("turbo_prod_decode")
def turbo_prod_decode_fake(packed, norm, signs, levels, bits: int, d: int, signs_packed, tables,
                           weight) -> torch.Tensor:
    """lloyd_decode's inputs and sign_decode's for signs_packed [N, mb], tables [mb·256, d] of levels' dtype
    -> an empty [N, d] in levels' dtype."""
    op = "turbo_prod_decode"
    out = lloyd_decode_fake(packed, norm, signs, levels, bits, d)
    sign_decode_fake(signs_packed, tables, weight, None)
    lib.check_device(packed, signs_packed, op, "signs_packed")
    if signs_packed.shape[0] != packed.shape[0]:
        raise ValueError(f"{op}: signs_packed must have {packed.shape[0]} rows (as packed), "
                         f"got {signs_packed.shape[0]}")
    if tables.dtype != levels.dtype:
        raise TypeError(f"{op}: tables must be {levels.dtype} (as levels), got {tables.dtype}")
    if tables.shape[1] != d:
        raise ValueError(f"{op}: tables must have d = {d} columns, got {tables.shape[1]}")
    return out


def turbo_prod_encode_reference(x, signs, thresholds, levels, bits: int, sketch, norm_dtype: torch.dtype):
    """x [N, d] -> (packed `bits`-bit indices, ‖x‖, packed sign(S r), γ = ‖r‖), r = Π x − ‖x‖·levels[idx].

    The residual uses ‖x‖ rounded to norm_dtype, as decode will. ``bits`` is the MSE stage's (b − 1).
    Computed on the row scaled by 2^-e (as the kernels): r' = r · 2^-e has r's sign bits, γ = ‖r'‖ · 2^e.
    """
    turbo_prod_encode_fake(x, signs, thresholds, levels, bits, sketch, norm_dtype)
    packed, norm = lloyd_encode_reference(x, signs, thresholds, bits, norm_dtype)
    xs, e = scaled_rows(x.to(thresholds.dtype))
    y = rotate_reference(xs, signs)
    idx = unpack_bits_reference(packed, bits, x.shape[-1]).long()
    w = norm.to(levels.dtype) * pow2(-e, levels.dtype)
    residual = y - levels[idx] * w.unsqueeze(-1)
    gamma = (torch.linalg.vector_norm(residual, dim=-1) * pow2(e, levels.dtype)).to(lib.storage_dtype(x, norm_dtype))
    return packed, norm, sign_bits(residual @ sketch.T), gamma


def turbo_prod_scores_reference(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma,
                                scale: float) -> torch.Tensor:
    """lloyd_scores(q, ...) + qjl_scores(q_sketch, ...): the TurboQuant_prod estimate from the codes."""
    turbo_prod_scores_fake(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma, scale)
    return lloyd_scores_reference(q, packed, norm, levels, bits) + qjl_scores_reference(
        q_sketch, signs_packed, gamma, scale)


def turbo_prod_decode_reference(packed, norm, signs, levels, bits: int, d: int, signs_packed, tables,
                                weight) -> torch.Tensor:
    """TurboQuant_prod decode in one call: Πᵀ(‖x‖·levels[idx]) + weight · Bᵀ b, with tables = sign_tables(B)
    and B = S·Π (rows of S de-rotated), so that the sum is Πᵀ(ŷ + weight · Sᵀ b). [N, d] in levels' dtype."""
    turbo_prod_decode_fake(packed, norm, signs, levels, bits, d, signs_packed, tables, weight)
    mse = lloyd_decode_reference(packed, norm, signs, levels, bits, d)
    return sign_decode_reference(signs_packed, tables, weight, mse)


def turbo_prod_encode(x, signs, thresholds, levels, bits: int, sketch, norm_dtype: torch.dtype):
    """(packed indices, ‖x‖, packed residual signs, γ) of x [N, d] (:func:`turbo_prod_encode_reference`)."""
    op = lib.kernel("turbo_prod_encode", x.device)
    if op is not None:
        return op(x, signs, thresholds, levels, bits, sketch, norm_dtype)
    return turbo_prod_encode_reference(x, signs, thresholds, levels, bits, sketch, norm_dtype)


def turbo_prod_scores(q, q_sketch, packed, norm, levels, bits: int, signs_packed, gamma, scale: float):
    """The TurboQuant_prod scores [G, n_q, n_k] (:func:`turbo_prod_scores_reference`)."""
    op = lib.kernel("turbo_prod_scores", q.device)
    if op is not None:
        return op(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma, scale)
    return turbo_prod_scores_reference(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma, scale)


def turbo_prod_decode(packed, norm, signs, levels, bits: int, d: int, signs_packed, tables, weight):
    """x̂ [N, d] of the MSE stage plus the sign part (:func:`turbo_prod_decode_reference`)."""
    op = lib.kernel("turbo_prod_decode", packed.device)
    if op is not None:
        return op(packed, norm, signs, levels, bits, d, signs_packed, tables, weight)
    return turbo_prod_decode_reference(packed, norm, signs, levels, bits, d, signs_packed, tables, weight)
