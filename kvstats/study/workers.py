"""Where a sweep's cells run: joblib's loky workers on this machine or a Dask cluster (docs/studies.md).

* :func:`run_cells` yields each cell's rows as it finishes (the sweep stores them the moment they arrive);
  :func:`parallel_map` runs a study's other work in the same workers, in order; :func:`warm_workers` starts the
  pool ahead of a run of several sweeps.
* A study *script*'s function (module ``__main__``) travels by path and name (:class:`ScriptFunction`), so
  its module-level state lives once per worker.
* joblib's loky workers outlive a driver killed by SIGKILL: every worker starts a watchdog the moment it starts
  (loky's ``initializer``, so a driver killed while its pool is still starting leaves none behind either) that
  ends it within :data:`WATCHDOG_SECONDS` of its parent's death, and the driver shuts the pool down at exit and
  on SIGTERM. Each cell runs with ``torch.set_num_threads(threads)`` (default 1).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["WATCHDOG_SECONDS", "ScriptFunction", "parallel_map", "portable", "run_cells", "warm_workers"]


#: A worker ends itself at most this many seconds after its driver died.
WATCHDOG_SECONDS = 1.0


@dataclass(frozen=True)
class ScriptFunction:
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


def portable(cell: Callable) -> Callable:
    """The cell function as workers should receive it: by script path and name when it lives in ``__main__``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(cell, "__module__", None) == "__main__" and path and "<locals>" not in cell.__qualname__:
        return ScriptFunction(Path(path).stem, str(Path(path).resolve()), cell.__qualname__)
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
    from joblib import delayed

    f = portable(fn)
    parallel = _parallel(n_jobs=jobs, return_as="generator", batch_size=1, pre_dispatch="2*n_jobs")
    yield from parallel(delayed(_call_with_threads)(f, kw, threads) for kw in items)


def _parallel(**kwargs):
    """A joblib ``Parallel`` on the loky pool whose workers watch this driver from their start
    (:func:`_watch_driver` as loky's initializer). Every caller passes the same initializer and driver pid, so
    they share one reusable pool (loky replaces the pool when its arguments change)."""
    from joblib import Parallel, parallel_config

    register_shutdown()
    with parallel_config(backend="loky", initializer=_watch_driver, initargs=(os.getpid(),)):
        return Parallel(**kwargs)


def _watch_driver(driver: int) -> None:
    """A loky worker's initializer: exit at once if the driver already died while this worker was starting (its
    parent is no longer the driver), else start the watchdog (:func:`_start_watchdog`)."""
    if os.getppid() != driver:
        os._exit(1)
    _start_watchdog(driver)


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


def _run_cell(cell: Callable[..., list[dict]], params: dict[str, Any], threads: int | None) -> tuple[list[dict], float]:
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


def _run_cell_tagged(cell, params, threads, driver: int | None = None):
    if driver is not None:
        _start_watchdog(driver)
    rows, seconds = _run_cell(cell, params, threads)
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


def register_shutdown() -> None:
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


def _run_cell_here(cell, params, threads):
    """In this process: restore torch's thread count afterwards."""
    import torch

    before = torch.get_num_threads()
    try:
        return _run_cell(cell, params, threads)
    finally:
        torch.set_num_threads(before)


def _dask_results(cell, todo, scheduler, threads, name: str, key: Callable[[dict], str]):
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
    fn = portable(cell)
    try:
        if isinstance(fn, ScriptFunction):
            try:  # remote workers may not see the script: ship it (Dask imports it there under its stem)
                client.upload_file(fn.path, load=False)
            except Exception as exc:  # noqa: BLE001 - a local cluster reads the file itself
                print(f"note: could not upload {fn.path} to the Dask workers ({exc}); they must see the file",
                      file=sys.stderr)
        futures = [client.submit(_run_cell_tagged, fn, params, threads, pure=False,
                                 key=f"{name}-{key(params)}-{i}") for i, params in enumerate(todo)]
        for future in as_completed(futures):
            yield future.result()
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()


_WARM_MODULES = ("torch", "numpy", "pandas", "scipy.stats", "statsmodels.stats.multitest", "matplotlib.pyplot",
                 "kvstats.study.sweep", "kvstats.study.plots", "kvstats.study.report", "kvstats.measure.stats",
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
    register_shutdown()
    parallel = _parallel(n_jobs=jobs, batch_size=1)

    def warm() -> None:
        from joblib import delayed, effective_n_jobs

        try:
            n = effective_n_jobs(jobs)
            driver = os.getpid()
            parallel(delayed(_import_modules)(modules, driver) for _ in range(n))
        except Exception as exc:  # noqa: BLE001 - warming is an optimisation only
            print(f"note: could not warm the joblib workers ({exc})", file=sys.stderr)

    thread = threading.Thread(target=warm, name="kvstats-warm-workers", daemon=True)
    thread.start()
    return thread


def run_cells(cell: Callable, todo: Sequence[dict[str, Any]], *, scheduler=None, n_jobs: int | None = None,
              threads: int | None = 1, name: str = "cells", key: Callable[[dict], str] = repr):
    """Run ``cell(**params)`` for each ``params`` of ``todo``; yield ``(params, rows, seconds)`` as cells finish,
    in any order. ``scheduler``: a Dask scheduler (address, ``"local"``, a Client or cluster); else joblib with
    ``n_jobs`` workers (default all cores), or this process when ``n_jobs == 1`` or a single cell is left.
    ``todo`` may be any iterable (a generator is consumed as workers free up). ``name`` and ``key(params)``
    name the Dask tasks."""
    if scheduler is not None:
        yield from _dask_results(cell, todo, scheduler, threads, name, key)
        return
    jobs = -1 if n_jobs is None else int(n_jobs)
    if jobs == 0:
        raise ValueError("n_jobs must be a positive number of workers or negative (all cores - k), got 0")
    if jobs == 1 or (hasattr(todo, "__len__") and len(todo) == 1):
        for params in todo:
            rows, seconds = _run_cell_here(cell, params, threads)
            yield params, rows, seconds
        return
    from joblib import delayed

    parallel = _parallel(n_jobs=jobs, return_as="generator_unordered", batch_size=1, pre_dispatch="2*n_jobs")
    fn = portable(cell)
    yield from parallel(delayed(_run_cell_tagged)(fn, params, threads, os.getpid()) for params in todo)
