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


def median_seconds(fn: Callable[[], object], min_run_time: float) -> float:
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src), 1.0)
    return 2 * nbytes / t


def bench_fwht(device: str, dtype: torch.dtype, rows: int, d: int, min_run_time: float) -> Case:
    x = torch.randn(rows, d, device=device).to(dtype)
    kernel = median_seconds(lambda: ops.fwht(x), min_run_time)
    with ops.use_reference():
        reference = median_seconds(lambda: ops.fwht(x), min_run_time)
    moved = 2 * x.numel() * x.element_size()
    return Case("fwht", (rows, d), str(dtype).removeprefix("torch."), rows, moved, kernel, reference)


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
        # The CPU setting: B=1, H_kv=8, S=32768, d=128 -> 262144 vectors.
        settings = [(torch.float32, 8 * 32768, 128), (torch.float32, 4096, 4096)]
    else:
        # The GPU setting: B=1, H_kv=32, S=32768, d=128 -> 1M vectors.
        settings = [(torch.float16, 32 * 32768, 128), (torch.float32, 32 * 32768, 128), (torch.float16, 4096, 8192)]

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
    print(f"{'op':<8}{'shape':<16}{'dtype':<10}{'kernel ms':>11}{'ref ms':>10}{'speedup':>9}"
          f"{'Mvec/s':>9}{'GB/s':>8}")
    for dtype, rows, d in settings:
        case = bench_fwht(args.device, dtype, rows, d, args.min_run_time)
        row = asdict(case) | {
            "speedup": case.speedup,
            "vectors_per_s": case.vectors / case.kernel_s,
            "GBps": case.bytes_moved / case.kernel_s / 1e9,
        }
        if args.device == "cuda":
            row["fraction_of_copy_bandwidth"] = row["GBps"] / results["copy_bandwidth_GBps"]
        results["cases"].append(row)
        print(f"{case.name:<8}{str(case.shape):<16}{case.dtype:<10}{case.kernel_s * 1e3:>11.3f}"
              f"{case.reference_s * 1e3:>10.3f}{case.speedup:>9.1f}{row['vectors_per_s'] / 1e6:>9.2f}"
              f"{row['GBps']:>8.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
