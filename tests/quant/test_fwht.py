"""The Walsh–Hadamard transform: kernel and reference against scipy's Hadamard matrix in float64."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstats.quant import ops
from kvstats.quant.rotations import fwht
from tests.helpers.ops import DTYPES, check_fwht_correctness, check_fwht_opcheck, fwht_oracle

needs_extension = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")


@needs_extension
def test_cpu_kernel_is_registered():
    assert "CPU" in ops.kernel_devices()["fwht"]


@pytest.mark.slow
@needs_extension
def test_cpu_kernel_matches_oracle_all_dtypes_and_dims():
    check_fwht_correctness("cpu")


@pytest.mark.slow
@needs_extension
def test_opcheck_cpu():
    check_fwht_opcheck("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("force_reference", [False, True])
@pytest.mark.parametrize("d", [2, 8, 128, 2048, 32768])
def test_float64_equals_scipy_hadamard(d, force_reference):
    x = torch.randn(3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(d))
    with ops.use_reference(force_reference):
        y = fwht(x)
    torch.testing.assert_close(y, fwht_oracle(x), rtol=0, atol=1e-12 * (d**0.5))


@given(
    batch=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    log_d=st.integers(1, 10),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=60, deadline=None)
def test_self_inverse_and_norm_preserving(batch, log_d, dtype, seed):
    d = 2**log_d
    x = torch.randn(*batch, d, generator=torch.Generator().manual_seed(seed)).to(dtype)
    y = fwht(x)
    assert y.shape == x.shape and y.dtype == dtype
    # bf16 has an 8-bit mantissa: a relative error of 2^-7 per rounding, two transforms (two roundings).
    rtol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    back = fwht(y)
    torch.testing.assert_close(back.float(), x.float(), rtol=rtol, atol=rtol * 4)
    torch.testing.assert_close(
        torch.linalg.vector_norm(y.float(), dim=-1), torch.linalg.vector_norm(x.float(), dim=-1),
        rtol=rtol, atol=rtol,
    )


def test_non_contiguous_input():
    x = torch.randn(64, 6, dtype=torch.float64).t()  # [6, 64], strided
    assert not x.is_contiguous()
    torch.testing.assert_close(fwht(x), fwht_oracle(x), rtol=0, atol=1e-12)


def test_kernel_equals_reference_fp32():
    x = torch.randn(100, 256, generator=torch.Generator().manual_seed(5))
    y = fwht(x)
    with ops.use_reference():
        y_ref = fwht(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)


@needs_extension
def test_gradient_is_the_transform_itself():
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.fwht(t), (x,))


@pytest.mark.parametrize("d", [1, 3, 96, 100, 65536])
def test_rejects_bad_dimension(d):
    with pytest.raises(ValueError, match=rf"x.shape\[-1\].*got {d}"):
        fwht(torch.zeros(2, d))


def test_rejects_non_finite_and_names_the_argument():
    x = torch.randn(2, 8)
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match="x contains non-finite"):
        fwht(x)
    x[1, 3] = float("inf")
    with pytest.raises(ValueError, match="non-finite.*inf"):
        fwht(x)
    assert torch.isnan(fwht(torch.full((1, 4), float("nan")), check_finite=False)).all()


@pytest.mark.parametrize(
    "bad, exc, pattern",
    [
        (torch.zeros(2, 8, dtype=torch.int32), TypeError, "x must be float16.*int32"),
        (torch.tensor(1.0), ValueError, "at least 1 dimension"),
        (torch.zeros(0, 8), ValueError, "x is empty"),
        ([1.0, 2.0], TypeError, "x must be a torch.Tensor, got list"),
    ],
)
def test_rejects_bad_input(bad, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fwht(bad)


@needs_extension
def test_kernel_checks_inputs_itself():
    # The op validates before touching memory even when called directly, bypassing the wrapper.
    # Same exception types as the reference (kvstats.ops): ValueError for a shape, TypeError for a dtype.
    with pytest.raises(ValueError, match="power of two"):
        torch.ops.kvstats.fwht(torch.zeros(2, 12))
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        torch.ops.kvstats.fwht(torch.zeros(2, 8, dtype=torch.int64))
