"""Benchmarks of the compiled kernels against their pure-torch references, side by side in one run.

    python benchmarks/bench_ops.py --device cpu --out benchmarks/results/cpu.json
    python benchmarks/bench_ops.py --device cuda --out $OUT/gpu.json

Each case times the public op with the kernel and again under ``kvstats.ops.use_reference()`` using
torch.utils.benchmark (median of blocked runs; CUDA is synchronised by the timer). On CUDA the
device-to-device copy bandwidth is measured first, and every case reports its effective bandwidth
(bytes read + written / time) as a fraction of it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.utils.benchmark as tbench

from kvstats import __version__, ops


@dataclass
class Case:
    name: str
    shape: tuple[int, ...]
    dtype: str
    vectors: int
    bytes_moved: int
    kernel_s: float
    reference_s: float

    @property
    def speedup(self) -> float:
        return self.reference_s / self.kernel_s


def median_seconds(fn: Callable[[], object], min_run_time: float, repeats: int = 1) -> float:
    """Median time of fn: the median over `repeats` blocked_autorange runs of their medians."""
    # Timer runs stmt on ONE thread unless told otherwise; time with the whole intra-op pool.
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    runs = sorted(timer.blocked_autorange(min_run_time=min_run_time).median for _ in range(repeats))
    return runs[len(runs) // 2]


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src), 1.0)
    return 2 * nbytes / t


def bench_fwht(device: str, dtype: torch.dtype, rows: int, d: int, min_run_time: float) -> Case:
    x = torch.randn(rows, d, device=device).to(dtype)
    kernel = median_seconds(lambda: ops.fwht(x), min_run_time, repeats=3)
    with ops.use_reference():
        reference = median_seconds(lambda: ops.fwht(x), min_run_time)
    moved = 2 * x.numel() * x.element_size()
    return Case("fwht", (rows, d), str(dtype).removeprefix("torch."), rows, moved, kernel, reference)


def bench_quantizers(device: str, dtype: torch.dtype, heads: int, seq: int, d: int, bits: int,
                     query_counts: tuple[int, ...], min_run_time: float) -> list[Case]:
    """Encode a [1, heads, seq, d] cache and score queries [1, heads, n_q, d] from the codes, through the
    public quantizer API, with the kernels and with the references; plus the dense fp32 q·Kᵀ baseline.
    Kernel times are the median of three timing runs (the references, slower by 5–500×, of one)."""
    from kvstats.quantizers import quantizer

    g = torch.Generator().manual_seed(0)
    keys = torch.randn(1, heads, seq, d, generator=g).to(device=device, dtype=dtype)
    all_queries = {n_q: torch.randn(1, heads, n_q, d, generator=g).to(device=device, dtype=dtype)
                   for n_q in query_counts}
    vectors = heads * seq
    in_bytes = keys.numel() * keys.element_size()
    dt = str(dtype).removeprefix("torch.")
    cases = []
    for name, opts in (("turbo_mse", {"bits": bits}), ("qjl", {"bits": bits}), ("turbo_prod", {"bits": bits})):
        qz = quantizer(name, dim=d, seed=0, **opts)
        code = qz.encode(keys)
        enc = median_seconds(lambda qz=qz: qz.encode(keys), min_run_time, repeats=3)
        with ops.use_reference():
            enc_ref = median_seconds(lambda qz=qz: qz.encode(keys), min_run_time)
        cases.append(Case(f"{name}.encode", tuple(keys.shape), dt, vectors, in_bytes + code.nbytes, enc, enc_ref))
        for n_q, queries in all_queries.items():
            sc = median_seconds(lambda qz=qz, code=code, q=queries: qz.inner(q, code), min_run_time, repeats=3)
            with ops.use_reference():
                sc_ref = median_seconds(lambda qz=qz, code=code, q=queries: qz.inner(q, code), min_run_time)
            cases.append(Case(f"{name}.scores(n_q={n_q})", tuple(keys.shape), dt, vectors,
                              code.nbytes + queries.numel() * 4 + heads * n_q * seq * 4, sc, sc_ref))
    dense_keys = keys.float()
    for n_q, queries in all_queries.items():
        dense_q = queries.float()
        dense = median_seconds(lambda q=dense_q: q @ dense_keys.transpose(-1, -2), min_run_time, repeats=3)
        cases.append(Case(f"dense_fp32_qK.scores(n_q={n_q})", tuple(keys.shape), "float32", vectors,
                          dense_keys.numel() * 4 + heads * n_q * seq * 4, dense, dense))
    return cases


# Peak resident memory of a fresh process around one encode: the kernel's allocations come from the C++
# allocator, invisible to tracemalloc, so read the kernel's own counter. Writing 5 to /proc/self/clear_refs
# resets the peak (VmHWM) to the current resident set, so the peak of the input's creation is not counted.
_MEMORY_PROBE = """
import sys, torch
from kvstats.quantizers import quantizer

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

n, d = int(sys.argv[1]), 128
x = torch.randn(n, d)
qz = quantizer("turbo_prod", bits=4, dim=d, seed=0)
qz.encode(x[:1000])  # warm-up: tables, sketch, thread pool
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
code = qz.encode(x)
print(status("VmHWM") - before, code.nbytes)
"""


def peak_extra_memory(device: str, n: int = 1 << 20) -> dict:
    """Peak memory an encode needs beyond its input, vs the size of its output (turbo_prod, 4 bits).

    CPU: the peak resident set of a fresh process during the encode above its resident set just before
    (Linux /proc); CUDA: torch.cuda.max_memory_allocated above the allocation before.
    """
    if device == "cpu":
        import subprocess

        out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(n)], capture_output=True, text=True, check=True)
        extra, output = (int(v) for v in out.stdout.split())
    else:
        from kvstats.quantizers import quantizer

        x = torch.randn(n, 128, device=device, dtype=torch.float16)
        qz = quantizer("turbo_prod", bits=4, dim=128, seed=0)
        qz.encode(x[:10])
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        code = qz.encode(x)
        torch.cuda.synchronize()
        extra, output = torch.cuda.max_memory_allocated() - base, code.nbytes
    return {"vectors": n, "d": 128, "extra_bytes": extra, "output_bytes": output, "ratio": extra / output}


# GPU targets (reported, not tested): encode and single-query scores at B=1, H_kv=8, S=1M, d=128 reach
# at least this fraction of the device's measured copy bandwidth.
TARGET_SHAPE = (1, 8, 1 << 20, 128)
TARGET_FRACTION = 0.7


def bandwidth_targets(cases: list[dict]) -> list[dict]:
    """The target cases (encode, scores with n_q = 1 at TARGET_SHAPE) and whether each met the target."""
    out = []
    for c in cases:
        if tuple(c["shape"]) == TARGET_SHAPE and (c["name"].endswith(".encode") or c["name"].endswith("(n_q=1)")) \
                and not c["name"].startswith("dense"):
            out.append({"case": c["name"], "fraction": c["fraction_of_copy_bandwidth"], "target": TARGET_FRACTION,
                        "met": c["fraction_of_copy_bandwidth"] >= TARGET_FRACTION})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per timing")
    args = parser.parse_args(argv)
    if not ops.HAS_EXTENSION:
        sys.exit(f"the extension is not built: {ops.EXTENSION_ERROR}")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device")

    if args.device == "cpu":
        # The CPU setting: B=1, H_kv=8, S=32768, d=128 -> 262144 vectors, fp32, 4 bits.
        settings = [(torch.float32, 8 * 32768, 128), (torch.float32, 4096, 4096)]
        quant_settings = [(torch.float32, 8, 32768, 128, 4, (1, 64))]
    else:
        # GPU settings: B=1, H_kv=32, S=32768, d=128 (GQA 4: 4 queries per KV head), fp16; and the
        # bandwidth targets' setting B=1, H_kv=8, S=1M, d=128 (encode and single-query scores).
        settings = [(torch.float16, 32 * 32768, 128), (torch.float32, 32 * 32768, 128), (torch.float16, 4096, 8192)]
        quant_settings = [(torch.float16, 32, 32768, 128, 4, (4,)), (torch.float16, 8, 1 << 20, 128, 4, (1,))]

    results = {
        "kvstats": __version__,
        "torch": torch.__version__,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "cases": [],
    }
    if args.device == "cuda":
        results["copy_bandwidth_GBps"] = copy_bandwidth("cuda") / 1e9
    print(f"{'op':<32}{'shape':<22}{'dtype':<10}{'kernel ms':>11}{'ref ms':>10}{'speedup':>9}"
          f"{'Mvec/s':>9}{'GB/s':>8}")
    cases = [bench_fwht(args.device, dtype, rows, d, args.min_run_time) for dtype, rows, d in settings]
    for setting in quant_settings:
        cases += bench_quantizers(args.device, *setting, args.min_run_time)
    for case in cases:
        row = asdict(case) | {
            "speedup": case.speedup,
            "vectors_per_s": case.vectors / case.kernel_s,
            "GBps": case.bytes_moved / case.kernel_s / 1e9,
        }
        if args.device == "cuda":
            row["fraction_of_copy_bandwidth"] = row["GBps"] / results["copy_bandwidth_GBps"]
        results["cases"].append(row)
        print(f"{case.name:<32}{str(case.shape):<22}{case.dtype:<10}{case.kernel_s * 1e3:>11.3f}"
              f"{case.reference_s * 1e3:>10.3f}{case.speedup:>9.1f}{row['vectors_per_s'] / 1e6:>9.2f}"
              f"{row['GBps']:>8.2f}")
    if args.device == "cuda":
        results["targets"] = bandwidth_targets(results["cases"])
        for t in results["targets"]:
            print(f"target {t['case']}: {t['fraction']:.0%} of copy bandwidth (target {t['target']:.0%}): "
                  f"{'met' if t['met'] else 'NOT met'}")
    results["memory_turbo_prod_encode"] = peak_extra_memory(args.device)
    mem = results["memory_turbo_prod_encode"]
    print(f"turbo_prod encode of {mem['vectors']} vectors: peak extra memory {mem['extra_bytes'] / 2**20:.1f} MiB "
          f"= {mem['ratio']:.2f} x the output ({mem['output_bytes'] / 2**20:.1f} MiB)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
