"""The orthonormal fast Walsh–Hadamard transform: its contract (the fake), its reference and its wrapper.

Kernels: ``cuda_ext/csrc/cpu/fwht_cpu.cpp``, ``cuda_ext/csrc/cuda/fwht_cuda.cu``, ``cuda_ext/csrc/shared/``;
schema in ``cuda_ext/csrc/schemas.h``.
"""

from __future__ import annotations

import math

import torch

from kvstats.quant.ops import _library as lib

__all__ = ["fwht", "fwht_reference"]


@lib.register_fake("fwht")
def fwht_fake(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] float, d a power of two in [2, 2^15] -> an empty [..., d] of x's dtype."""
    if x.dim() < 1:
        raise ValueError("fwht: x must have at least one dimension, got a 0-d tensor")
    lib.check_dtype(x, lib.FLOATS, "fwht", "x")
    d = x.shape[-1]
    if not (2 <= d <= lib.MAX_FWHT_DIM and d & (d - 1) == 0):
        raise ValueError(f"fwht: the last dimension must be a power of two in [2, {lib.MAX_FWHT_DIM}], got {d}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def fwht_reference(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last axis, in pure torch.

    y = x · H_d / √d with H_d the Sylvester–Hadamard matrix (H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]]),
    the same order as ``scipy.linalg.hadamard``. O(d log d): log2(d) butterfly stages, each one
    reshape of x to [..., d/(2h), 2, h]. Arithmetic in fp32 (fp64 for fp64 input); returns x's dtype.

    Shapes: x [..., d] with d a power of two -> [..., d].
    """
    fwht_fake(x)
    d = x.shape[-1]
    y = x.to(lib.acc_dtype(x)).reshape(-1, d)
    h = 1
    while h < d:
        pairs = y.view(-1, d // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).view(-1, d)
        h *= 2
    return (y / math.sqrt(d)).to(x.dtype).view(x.shape)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh–Hadamard transform: x [..., d], d a power of two (see :func:`fwht_reference`)."""
    op = lib.kernel("fwht", x.device)
    return op(x) if op is not None else fwht_reference(x)


if lib.HAS_EXTENSION:
    for _namespace in (lib.NAMESPACE, lib.SHARED_NAMESPACE):
        # H_d/√d is symmetric and orthogonal: the transform is its own adjoint.
        _op = getattr(torch.ops, _namespace).fwht.default
        torch.library.register_autograd(f"{_namespace}::fwht", lambda ctx, grad, _op=_op: _op(grad))
