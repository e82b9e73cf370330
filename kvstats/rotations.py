"""Rotations and sketches applied to vectors on the last axis.

* :func:`fwht` — orthonormal fast Walsh–Hadamard transform, y = x · H_d / √d, for d a power of two
  (2 ≤ d ≤ 32768). It is symmetric, orthogonal and self-inverse: fwht(fwht(x)) = x.

Head dims that are not powers of two (96, 80, 192, ...) have no Sylvester–Hadamard matrix. kvstats'
randomized rotation handles them with two overlapping power-of-two blocks (see docs/rotations.md);
:func:`fwht` itself refuses them with a ValueError instead of silently padding, so a caller never gets a
transform of a different length than it asked for.
"""

from __future__ import annotations

import torch

from kvstats import ops
from kvstats._validation import check_float_tensor, is_power_of_two

__all__ = ["fwht", "MAX_FWHT_DIM"]

MAX_FWHT_DIM = 32768


def fwht(x: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last axis.

    y = x · H_d / √d, H_d the Sylvester–Hadamard matrix (``scipy.linalg.hadamard(d)`` order).
    O(d log d) per vector; runs the compiled kernel for x's device when built, else the pure-torch
    reference. Arithmetic in fp32 (fp64 for fp64 input); the result has x's dtype and shape.

    Args:
        x: [..., d] tensor, float16 / bfloat16 / float32 / float64, d a power of two in [2, 32768].
        check_finite: raise on NaN/Inf input (default). With False, NaN/Inf propagate as in torch
            (a non-finite entry spoils its whole vector).

    Returns:
        [..., d] tensor, contiguous.
    """
    check_float_tensor(x, "x", check_finite=check_finite)
    d = x.shape[-1]
    if not (2 <= d <= MAX_FWHT_DIM and is_power_of_two(d)):
        raise ValueError(
            f"x.shape[-1] must be a power of two in [2, {MAX_FWHT_DIM}] for fwht, got {d}; "
            "for other head dims use the randomized rotation, which blocks non-powers of two"
        )
    return ops.fwht(x)
