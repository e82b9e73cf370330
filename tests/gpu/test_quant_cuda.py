"""The quantizer kernels on CUDA: against the references, opcheck, and CPU/CUDA agreement (skipped without a GPU)."""

import pytest
import torch

from kvstats import ops
from kvstats.quantizers import quantizer
from tests.op_suite import (
    as_tuple,
    assert_outputs_agree,
    block_boundary_cases,
    check_ops_against_references,
    check_ops_opcheck,
    sample_cases,
)


def test_every_op_has_a_cuda_kernel():
    assert all("CUDA" in devices for devices in ops.kernel_devices().values())


def test_cuda_kernels_match_references():
    check_ops_against_references("cuda")


def test_cuda_kernels_match_references_across_blocks():
    check_ops_against_references("cuda", block_boundary_cases("cuda"))


def test_opcheck_cuda():
    check_ops_opcheck("cuda")


def test_cpu_and_cuda_kernels_agree():
    # Same inputs, same rotation/sketch matrices: float outputs within tolerance, codes equal except
    # where an input sits on a threshold within rounding (counted and bounded).
    for name, args in sample_cases("cpu") + block_boundary_cases("cpu"):
        cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        cpu_out = getattr(torch.ops.kvstats, name).default(*args)
        cuda_out = as_tuple(getattr(torch.ops.kvstats, name).default(*cuda_args))
        assert_outputs_agree(name, args, tuple(t.cpu() for t in cuda_out), cpu_out)


@pytest.mark.parametrize("name", ["turbo_mse", "turbo_prod", "qjl", "minmax", "lloyd"])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_public_api_on_cuda_matches_cpu(name, d):
    qz = quantizer(name, bits=4, dim=d, seed=3)
    x = torch.randn(2, 8, 300, d, generator=torch.Generator().manual_seed(d))
    q = torch.randn(2, 8, 5, d, generator=torch.Generator().manual_seed(d + 1))
    s_cpu = qz.inner(q, qz.encode(x))
    s_cuda = qz.inner(q.cuda(), qz.encode(x.cuda())).cpu()
    close = torch.isclose(s_cuda, s_cpu, rtol=1e-3, atol=1e-3).float().mean().item()
    assert close > 0.999, close  # a key whose code differs at a threshold moves its score a little
