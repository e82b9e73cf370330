"""After `make cuda-check`: load the CUDA build of kvstats._C and list the CUDA kernels it registered.

Run with the CUDA venv's python: ``python scripts/check_cuda_build.py BUILD_LIB_DIR``. Exits non-zero
when the library fails to load or an op lacks a CUDA kernel. No GPU is needed: loading registers the
kernels; only launching one needs a driver.
"""

import glob
import os
import sys

import torch

lib_dir = sys.argv[1]
libs = glob.glob(os.path.join(lib_dir, "kvstats", "_C*.so"))
if len(libs) != 1:
    sys.exit(f"expected one kvstats/_C*.so under {lib_dir}, found {libs}")
torch.ops.load_library(libs[0])
# The ops of the schema list (torch.ops.kvstats._sign_decode_blocked, a CPU probe for the tests, is not one).
ops = sorted(n.split("::")[1] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("kvstats::") and not n.startswith("kvstats::_"))
missing = [op for op in ops if not torch._C._dispatch_has_kernel_for_dispatch_key(f"kvstats::{op}", "CUDA")]
print(f"   {os.path.basename(libs[0])}: ops {ops}; CUDA kernels missing for {missing or 'none'}")
if not ops or missing:
    sys.exit(1)
