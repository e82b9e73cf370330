"""Rotation + Lloyd–Max (lloyd, turbo_mse): encode, decode and scores straight from the codes.

signs [P, B]: the randomized-Hadamard rotation Π (:mod:`kvstats.quant.ops._rows`); thresholds [2^b − 1] and
levels [2^b] of the codebook in the accumulation dtype. Kernels: ``cuda_ext/csrc/cpu/lloyd_cpu.cpp``,
``cuda_ext/csrc/cuda/lloyd_cuda.cu``, ``cuda_ext/csrc/shared/``.
"""

from __future__ import annotations

import torch

from kvstats.quant.ops import _library as lib
from kvstats.quant.ops._rows import pow2, rotate_reference, scaled_rows, unrotate_reference
from kvstats.quant.ops.pack import pack_bits_reference, unpack_bits_reference

__all__ = [
    "lloyd_decode",
    "lloyd_decode_reference",
    "lloyd_encode",
    "lloyd_encode_reference",
    "lloyd_scores",
    "lloyd_scores_reference",
    "lloyd_weighted_sum",
    "lloyd_weighted_sum_reference",
]


@lib.register_fake("lloyd_encode")
def lloyd_encode_fake(x, signs, thresholds, bits: int, norm_dtype: torch.dtype):
    """x [N, d] float (d >= 2); signs [P, B] and thresholds [2^bits − 1] in x's accumulation dtype ->
    empty (packed uint8 [N, ceil(d·bits/8)], norm [N] in norm_dtype)."""
    op = "lloyd_encode"
    lib.check_bits(bits, op)
    if x.dim() != 2 or x.shape[1] < 2:
        raise ValueError(f"{op}: x must be [N, d] with d >= 2, got {tuple(x.shape)}")
    lib.check_float(x, op, "x")
    lib.check_signs(x, signs, x.shape[1], lib.acc_dtype(x), op)
    lib.check_table(x, thresholds, (1 << bits) - 1, op, "thresholds")
    lib.check_storage(norm_dtype)
    n, d = x.shape
    return (x.new_empty(n, lib.packed_nbytes(d, bits), dtype=torch.uint8),
            x.new_empty(n, dtype=lib.storage_dtype(x, norm_dtype)))


@lib.register_fake("lloyd_decode")
def lloyd_decode_fake(packed, norm, signs, levels, bits: int, d: int) -> torch.Tensor:
    """packed uint8 [N, ceil(d·bits/8)], norm [N] float, signs [P, B] and levels [2^bits] fp32/fp64 -> an
    empty [N, d] in levels' dtype."""
    op = "lloyd_decode"
    lib.check_bits(bits, op)
    if d < 2:
        raise ValueError(f"{op}: d must be >= 2, got {d}")
    lib.check_packed(packed, 2, bits, d, op)
    lib.check_device(packed, norm, op, "norm")
    if norm.dim() != 1 or norm.shape[0] != packed.shape[0]:
        raise ValueError(f"{op}: norm must be [{packed.shape[0]}], got {tuple(norm.shape)}")
    lib.check_float(norm, op, "norm")
    lib.check_dtype(levels, (torch.float32, torch.float64), op, "levels")
    lib.check_device(packed, levels, op, "levels")
    if levels.dim() != 1 or levels.shape[0] != 1 << bits:
        raise ValueError(f"{op}: levels must have {1 << bits} entries, got {tuple(levels.shape)}")
    lib.check_signs(packed, signs, d, levels.dtype, op)
    return levels.new_empty(packed.shape[0], d)


@lib.register_fake("lloyd_scores")
def lloyd_scores_fake(q, packed, norm, levels, bits: int) -> torch.Tensor:
    """q [G, n_q, d] fp32/fp64 (rotated), packed [G, n_k, ceil(d·bits/8)], norm [G, n_k], levels [2^bits] in
    q's dtype -> an empty [G, n_q, n_k]."""
    op = "lloyd_scores"
    lib.check_bits(bits, op)
    lib.check_score_keys(q, packed, norm, bits, op, "q")
    lib.check_table(q, levels, 1 << bits, op, "levels")
    return lib.scores_like(q, packed)


@lib.register_fake("lloyd_weighted_sum")
def lloyd_weighted_sum_fake(w, packed, norm, levels, bits: int, d: int) -> torch.Tensor:
    """w [G, n_q, n_k] fp32/fp64 (attention weights), packed [G, n_k, ceil(d·bits/8)], norm [G, n_k], levels
    [2^bits] in w's dtype -> an empty [G, n_q, d] in w's dtype."""
    op = "lloyd_weighted_sum"
    lib.check_bits(bits, op)
    if d < 2:
        raise ValueError(f"{op}: d must be >= 2, got {d}")
    lib.check_weighted_keys(w, packed, norm, bits, d, op)
    lib.check_table(w, levels, 1 << bits, op, "levels")
    return lib.weighted_like(w, d)


def lloyd_encode_reference(x, signs, thresholds, bits: int, norm_dtype: torch.dtype):
    """x [N, d] -> (packed cell indices of (Π x)/‖x‖ [N, ceil(d·bits/8)], ‖x‖ [N] in norm_dtype).

    Arithmetic in thresholds' dtype (fp32, or fp64). Cells as torch.bucketize (a value equal to a
    threshold falls in the lower cell); a zero vector gets u = 0. Each row is scaled by a power of two
    (its max |x|) first, so the norm does not overflow for finite input (as the kernels, math/lloyd.h).
    """
    lloyd_encode_fake(x, signs, thresholds, bits, norm_dtype)
    xs, e = scaled_rows(x.to(thresholds.dtype))
    norm_s = torch.linalg.vector_norm(xs, dim=-1)
    u = rotate_reference(xs, signs) / torch.where(norm_s > 0, norm_s, torch.ones_like(norm_s)).unsqueeze(-1)
    idx = torch.bucketize(u, thresholds).to(torch.uint8)
    norm = norm_s * pow2(e, norm_s.dtype)
    return pack_bits_reference(idx, bits), norm.to(lib.storage_dtype(x, norm_dtype))


def lloyd_decode_reference(packed, norm, signs, levels, bits: int, d: int) -> torch.Tensor:
    """x̂ = Πᵀ(‖x‖ · levels[idx]) [N, d] in levels' dtype."""
    lloyd_decode_fake(packed, norm, signs, levels, bits, d)
    idx = unpack_bits_reference(packed, bits, d).long()
    return unrotate_reference(levels[idx] * norm.to(levels.dtype).unsqueeze(-1), signs)


def lloyd_scores_reference(q, packed, norm, levels, bits: int) -> torch.Tensor:
    """scores[g, i, j] = ‖k_j‖ · ⟨q_i, levels[idx_j]⟩: q [G, n_q, d], packed [G, n_k, nb], norm [G, n_k]."""
    lloyd_scores_fake(q, packed, norm, levels, bits)
    g, nk, nb = packed.shape
    d = q.shape[-1]
    k_hat = levels[unpack_bits_reference(packed.reshape(-1, nb), bits, d).long()].reshape(g, nk, d)
    return (q @ k_hat.transpose(-1, -2)) * norm.to(q.dtype).unsqueeze(-2)


def lloyd_weighted_sum_reference(w, packed, norm, levels, bits: int, d: int) -> torch.Tensor:
    """out[g, i, :] = Σ_j w[g, i, j] · ‖x_j‖ · levels[idx_j] [G, n_q, d]: the weighted sum of the keys' (or
    values') reconstructions in the rotated domain (Πᵀ of it is Σ_j w_ij x̂_j), decoded then multiplied."""
    lloyd_weighted_sum_fake(w, packed, norm, levels, bits, d)
    g, nk, nb = packed.shape
    y_hat = levels[unpack_bits_reference(packed.reshape(-1, nb), bits, d).long()].reshape(g, nk, d)
    return w @ (y_hat * norm.to(w.dtype).unsqueeze(-1))


def lloyd_encode(x, signs, thresholds, bits: int, norm_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed cells, ‖x‖) of x [N, d] (:func:`lloyd_encode_reference`)."""
    op = lib.kernel("lloyd_encode", x.device)
    if op is not None:
        return op(x, signs, thresholds, bits, norm_dtype)
    return lloyd_encode_reference(x, signs, thresholds, bits, norm_dtype)


def lloyd_decode(packed, norm, signs, levels, bits: int, d: int) -> torch.Tensor:
    """x̂ [N, d] from the packed cells and norms (:func:`lloyd_decode_reference`)."""
    op = lib.kernel("lloyd_decode", packed.device)
    return op(packed, norm, signs, levels, bits, d) if op is not None else lloyd_decode_reference(
        packed, norm, signs, levels, bits, d)


def lloyd_scores(q, packed, norm, levels, bits: int) -> torch.Tensor:
    """Scores [G, n_q, n_k] of rotated queries against the packed keys (:func:`lloyd_scores_reference`)."""
    op = lib.kernel("lloyd_scores", q.device)
    return op(q, packed, norm, levels, bits) if op is not None else lloyd_scores_reference(q, packed, norm, levels,
                                                                                         bits)


def lloyd_weighted_sum(w, packed, norm, levels, bits: int, d: int) -> torch.Tensor:
    """Σ_j w_ij ‖x_j‖ levels[idx_j] [G, n_q, d] straight from the packed codes
    (:func:`lloyd_weighted_sum_reference`)."""
    op = lib.kernel("lloyd_weighted_sum", w.device)
    if op is not None:
        return op(w, packed, norm, levels, bits, d)
    return lloyd_weighted_sum_reference(w, packed, norm, levels, bits, d)
