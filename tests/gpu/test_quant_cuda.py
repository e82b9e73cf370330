"""The quantizer kernels on CUDA: against the references, opcheck, and CPU/CUDA agreement (skipped without a GPU)."""

import pytest
import torch

from kvstats.quant import ops
from kvstats.quant.quantizers import quantizer
from tests.helpers.ops import (
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


@pytest.mark.parametrize("name", ["turbo_mse", "turbo_prod", "qjl", "minmax", "rotated_minmax"])
def test_weighted_sum_on_cuda_equals_decode_then_multiply(name):
    # Attention's output from the value codes on the GPU (the cache's decode step) against decode-then-matmul
    # of the same codes in float64: the fp32 summation bound of tests/quant/test_weighted_values.py.
    qz = quantizer(name, bits=4, dim=128, seed=5)
    g = torch.Generator().manual_seed(7)
    code = qz.encode(torch.randn(1, 8, 2000, 128, generator=g).cuda())
    w = torch.softmax(torch.randn(1, 8, 4, 2000, generator=g) * 3, -1).cuda()
    got = qz.weighted_sum(w, code).double().cpu()
    x_hat = qz.decode(code).double().cpu()
    want = w.double().cpu() @ x_hat
    bound = 4 * (2000 + 128) * torch.finfo(torch.float32).eps * (w.double().cpu().abs() @ x_hat.abs())
    assert bool(((got - want).abs() <= bound).all()), float(((got - want).abs() - bound).max())


@pytest.mark.parametrize("bits", range(1, 9))
def test_cuda_matches_the_cpu_shared_path(bits):
    # The CPU's shared path runs the CUDA kernels' own arithmetic (quant_math.h): codes and floats agree.
    from tests.helpers.ops import width_cases

    for name, args in width_cases("cpu", bits):
        cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        cpu_out = getattr(torch.ops.kvstats_shared, name).default(*args)
        cuda_out = as_tuple(getattr(torch.ops.kvstats, name).default(*cuda_args))
        assert_outputs_agree(name, args, tuple(t.cpu() for t in cuda_out), cpu_out)


@pytest.mark.parametrize("index", range(max(torch.cuda.device_count(), 1)))
def test_every_device_index(index):
    # Inputs on cuda:index (whatever the current device): outputs on the same device, equal to CPU's.
    device = f"cuda:{index}"
    for name, args in sample_cases("cpu")[:12]:
        dev_args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        with torch.cuda.device(0):
            out = as_tuple(getattr(torch.ops.kvstats, name).default(*dev_args))
        assert all(t.device == torch.device(device) for t in out), name
        assert_outputs_agree(name, args, tuple(t.cpu() for t in out), getattr(torch.ops.kvstats, name).default(*args))


def test_kernels_run_on_the_current_stream():
    # Work queued on a side stream: every op must be ordered after it (it runs on the current stream), so
    # its output reflects the side stream's preceding writes without any explicit synchronisation. Each op
    # reads copies of its inputs made on the side stream behind a long sleep (~0.5 s, longer than enqueueing
    # every case): an op launched on another stream would read them before they are written, and its output
    # would then differ from the CPU kernel's on the same inputs.
    side = torch.cuda.Stream()
    x = torch.randn(4096, 128, device="cuda")
    cases = [(name, args, [a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
             for name, args in sample_cases("cpu")]
    torch.cuda.synchronize()
    outs = []
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # keep the side stream busy
        x.mul_(2.0)
        y = ops.fwht(x)
        for name, _, cuda_args in cases:
            fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in cuda_args]  # written after the sleep
            outs.append(as_tuple(getattr(torch.ops.kvstats, name).default(*fresh)))
    side.synchronize()
    torch.testing.assert_close(y.cpu(), ops.fwht(x.cpu()), rtol=1e-5, atol=1e-5)
    for (name, args, _), out in zip(cases, outs):
        assert all(t.device.type == "cuda" for t in out), name
        assert_outputs_agree(name, args, tuple(t.cpu() for t in out), getattr(torch.ops.kvstats, name).default(*args))
