"""The same cells through every engine the sweep runs on give byte-identical rows (issue 50, item 5): joblib's loky
processes, this process alone, and a real ``distributed.LocalCluster`` of two worker *processes* — each cell under
the sweep's one torch thread, its seeds from its parameters. A study's quick-scale cells, not a toy: TurboQuant's
distortion replicates (encode, decode, float64 errors), its WHT worst case and its outlier configuration."""

from __future__ import annotations

import json

import pytest

from kvstats.study.sweep import Sweep


def _stored_rows(root, name: str) -> dict[str, tuple[str, str]]:
    """{cell key: (its rows as stored JSON text, rows_sha256)} of one sweep's cell files under ``root``."""
    out = {}
    for path in sorted((root / name).glob("*.json")):
        payload = json.loads(path.read_text())
        out[payload["key"]] = (json.dumps(payload["rows"], sort_keys=True), payload["rows_sha256"])
    return out


@pytest.mark.slow  # two worker processes import torch and kvstats (≈ 20 s)
def test_dask_worker_processes_give_joblibs_rows_byte_for_byte(tmp_path):
    distributed = pytest.importorskip("distributed", reason="the [dist] extra (dask.distributed) is not installed")
    from studies.turboquant_distortion import TurboQuantDistortion

    study = TurboQuantDistortion()
    sweeps = {}
    for name, (cell, cells) in study.cells("quick").items():
        chosen = [c for c in cells if c.get("bits", 2) in (2, 3) and c["rep"] < 2][:12]
        sweeps[name] = Sweep(name, cell, chosen, version=study.version)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        for sweep in sweeps.values():
            sweep.run(scheduler=c.scheduler_address, cache_dir=tmp_path / "dask", progress=False)
    for sweep in sweeps.values():
        sweep.run(n_jobs=2, cache_dir=tmp_path / "joblib", progress=False)
        sweep.run(n_jobs=1, cache_dir=tmp_path / "here", progress=False)
    for name, sweep in sweeps.items():
        dask, joblib, here = (_stored_rows(tmp_path / engine, name) for engine in ("dask", "joblib", "here"))
        assert len(dask) == len(sweep.cells) > 0
        assert dask == joblib == here, name
