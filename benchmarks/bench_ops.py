"""Benchmarks of the public calls (q.encode, q.decode, q.inner) and the kernels, against the pure-torch
references, side by side in one run.

    python benchmarks/bench_ops.py --device cpu --out benchmarks/results/cpu.json
    python benchmarks/bench_ops.py --device cuda --out $OUT/gpu.json

Each case times one public call exactly as a user makes it (the inputs are built before, outside the timed
region): one warm-up call, then back-to-back calls, each timed alone with time.perf_counter (CUDA
synchronised before and after), and the median reported. The same call runs again under
``kvstats.ops.use_reference()``. The copy bandwidth of the device (a large tensor copy, bytes read +
written per second) is measured in the same run, and every case states its effective bandwidth (bytes it
must read and write / time) as a fraction of it. The load average is recorded before and after: on a
shared machine every number moves with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kvstats import __version__
from kvstats.quant import ops


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


def median_seconds(fn: Callable[[], object], min_run_time: float, min_calls: int = 5) -> float:
    """Median wall time of one call of fn: one warm-up call, then calls timed one by one until both
    `min_calls` calls and `min_run_time` seconds are reached. Nothing but the call is in the timed region."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_run_time:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device: str, nbytes: int = 1 << 28) -> float:
    """Copy bandwidth in bytes/s (read + write counted): dst.copy_(src) of `nbytes` (256 MiB, well past
    the caches) with the whole intra-op pool."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src), 1.0, min_calls=10)
    return 2 * nbytes / t


def bench_fwht(device: str, dtype: torch.dtype, rows: int, d: int, min_run_time: float) -> Case:
    x = torch.randn(rows, d, device=device).to(dtype)
    kernel = median_seconds(lambda: ops.fwht(x), min_run_time)
    with ops.use_reference():
        reference = median_seconds(lambda: ops.fwht(x), min_run_time, min_calls=1)
    moved = 2 * x.numel() * x.element_size()
    return Case("fwht", (rows, d), str(dtype).removeprefix("torch."), rows, moved, kernel, reference)


def bench_quantizers(device: str, dtype: torch.dtype, heads: int, seq: int, d: int, bits: int,
                     query_counts: tuple[int, ...], min_run_time: float) -> list[Case]:
    """The public calls on a [1, heads, seq, d] cache: q.encode(keys), q.decode(code) and q.inner(queries,
    code) for queries [1, heads, n_q, d], with the kernels and with the references; plus the dense fp32
    q·Kᵀ baseline on the unquantised keys."""
    from kvstats.quant.quantizers import quantizer

    g = torch.Generator().manual_seed(0)
    keys = torch.randn(1, heads, seq, d, generator=g).to(device=device, dtype=dtype)
    all_queries = {n_q: torch.randn(1, heads, n_q, d, generator=g).to(device=device, dtype=dtype)
                   for n_q in query_counts}
    vectors = heads * seq
    in_bytes = keys.numel() * keys.element_size()
    dt = str(dtype).removeprefix("torch.")
    cases = []

    def timed(name: str, call: Callable[[], object], moved: int) -> None:
        kernel = median_seconds(call, min_run_time)
        with ops.use_reference():
            reference = median_seconds(call, min_run_time, min_calls=1)
        cases.append(Case(name, tuple(keys.shape), dt, vectors, moved, kernel, reference))

    # attention weights [1, heads, n_q, seq] (softmax rows) for the weighted sums of values
    all_weights = {n_q: torch.softmax(torch.randn(1, heads, n_q, seq, generator=g), -1).to(device)
                   for n_q in query_counts}
    for name in ("turbo_mse", "qjl", "turbo_prod", "minmax"):
        qz = quantizer(name, bits=bits, dim=d, seed=0)
        code = qz.encode(keys)
        timed(f"{name}.encode", lambda qz=qz: qz.encode(keys), in_bytes + code.nbytes)
        timed(f"{name}.decode", lambda qz=qz, code=code: qz.decode(code), code.nbytes + in_bytes)
        for n_q, queries in all_queries.items():
            if name != "minmax":  # min-max scores are decode-then-dot
                timed(f"{name}.scores(n_q={n_q})", lambda qz=qz, code=code, q=queries: qz.inner(q, code),
                      code.nbytes + queries.numel() * 4 + heads * n_q * seq * 4)
            timed(f"{name}.weighted_sum(n_q={n_q})", lambda qz=qz, code=code, w=all_weights[n_q]: qz.weighted_sum(
                w, code), code.nbytes + heads * n_q * seq * 4 + heads * n_q * d * 4)
    # NOVA-KV's keys (arXiv 2608.04074; torch code, no kernel of its own: kernel and reference times agree),
    # calibrated once on 4,096 keys and queries of the same law, outside the timed region
    calibration = torch.randn(2, 4096, d, generator=g).to(device=device, dtype=torch.float32)
    nova = quantizer("nova", bits=bits, dim=d, seed=0).calibrate(calibration[0], calibration[1])
    code = nova.encode(keys)
    timed("nova.encode", lambda: nova.encode(keys), in_bytes + code.nbytes)
    timed("nova.decode", lambda: nova.decode(code), code.nbytes + in_bytes)
    for n_q, queries in all_queries.items():
        timed(f"nova.scores(n_q={n_q})", lambda q=queries: nova.inner(q, code),
              code.nbytes + queries.numel() * 4 + heads * n_q * seq * 4)
    dense_keys = keys.float()
    for n_q, queries in all_queries.items():
        dense_q, w = queries.float(), all_weights[n_q]
        dense = median_seconds(lambda q=dense_q: q @ dense_keys.transpose(-1, -2), min_run_time)
        cases.append(Case(f"dense_fp32_qK.scores(n_q={n_q})", tuple(keys.shape), "float32", vectors,
                          dense_keys.numel() * 4 + heads * n_q * seq * 4, dense, dense))
        dense = median_seconds(lambda w=w: w @ dense_keys, min_run_time)
        cases.append(Case(f"dense_fp32_wV.weighted_sum(n_q={n_q})", tuple(keys.shape), "float32", vectors,
                          dense_keys.numel() * 4 + heads * n_q * seq * 4 + heads * n_q * d * 4, dense, dense))
    return cases


def bench_decode_step(device: str, dtype: torch.dtype, kv_heads: int, group: int, seq: int, d: int, bits: int,
                      min_run_time: float) -> list[Case]:
    """One decode step's attention for one layer: logits from the K codes, softmax, output from the V codes
    (kvstats.scheme("kqv")) through the public methods (``decode_step``) and in one call of the fused op
    (``decode_attention``, what a KVStatsCache decode step runs), against torch's scaled_dot_product_attention on
    dense K/V in ``dtype`` (bf16 on a GPU, fp32 on the CPU); queries [1, kv_heads·group, 1, d] (grouped-query
    attention)."""
    import torch.nn.functional as F

    from kvstats.quant.schemes import scheme

    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(1, kv_heads, seq, d, generator=g).to(device) for _ in range(2))
    q = torch.randn(1, kv_heads * group, 1, d, generator=g).to(device)
    s = scheme("kqv", bits=bits, dim=d, seed=0)
    cache = s.encode(k, v)

    def from_codes():
        w = torch.softmax(s.scores(q, cache) * d ** -0.5, dim=-1)
        return s.weighted_values(w, cache)

    # the same step in one call, as a KVStatsCache decode step runs it (every token through the codes: no window)
    k_parts, v_parts = s.decode_parts(cache, torch.float32)
    q3, no_window = q.reshape(kv_heads, group, d), k.new_empty(kv_heads, 0, d)

    def fused():
        return ops.decode_attention(q3, no_window, no_window, seq, d ** -0.5, None, None, *k_parts, *v_parts)

    kd, vd, qd = k.to(dtype), v.to(dtype), q.to(dtype)
    kernel = median_seconds(from_codes, min_run_time)
    one_call = median_seconds(fused, min_run_time)
    with ops.use_reference():
        reference = median_seconds(from_codes, min_run_time, min_calls=1)
        one_call_reference = median_seconds(fused, min_run_time, min_calls=1)
    sdpa = median_seconds(lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True), min_run_time)
    shape, vectors = (1, kv_heads, seq, d), kv_heads * seq
    out_bytes = kv_heads * group * d * 4
    code_bytes = cache.k.nbytes + cache.v.nbytes + out_bytes
    dt = str(dtype).removeprefix("torch.")
    return [Case("kqv.decode_step(codes)", shape, "float32", vectors, code_bytes, kernel, reference),
            Case("kqv.decode_attention(codes)", shape, "float32", vectors, code_bytes, one_call, one_call_reference),
            Case(f"sdpa.decode_step({dt})", shape, dt, vectors, 2 * k.numel() * kd.element_size() + out_bytes, sdpa,
                 sdpa)]


# Peak resident memory of a fresh process around one encode: the kernel's allocations come from the C++
# allocator, invisible to tracemalloc, so read the kernel's own counter. Writing 5 to /proc/self/clear_refs
# resets the peak (VmHWM) to the current resident set, so the peak of the input's creation is not counted.
_MEMORY_PROBE = """
import sys, torch
from kvstats.quant.quantizers import quantizer

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
        from kvstats.quant.quantizers import quantizer

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
        "load_average_before": list(os.getloadavg()),
        "cases": [],
    }
    results["copy_bandwidth_GBps"] = copy_bandwidth(args.device) / 1e9
    print(f"copy bandwidth {results['copy_bandwidth_GBps']:.1f} GB/s; load average {results['load_average_before']}")
    print(f"{'op':<32}{'shape':<22}{'dtype':<10}{'kernel ms':>11}{'ref ms':>10}{'speedup':>9}"
          f"{'Mvec/s':>9}{'GB/s':>8}{'of BW':>7}")
    cases = [bench_fwht(args.device, dtype, rows, d, args.min_run_time) for dtype, rows, d in settings]
    for setting in quant_settings:
        cases += bench_quantizers(args.device, *setting, args.min_run_time)
    # a decode step of SmolLM2-135M's attention shape (3 KV heads, 3 queries each, d = 64) and of an 8B model's
    # (8 KV heads, 4 queries each, d = 128), at 8,192 and 32,768 cached tokens
    step_dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    for kv_heads, group, d, seq in ((3, 3, 64, 8192), (8, 4, 128, 32768)):
        cases += bench_decode_step(args.device, step_dtype, kv_heads, group, seq, d, 4, args.min_run_time)
    for case in cases:
        row = asdict(case) | {
            "speedup": case.speedup,
            "vectors_per_s": case.vectors / case.kernel_s,
            "GBps": case.bytes_moved / case.kernel_s / 1e9,
        }
        row["fraction_of_copy_bandwidth"] = row["GBps"] / results["copy_bandwidth_GBps"]
        results["cases"].append(row)
        print(f"{case.name:<32}{str(case.shape):<22}{case.dtype:<10}{case.kernel_s * 1e3:>11.3f}"
              f"{case.reference_s * 1e3:>10.3f}{case.speedup:>9.1f}{row['vectors_per_s'] / 1e6:>9.2f}"
              f"{row['GBps']:>8.2f}{row['fraction_of_copy_bandwidth']:>7.0%}")
    if args.device == "cuda":
        results["targets"] = bandwidth_targets(results["cases"])
        for t in results["targets"]:
            print(f"target {t['case']}: {t['fraction']:.0%} of copy bandwidth (target {t['target']:.0%}): "
                  f"{'met' if t['met'] else 'NOT met'}")
    results["load_average_after"] = list(os.getloadavg())
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
