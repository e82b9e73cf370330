"""Argument handling shared by the measurements (:mod:`kvstats.measure.metrics`, :mod:`kvstats.measure.geometric`,
:mod:`kvstats.measure.error6d`): tensors in, their checks, the working dtype, reductions, logits that cannot
overflow silently, and the relative error with its zero rule (docs/metrics.md)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from kvstats._validation import as_tensor, check_float_tensor
from kvstats.quant import attention

Reduction = Literal["mean", "none"]


def _prep(x, name: str, *, min_dim: int = 1) -> torch.Tensor:
    return check_float_tensor(as_tensor(x, name), name, min_dim=min_dim)


def _work_dtype(double: bool, *tensors: torch.Tensor) -> torch.dtype:
    if double or any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def _reduce(x: torch.Tensor, reduction: str) -> float | torch.Tensor:
    return float(x.mean().item()) if reduction == "mean" else x


def _check_same_shape(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{b_name} must have the shape of {a_name} {tuple(a.shape)}, got {tuple(b.shape)}")


def _check_qk(q: torch.Tensor, k: torch.Tensor, k_name: str = "k") -> int:
    """Check q [B, Hq, Nq, d] against k [B, Hkv, S, d]; return the group size Hq // Hkv."""
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [batch, q_heads, n_q, d], got shape {tuple(q.shape)}")
    if k.dim() != 4:
        raise ValueError(f"{k_name} must be 4-D [batch, kv_heads, seq, d], got shape {tuple(k.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{k_name}.shape[0] (batch) must equal q.shape[0] = {q.shape[0]}, got {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{k_name}.shape[-1] (head dim) must equal q.shape[-1] = {q.shape[-1]}, got {k.shape[-1]}")
    if q.shape[-1] < 2:
        raise ValueError(f"q.shape[-1] (head dim d) must be >= 2, got {q.shape[-1]}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv != 0:
        raise ValueError(
            f"q.shape[1] (q_heads = {hq}) must be a multiple of {k_name}.shape[1] (kv_heads), got kv_heads = {hkv}"
        )
    return hq // hkv


def _scores(q: torch.Tensor, k: torch.Tensor, dtype: torch.dtype, k_name: str = "k") -> torch.Tensor:
    """``q kᵀ/√d`` in ``dtype`` (kvstats.quant.attention.scores); fp32 logits that overflow are recomputed in fp64.

    Finite inputs can overflow fp32 in the product (|q|·|k| above ~1e38): the logits are then computed in
    fp64; if even fp64 overflows, ValueError names the arguments (never a silent inf/NaN downstream).
    """
    s = attention.scores(q.to(dtype), k.to(dtype))
    if bool(torch.isfinite(s).all()):
        return s
    if dtype != torch.float64:
        s = attention.scores(q.double(), k.double())
        if bool(torch.isfinite(s).all()):
            return s
    raise ValueError(
        f"q·{k_name}ᵀ/√d overflows float64 (max |q| = {q.abs().max().item():.3g}, max |{k_name}| = "
        f"{k.abs().max().item():.3g}); rescale the inputs"
    )


def _relative(num: torch.Tensor, den: torch.Tensor, what: str = "the reference") -> torch.Tensor:
    """``num / den``, 0 where both are 0; a ValueError naming ``what`` where only ``den`` is 0 (the relative
    error is infinite there: refused, never returned as inf)."""
    bad = (den == 0) & (num > 0)
    if bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"{what} is zero at index {index} where the estimate is not: the relative error is "
                         "infinite there; leave zero vectors out, or use an absolute error (mse)")
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), torch.zeros_like(num))


def _vec(x, name: str) -> np.ndarray:
    """A float64 numpy array [..., d] of finite values (a tensor is copied to the CPU)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim < 1 or arr.shape[-1] < 1:
        raise ValueError(f"{name} must be a vector [..., d], got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains non-finite values (first seen: {arr[~np.isfinite(arr)][0]})")
    return arr
