"""Resumable units: each finished unit of an evaluation is stored at once, and a rerun with the same arguments
computes only the missing ones (the study runner's cell store, :class:`kvstats.study.sweep.Sweep`, one cell a unit).

    rows, reused = run_units(compute, 16, key=key, store=Path("results.json.units"), progress=True)

The key identifies everything a unit's numbers depend on: the evaluation's arguments, the data (a capture by
its sha256), and the *code* of both quantizers — a class or factory by the sha256 of the source file that
defines it, the values its closure or partial binds, every user file the process has loaded (what it imports),
and kvstats' own sources — so that a unit computed by an older version of a quantizer is never reused for a
newer one. Where the source cannot be read (a class typed into a REPL) or a bound value has no stable form,
:func:`code_identity` returns None and the evaluation stores nothing (it says so).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["STORE_VERSION", "code_identity", "kvstats_digest", "remove_units", "run_resumable", "run_units",
           "save_results", "store_key", "user_code_digest"]

#: Part of every unit's key: bump when what a unit row means changes.
STORE_VERSION = "2"


@functools.lru_cache(maxsize=1)
def kvstats_digest() -> str:
    """sha256 of kvstats' own code as it runs here: its Python sources, its data files (the codebook tables, the
    shipped texts) and the loaded compiled extension's bytes (:func:`kvstats.study.fingerprint.extension_identity`:
    the binary that runs, not the sources it was built from)."""
    from kvstats.study.fingerprint import extension_identity, package_data

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")) + package_data():
        digest.update(str(path.resolve().relative_to(root)).encode())
        digest.update(path.read_bytes())
    digest.update(extension_identity())
    return digest.hexdigest()[:24]


def user_code_digest() -> str:
    """sha256 of every Python file this process has loaded that is neither the standard library, nor an installed
    package, nor kvstats: the user's own code (the module that defines a quantizer and everything it imports from
    the user's folders), read from disk now."""
    import sys
    import sysconfig

    skip = [Path(p).resolve() for key, p in sysconfig.get_paths().items()
            if key in ("stdlib", "platstdlib", "purelib", "platlib")]
    skip.append(Path(__file__).resolve().parents[1])  # kvstats itself: kvstats_digest
    files = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not isinstance(name, str) or not name.endswith(".py"):
            continue
        path = Path(name).resolve()
        if path.is_file() and not any(path.is_relative_to(root) for root in skip):
            files.add(path)
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def _stable_repr(value: Any) -> str | None:
    """``repr(value)``, or None when it names a memory address (it would differ between runs: unidentifiable)."""
    text = repr(value)
    return None if " at 0x" in text else text


def code_identity(obj: Any) -> dict | None:
    """What identifies the code of ``obj`` (a class, a function, a ``functools.partial``, or an instance of a class)
    across runs: its module and qualified name, the sha256 of its source file (kvstats' own: :func:`kvstats_digest`),
    the values a closure or a partial binds, and :func:`user_code_digest` (every user file loaded: what the
    quantizer imports). None when any of it cannot be read or has no stable form: the evaluation then stores
    nothing rather than risk reusing units of other code."""
    import functools

    if isinstance(obj, functools.partial):
        inner = code_identity(obj.func)
        bound = _stable_repr((obj.args, sorted(obj.keywords.items())))
        return None if inner is None or bound is None else {"partial": inner, "bound": bound}
    target = obj if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj) else type(obj)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", repr(target))
    bound = None
    if inspect.isfunction(target):
        cells = [c.cell_contents for c in (target.__closure__ or ()) if c.cell_contents is not None]
        bound = _stable_repr((cells, target.__defaults__, target.__kwdefaults__))
        if bound is None:
            return None
    if module == "kvstats" or module.startswith("kvstats."):
        return {"module": module, "name": name, "source": f"kvstats {kvstats_digest()}", "bound": bound,
                "user_code": user_code_digest()}
    try:
        source = inspect.getsourcefile(target)
        text = Path(source).read_bytes() if source else None
    except (OSError, TypeError):
        text = None
    if text is None:
        return None
    return {"module": module, "name": name, "source": hashlib.sha256(text).hexdigest()[:24], "bound": bound,
            "user_code": user_code_digest()}


def store_key(fields: dict) -> str:
    """The 24-hex-digit key of an evaluation: sha256 of its identifying fields as canonical JSON."""
    blob = json.dumps({"version": STORE_VERSION, **fields}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _sweep(compute: Callable[[int], dict] | None, n: int, key: str):
    from kvstats.study.sweep import Sweep

    def cell(evaluation: str, unit: int) -> list[dict]:
        return [compute(unit)]

    return Sweep("evaluate", cell, [{"evaluation": key, "unit": i} for i in range(n)], version=STORE_VERSION)


def run_units(compute: Callable[[int], dict], n: int, *, key: str | None, store: str | os.PathLike | None,
              progress: bool = False, desc: str = "units") -> tuple[list[dict], int]:
    """``[compute(i) for i in range(n)]``, each stored under ``store`` as it finishes (when ``store`` and ``key``
    are given) and read back instead of computed on a rerun. Returns (rows in unit order, how many were reused).
    A progress bar (tqdm, stderr) counts units with the time left when ``progress``."""
    if store is None or key is None:
        from tqdm.auto import tqdm

        rows = []
        with tqdm(total=n, desc=desc, unit="unit", disable=not progress, mininterval=1.0, dynamic_ncols=True) as bar:
            for i in range(n):
                rows.append(compute(i))
                bar.update(1)
        return rows, 0
    sweep = _sweep(compute, n, key)
    reused = n - len(sweep.pending(store))
    sweep.run(n_jobs=1, threads=None, cache_dir=store, progress=progress)
    return [sweep.load(cell, store)[0] for cell in sweep.cells], reused


def stored_units(n: int, key: str, store: str | os.PathLike) -> int:
    """How many of the ``n`` units of evaluation ``key`` are stored under ``store``."""
    sweep = _sweep(None, n, key)
    return sum(sweep.path(cell, store).is_file() for cell in sweep.cells)


def remove_units(n: int, key: str, store: str | os.PathLike) -> None:
    """Delete the stored units of evaluation ``key`` (after its results file is written), then the store's
    folders if nothing else is left in them."""
    sweep = _sweep(None, n, key)
    for cell in sweep.cells:
        sweep.path(cell, store).unlink(missing_ok=True)
    for folder in (Path(store) / "evaluate", Path(store)):
        try:
            folder.rmdir()
        except OSError:  # not empty (another evaluation's units) or already gone
            pass


def save_results(result, out, *, force: bool, store, n: int, key: str | None):
    """Write ``result`` (anything with ``save(path, force=)``) to ``out`` when given, then delete its stored units
    (the results file now holds them); returns ``result``."""
    if out is not None:
        result.save(out, force=force)
        if store is not None and key is not None:
            remove_units(n, key, store)
    return result


def run_resumable(compute: Callable[[int], dict], n: int, *, key: str | None, store, progress: bool, desc: str,
                  seed: int, fresh_seed: bool) -> tuple[list[dict], int]:
    """:func:`run_units`, saying how to resume when interrupted (Ctrl-C): how many units are stored, and the seed
    to pass again when it was drawn fresh."""
    import sys

    if progress and store is not None and key is not None:
        have = stored_units(n, key, store)
        if have:
            print(f"resuming: {have} of {n} units are stored in {store}", file=sys.stderr)
    try:
        return run_units(compute, n, key=key, store=store, progress=progress, desc=desc)
    except KeyboardInterrupt:
        if store is not None and key is not None:
            have = stored_units(n, key, store)
            again = (f"rerun with seed={seed} (--seed {seed}): the seed was drawn fresh" if fresh_seed else
                     "run the same command again")
            print(f"interrupted: {have} of {n} units are stored in {store}; {again} to resume", file=sys.stderr)
        raise
