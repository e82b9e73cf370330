"""Row arithmetic the references share, as the kernels do it (``cuda_ext/csrc/math/``): norms that cannot
overflow, and the randomized-Hadamard rotation Π applied pass by pass."""

from __future__ import annotations

import torch

from kvstats.quant.ops.hadamard import fwht_reference


def scale_exponents(x: torch.Tensor) -> torch.Tensor:
    """Per row of x [..., d]: e with max|x| = f · 2^e, f in [0.5, 1) (0 for a zero or non-finite row),
    clamped to ±120 (fp32) or ±1000 (fp64) so that 2^±e is a normal number. As math/scalar.h."""
    max_abs = x.abs().amax(dim=-1).double()
    _, e = torch.frexp(max_abs)
    e = torch.where((max_abs > 0) & torch.isfinite(max_abs), e, torch.zeros_like(e))
    limit = 1000 if x.dtype == torch.float64 else 120
    return e.clamp(-limit, limit)


def pow2(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.exp2(e.double()).to(dtype)


def scaled_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x · 2^-e per row, e): the scaled rows lie in [-1, 1], so their squares never overflow, and the
    scaling by a power of two is exact."""
    e = scale_exponents(x)
    return x * pow2(-e, x.dtype).unsqueeze(-1), e


def row_norm(x: torch.Tensor) -> torch.Tensor:
    """‖x‖ per row without overflow for finite x (fp32 rows of norm > 1.8e19 included)."""
    xs, e = scaled_rows(x)
    return torch.linalg.vector_norm(xs, dim=-1) * pow2(e, x.dtype)


# signs: [P, B] random ±1 of the randomized Hadamard rotation (kvstats.quant.rotations.RandomizedHadamard):
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
