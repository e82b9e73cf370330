"""fwht on CUDA: the same checks as on CPU, and CPU/CUDA agreement (skipped without a GPU)."""

import torch

from kvstats.quant import ops
from tests.helpers.ops import check_fwht_correctness, check_fwht_opcheck


def test_cuda_kernel_is_registered():
    assert "CUDA" in ops.kernel_devices()["fwht"]


def test_cuda_kernel_matches_oracle():
    check_fwht_correctness("cuda")


def test_opcheck_cuda():
    check_fwht_opcheck("cuda")


def test_cpu_and_cuda_agree():
    x = torch.randn(512, 128, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ops.fwht(x.cuda()).cpu(), ops.fwht(x), rtol=1e-5, atol=1e-5)


def test_large_dim_uses_dynamic_shared_memory():
    x = torch.randn(3, 32768, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.testing.assert_close(ops.fwht(x.cuda()).cpu(), ops.fwht(x), rtol=1e-10, atol=1e-10)
