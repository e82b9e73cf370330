"""The QJL sketch (arXiv 2406.03482): encode to packed signs of S x with ‖x‖, and scores from the signs.

Kernels: ``cuda_ext/csrc/cpu/qjl_cpu.cpp``, ``cuda_ext/csrc/cuda/qjl_cuda.cu``, ``cuda_ext/csrc/shared/``.
"""

from __future__ import annotations

import torch

from kvstats.quant.ops import _library as lib
from kvstats.quant.ops._rows import row_norm
from kvstats.quant.ops.pack import sign_bits, unpack_bits_reference

__all__ = ["qjl_encode", "qjl_encode_reference", "qjl_scores", "qjl_scores_reference", "qjl_weighted_sum",
           "qjl_weighted_sum_reference"]


@lib.register_fake("qjl_encode")
def qjl_encode_fake(x, sketch, norm_dtype: torch.dtype):
    """x [N, d] float, sketch S [m, d] in x's accumulation dtype -> empty (packed signs uint8 [N, ceil(m/8)],
    norm [N] in norm_dtype)."""
    op = "qjl_encode"
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [N, d], got {tuple(x.shape)}")
    lib.check_float(x, op, "x")
    lib.check_device(x, sketch, op, "sketch")
    if sketch.dim() != 2 or sketch.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: sketch must be [m, {x.shape[1]}], got {tuple(sketch.shape)}")
    lib.check_dtype(sketch, lib.acc_dtype(x), op, "sketch")
    lib.check_storage(norm_dtype)
    n = x.shape[0]
    return (x.new_empty(n, lib.packed_nbytes(sketch.shape[0], 1), dtype=torch.uint8),
            x.new_empty(n, dtype=lib.storage_dtype(x, norm_dtype)))


@lib.register_fake("qjl_scores")
def qjl_scores_fake(q_sketch, packed, norm, scale: float) -> torch.Tensor:
    """q_sketch [G, n_q, m] fp32/fp64, packed signs [G, n_k, ceil(m/8)], norm [G, n_k] -> an empty
    [G, n_q, n_k]."""
    lib.check_score_keys(q_sketch, packed, norm, 1, "qjl_scores", "q_sketch")
    return lib.scores_like(q_sketch, packed)


@lib.register_fake("qjl_weighted_sum")
def qjl_weighted_sum_fake(w, packed, norm, scale: float, m: int) -> torch.Tensor:
    """w [G, n_q, n_k] fp32/fp64, packed signs [G, n_k, ceil(m/8)], norm [G, n_k] -> an empty [G, n_q, m] in
    w's dtype."""
    op = "qjl_weighted_sum"
    if m < 1:
        raise ValueError(f"{op}: m must be >= 1, got {m}")
    lib.check_weighted_keys(w, packed, norm, 1, m, op)
    return lib.weighted_like(w, m)


def qjl_encode_reference(x, sketch, norm_dtype: torch.dtype):
    """x [N, d], S [m, d] -> (packed sign(S x) [N, ceil(m/8)], ‖x‖ [N] in norm_dtype)."""
    qjl_encode_fake(x, sketch, norm_dtype)
    xa = x.to(sketch.dtype)
    return sign_bits(xa @ sketch.T), row_norm(xa).to(lib.storage_dtype(x, norm_dtype))


def qjl_scores_reference(q_sketch, packed, norm, scale: float) -> torch.Tensor:
    """scores[g, i, j] = scale · norm[g, j] · ⟨q_sketch[g, i], b[g, j]⟩, b = ±1 unpacked signs."""
    qjl_scores_fake(q_sketch, packed, norm, scale)
    g, nk, mb = packed.shape
    m = q_sketch.shape[-1]
    b = unpack_bits_reference(packed.reshape(-1, mb), 1, m).reshape(g, nk, m).to(q_sketch.dtype) * 2 - 1
    return (q_sketch @ b.transpose(-1, -2)) * (norm.to(q_sketch.dtype) * scale).unsqueeze(-2)


def qjl_weighted_sum_reference(w, packed, norm, scale: float, m: int) -> torch.Tensor:
    """out[g, i, :] = scale · Σ_j w[g, i, j] · norm[g, j] · b[g, j] [G, n_q, m], b = ±1 unpacked signs: Sᵀ of it
    is the weighted sum of the QJL reconstructions (scale · norm_j · Sᵀ b_j), unpacked then multiplied."""
    qjl_weighted_sum_fake(w, packed, norm, scale, m)
    g, nk, mb = packed.shape
    b = unpack_bits_reference(packed.reshape(-1, mb), 1, m).reshape(g, nk, m).to(w.dtype) * 2 - 1
    return w @ (b * (norm.to(w.dtype) * scale).unsqueeze(-1))


def qjl_encode(x, sketch, norm_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed sign(S x), ‖x‖) of x [N, d] (:func:`qjl_encode_reference`)."""
    op = lib.kernel("qjl_encode", x.device)
    return op(x, sketch, norm_dtype) if op is not None else qjl_encode_reference(x, sketch, norm_dtype)


def qjl_scores(q_sketch, packed, norm, scale: float) -> torch.Tensor:
    """QJL scores [G, n_q, n_k] from the packed signs (:func:`qjl_scores_reference`)."""
    op = lib.kernel("qjl_scores", q_sketch.device)
    return op(q_sketch, packed, norm, scale) if op is not None else qjl_scores_reference(q_sketch, packed, norm,
                                                                                       scale)


def qjl_weighted_sum(w, packed, norm, scale: float, m: int) -> torch.Tensor:
    """scale · Σ_j w_ij norm_j b_j [G, n_q, m] straight from the packed signs (:func:`qjl_weighted_sum_reference`)."""
    op = lib.kernel("qjl_weighted_sum", w.device)
    return op(w, packed, norm, scale, m) if op is not None else qjl_weighted_sum_reference(w, packed, norm, scale, m)
