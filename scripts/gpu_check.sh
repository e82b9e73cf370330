#!/usr/bin/env bash
# The GPU check: the one command to run on a lent GPU (docs/kernels.md, "GPU check"); about 7–9 minutes
# on an H200, each step under a time limit. On a machine with an NVIDIA GPU, torch with CUDA and no
# network: builds the extension for sm_90, runs tests/gpu (kernels vs references, CPU/CUDA and CPU
# shared-path/CUDA agreement, opcheck, every device index, the current stream, fp16/bf16/fp32), runs
# compute-sanitizer memcheck and racecheck over every kernel, and the GPU benchmark with the device's
# measured copy bandwidth in the same run (every op's fraction of it, the weighted sums of values from the
# codes included, and one decode step's attention from the codes — the public methods one by one and the fused
# decode_attention a KVStatsCache decode step runs, with its fraction of the copy bandwidth — against torch's sdpa
# on bf16 K/V). Everything lands in $OUT (or the folder given as $1): logs,
# gpu.json, performance.md (rendered with the GPU table) and summary.txt; gpu.json is also copied to
# benchmarks/results/ so that docs/performance.md shows the GPU table.
set -uo pipefail
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
# The machine's interpreter: `python` where a venv is active, else `python3`.
py="$(command -v python || command -v python3)"
summary="$out/summary.txt"
: >"$summary"
step() { echo "== $1: $2" | tee -a "$summary"; }
start=$SECONDS

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/nvidia-smi.txt" 2>&1
"$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
  >>"$summary" 2>&1

# Build in place against the machine's torch; never touch its packages (no network there).
# Fallback: the same setup.py run away from pyproject.toml (whose metadata an older setuptools may reject),
# building kvstats/_C in place through links to the sources.
build_in_place() {
  local dir
  dir="$(mktemp -d)"
  ln -s "$PWD/cuda_ext" "$dir/cuda_ext" && ln -s "$PWD/kvstats" "$dir/kvstats" && cp setup.py "$dir/"
  (cd "$dir" && "$py" setup.py build_ext --inplace)
}
if "$py" -m pip install --no-deps --no-build-isolation -e . >"$out/build.log" 2>&1; then
  step build "ok ($((SECONDS - start)) s)"
elif build_in_place >>"$out/build.log" 2>&1; then
  step build "ok in place, pip install failed ($((SECONDS - start)) s)"
else
  step build FAILED; tail -40 "$out/build.log"; exit 1
fi

timeout 150 "$py" -m pytest -q tests/gpu -p no:cacheprovider >"$out/pytest_gpu.log" 2>&1
step "pytest tests/gpu" "exit $? — $(tail -1 "$out/pytest_gpu.log") ($((SECONDS - start)) s)"

# compute-sanitizer over every kernel on small inputs (memcheck, then racecheck on shared memory).
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 9 "$py" scripts/sanitizer_workload.py \
      >"$out/sanitizer_$tool.log" 2>&1
    rc=$?
    step "compute-sanitizer $tool" "exit $rc ($(grep -c 'ERROR SUMMARY: 0 errors' "$out/sanitizer_$tool.log") clean summaries, $((SECONDS - start)) s)"
  done
else
  step compute-sanitizer "not found"
fi

timeout 230 "$py" benchmarks/bench_ops.py --device cuda --min-run-time 0.5 --out "$out/gpu.json" >"$out/bench.log" 2>&1
step bench "exit $? ($((SECONDS - start)) s)"
cat "$out/bench.log" >>"$summary"
if [ -f "$out/gpu.json" ]; then
  mkdir -p benchmarks/results
  cp "$out/gpu.json" benchmarks/results/gpu.json
  "$py" benchmarks/render_performance.py benchmarks/results "$out/performance.md" >>"$summary" 2>&1
fi
step total "$((SECONDS - start)) s"
cat "$summary"
