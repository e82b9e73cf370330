"""Render docs/performance.md from the benchmark results in benchmarks/results/*.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = """# Performance

Measured by `make bench` (CPU; `benchmarks/bench_ops.py`, results in `benchmarks/results/cpu.json`) and by
`scripts/gpu_check.sh` on a lent GPU (`benchmarks/results/gpu.json`, when one was available). Each
case times the public API with the compiled kernels and again under `kvstats.ops.use_reference()`
(the pure-torch references), side by side in one run: torch.utils.benchmark, median of blocked runs.
Bytes/s counts the bytes each case must read and write (input, codes, scores). This file is generated
by `benchmarks/render_performance.py`; do not edit it by hand.
"""


def table(results: dict) -> str:
    lines = [
        f"## {results['device']}: {results['device_name']} ({results['threads']} threads, torch {results['torch']}, "
        f"{results['date']})",
        "",
    ]
    if "copy_bandwidth_GBps" in results:
        lines += [f"Device-to-device copy bandwidth: {results['copy_bandwidth_GBps']:.0f} GB/s.", ""]
    frac = "copy_bandwidth_GBps" in results
    lines.append("| case | shape | dtype | kernel ms | reference ms | speedup | M vectors/s | GB/s |"
                 + (" of copy BW |" if frac else ""))
    lines.append("|---|---|---|---:|---:|---:|---:|---:|" + ("---:|" if frac else ""))
    for c in results["cases"]:
        row = (f"| {c['name']} | {tuple(c['shape'])} | {c['dtype']} | {c['kernel_s'] * 1e3:.2f} | "
               f"{c['reference_s'] * 1e3:.2f} | {c['speedup']:.1f}× | {c['vectors_per_s'] / 1e6:.2f} | "
               f"{c['GBps']:.2f} |")
        if frac:
            row += f" {c['fraction_of_copy_bandwidth']:.0%} |"
        lines.append(row)
    targets = results.get("targets")
    if targets:
        lines += ["", "Bandwidth targets (encode and single-query scores at B = 1, H_kv = 8, S = 1M, d = 128, "
                      "≥ 70% of the measured copy bandwidth; reported, not tested):", ""]
        lines += [f"- {t['case']}: {t['fraction']:.0%} of copy bandwidth — {'met' if t['met'] else 'not met'}"
                  for t in targets]
    mem = results.get("memory_turbo_prod_encode")
    if mem:
        scratch = (mem["extra_bytes"] - mem["output_bytes"]) / 2**20
        lines += ["", f"Memory of a turbo_prod encode of {mem['vectors']} vectors (d = {mem['d']}): the peak grows by "
                      f"{mem['extra_bytes'] / 2**20:.1f} MiB, the output included ({mem['output_bytes'] / 2**20:.1f} "
                      f"MiB; ratio {mem['ratio']:.2f}), so the scratch beyond the output is {scratch:.1f} MiB: "
                      f"encode streams through bounded per-thread blocks."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    results_dir = Path(argv[0] if argv else "benchmarks/results")
    out = Path(argv[1] if argv and len(argv) > 1 else "docs/performance.md")
    files = sorted(results_dir.glob("*.json"))
    if not files:
        print(f"no results in {results_dir}", file=sys.stderr)
        return 1
    notes = results_dir / "NOTES.md"
    body = [HEADER] + [table(json.loads(f.read_text())) for f in files]
    if notes.exists():
        body.append(notes.read_text())
    out.write_text("\n".join(body))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
