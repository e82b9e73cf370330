"""The study runner: a sweep's cells run in parallel, each cell's rows stored the moment it finishes.

A study declares its sweep — a list of *cells*, each a dict of parameters (scheme, budget n, distribution,
dim, layer, seed, sizes, ...) — and a *cell function* ``cell(**params) -> list[dict]`` returning tidy rows::

    from kvstats.study.sweep import Sweep, grid, cell_seed

    def cell(scheme, n, dist, trials):
        rng = cell_seed("data", dist, n)            # seeds come from the parameters: deterministic
        return [{"trial": t, "kl": ...} for t in range(trials)]

    sweep = Sweep("budget_sweep", cell, grid(scheme=["kqv", "qkqv"], n=[2, 3, 4], dist=["gaussian"], trials=[16]),
                  version="1")
    table = sweep.run()                             # pandas DataFrame: the params' columns, then the rows'

Execution. ``run()`` uses joblib (loky processes, ``n_jobs`` workers, default all cores) or, given
``scheduler`` (a Dask scheduler address such as ``"tcp://10.0.0.5:8786"``, ``"local"`` for a
``LocalCluster`` on this machine, or a ``distributed.Client`` / ``LocalCluster`` object), a Dask cluster
(extra ``kvstats[dist]``). Each cell runs with ``torch.set_num_threads(threads)`` (default 1: the
parallelism is across cells). With ``n_jobs=1`` and no scheduler, cells run in this process, one by one.

Storage and resumption. A finished cell is written at once (atomically) by the driving process to
``<cells_dir>/<study>/<key>.json`` with ``key = sha256(study, version, params)``. A run first looks up
every cell's file and computes only the missing ones, so an interrupted run resumes where it stopped and a
rerun with the same parameters recomputes nothing. Bump ``version`` when the cell function changes
meaning. ``cells_dir`` defaults to ``$KVSTATS_CELLS_DIR``, else ``figures/.cells`` (git-ignored).

Concurrent drivers. Two runs of one sweep on one store (two shells, two machines on a shared disk with working
``flock``) share the work: a driver computes a cell only while it holds the cell's lock (``<key>.lock``, an
exclusive ``fcntl.flock``, released by the kernel when its holder dies, even by SIGKILL). A cell another driver
holds is waited for after this driver's own cells, then read — or computed here if that driver died first —
so every cell is computed once.

Every stored cell is validated when it is read (:func:`check_cell`): a JSON object with the sweep's
``study``, ``version``, the cell's ``key`` and ``params``, and ``rows`` a list of objects (as many as
``n_rows`` says and matching ``rows_sha256``, both required). A file that fails — truncated,
empty, not JSON, another cell's payload, ``{"rows": []}``, an edited row — is reported with its path (a
:class:`BadCellWarning`), moved aside to ``<key>.json.bad`` and computed again.

Workers (:mod:`kvstats.study.workers`). joblib's loky workers outlive a driver killed by SIGKILL (nothing runs
in a killed process). So every worker that runs a cell starts a watchdog thread that ends the worker
(``os._exit``) within ``WATCHDOG_SECONDS`` of its parent's death (its parent pid changes when it is
re-parented), and the driver shuts the reusable executor down at exit (``atexit``) and on SIGTERM.

Progress: a tqdm bar on stderr counts cells done / total (cached cells count as done) with the time left.

Rows must be JSON-serialisable dicts (numbers, strings, booleans, None; numpy scalars are converted).
Parameter values must be str, int, float, bool or None (or lists/tuples of them).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvstats.study.paths import base_figures_dir, default_figures_dir  # the figures folder: kvstats.study.paths
from kvstats.study.scales import SCALES  # quick, paper, full (docs/studies.md, "Tiers")
from kvstats.study.workers import parallel_map, run_cells, warm_workers

__all__ = [
    "SCALES",
    "BadCellWarning",
    "Sweep",
    "cell_seed",
    "check_cell",
    "cells_dir",
    "default_figures_dir",
    "grid",
    "parallel_map",
    "study_args",
    "warm_workers",
]


_SCALAR = (str, int, float, bool, type(None))

#: what :meth:`Sweep._claim` returns where the file system has no flock: nothing to release
NO_LOCK = -1


class BadCellWarning(UserWarning):
    """A stored cell file failed validation; it was moved aside and the cell is computed again."""


def cells_dir() -> Path:
    """Where finished cells are stored: ``$KVSTATS_CELLS_DIR``, else ``<figures>/.cells`` (one store for every tier:
    :func:`kvstats.study.paths.base_figures_dir`)."""
    env = os.environ.get("KVSTATS_CELLS_DIR")
    return Path(env) if env else base_figures_dir() / ".cells"


def grid(**axes: Iterable) -> list[dict[str, Any]]:
    """The Cartesian product of the axes as a list of cells, the last axis varying fastest.

    ``grid(scheme=["kqv", "qkqv"], n=[2, 4])`` → ``[{"scheme": "kqv", "n": 2}, {"scheme": "kqv", "n": 4}, ...]``.
    A scalar (or string) axis is a single value. Concatenate grids (``grid(...) + grid(...)``) for sweeps
    that are not a full product.
    """
    names = list(axes)
    values = [[v] if isinstance(v, (str, bytes)) or not isinstance(v, Iterable) else list(v) for v in axes.values()]
    for name, vals in zip(names, values):
        if not vals:
            raise ValueError(f"axis {name!r} is empty")
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def _canonical(value: Any, where: str) -> Any:
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be finite, got {value}")
    if isinstance(value, _SCALAR):
        return value
    if isinstance(value, (list, tuple)):
        return [_canonical(v, where) for v in value]
    raise TypeError(f"{where} must be a str, int, float, bool, None or a list of them, got {type(value).__name__}")


def _canonical_params(params: Mapping[str, Any], where: str = "cell") -> dict[str, Any]:
    if not isinstance(params, Mapping):
        raise TypeError(f"{where} must be a dict of parameters, got {type(params).__name__}")
    return {str(k): _canonical(v, f"{where}[{k!r}]") for k, v in params.items()}


def cell_seed(*parts: Any) -> int:
    """A deterministic seed in [0, 2³¹) from any JSON-able parts: ``cell_seed("data", "gaussian", 128, trial)``.

    Cells derive every seed from their parameters with it, so a cell's rows depend on its parameters only
    (not on which worker ran it, nor on the order of the cells).
    """
    blob = json.dumps([_canonical(p, "seed part") for p in parts], sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:4], "little") & 0x7FFFFFFF


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "item") and callable(obj.item):  # 0-d torch tensors
        return obj.item()
    raise TypeError(f"cell rows must be JSON-serialisable; got a {type(obj).__name__}")


def check_cell(text: str, *, study: str, version: str, key: str, params: Mapping[str, Any],
               where: str = "(no path given)") -> list[dict]:
    """Validate a stored cell's JSON text; return its rows.

    A cell file holds a JSON object with ``study``, ``version``, ``key`` and ``params`` equal to the expected
    ones, ``rows`` a list of JSON objects, ``n_rows`` = len(rows) and ``rows_sha256``, the sha256 of the rows as
    canonical JSON (a file without them — from before the check, or edited — is refused: its rows cannot be
    verified).

    Raises:
        ValueError naming ``where`` and what is wrong (empty, truncated or not JSON, a missing or
        mismatched field, rows of the wrong type or count).
    """
    if not text.strip():
        raise ValueError(f"cell file {where} is empty")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"cell file {where} is not valid JSON (truncated?): {exc}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"cell file {where} must hold a JSON object, got {type(payload).__name__}")
    expected = {"study": study, "version": version, "key": key, "params": dict(params)}
    for name, value in expected.items():
        if name not in payload:
            raise ValueError(f"cell file {where} has no {name!r} field (fields: {sorted(payload)})")
        if payload[name] != value:
            raise ValueError(f"cell file {where}: {name} is {payload[name]!r}, expected {value!r}")
    rows = payload.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"cell file {where}: rows must be a list of objects, got {type(rows).__name__}")
    for name in ("n_rows", "rows_sha256"):  # without them an emptied or edited table would pass (issue 30)
        if name not in payload:
            raise ValueError(f"cell file {where} records no {name!r} (written before the check existed, or edited): "
                             "its rows cannot be verified")
    n_rows = payload["n_rows"]
    if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows != len(rows):
        raise ValueError(f"cell file {where} holds {len(rows)} rows but records n_rows={n_rows!r}")
    digest = payload["rows_sha256"]
    if digest != _rows_digest(rows):
        raise ValueError(f"cell file {where}: its rows do not match their recorded sha256 (edited or damaged)")
    return rows


def _rows_digest(rows: list) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Sweep:
    """A study's sweep: its name, its cell function, its cells and a version string.

    Args:
        study: the study name (``"budget_sweep"``), part of every cell's key and of the storage path.
        cell: ``cell(**params) -> list[dict]`` (a dict or a DataFrame is accepted too). Must be picklable
            for parallel runs: a module-level function (a study script's functions are fine: they travel to
            the workers by path and name, :class:`~kvstats.study.workers.ScriptFunction`).
        cells: the parameter dicts, e.g. from :func:`grid`; duplicates are refused.
        version: part of the key: bump it when the cell function's output changes meaning.
    """

    study: str
    cell: Callable[..., list[dict]]
    cells: list[dict[str, Any]] = field(default_factory=list)
    version: str = "1"

    def __post_init__(self) -> None:
        if not isinstance(self.study, str) or not self.study or "/" in self.study:
            raise ValueError(f"study must be a name like 'budget_sweep', got {self.study!r}")
        if not callable(self.cell):
            raise TypeError(f"cell must be callable, got {type(self.cell).__name__}")
        self.cells = [_canonical_params(p, f"cells[{i}]") for i, p in enumerate(self.cells)]
        keys = [self.key(p) for p in self.cells]
        if len(set(keys)) != len(keys):
            dupes = [p for p, k in zip(self.cells, keys) if keys.count(k) > 1]
            raise ValueError(f"cells must be distinct; repeated: {dupes[:3]}")

    # ----------------------------------------------------------------------------------------------- keys
    def key(self, params: Mapping[str, Any]) -> str:
        """The cell's storage key: sha256 of (study, version, params) as canonical JSON."""
        blob = json.dumps({"study": self.study, "version": str(self.version), "params": _canonical_params(params)},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def path(self, params: Mapping[str, Any], root: str | os.PathLike | None = None) -> Path:
        """File where the cell's rows are (or will be) stored."""
        return Path(root or cells_dir()) / self.study / f"{self.key(params)}.json"

    def pending(self, root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
        """The cells without a valid stored file. A file that fails :func:`check_cell` is reported (a
        :class:`BadCellWarning` naming it), renamed to ``<key>.json.bad`` and its cell counted as pending. A file
        that vanishes between the look and the read (another driver moved it aside to compute it again) is
        pending too: :meth:`run` then waits for that driver's claim and reads what it stored."""
        todo = []
        for params in self.cells:
            path = self.path(params, root)
            if not path.is_file():
                todo.append(params)
                continue
            try:
                self._read(path, params)
            except FileNotFoundError:
                todo.append(params)
            except ValueError as exc:
                self._move_aside(params, path, exc, root)
                todo.append(params)
        return todo

    def _move_aside(self, params: Mapping[str, Any], path: Path, exc: ValueError, root) -> None:
        """Rename a bad cell file to ``<key>.json.bad`` under the cell's lock; a driver that holds the lock is
        recomputing the cell, and one that already replaced the file left a good one (read again here)."""
        lock = self._claim(params, root)
        if lock is None:
            return
        try:
            if self._stored(params, root):
                return  # another driver stored a good file meanwhile
            bad = path.with_name(path.name + ".bad")
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, bad)
                warnings.warn(f"{exc}; moved aside to {bad.name}, the cell is computed again", BadCellWarning,
                              stacklevel=3)
        finally:
            self._release(params, root, lock, stored=False)

    # ------------------------------------------------------------------------------------------ claims
    def _claim(self, params: Mapping[str, Any], root, *, wait: bool = False) -> int | None:
        """The cell's lock (an open fd holding an exclusive flock on ``<key>.lock``), or None when another
        driver holds it (``wait=True``: block until it is released — by that driver, or by the kernel when the
        driver dies). On a file system without flock (some NFS or FUSE mounts) :data:`NO_LOCK`, with a warning:
        the sweep runs as before, and concurrent drivers may compute a cell twice."""
        path = self.path(params, root).with_suffix(".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            if not self.__dict__.get("_warned_no_lock"):
                self.__dict__["_warned_no_lock"] = True
                warnings.warn(f"cell locks are not available in {path.parent} ({exc}): two drivers on this store may "
                              "compute a cell twice", stacklevel=3)
            return NO_LOCK
        return fd

    def _release(self, params: Mapping[str, Any] | None, root, lock: int, *, stored: bool) -> None:
        """Release a claim; the lock file goes too once the cell is stored (whoever holds or takes a lock on it
        then finds the cell stored)."""
        try:
            if stored:
                with contextlib.suppress(FileNotFoundError):
                    self.path(params, root).with_suffix(".lock").unlink()
        finally:
            if lock != NO_LOCK:
                os.close(lock)

    def _stored(self, params: Mapping[str, Any], root, since: float | None = None) -> bool:
        """Whether the cell has a valid stored file (written at or after ``since``, a time.time(), when given)."""
        path = self.path(params, root)
        try:
            if since is not None and path.stat().st_mtime < since:
                return False
            self._read(path, params)
            return True
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------------------------------------- storage
    def _store(self, params: dict, rows: list[dict], seconds: float, root: Path) -> None:
        path = self.path(params, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = json.loads(json.dumps(rows, default=_json_default))  # as a reader will see them
        payload = {"study": self.study, "version": str(self.version), "key": self.key(params), "params": params,
                   "seconds": seconds, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "n_rows": len(rows),
                   "rows_sha256": _rows_digest(rows), "rows": rows}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(payload, default=_json_default, separators=(",", ":")), encoding="utf-8")
        tmp.replace(path)


    def _read(self, path: Path, params: Mapping[str, Any]) -> list[dict]:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"cell file {path} is not UTF-8 text ({exc.reason})") from None
        return check_cell(text, study=self.study, version=str(self.version), key=self.key(params),
                          params=_canonical_params(params), where=str(path))

    def load(self, params: Mapping[str, Any], root: str | os.PathLike | None = None) -> list[dict]:
        """The stored rows of one cell (FileNotFoundError when it has not run; ValueError naming the file
        when the file fails :func:`check_cell`)."""
        return self._read(self.path(params, root), params)

    def table(self, root: str | os.PathLike | None = None) -> pd.DataFrame:
        """All stored rows of the sweep's cells, in cell order: the params' columns, then the rows' columns."""
        frames = []
        for params in self.cells:
            rows = self.load(params, root)
            frames.extend({**params, **row} for row in rows)
        return pd.DataFrame(frames)

    # ----------------------------------------------------------------------------------------------- run
    def run(
        self,
        *,
        scheduler: Any = None,
        n_jobs: int | None = None,
        threads: int | None = 1,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
        recompute: bool = False,
    ) -> pd.DataFrame:
        """Compute the missing cells, store each as it finishes, return the whole table.

        Args:
            scheduler: None (joblib), a Dask scheduler address, ``"local"`` (a Dask LocalCluster here), or a
                ``distributed.Client`` / cluster object.
            n_jobs: joblib workers (default -1: all cores); 1 runs the cells in this process.
            threads: torch threads per cell (default 1; None leaves torch's setting alone).
            cache_dir: where cells are stored (default :func:`cells_dir`).
            progress: show a tqdm bar (cells done / total, time left) on stderr.
            recompute: ignore stored cells and compute every cell again.

        Returns:
            DataFrame of every cell's rows with the cell's parameters as leading columns, in cell order.
            ``df.attrs["sweep"]`` = {"study", "cells", "cached", "computed", "seconds"}.
        """
        root = Path(cache_dir or cells_dir())
        t0 = time.perf_counter()
        # with recompute, a stored file counts only when written during this run (by this driver or another)
        since = time.time() if recompute else None
        todo = list(self.cells) if recompute else self.pending(root)
        n_cached = len(self.cells) - len(todo)
        bar = _progress_bar(self.study, len(self.cells), n_cached, progress)
        computed = 0
        # key -> lock of the cells this driver is computing; filled by claimed(), which joblib may run in its
        # dispatch thread
        held: dict[str, int] = {}
        guard = threading.Lock()
        try:
            while todo:
                elsewhere: list[dict] = []  # held by another driver: waited for after this round

                def claimed(cells: list[dict], elsewhere: list[dict] = elsewhere):
                    for params in cells:
                        lock = self._claim(params, root)
                        if lock is None:
                            elsewhere.append(params)
                        elif self._stored(params, root, since):  # another driver finished it meanwhile
                            self._release(params, root, lock, stored=True)
                            bar.update(1)
                        else:
                            with guard:
                                held[self.key(params)] = lock
                            yield params

                jobs = 1 if len(todo) == 1 else n_jobs
                for params, rows, seconds in run_cells(self.cell, claimed(todo), scheduler=scheduler, n_jobs=jobs,
                                                        threads=threads, name=self.study, key=self.key):
                    self._store(params, rows, seconds, root)
                    with guard:
                        lock = held.pop(self.key(params))
                    self._release(params, root, lock, stored=True)
                    computed += 1
                    bar.update(1)
                todo = []
                for params in elsewhere:  # wait for the other driver; a cell it did not store is ours
                    lock = self._claim(params, root, wait=True)
                    stored = self._stored(params, root, since)
                    self._release(params, root, lock, stored=stored)
                    if stored:
                        bar.update(1)
                    else:
                        todo.append(params)
        finally:
            with guard:
                locks, held = list(held.values()), {}
            for lock in locks:
                self._release(None, root, lock, stored=False)
            bar.close()
        table = self.table(root)
        table.attrs["sweep"] = {"study": self.study, "cells": len(self.cells),
                                "cached": len(self.cells) - computed, "computed": computed,
                                "seconds": time.perf_counter() - t0}
        return table




def _progress_bar(study: str, total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=study, unit="cell", disable=not enabled, file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True, smoothing=0.1)


# ------------------------------------------------------------------------------------- study command lines


def study_args(description: str | None = None, argv: Sequence[str] | None = None, *,
               scales: Sequence[str] = SCALES) -> argparse.Namespace:
    """Parse a study script's command line: ``--scale quick|paper|full`` (of ``scales``: the ones the study runs
    at), ``--scheduler ADDR``, ``--n-jobs N``, ``--no-progress``, ``--recompute``."""
    unknown = [s for s in scales if s not in SCALES]
    if not scales or unknown:
        raise ValueError(f"scales must be a non-empty subset of {list(SCALES)}, got {list(scales)!r}")
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=list(scales), default="quick", help="sample sizes (default quick)")
    parser.add_argument("--scheduler", default=None,
                        help="Dask scheduler address, or 'local' (default: joblib on all cores)")
    parser.add_argument("--n-jobs", type=int, default=None, help="joblib workers (default: all cores)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--recompute", action="store_true", help="ignore stored cells")
    return parser.parse_args(argv)
