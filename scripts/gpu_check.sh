#!/usr/bin/env bash
# The GPU check, run once per lent GPU session (see README "GPU check"). On a machine with an NVIDIA
# GPU, torch with CUDA and no network: builds the extension for sm_90, runs tests/ on CUDA
# (tests/gpu plus the CPU suite as a sanity check), runs compute-sanitizer on each kernel, and runs the
# GPU benchmark. Everything lands in $OUT (or the folder given as $1): logs, gpu.json, summary.txt.
set -uo pipefail
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONUNBUFFERED=1 MAX_JOBS=16
summary="$out/summary.txt"
: >"$summary"
step() { echo "== $1: $2" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/nvidia-smi.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
  >>"$summary" 2>&1

# Build in place against the machine's torch; never touch its packages (no network there).
if python -m pip install --no-deps --no-build-isolation -e . >"$out/build.log" 2>&1; then
  step build ok
else
  step build FAILED; tail -40 "$out/build.log"; exit 1
fi

python -m pytest -q tests/gpu -p no:cacheprovider >"$out/pytest_gpu.log" 2>&1
step "pytest tests/gpu" "$(tail -1 "$out/pytest_gpu.log")"

# compute-sanitizer over every kernel on small inputs (memcheck, then racecheck on shared memory).
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 python scripts/sanitizer_workload.py \
      >"$out/sanitizer_$tool.log" 2>&1
    step "compute-sanitizer $tool" "exit $? ($(grep -c 'ERROR SUMMARY: 0 errors' "$out/sanitizer_$tool.log") clean summaries)"
  done
else
  step compute-sanitizer "not found"
fi

python benchmarks/bench_ops.py --device cuda --out "$out/gpu.json" >"$out/bench.log" 2>&1
step bench "exit $?"
cat "$out/bench.log" >>"$summary"
cat "$summary"
