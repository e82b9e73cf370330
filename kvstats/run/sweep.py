"""The study runner: a sweep's cells run in parallel, each cell's rows stored the moment it finishes.

A study declares its sweep — a list of *cells*, each a dict of parameters (scheme, budget n, distribution,
dim, layer, seed, sizes, ...) — and a *cell function* ``cell(**params) -> list[dict]`` returning tidy rows::

    from kvstats.run.sweep import Sweep, grid, cell_seed

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

Every stored cell is validated when it is read (:func:`check_cell`): a JSON object with the sweep's
``study``, ``version``, the cell's ``key`` and ``params``, and ``rows`` a list of objects (as many as
``n_rows`` says and matching ``rows_sha256``, when the file records them). A file that fails — truncated,
empty, not JSON, another cell's payload, ``{"rows": []}``, an edited row — is reported with its path (a
:class:`BadCellWarning`), moved aside to ``<key>.json.bad`` and computed again.

Workers. joblib's loky workers outlive a driver killed by SIGKILL (nothing runs in a killed process). So
every worker that runs a cell starts a watchdog thread that ends the worker (``os._exit``) within
``WATCHDOG_SECONDS`` of its parent's death (its parent pid changes when it is re-parented), and the driver
shuts the reusable executor down at exit (``atexit``) and on SIGTERM.

Progress: a tqdm bar on stderr counts cells done / total (cached cells count as done) with the time left.

Rows must be JSON-serialisable dicts (numbers, strings, booleans, None; numpy scalars are converted).
Parameter values must be str, int, float, bool or None (or lists/tuples of them).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvstats.run.paths import default_figures_dir  # the figures folder: one home, kvstats.paths

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

#: The scales every study accepts.
SCALES = ("quick", "paper")

_SCALAR = (str, int, float, bool, type(None))

#: A worker ends itself at most this many seconds after its driver died.
WATCHDOG_SECONDS = 1.0


class BadCellWarning(UserWarning):
    """A stored cell file failed validation; it was moved aside and the cell is computed again."""


def cells_dir() -> Path:
    """Where finished cells are stored: ``$KVSTATS_CELLS_DIR``, else ``<figures>/.cells``."""
    env = os.environ.get("KVSTATS_CELLS_DIR")
    return Path(env) if env else default_figures_dir() / ".cells"


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
    ones, ``rows`` a list of JSON objects and (files written since the check exists) ``n_rows`` = len(rows)
    and ``rows_sha256``, the sha256 of the rows as canonical JSON.

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
    n_rows = payload.get("n_rows", len(rows))
    if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows != len(rows):
        raise ValueError(f"cell file {where} holds {len(rows)} rows but records n_rows={n_rows!r}")
    digest = payload.get("rows_sha256")
    if digest is not None and digest != _rows_digest(rows):
        raise ValueError(f"cell file {where}: its rows do not match their recorded sha256 (edited or damaged)")
    return rows


def _rows_digest(rows: list) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class _ScriptFunction:
    """A function of a study *script* (``python studies/x.py``: module ``__main__``), sent to workers by name.

    Workers import the script as the module ``module`` (its file stem) from ``path`` — or find it already
    imported (Dask's ``upload_file`` puts it there) — and call ``name`` in it. Unlike pickling the function
    by value, the script's module-level state (constants, ``functools.lru_cache`` caches) then lives once
    per worker and is shared by all the cells the worker runs.
    """

    module: str
    path: str
    name: str

    def resolve(self) -> Callable:
        # One import per process even when a worker runs cells on several threads (Dask's threaded
        # workers): without the lock a second thread finds the module in sys.modules while the first is
        # still executing it, and the function it looks up is not defined yet.
        with _SCRIPT_IMPORT_LOCK:
            mod = self._module()
        fn = mod
        for part in self.name.split("."):
            fn = getattr(fn, part)
        return fn

    def _module(self):
        import importlib
        import importlib.util

        target = Path(self.path).resolve()
        mod = sys.modules.get(self.module)
        if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve() == target:
            return mod
        if target.is_file():  # the script itself (local workers, shared file systems)
            spec = importlib.util.spec_from_file_location(self.module, target)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[self.module] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop(self.module, None)  # never leave a half-executed module behind
                raise
            return mod
        try:  # a copy shipped to this worker (Dask's upload_file puts it on the path)
            return importlib.import_module(self.module)
        except ImportError as exc:
            raise FileNotFoundError(f"study script {self.path} is not on this worker and no module "
                                    f"{self.module!r} was shipped to it") from exc

    def __call__(self, **params):
        return self.resolve()(**params)


_SCRIPT_IMPORT_LOCK = threading.RLock()


def _portable(cell: Callable) -> Callable:
    """The cell function as workers should receive it: by script path and name when it lives in ``__main__``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(cell, "__module__", None) == "__main__" and path and "<locals>" not in cell.__qualname__:
        return _ScriptFunction(Path(path).stem, str(Path(path).resolve()), cell.__qualname__)
    return cell


def parallel_map(fn: Callable, kwargs_list: Sequence[Mapping[str, Any]], *, n_jobs: int | None = None,
                 threads: int | None = 1) -> Iterator[Any]:
    """``fn(**kw)`` for each ``kw`` of ``kwargs_list``, yielded lazily and in order, in the sweep's joblib workers.

    For a study's work outside its cells (e.g. figure data drawn in the main process): with ``n_jobs`` workers
    (loky processes, default all cores; a study script's function travels by path and name, as cells do) or in
    this process when ``n_jobs == 1``. At most ``2·n_jobs`` results wait to be consumed (bounded memory).
    ``threads``: torch threads per call in a worker (1: the workers share the cores, as the sweep's cells do).
    """
    items = [dict(kw) for kw in kwargs_list]
    jobs = -1 if n_jobs is None else int(n_jobs)
    if jobs == 0:
        raise ValueError("n_jobs must be a positive number of workers or negative (all cores - k), got 0")
    if jobs == 1 or len(items) <= 1:
        for kw in items:
            yield fn(**kw)
        return
    from joblib import Parallel, delayed

    _register_shutdown()
    f = _portable(fn)
    parallel = Parallel(n_jobs=jobs, return_as="generator", batch_size=1, pre_dispatch="2*n_jobs")
    yield from parallel(delayed(_call_with_threads)(f, kw, threads) for kw in items)


#: How much a worker's memory may grow past its size after its first task before loky restarts it. A worker
#: keeps what its cells load on purpose (a model, captured K/V, calibrations: cached per process), and loky's
#: guard against leaks, 300 MB, restarted it after the first cell that loaded SmolLM2 — warning "A worker
#: stopped while some jobs were given to the executor" — so that the next worker loaded the model again.
#: The guard stays, above what the studies cache (the fp32 and fp64 models together: about 1.6 GB).
WORKER_MEMORY_GROWTH_BYTES = 8 << 30


def _prepare_worker(threads: int | None) -> None:
    """In the calling worker: ``torch.set_num_threads(threads)`` (None: leave it), and loky's leak bound raised
    to :data:`WORKER_MEMORY_GROWTH_BYTES` (a module constant of the worker's loky, read at each check)."""
    if threads is not None:
        try:
            import torch

            torch.set_num_threads(threads)
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
    try:
        from joblib.externals.loky import process_executor
    except ImportError:  # pragma: no cover - joblib is a dependency
        return
    if getattr(process_executor, "_MAX_MEMORY_LEAK_SIZE", WORKER_MEMORY_GROWTH_BYTES) < WORKER_MEMORY_GROWTH_BYTES:
        process_executor._MAX_MEMORY_LEAK_SIZE = WORKER_MEMORY_GROWTH_BYTES


def _call_with_threads(fn: Callable, kw: dict[str, Any], threads: int | None) -> Any:
    _prepare_worker(threads)
    return fn(**kw)


def _execute(cell: Callable[..., list[dict]], params: dict[str, Any], threads: int | None) -> tuple[list[dict], float]:
    """Run one cell (in a worker or in-process) and check its rows."""
    _prepare_worker(threads)
    t0 = time.perf_counter()
    rows = cell(**params)
    seconds = time.perf_counter() - t0
    if isinstance(rows, Mapping):
        rows = [rows]
    if isinstance(rows, pd.DataFrame):
        rows = rows.to_dict(orient="records")
    rows = list(rows)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"cell {params} returned a non-dict row at position {i}: {type(row).__name__}")
    return [dict(r) for r in rows], seconds


@dataclass
class Sweep:
    """A study's sweep: its name, its cell function, its cells and a version string.

    Args:
        study: the study name (``"budget_sweep"``), part of every cell's key and of the storage path.
        cell: ``cell(**params) -> list[dict]`` (a dict or a DataFrame is accepted too). Must be picklable
            for parallel runs: a module-level function (a study script's functions are fine: cloudpickle
            sends ``__main__`` functions by value).
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
        :class:`BadCellWarning` naming it), renamed to ``<key>.json.bad`` and its cell counted as pending."""
        todo = []
        for params in self.cells:
            path = self.path(params, root)
            if not path.is_file():
                todo.append(params)
                continue
            try:
                self._read(path, params)
            except ValueError as exc:
                bad = path.with_name(path.name + ".bad")
                os.replace(path, bad)
                warnings.warn(f"{exc}; moved aside to {bad.name}, the cell is computed again", BadCellWarning,
                              stacklevel=2)
                todo.append(params)
        return todo

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
        todo = list(self.cells) if recompute else self.pending(root)
        n_cached = len(self.cells) - len(todo)
        bar = _progress_bar(self.study, len(self.cells), n_cached, progress)
        try:
            if todo:
                for params, rows, seconds in self._results(todo, scheduler, n_jobs, threads):
                    self._store(params, rows, seconds, root)
                    bar.update(1)
        finally:
            bar.close()
        table = self.table(root)
        table.attrs["sweep"] = {"study": self.study, "cells": len(self.cells), "cached": n_cached,
                                "computed": len(todo), "seconds": time.perf_counter() - t0}
        return table

    def _results(self, todo, scheduler, n_jobs, threads):
        """Yield (params, rows, seconds) as cells finish, in any order."""
        if scheduler is not None:
            yield from _dask_results(self, todo, scheduler, threads)
            return
        jobs = -1 if n_jobs is None else int(n_jobs)
        if jobs == 0:
            raise ValueError("n_jobs must be a positive number of workers or negative (all cores - k), got 0")
        if jobs == 1 or len(todo) == 1:
            for params in todo:
                rows, seconds = _execute_local(self.cell, params, threads)
                yield params, rows, seconds
            return
        from joblib import Parallel, delayed

        _register_shutdown()
        parallel = Parallel(n_jobs=jobs, return_as="generator_unordered", batch_size=1, pre_dispatch="2*n_jobs")
        fn = _portable(self.cell)
        outputs = parallel(delayed(_execute_tagged)(fn, params, threads, os.getpid()) for params in todo)
        yield from outputs


def _execute_tagged(cell, params, threads, driver: int | None = None):
    if driver is not None:
        _start_watchdog(driver)
    rows, seconds = _execute(cell, params, threads)
    return params, rows, seconds


_watchdog: threading.Thread | None = None


def _start_watchdog(driver: int) -> None:
    """In a worker process that ``driver`` started: end it (``os._exit``) once the driver dies.

    The driver's death shows as a change of the parent pid (the worker is re-parented). joblib's loky workers
    otherwise outlive a driver killed by SIGKILL, busy with their cell and then idle for minutes. Does
    nothing in any process that is not a direct child of ``driver`` (the driver itself, Dask's workers under
    their nanny); idempotent.
    """
    global _watchdog
    parent = os.getppid()
    if parent != driver or (_watchdog is not None and _watchdog.is_alive()):
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_SECONDS / 2)
        os._exit(1)

    _watchdog = threading.Thread(target=watch, name="kvstats-parent-watchdog", daemon=True)
    _watchdog.start()


def _shutdown_workers(*_args) -> None:
    """Stop joblib's reusable loky executor if this process started one (at exit and on SIGTERM)."""
    try:
        from joblib.externals.loky import reusable_executor
    except ImportError:  # pragma: no cover - joblib is a dependency
        return
    executor = getattr(reusable_executor, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=False, kill_workers=True)


_shutdown_registered = False


def _register_shutdown() -> None:
    """Shut the workers down when the driver exits or receives SIGTERM (SIGKILL: the workers' watchdog)."""
    global _shutdown_registered
    if _shutdown_registered:
        return
    _shutdown_registered = True
    import atexit
    import signal

    atexit.register(_shutdown_workers)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
            signal.SIG_DFL, None):

        def on_term(signum, frame):
            _shutdown_workers()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, on_term)


def _execute_local(cell, params, threads):
    """In this process: restore torch's thread count afterwards."""
    import torch

    before = torch.get_num_threads()
    try:
        return _execute(cell, params, threads)
    finally:
        torch.set_num_threads(before)


def _dask_results(sweep: Sweep, todo, scheduler, threads):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("a Dask scheduler needs the 'dist' extra: pip install 'kvstats[dist]'") from exc
    own_cluster = own_client = None
    if isinstance(scheduler, Client):
        client = scheduler
    else:
        if isinstance(scheduler, str) and scheduler == "local":
            own_cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
            target = own_cluster
        else:
            target = scheduler  # an address string or a cluster object
        client = own_client = Client(target)
    fn = _portable(sweep.cell)
    try:
        if isinstance(fn, _ScriptFunction):
            try:  # remote workers may not see the script: ship it (Dask imports it there under its stem)
                client.upload_file(fn.path, load=False)
            except Exception as exc:  # noqa: BLE001 - a local cluster reads the file itself
                print(f"note: could not upload {fn.path} to the Dask workers ({exc}); they must see the file",
                      file=sys.stderr)
        futures = [client.submit(_execute_tagged, fn, params, threads, pure=False,
                                 key=f"{sweep.study}-{sweep.key(params)}-{i}") for i, params in enumerate(todo)]
        for future in as_completed(futures):
            yield future.result()
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()


_WARM_MODULES = ("torch", "numpy", "pandas", "scipy.stats", "statsmodels.stats.multitest", "matplotlib.pyplot",
                 "kvstats.run.sweep", "kvstats.run.plots", "kvstats.run.report", "kvstats.measure.stats",
                 "kvstats.measure.metrics", "kvstats.quant.schemes", "kvstats.data.synthetic",
                 "kvstats.measure.inference")


def _import_modules(names: tuple[str, ...], driver: int | None = None) -> int:
    import importlib
    import os as _os

    if driver is not None:
        _start_watchdog(driver)

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return _os.getpid()


def warm_workers(n_jobs: int | None = None, modules: tuple[str, ...] = _WARM_MODULES):
    """Start joblib's worker pool in the background and import the heavy modules there; returns the thread.

    Spawning loky workers and importing torch & co. in them takes seconds (tens on a loaded machine); a
    driver that runs several sweeps (``kvstats reproduce``) calls this first so that the pool is ready when
    the first sweep needs it. The pool is joblib's reusable executor, which later ``Sweep.run`` calls share.
    """
    jobs = -1 if n_jobs is None else int(n_jobs)
    _register_shutdown()

    def warm() -> None:
        from joblib import Parallel, delayed, effective_n_jobs

        try:
            n = effective_n_jobs(jobs)
            driver = os.getpid()
            Parallel(n_jobs=jobs, batch_size=1)(delayed(_import_modules)(modules, driver) for _ in range(n))
        except Exception as exc:  # noqa: BLE001 - warming is an optimisation only
            print(f"note: could not warm the joblib workers ({exc})", file=sys.stderr)

    thread = threading.Thread(target=warm, name="kvstats-warm-workers", daemon=True)
    thread.start()
    return thread


def _progress_bar(study: str, total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=study, unit="cell", disable=not enabled, file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True, smoothing=0.1)


# ------------------------------------------------------------------------------------- study command lines


def study_args(description: str | None = None, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a study script's command line: ``--scale quick|paper``, ``--scheduler ADDR``, ``--n-jobs N``,
    ``--no-progress``, ``--recompute``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=SCALES, default="quick", help="sample sizes (default quick)")
    parser.add_argument("--scheduler", default=None,
                        help="Dask scheduler address, or 'local' (default: joblib on all cores)")
    parser.add_argument("--n-jobs", type=int, default=None, help="joblib workers (default: all cores)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--recompute", action="store_true", help="ignore stored cells")
    return parser.parse_args(argv)
