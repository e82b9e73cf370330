"""The quantizer kernels (CPU) against their pure-torch references, opcheck, and bad inputs."""

import pytest
import torch

from kvstats.quant import ops
from kvstats.quant.quantizers import quantizer
from tests.helpers.ops import block_boundary_cases, check_ops_against_references, check_ops_opcheck

pytestmark = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")


def test_every_op_has_a_cpu_kernel():
    assert all("CPU" in devices for devices in ops.kernel_devices().values())


@pytest.mark.slow
def test_kernels_match_references():
    check_ops_against_references("cpu")


def test_kernels_match_references_across_blocks():
    check_ops_against_references("cpu", block_boundary_cases("cpu"))


@pytest.mark.slow
def test_opcheck():
    check_ops_opcheck("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name, opts", [
    ("turbo_mse", {}), ("turbo_mse", {"rotation": "haar"}), ("lloyd", {}), ("turbo_prod", {}),
    ("turbo_prod", {"rotation": "haar"}), ("qjl", {}), ("qjl", {"outliers": [1, 5]}), ("minmax", {}),
])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_public_api_same_with_kernels_and_references(name, opts, d, dtype):
    # Same seed ⇒ same codes with the kernels as with the references (up to threshold ties), and the
    # estimates and reconstructions agree.
    qz = quantizer(name, bits=3, dim=d, seed=7, **opts)
    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 40, d, generator=g).to(dtype)
    q = torch.randn(2, 4, d, generator=g).to(dtype)
    code = qz.encode(x)
    with ops.use_reference():
        code_ref = qz.encode(x)
        x_hat_ref = qz.decode(code_ref)
        s_ref = qz.inner(q, code_ref)
    for key in code.payload:
        mismatch = (code.payload[key] != code_ref.payload[key]).float().mean().item()
        assert mismatch <= 0.01, (key, mismatch)
    # Where codes agree, reconstructions and scores agree to float precision; compare on the ref code.
    # Outputs are cast to the input dtype: allow one rounding step of that dtype.
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(qz.decode(code_ref).float(), x_hat_ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(qz.inner(q, code_ref), s_ref, rtol=1e-4, atol=1e-3)


def test_kernels_check_inputs():
    x = torch.randn(4, 16)
    th = torch.zeros(3)
    with pytest.raises(ValueError, match="bits must be in \\[1, 8\\], got 9"):
        torch.ops.kvstats.lloyd_encode(x, torch.empty(0, 0), th, 9, torch.float32)
    with pytest.raises(ValueError, match="thresholds must be 1-D of length 3"):
        torch.ops.kvstats.lloyd_encode(x, torch.empty(0, 0), torch.zeros(4), 2, torch.float32)
    with pytest.raises(ValueError, match="rotation block 8 does not fit d = 16"):
        torch.ops.kvstats.lloyd_encode(x, torch.ones(1, 8), th, 2, torch.float32)
    with pytest.raises(ValueError, match="packed.size\\(-1\\) must be ceil"):
        torch.ops.kvstats.lloyd_scores(torch.randn(1, 2, 16), torch.zeros(1, 3, 5, dtype=torch.uint8),
                                       torch.ones(1, 3), torch.zeros(4), 2)
    with pytest.raises(ValueError, match="sketch must be \\[m, 16\\]"):
        torch.ops.kvstats.qjl_encode(x, torch.randn(8, 12), torch.float32)
    with pytest.raises(ValueError, match="group must divide d = 16, got 5"):
        torch.ops.kvstats.minmax_encode(x, 5, 2, torch.float16)


def test_every_op_on_meta_tensors_answers_with_its_fake():
    # Shapes and dtypes only (a model loaded on the meta device): each op returns the outputs its fake promises,
    # equal in shape and dtype to the CPU kernel's, instead of "could not parse dispatch key: META".
    from tests.helpers.ops import as_tuple, sample_cases

    seen = set()
    for name, args in sample_cases("cpu"):
        meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        got = as_tuple(getattr(ops, name)(*meta_args))
        want = as_tuple(getattr(ops, name)(*args))
        assert [(t.device.type, t.shape, t.dtype) for t in got] == [("meta", t.shape, t.dtype) for t in want], name
        seen.add(name)
    assert seen == set(ops.OPS) - {"fwht"}  # sample_cases holds every op but fwht (its own sample inputs)
    assert ops.fwht(torch.empty(3, 8, device="meta")).shape == (3, 8)
