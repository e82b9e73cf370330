"""benchmarks/bench_cache.py's cache rows (``--caches``) and their rendering in benchmarks/render_performance.py:
entries parsed or refused by name, a pair's records (a row not run says why, a failed run too), the bytes a
QuantizedCache holds, and the tables of both JSON formats. Nothing here is timed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _module("bench_cache")


@pytest.fixture(scope="module")
def render():
    return _module("render_performance")


def test_default_caches_are_the_issue_rows(bench):
    rows = bench.parse_caches(bench.DEFAULT_CACHES)
    assert [(r.kind, r.name, r.bits) for r in rows] == [
        ("kvstats", "kqv", 4), ("kvstats", "fp8_e4m3", 8), ("kvstats", "nvfp4", 4),
        ("kvstats", "tests.helpers.user_quantizers:GroupAbsmax", 4), ("quantized", "quanto", 4)]


def test_a_module_class_row_is_built_by_evaluate_s_rules_or_refused_by_name(bench):
    (row,) = bench.parse_caches("tests.helpers.user_quantizers:GroupAbsmax@3")
    assert (row.kind, row.name, row.bits) == ("kvstats", "tests.helpers.user_quantizers:GroupAbsmax", 3)
    with pytest.raises(ValueError, match="--caches entry 'nowhere.mod:Q@4'.*cannot import"):
        bench.parse_caches("nowhere.mod:Q@4")


def test_pair_specs_take_the_bits_after_the_last_at(bench):
    (row,) = bench.parse_caches("int_token@8/int_token@4@6")
    assert (row.kind, row.name, row.bits) == ("kvstats", "int_token@8/int_token@4", 6)


@pytest.mark.parametrize("text, named", [
    ("kqv", "'kqv' must be name@bits"),
    ("kqv@4,fp8_e4m3@4", "'fp8_e4m3@4'"),
    ("quanto@8", "'quanto@8'"),
    ("nope@4", "'nope@4'"),
    ("kqv@4,,nvfp4@4", "empty entry"),
    ("kqv@4,kqv@4", "repeats kqv@4"),
])
def test_bad_entries_are_refused_by_name(bench, text, named):
    with pytest.raises(ValueError, match=named):
        bench.parse_caches(text)


def test_main_refuses_a_bad_entry_through_argparse(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--caches", "kqv@4,quanto@3", "--out", "unused.json"])
    assert "--caches entry 'quanto@3'" in capsys.readouterr().err


def _run(cache: str, per_token: float, held: int | None) -> dict:
    return {"cache": cache, "prefill_s": 1.0, "prefill_cpu_s": 1.0, "per_token_s": per_token,
            "per_token_cpu_s": per_token, "total_s": 2.0, "total_cpu_s": 2.0, "peak_rss_above_start_mb": 10.0,
            "peak_live_above_start_mb": 8.0, "cache_bytes": held, "bits_per_element": None if held is None else
            held * 8 / 1000, "load_average": [1.0, 1.0, 1.0]}


def test_measure_pair_records_ratios_skips_and_failures(bench, monkeypatch):
    calls = []

    def child(command):
        calls.append(command[-3:])
        if command[-1] == "dynamic":
            return _run("dynamic", 0.1, 4000)
        entry = command[command.index("--caches") + 1]
        if entry == "nvfp4@4":
            raise RuntimeError("the run exited with status 1: boom")
        return _run(entry, 0.2, 1000)

    monkeypatch.setattr(bench, "_child", child)
    rows = bench.parse_caches("kqv@4,nvfp4@4,quanto@4")
    records, failed = bench.measure_pair(["python", "bench"], rows, {"quanto@4": "no quanto here"}, 128, 0)
    assert failed == 1
    assert [r["cache"] for r in records] == ["kqv@4", "nvfp4@4", "quanto@4"]
    assert records[0]["ratio"]["per_token_cpu"] == pytest.approx(2.0)
    assert records[0]["ratio"]["cache_bytes"] == pytest.approx(0.25)
    assert "boom" in records[1]["not_run"] and "run" not in records[1]
    assert records[2] == {"cache": "quanto@4", "not_run": "no quanto here"}
    assert not any("quanto@4" in c for c in calls)  # a skipped row starts no process, not even its DynamicCache


def _new_results(interleaved: dict | None) -> dict:
    length = {"prompt_tokens": 512, "pairs": [{"rows": [
        {"cache": "kqv@4", "dynamic": _run("dynamic", 0.1, 4000), "run": _run("kqv@4", 0.2, 1000),
         "ratio": {"per_token_cpu": 2.0, "per_token": 2.0, "prefill_cpu": 1.0, "prefill": 1.0, "peak_rss": 1.0,
                   "peak_live": 1.0, "cache_bytes": 0.25}},
        {"cache": "quanto@4", "not_run": "optimum-quanto is not installed"}]}]}
    if interleaved is not None:
        length["interleaved"] = interleaved
    return {"date": "2026-12-06", "torch": "2", "config": {"threads": 1, "new_tokens": 16, "window": 32,
                                                           "caches": ["kqv@4", "quanto@4"]},
            "caches": [{"cache": "kqv@4", "kind": "kvstats", "scheme": "kqv", "bits": 4, "window": 32},
                       {"cache": "quanto@4", "kind": "quantized", "backend": "quanto", "bits": 4,
                        "residual_length": 32, "q_group_size": 64, "not_run": "optimum-quanto is not installed"}],
            "load_average_before": [1, 1, 1], "load_average_after": [1, 1, 1], "lengths": [length]}


def test_rows_table_has_a_row_per_cache_and_length_and_says_why_one_did_not_run(render):
    interleaved = {"prompt_tokens": 512, "rounds": 8, "block": 4, "load_average": [1, 1, 1],
                   "per_token_cpu_s": {"dynamic": 0.1, "kqv@4": 0.15}, "ratio_per_token_cpu": {"kqv@4": 1.5},
                   "caches_not_run": {"quanto@4": "optimum-quanto is not installed"}}
    text = render.cache_table(_new_results(interleaved))
    assert "| 512 | kqv@4 | 8.00 | 0.25× | 2.00× | 1.00× | 1.50× |" in text
    assert "| 512 | quanto@4 | not run: optimum-quanto is not installed | — | — | — | — |" in text
    assert "**not run: optimum-quanto is not installed**" in text
    assert "| 512 | quanto@4 | not run: optimum-quanto is not installed | | |" in text  # the interleaved table
    failed = render.cache_table(_new_results({"prompt_tokens": 512, "not_run": "exited with status 1"}))
    assert "| 512 | kqv@4 | 8.00 | 0.25× | 2.00× | 1.00× | not run: exited with status 1 |" in failed


def test_results_of_one_scheme_still_render_as_before(render):
    run = {"per_token_cpu_s": 0.1, "per_token_s": 0.1, "prefill_cpu_s": 1.0, "prefill_s": 1.0,
           "peak_rss_above_start_mb": 10.0, "peak_live_above_start_mb": 8.0, "cache_bytes": 2**20,
           "load_average": [1.0, 1.0, 1.0]}
    old = {"date": "2026-12-05", "torch": "2", "load_average_before": [1, 1, 1], "load_average_after": [1, 1, 1],
           "config": {"threads": 1, "new_tokens": 16, "scheme": "kqv", "bits": 4, "window": 32},
           "lengths": [{"prompt_tokens": 512, "pairs": [{"dynamic": run, "kvstats": run}]}]}
    text = render.cache_table(old)
    assert "with scheme kqv at 4 bits" in text
    assert "| 512 | 1 | 100.0 / 100.0 | 1.00× (1.00×) | 1.00× (1.00×) |" in text
