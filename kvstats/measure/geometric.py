"""Geometric errors of reconstructed vectors, per vector on the last axis: the directional error (1 − cos θ or
θ), the relative norm error and the squared error ``‖x − x̂‖²`` (TurboQuant's D_mse, arXiv:2504.19874 §2).

Zero vectors: the direction of a zero vector is undefined; ``1 − cos = 0`` (angle 0) when both ``x`` and ``x̂``
are zero and ``1 − cos = 1`` (angle π/2, "no directional information") when exactly one is. The relative norm
error is 0 when both are zero and +inf when ``x = 0 ≠ x̂`` (reported, not hidden). Re-exported by
:mod:`kvstats.measure.metrics`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from kvstats.measure._inputs import (
    Reduction,
    _check_reduction,
    _check_same_shape,
    _prep,
    _reduce,
    _relative,
    _work_dtype,
)

__all__ = ["direction_error", "mse", "relative_norm_error"]


def _pair(x, x_hat, double: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, x_hat = _prep(x, "x"), _prep(x_hat, "x_hat")
    _check_same_shape(x, "x", x_hat, "x_hat")
    dtype = _work_dtype(double, x, x_hat)
    return x.to(dtype), x_hat.to(dtype)


def direction_error(
    x,
    x_hat,
    *,
    kind: Literal["cosine", "angle"] = "cosine",
    reduction: Reduction = "none",
    double: bool = False,
) -> float | torch.Tensor:
    """Directional error of reconstructions, per vector on the last axis.

    ``kind="cosine"``: ``1 − cos θ = ½ ‖x/‖x‖ − x̂/‖x̂‖‖²`` (computed in this form: accurate for small θ).
    ``kind="angle"``: ``θ = 2·atan2(‖u − û‖, ‖u + û‖)`` in radians, ``u = x/‖x‖`` (Kahan's stable angle).
    Zero vectors: 0 when both are zero, ``1 − cos = 1`` / ``θ = π/2`` when exactly one is zero.

    Args:
        x, x_hat: ``[..., d]`` of the same shape.
        reduction: ``"none"`` (tensor ``[...]``) or ``"mean"`` (float).
    """
    if kind not in ("cosine", "angle"):
        raise ValueError(f"kind must be 'cosine' or 'angle', got {kind!r}")
    _check_reduction(reduction)
    x, x_hat = _pair(x, x_hat, double)
    nx, nh = torch.linalg.vector_norm(x, dim=-1), torch.linalg.vector_norm(x_hat, dim=-1)
    u = x / torch.where(nx > 0, nx, 1.0).unsqueeze(-1)
    uh = x_hat / torch.where(nh > 0, nh, 1.0).unsqueeze(-1)
    diff = torch.linalg.vector_norm(u - uh, dim=-1)
    if kind == "cosine":
        err = 0.5 * diff.square()
        one_zero = torch.ones_like(err)
    else:
        err = 2.0 * torch.atan2(diff, torch.linalg.vector_norm(u + uh, dim=-1))
        one_zero = torch.full_like(err, math.pi / 2)
    zx, zh = nx == 0, nh == 0
    err = torch.where(zx ^ zh, one_zero, err)
    err = torch.where(zx & zh, torch.zeros_like(err), err)
    return _reduce(err, reduction)


def relative_norm_error(x, x_hat, *, reduction: Reduction = "none", double: bool = False) -> float | torch.Tensor:
    """``|‖x̂‖ − ‖x‖| / ‖x‖`` per vector on the last axis (0 if both zero; a zero ``x`` with a non-zero ``x̂`` is
    refused with a ValueError: the relative error is infinite). Norms in float64, so fp32 rows near the dtype's
    maximum give a finite result.

    Args:
        x, x_hat: ``[..., d]`` of the same shape.
        reduction: ``"none"`` (tensor ``[...]``) or ``"mean"`` (float).
    """
    _check_reduction(reduction)
    x, x_hat = _pair(x, x_hat, double)
    nx, nh = torch.linalg.vector_norm(x.double(), dim=-1), torch.linalg.vector_norm(x_hat.double(), dim=-1)
    return _reduce(_relative((nh - nx).abs(), nx, "x").to(x.dtype), reduction)


def mse(
    x, x_hat, *, relative: bool = False, reduction: Reduction = "mean", double: bool = False
) -> float | torch.Tensor:
    """Squared reconstruction error per vector, ``‖x − x̂‖²`` (summed over the last axis, not averaged).

    This is TurboQuant's ``D_mse = E‖x − x̂‖²`` (docs/references.md §3) when averaged over unit vectors; divide by
    ``d`` for a per-coordinate MSE. ``relative=True`` gives ``‖x − x̂‖² / ‖x‖²`` (zero ``x``: 0 if
    ``x̂ = 0`` too, else refused with a ValueError), computed in float64. Finite fp32 rows whose squared error
    exceeds fp32 (above 3.4e38) are recomputed in float64: the mean is returned, a per-vector fp32 tensor could not
    hold it and is refused naming the magnitude (``double=True`` returns float64).

    Args:
        x, x_hat: ``[..., d]`` of the same shape.
        reduction: ``"mean"`` (float, mean over vectors) or ``"none"`` (tensor ``[...]``).
    """
    _check_reduction(reduction)
    x, x_hat = _pair(x, x_hat, double)
    if relative:  # in float64: squares of fp32 rows near the dtype's maximum overflow fp32
        x64 = x.double()
        err = _relative((x64 - x_hat.double()).square().sum(-1), x64.square().sum(-1), "x").to(x.dtype)
        return _reduce(err, reduction)
    err = (x - x_hat).square().sum(-1)
    if x.dtype != torch.float64 and not bool(torch.isfinite(err).all()):
        err = (x.double() - x_hat.double()).square().sum(-1)  # the inputs are finite: so is this, below 1e77·d
        if reduction == "none":
            raise ValueError(f"mse reaches {float(err.max()):.4g} per vector, beyond {str(x.dtype)[6:]}'s largest "
                             f"finite value {torch.finfo(x.dtype).max:.4g}: pass double=True for float64 errors")
    return _reduce(err, reduction)
