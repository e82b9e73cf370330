"""Study drivers as processes (issue 30, item 8): a killed driver leaves no worker behind, and two drivers on one
cell store compute every cell once.

Each test runs a small sweep script in subprocesses. Processes are found by an environment marker the driver's
children inherit (Linux /proc), so workers re-parented after the driver's death are found too.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,  # every test here runs Python subprocesses
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes through /proc")]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import os, sys, time
    from kvstats.study.sweep import Sweep, grid

    LOG = sys.argv[2]

    def cell(i, sleep):
        with open(LOG, "a") as log:  # one line per computation, appended atomically
            log.write(f"{i} {os.getpid()}\\n")
        time.sleep(sleep)
        return [{"i": i, "twice": 2 * i}]

    if __name__ == "__main__":
        n_cells, sleep, n_jobs = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
        sweep = Sweep("processes", cell, grid(i=list(range(n_cells)), sleep=[sleep]), version="1")
        print("running", flush=True)
        table = sweep.run(n_jobs=n_jobs, cache_dir=sys.argv[1], progress=False)
        print("done", table["i"].tolist(), table.attrs["sweep"]["computed"], flush=True)
''')


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def _driver(tmp_path: Path, marker: str, *args) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "KVSTATS_PROCESS_TEST": marker, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "cells"), str(tmp_path / "log"),
                             *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _computed(tmp_path: Path) -> list[int]:
    log = tmp_path / "log"
    return sorted(int(line.split()[0]) for line in log.read_text().splitlines()) if log.exists() else []


# the driver's import of torch and pandas takes ~2-4 s; loky starts its workers after "running", and a worker's
# own start (interpreter, loky, kvstats.study.workers) takes ~1-2 s more: the delays cover a kill before any
# worker exists, while they start, and while they run cells
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0, 2.5, 6.0])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_driver_leaves_no_process_alive_after_10_s(tmp_path, delay, sig):
    marker = uuid.uuid4().hex
    driver = _driver(tmp_path, marker, 8, 30.0, 2)
    assert driver.stdout.readline().strip() == "running", driver.stderr.read()
    time.sleep(delay)
    driver.send_signal(sig)
    driver.wait(timeout=30)
    deadline = time.monotonic() + 10.0
    while (alive := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.25)
    for pid in alive:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"{len(alive)} process(es) of the killed driver alive 10 s after {sig.name} at +{delay} s"


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_two_drivers_on_one_store_compute_every_cell_once(tmp_path, n_jobs):
    # cells of 1 s: a driver needs ≥ 8 s / n_jobs for all of them, far more than the two starts can differ by
    # (both import torch at once), so the two overlap and each computes some
    n_cells = 8
    drivers = [_driver(tmp_path, uuid.uuid4().hex, n_cells, 1.0, n_jobs) for _ in range(2)]
    outputs = [d.communicate(timeout=300) for d in drivers]
    for d, (out, err) in zip(drivers, outputs):
        assert d.returncode == 0, err
        done = out.strip().splitlines()[-1].split(" ", 1)[1]
        cells, computed = done.rsplit(" ", 1)
        assert json.loads(cells) == list(range(n_cells))  # each driver returns the whole table
    assert _computed(tmp_path) == list(range(n_cells))  # every cell computed once, by one of the two
    computed = [int(out.strip().rsplit(" ", 1)[1]) for out, _ in outputs]
    assert sum(computed) == n_cells and min(computed) >= 1, computed  # the work was shared
    assert not list((tmp_path / "cells").rglob("*.lock"))  # a stored cell's lock goes with it


def test_two_drivers_meeting_a_bad_cell_file_both_finish(tmp_path):
    # the race that killed one of them with a bare FileNotFoundError: both read the bad file, both move it aside
    first = _driver(tmp_path, uuid.uuid4().hex, 4, 0.0, 1)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    (tmp_path / "log").unlink()
    for path in (tmp_path / "cells" / "processes").glob("*.json"):
        path.write_text('{"rows": []}', encoding="utf-8")
    drivers = [_driver(tmp_path, uuid.uuid4().hex, 4, 0.3, 1) for _ in range(2)]
    outputs = [d.communicate(timeout=300) for d in drivers]
    for d, (_out, err) in zip(drivers, outputs):
        assert d.returncode == 0, err
        assert "FileNotFoundError" not in err
    assert _computed(tmp_path) == [0, 1, 2, 3]


HOLDER = textwrap.dedent('''
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    os._exit(0)  # dies holding the claim, without storing the cell
''')


def test_recompute_does_not_take_a_stale_file_for_a_cell_another_driver_held(tmp_path):
    # a driver that held cell 0's claim and died without storing it: recompute=True must compute cell 0 itself,
    # not accept the file stored before this run
    from kvstats.study.sweep import Sweep, grid

    log = tmp_path / "log"

    def cell(i):
        with open(log, "a") as f:
            f.write(f"{i}\n")
        return [{"i": i}]

    sweep = Sweep("recompute_stale", cell, grid(i=[0, 1, 2]), version="1")
    sweep.run(n_jobs=1, cache_dir=tmp_path / "cells", progress=False)
    log.unlink()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sweep.path(sweep.cells[0], tmp_path / "cells")
                                                                 .with_suffix(".lock")), "1.5"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    again = sweep.run(n_jobs=1, cache_dir=tmp_path / "cells", progress=False, recompute=True)
    holder.wait(timeout=30)
    assert sorted(int(x) for x in log.read_text().split()) == [0, 1, 2]
    assert again.attrs["sweep"]["computed"] == 3
