"""A small CUDA workload that launches every kvstats kernel, for compute-sanitizer (memcheck, racecheck)."""

import torch

from kvstats.quant import ops
from tests.helpers.ops import block_boundary_cases, sample_cases, width_cases

for d in (2, 64, 128, 4096, 32768):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        ops.fwht(torch.randn(3, d, device="cuda").to(dtype))
for name, args in sample_cases("cuda") + block_boundary_cases("cuda") + width_cases("cuda", 3) + width_cases("cuda", 8):
    getattr(torch.ops.kvstats, name).default(*args)
torch.cuda.synchronize()
print("sanitizer workload done")
