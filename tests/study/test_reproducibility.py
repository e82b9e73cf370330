"""The printed numbers do not depend on the thread count (issue 28: two runs with different thread settings
must print the same report).

Small cells of the studies are rerun in fresh processes with torch (and OpenMP/MKL) at 1 and at 2 threads and
must return the same rows bit for bit; the study shell itself, run with 1 worker at 1 thread and with 2
workers at 2 threads, must write the same claims (measurements, verdicts, details). The sweeps pin each cell to
one thread (kvstats.study.sweep, threads=1), so the driver's setting reaches the cells only through these paths;
the cell tests hold even where a user passes threads=None.

Cross-machine differences (another CPU's BLAS kernels) are outside what a test on one machine can pin; the
report rounds to the digits that reproduce and gives chaotic quantities as bounds (docs/studies.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here runs Python subprocesses

ROOT = Path(__file__).resolve().parents[2]

#: run one cell of studies/<name>.py with torch at <threads> threads; print its rows as JSON (floats exact: repr)
CELL_DRIVER = r"""
import importlib, importlib.util, json, sys
import torch
name, fn, params, threads = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
import os
if os.path.isdir(f"{sys.argv[5]}/studies/{name}"):  # a study package: kvstats.studies.<name>
    mod = importlib.import_module(f"kvstats.studies.{name}")
else:
    spec = importlib.util.spec_from_file_location(name, f"{sys.argv[5]}/studies/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
if len(sys.argv) > 6:  # the study's own preparation (e.g. nova's captures), as its main() would run it first
    getattr(mod, sys.argv[6])()
print(json.dumps(getattr(mod, fn)(**params), default=repr))
"""

#: run studies/<name>.py main() at a tiny 'quick' scale (SCALE patched) with --n-jobs <jobs>
SHELL_DRIVER = r"""
import importlib, importlib.util, json, sys
name, tiny, jobs, root = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
import os
if os.path.isdir(f"{root}/studies/{name}"):  # a study package: kvstats.studies.<name>
    mod = importlib.import_module(f"kvstats.studies.{name}")
else:
    spec = importlib.util.spec_from_file_location(name, f"{root}/studies/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
mod.SCALE["quick"] = tiny
sys.exit(mod.main(["--scale", "quick", "--n-jobs", jobs, "--no-progress"]))
"""


def _env(threads: int, tmp: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads), "MPLBACKEND": "Agg"}
    if tmp is not None:
        env |= {"KVSTATS_FIGURES_DIR": str(tmp / "figures"), "KVSTATS_CELLS_DIR": str(tmp / "cells"),
                # the driver imports the study as a module (not __main__): the workers unpickle its cell
                # functions by module name, so they must find it too
                "PYTHONPATH": os.pathsep.join([str(ROOT / "studies"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return env


def _cell_rows(study: str, fn: str, params: dict, threads: int, prepare: str | None = None) -> list:
    args = [study, fn, json.dumps(params), str(threads), str(ROOT)] + ([prepare] if prepare else [])
    out = subprocess.run([sys.executable, "-c", CELL_DRIVER, *args],
                         capture_output=True, text=True, env=_env(threads), cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    # wall-clock fields ("seconds", "calibration_seconds") are the only ones allowed to differ
    return [{k: v for k, v in row.items() if not k.endswith("seconds")} for row in rows]


SYNTHETIC_CELLS = [
    ("budget_sweep", "cell", {"data": "heavy_tail_df3", "layer": None, "scheme_name": "qkqv", "sketch": "srht",
                              "n": 4, "d": 128, "seq": 128, "n_q": 8, "trials": 2}),
    ("budget_sweep", "cell", {"data": "gaussian", "layer": None, "scheme_name": "kqv", "sketch": "srht-original",
                              "n": 3, "d": 128, "seq": 64, "n_q": 8, "trials": 1}),
    ("turboquant_distortion", "cell", {"method": "turbo_prod:srht", "bits": 3, "d": 128, "vectors": 500, "rep": 0}),
    ("jensen", "scheme_cell", {"scheme_name": "qkqv", "n": 3, "trials": 2}),
    ("beta_figures", "cell", {"d": 8, "kind": "low_rank", "bits": 4, "seq": 64, "n_q": 4, "trials": 2}),
]


@pytest.mark.parametrize("study, fn, params", SYNTHETIC_CELLS, ids=lambda v: v if isinstance(v, str) else None)
def test_synthetic_cells_are_the_same_at_1_and_2_threads(study, fn, params):
    assert _cell_rows(study, fn, params, 1) == _cell_rows(study, fn, params, 2)


def test_model_cells_are_the_same_at_1_and_2_threads(smollm2):
    """SmolLM2's forward through a quantized cache (end_to_end) and NOVA-KV's calibration on real keys (nova: the
    eigendecomposition and k-means), where thread-dependent summation would show first."""
    e2e = {"scheme": "kqv", "n": 2, "seed": 0, "window": 0, "segment_tokens": 16, "segments": 2,
           "calibration_tokens": None}
    assert _cell_rows("end_to_end", "cell", e2e, 1) == _cell_rows("end_to_end", "cell", e2e, 2)
    nova = {"layer": 3, "seed": 0, "n_q": 4, "insample": False}
    assert _cell_rows("nova", "cell", nova, 1, "ensure_captures") == _cell_rows("nova", "cell", nova, 2)


def test_study_shell_writes_the_same_claims_with_1_and_2_workers(tmp_path):
    """jensen end to end (sweeps, Holm, bootstrap, verdicts, report text) with 1 worker at 1 thread and with 2
    workers at 2 threads: the same claims and definitions, character for character."""
    tiny = {"draws": 200, "queries": 2, "trials": 6, "bias_seeds": 4}
    texts = []
    for jobs in (1, 2):
        tmp = tmp_path / f"jobs{jobs}"
        out = subprocess.run([sys.executable, "-c", SHELL_DRIVER, "jensen", json.dumps(tiny), str(jobs), str(ROOT)],
                             capture_output=True, text=True, env=_env(jobs, tmp), cwd=ROOT, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        data = tmp / "figures" / "data"
        claims = json.loads((data / "jensen_claims.json").read_text())
        texts.append((json.dumps(claims, sort_keys=True), (data / "jensen_definitions.json").read_text()))
    assert texts[0] == texts[1]
