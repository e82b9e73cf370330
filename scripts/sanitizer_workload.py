"""A small CUDA workload that launches every kvstats kernel once, for compute-sanitizer."""

import torch

from kvstats import ops

for d in (2, 64, 128, 4096, 32768):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(3, d, device="cuda").to(dtype)
        ops.fwht(x)
torch.cuda.synchronize()
print("sanitizer workload done")
