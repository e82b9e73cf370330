"""Asymmetric min-max quantization written from its definition in numpy (KIVI, arXiv 2402.02750 §3), and the bit
layout of kvstats.quant.packing from its definition: the independent references of tests/quant/test_int_token.py and
tests/quant/test_kivi.py (nothing of kvstats' encode is used).

Per group g (the last axis): lo = min g, s = (max g − lo)/(2^b − 1), both computed in float32 and rounded to fp16;
code = clip(round_half_even((x − lo)/s), 0, 2^b − 1) from the rounded lo and s, 0 when s = 0; x̂ = lo + s·code.
"""

from __future__ import annotations

import numpy as np
import torch


def as_float32(x: torch.Tensor) -> np.ndarray:
    """fp16/bf16/fp32 x as float32 numpy (exact: every such value is a float32)."""
    return x.detach().to(torch.float32).cpu().numpy()


def minmax_groups(x: np.ndarray, bits: int, side=np.float16):
    """(codes int64, lo, step in ``side``, x̂ float32) of float32 x grouped along its last axis."""
    x = np.asarray(x, dtype=np.float32)
    top = np.float32((1 << bits) - 1)
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    lo_s = lo.astype(side)
    step_s = ((hi - lo) / top).astype(side)  # float32 arithmetic, then rounded to the stored dtype
    lo_a, step = lo_s.astype(np.float32), step_s.astype(np.float32)
    safe = np.where(step > 0, step, np.float32(1))
    codes = np.clip(np.rint((x - lo_a) / safe), 0, top)  # np.rint: round half to even
    codes = np.where(step > 0, codes, 0).astype(np.int64)
    x_hat = lo_a + step * codes.astype(np.float32)
    return codes, lo_s[..., 0], step_s[..., 0], x_hat


def pack_reference(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [..., d] -> uint8 [..., ceil(d·bits/8)]: code i at stream bits [i·bits, (i+1)·bits), least significant
    bit first; stream bit p in byte p // 8 at bit p % 8; the last byte zero-padded."""
    d = codes.shape[-1]
    nbytes = (d * bits + 7) // 8
    out = np.zeros((*codes.shape[:-1], nbytes), dtype=np.int64)
    for i in range(d):
        for t in range(bits):
            p = i * bits + t
            out[..., p // 8] |= ((codes[..., i] >> t) & 1) << (p % 8)
    return out.astype(np.uint8)
