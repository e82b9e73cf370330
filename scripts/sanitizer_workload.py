"""A small CUDA workload that launches every kvstats kernel, for compute-sanitizer."""

import torch

from kvstats import ops
from tests.op_suite import sample_cases

for d in (2, 64, 128, 4096, 32768):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        ops.fwht(torch.randn(3, d, device="cuda").to(dtype))
for name, args in sample_cases("cuda"):
    getattr(torch.ops.kvstats, name).default(*args)
torch.cuda.synchronize()
print("sanitizer workload done")
