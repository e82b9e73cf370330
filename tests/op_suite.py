"""Shared correctness checks of the compiled ops, run by tests/ on CPU and by tests/gpu/ on CUDA.

Tolerances follow the fast-hadamard-transform idiom: the kernel's error against a float64 oracle must
be at most twice the error of the pure-torch reference run in the same low-precision dtype, plus a
small absolute slack (rounding of the final cast can differ by one ulp).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from kvstats import ops

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FWHT_DIMS = (2, 4, 8, 16, 64, 128, 256, 1024, 4096)


def fwht_oracle(x: torch.Tensor) -> torch.Tensor:
    """x · H_d / √d in float64 with scipy's Sylvester–Hadamard matrix.

    Above d = 4096 the dense matrix would take gigabytes, so the Sylvester recursion
    H_2k [a; b] = [H_k (a + b); H_k (a − b)] splits the vector down to scipy's matrix.
    """
    x = x.double().cpu()
    d = x.shape[-1]
    if d > 4096:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((fwht_oracle(a + b), fwht_oracle(a - b)), dim=-1) / np.sqrt(2.0)
    h = torch.from_numpy(scipy.linalg.hadamard(d).astype(np.float64) / np.sqrt(d))
    return x @ h


def fwht_sample_inputs(device: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 64), (2, 5, 128), (7, 2), (1, 1, 1, 256), (33, 1024), (4, 96 * 0 + 32)]
    out = []
    for i, shape in enumerate(shapes):
        dtype = DTYPES[i % len(DTYPES)]
        out.append((torch.randn(shape, generator=g) * 3 + 0.5).to(device=device, dtype=dtype))
    return out


def assert_close_to_oracle(kernel_out: torch.Tensor, ref_low: torch.Tensor, oracle: torch.Tensor) -> None:
    """Kernel error ≤ 2 × (reference-in-same-dtype error) + atol, both against the float64 oracle."""
    err_kernel = (kernel_out.double().cpu() - oracle).abs().max().item()
    err_ref = (ref_low.double().cpu() - oracle).abs().max().item()
    scale = oracle.abs().max().item()
    atol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}[
        kernel_out.dtype
    ] * max(scale, 1.0)
    assert err_kernel <= 2 * err_ref + atol, (err_kernel, err_ref, atol)


def check_fwht_correctness(device: str) -> None:
    g = torch.Generator().manual_seed(1234)
    for d in FWHT_DIMS:
        for dtype in DTYPES:
            x64 = torch.randn(6, d, generator=g, dtype=torch.float64) + 0.25
            x = x64.to(device=device, dtype=dtype)
            oracle = fwht_oracle(x.double())
            kernel = ops.fwht(x)
            with ops.use_reference():
                ref_low = ops.fwht(x)
            assert kernel.dtype == dtype and kernel.shape == x.shape and kernel.device == x.device
            assert_close_to_oracle(kernel, ref_low, oracle)


def check_fwht_opcheck(device: str) -> None:
    for x in fwht_sample_inputs(device):
        torch.library.opcheck(torch.ops.kvstats.fwht.default, (x,))
        if x.dtype == torch.float32:
            torch.library.opcheck(torch.ops.kvstats.fwht.default, (x.double().requires_grad_(),))
