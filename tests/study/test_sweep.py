"""The study runner: results, storage, resumption, no recomputation, joblib and Dask paths, progress."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from kvstats.study.sweep import BadCellWarning, Sweep, cell_seed, grid, study_args

_FAIL_ON: set[int] = set()


def _cell(x: int, y: str, log: str) -> list[dict]:
    """Two rows per cell; appends one line per call to ``log`` (works across processes)."""
    with open(log, "a") as fh:
        fh.write(f"{x},{y}\n")
    if x in _FAIL_ON:
        raise RuntimeError(f"cell x={x} interrupted")
    seed = cell_seed("test", x, y)
    return [{"rep": r, "value": x * 10 + r, "seed": seed} for r in range(2)]


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def sweep_env(tmp_path):
    log = tmp_path / "calls.log"
    cells = grid(x=[1, 2, 3, 4], y=["a", "b"], log=[str(log)])
    return Sweep("unit", _cell, cells, version="1"), tmp_path / "cells", log


def test_grid_product_and_scalars():
    g = grid(a=[1, 2], b="s", c=(True, False))
    assert g == [{"a": 1, "b": "s", "c": True}, {"a": 1, "b": "s", "c": False},
                 {"a": 2, "b": "s", "c": True}, {"a": 2, "b": "s", "c": False}]
    with pytest.raises(ValueError, match="axis 'a' is empty"):
        grid(a=[])


def test_cell_seed_is_deterministic_and_distinct():
    assert cell_seed("a", 1, 2.5) == cell_seed("a", 1, 2.5)
    assert len({cell_seed("a", i) for i in range(1000)}) == 1000
    assert 0 <= cell_seed("x") < 2**31


def test_run_returns_tidy_table_and_stores_each_cell(sweep_env):
    sweep, root, log = sweep_env
    df = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert len(df) == 16 and list(df.columns[:3]) == ["x", "y", "log"]
    assert df["value"].tolist() == [x * 10 + r for x in (1, 2, 3, 4) for _ in "ab" for r in (0, 1)]
    assert df.attrs["sweep"]["computed"] == 8 and df.attrs["sweep"]["cached"] == 0
    files = sorted((root / "unit").glob("*.json"))
    assert len(files) == 8
    payload = json.loads(sweep.path(sweep.cells[0], root).read_text())
    assert payload["params"] == sweep.cells[0] and payload["version"] == "1" and len(payload["rows"]) == 2


def test_rerun_recomputes_nothing(sweep_env):
    sweep, root, log = sweep_env
    first = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert len(_calls(log)) == 8
    again = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert len(_calls(log)) == 8, "a rerun with the same parameters must not call the cell function"
    assert again.attrs["sweep"]["computed"] == 0 and again.attrs["sweep"]["cached"] == 8
    pd.testing.assert_frame_equal(first, again)
    # a new version is a new key: everything recomputed
    bumped = Sweep("unit", _cell, sweep.cells, version="2")
    bumped.run(n_jobs=1, cache_dir=root, progress=False)
    assert len(_calls(log)) == 16
    # recompute=True ignores the store
    sweep.run(n_jobs=1, cache_dir=root, progress=False, recompute=True)
    assert len(_calls(log)) == 24


def test_interrupted_run_resumes_where_it_stopped(sweep_env):
    sweep, root, log = sweep_env
    _FAIL_ON.add(3)
    try:
        with pytest.raises(RuntimeError, match="x=3 interrupted"):
            sweep.run(n_jobs=1, cache_dir=root, progress=False)
    finally:
        _FAIL_ON.clear()
    # the four cells with x in {1, 2} finished and were stored before the interruption
    assert len(sweep.pending(root)) == 4
    assert len(_calls(log)) == 5
    df = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert df.attrs["sweep"]["cached"] == 4 and df.attrs["sweep"]["computed"] == 4
    assert [c.split(",")[0] for c in _calls(log)[5:]] == ["3", "3", "4", "4"]
    assert len(df) == 16


_SCRIPT = """
import functools, json, sys
from kvstats.study.sweep import Sweep, grid, cell_seed

@functools.lru_cache(maxsize=None)          # module state: fine only if workers import the script
def shared(x):
    return x * 10

def cell(x, y):
    return [{"value": shared(x) + r, "seed": cell_seed(x, y)} for r in range(2)]

if __name__ == "__main__":
    sweep = Sweep("script", cell, grid(x=[1, 2, 3, 4], y=["a", "b"]))
    df = sweep.run(n_jobs=int(sys.argv[2]), cache_dir=sys.argv[1], progress=False)
    out = {"rows": df.to_dict(orient="records"), "computed": df.attrs["sweep"]["computed"]}
    if len(sys.argv) > 3:  # the same through a Dask cluster (in-process workers)
        from distributed import LocalCluster
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as c:
            dd = sweep.run(scheduler=c.scheduler_address, cache_dir=sys.argv[3], progress=False)
        out["dask_rows"] = dd.to_dict(orient="records")
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_study_script_cells_run_in_joblib_processes(tmp_path):
    """A study script's cell (module __main__, with module-level caches) runs in loky workers."""
    import importlib.util
    import subprocess
    import sys

    script = tmp_path / "mystudy.py"
    script.write_text(_SCRIPT)

    def run(cache, jobs, *more):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / cache), str(jobs), *more],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    dask = ["dask"] if importlib.util.find_spec("distributed") else []
    par = run("par", 2, *(str(tmp_path / d) for d in dask))
    if dask:
        assert par["dask_rows"] == par["rows"]
    assert par["computed"] == 8 and len(list((tmp_path / "par" / "script").glob("*.json"))) == 8
    assert [r["value"] for r in par["rows"]] == [x * 10 + r for x in (1, 2, 3, 4) for _ in "ab" for r in (0, 1)]
    assert [r["seed"] for r in par["rows"]] == [cell_seed(x, y) for x in (1, 2, 3, 4) for y in "ab" for _ in (0, 1)]


def test_dask_local_cluster_path(sweep_env):
    distributed = pytest.importorskip("distributed")
    sweep, root, log = sweep_env
    seq = sweep.run(n_jobs=1, cache_dir=root / "seq", progress=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        dask_df = sweep.run(scheduler=client, cache_dir=root / "dask", progress=False)
        pd.testing.assert_frame_equal(seq, dask_df)
        assert dask_df.attrs["sweep"]["computed"] == 8
        n_calls = len(_calls(log))
        again = sweep.run(scheduler=cluster.scheduler_address, cache_dir=root / "dask", progress=False)
        assert again.attrs["sweep"]["computed"] == 0 and len(_calls(log)) == n_calls


def test_progress_bar_counts_cells(sweep_env, capsys):
    sweep, root, log = sweep_env
    sweep.run(n_jobs=1, cache_dir=root, progress=True)
    err = capsys.readouterr().err
    assert "unit" in err and "8/8" in err
    sweep.run(n_jobs=1, cache_dir=root, progress=True)
    assert "8/8" in capsys.readouterr().err


def test_bad_sweeps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        Sweep("s", _cell, [{"x": 1}, {"x": 1}])
    with pytest.raises(TypeError, match=r"cells\[0\]\['x'\]"):
        Sweep("s", _cell, [{"x": object()}])
    with pytest.raises(ValueError, match="study"):
        Sweep("a/b", _cell, [])
    with pytest.raises(ValueError, match="n_jobs"):
        cells = grid(x=[1, 2], y="a", log=str(tmp_path / "l"))
        Sweep("s", _cell, cells).run(n_jobs=0, cache_dir=tmp_path, progress=False)


def test_study_args_defaults():
    args = study_args("doc", [])
    assert args.scale == "quick" and args.scheduler is None and args.n_jobs is None
    assert study_args("doc", ["--scale", "paper", "--scheduler", "local"]).scheduler == "local"


# ------------------------------------------------------------------------------- hostile cell files


def _truncated(text: str) -> str:
    return text[: len(text) // 2]


_BAD_CELLS = {
    "empty": lambda good, other: "",
    "truncated": lambda good, other: _truncated(good),
    "rows only": lambda good, other: '{"rows": []}',
    "another cell": lambda good, other: other,
    "not an object": lambda good, other: "[1, 2]",
    "short rows": lambda good, other: good.replace('"n_rows":2', '"n_rows":3'),
    "row not a dict": lambda good, other: json.dumps({**json.loads(good), "rows": [1, 2], "n_rows": 2}),
    "edited row": lambda good, other: good.replace('"rep":1', '"rep":7'),
}


@pytest.mark.parametrize("case", sorted(_BAD_CELLS))
def test_bad_cell_file_is_reported_moved_aside_and_recomputed(case, sweep_env):
    from kvstats.study.sweep import BadCellWarning

    sweep, root, log = sweep_env
    first = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    target, other = sweep.path(sweep.cells[2], root), sweep.path(sweep.cells[5], root)
    good = target.read_text()
    target.write_text(_BAD_CELLS[case](good, other.read_text()))
    with pytest.raises(ValueError, match=target.name):
        sweep.load(sweep.cells[2], root)
    n_calls = len(_calls(log))
    with pytest.warns(BadCellWarning, match=target.name):
        again = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert len(_calls(log)) == n_calls + 1, "exactly the bad cell is computed again"
    assert again.attrs["sweep"]["computed"] == 1 and again.attrs["sweep"]["cached"] == 7
    pd.testing.assert_frame_equal(first, again)
    assert target.with_name(target.name + ".bad").read_text() == _BAD_CELLS[case](good, other.read_text())
    assert json.loads(target.read_text())["rows"] == json.loads(good)["rows"]


@pytest.mark.parametrize("edit", ["intact", "rows cut"])
def test_cell_files_without_row_count_or_digest_are_recomputed(sweep_env, edit):
    """A cell file without n_rows / rows_sha256 (the right study, version, key and params) cannot be verified: a
    legacy file with rows cut away gave a short table silently (issue 30). It is reported, moved aside and
    computed again, whole or cut."""
    sweep, root, log = sweep_env
    table = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    target = sweep.path(sweep.cells[0], root)
    payload = json.loads(target.read_text())
    del payload["n_rows"], payload["rows_sha256"]
    if edit == "rows cut":
        payload["rows"] = payload["rows"][:-1]
    target.write_text(json.dumps(payload))
    with pytest.warns(BadCellWarning, match="records no 'n_rows'"):
        again = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert again.attrs["sweep"]["computed"] == 1 and again.equals(table)
    assert target.with_name(target.name + ".bad").exists()


def test_a_cell_file_moved_aside_between_the_look_and_the_read_is_pending(sweep_env, monkeypatch):
    """Two drivers on a store with a bad cell: the other driver moves the file aside between this one's
    ``is_file()`` and its read (simulated here, deterministically). That ended the driver with a bare
    FileNotFoundError (issue 43, item 7); the cell is pending, then computed once, the table whole."""
    sweep, root, log = sweep_env
    first = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    target = sweep.path(sweep.cells[2], root)
    target.write_text('{"rows": []}')
    real, moved = Sweep._read, []

    def read_after_the_other_driver(self, path, params):
        if path == target and path.exists() and not moved:  # the other driver gets there first, once
            os.replace(path, path.with_name(path.name + ".bad"))
            moved.append(path)
        return real(self, path, params)

    monkeypatch.setattr(Sweep, "_read", read_after_the_other_driver)
    assert sweep.pending(root) == [sweep.cells[2]] and moved
    target.write_text('{"rows": []}')  # the same race inside a run
    moved.clear()
    n_calls = len(_calls(log))
    again = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    assert moved and len(_calls(log)) == n_calls + 1 and again.attrs["sweep"]["computed"] == 1
    pd.testing.assert_frame_equal(first, again)


_KILLED_DRIVER = """
import os, sys, time
from kvstats.study.sweep import Sweep, grid

def cell(x, log):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    time.sleep(120)
    return [{"x": x}]

if __name__ == "__main__":
    Sweep("killed", cell, grid(x=[1, 2, 3, 4], log=sys.argv[1])).run(n_jobs=2, cache_dir=sys.argv[2],
                                                                      progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_workers_end_after_the_driver_is_killed(tmp_path):
    """SIGKILL the driver while its two loky workers run cells: both workers are gone within a bounded wait."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script, log = tmp_path / "driver.py", tmp_path / "pids.log"
    script.write_text(_KILLED_DRIVER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, str(script), str(log), str(tmp_path / "cells")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 180  # spawning workers and importing torch on a loaded machine
        while len(pids) < 2 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)
            pids = [int(p) for p in _calls(log)]
        if len(pids) < 2:
            driver.kill()
            pytest.fail(f"the workers did not start: {driver.communicate()[1].decode()[-2000:]}")
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 30  # the watchdog polls every 0.5 s
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [p for p in pids if _alive(p)]
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)  # do not leak a worker when the test fails
    assert not survivors, f"loky workers {survivors} outlived their killed driver"


def test_script_function_resolves_once_under_concurrent_threads(tmp_path):
    """Threads of one Dask worker resolving the same study script all get the fully executed module.

    The script sleeps while it is imported, so without the import lock the other threads would find the
    half-executed module in sys.modules and miss ``cell`` (the race a CI run once hit); with it, the
    script runs exactly once and every thread gets the function.
    """
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from kvstats.study.workers import ScriptFunction as _ScriptFunction

    script = tmp_path / "slowstudy_race.py"
    counter = tmp_path / "imports.txt"
    script.write_text(
        "import time\n"
        f"with open({str(counter)!r}, 'a') as fh:\n"
        "    fh.write('x')\n"
        "time.sleep(0.3)\n"
        "def cell(x):\n"
        "    return [{'x': x}]\n")
    fn = _ScriptFunction("slowstudy_race", str(script), "cell")
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda x: fn(x=x), range(8)))
    finally:
        sys.modules.pop("slowstudy_race", None)
    assert results == [[{"x": x}] for x in range(8)]
    assert counter.read_text() == "x", "the script must be imported once per process"


def test_script_function_failed_import_leaves_no_half_module(tmp_path):
    import sys

    from kvstats.study.workers import ScriptFunction as _ScriptFunction

    script = tmp_path / "brokenstudy_race.py"
    script.write_text("raise RuntimeError('broken at import')\n")
    fn = _ScriptFunction("brokenstudy_race", str(script), "cell")
    with pytest.raises(RuntimeError, match="broken at import"):
        fn(x=1)
    assert "brokenstudy_race" not in sys.modules


_MAP_SCRIPT = """
import json, os, sys
import torch
from kvstats.study.sweep import parallel_map

def draw(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g, dtype=torch.float64)
    return {"pid": os.getpid(), "threads": torch.get_num_threads(),
            "x": (x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)).numpy().tobytes().hex()}

if __name__ == "__main__":
    kws = [{"seed": s, "n": 50 + s} for s in (5, 3, 9, 1, 7)]
    out = {str(j): list(parallel_map(draw, kws, n_jobs=j)) for j in (1, 2)}
    print(json.dumps({"driver": os.getpid(), **out}))
"""


@pytest.mark.slow
def test_parallel_map_yields_in_order_from_workers_the_in_process_results(tmp_path):
    """A study script's function mapped over keyword sets in loky workers: the in-process results (oracle: the same
    function with n_jobs=1, byte for byte), in the order given, computed in other processes with 1 torch thread."""
    import subprocess
    import sys

    script = tmp_path / "mapstudy.py"
    script.write_text(_MAP_SCRIPT)
    import os

    root = str(Path(__file__).resolve().parents[2])  # this checkout's kvstats, also in the workers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    serial, par = out["1"], out["2"]
    assert [r["x"] for r in par] == [r["x"] for r in serial]
    assert [len(bytes.fromhex(r["x"])) for r in par] == [8 * 64 * (50 + s) for s in (5, 3, 9, 1, 7)]
    assert all(r["pid"] == out["driver"] for r in serial)
    assert all(r["pid"] != out["driver"] and r["threads"] == 1 for r in par)


_HOLD_SCRIPT = """
import json, os, time
import numpy as np
from kvstats.study.sweep import parallel_map

CALLS, HELD = [0], []

def hold(i):
    # From its second task on, a worker keeps 400 MB (as a cell keeps a loaded model); every task outlasts
    # loky's 1 s between memory checks, so the check after the second task sees the growth.
    CALLS[0] += 1
    if CALLS[0] >= 2:
        HELD[:] = [np.ones(50_000_000)]
    time.sleep(1.2)
    return os.getpid()

if __name__ == "__main__":
    print(json.dumps(list(parallel_map(hold, [{"i": i} for i in range(6)], n_jobs=2))))
"""


@pytest.mark.slow
def test_workers_that_keep_what_they_load_are_not_restarted(tmp_path):
    """loky restarts a worker whose memory grew 300 MB past its size after the first task (a "memory leak"),
    so a worker that kept a loaded model was replaced and the model loaded again. With the bound raised in
    the sweep's workers, six tasks that each keep 400 MB run in the two workers the pool started (oracle:
    without the raised bound they ran in at least three, a restart after the second task of each worker)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "holdstudy.py"
    script.write_text(_HOLD_SCRIPT)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(pids) == 6 and len(set(pids)) <= 2, pids
    assert "A worker stopped" not in done.stderr


def test_parallel_map_refuses_zero_jobs():
    from kvstats.study.sweep import parallel_map

    with pytest.raises(ValueError, match="n_jobs must be a positive number of workers .* got 0"):
        list(parallel_map(dict, [{"a": 1}, {"a": 2}], n_jobs=0))
