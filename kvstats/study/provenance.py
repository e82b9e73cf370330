"""Where a result came from: versions, commit, device, threads, date, command line (results files record it).

    block = provenance(started=t0, seeds={"data": 0})    # a JSON-ready dict
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["git_commit", "installed_commit", "kvstats_commit", "provenance", "source_root"]

#: Packages whose versions change what kvstats computes or how it reads models.
PACKAGES = ("kvstats", "torch", "numpy", "scipy", "statsmodels", "transformers", "safetensors")


def source_root() -> Path | None:
    """The source checkout kvstats runs from (the folder holding pyproject.toml), or None for an installed copy."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "kvstats").is_dir() else None


def git_commit(root: str | os.PathLike | None) -> str:
    """The short commit of the git checkout at ``root``, with " (with uncommitted changes)" when the tracked files
    differ from it; "unknown" when ``root`` is None or not a git checkout (or git is missing)."""
    if root is None:
        return "unknown"
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def installed_commit(distribution: str = "kvstats") -> str:
    """The commit an installed copy was built from, as pip recorded it in the distribution's ``direct_url.json``
    (PEP 610): ``vcs_info.commit_id`` of an install from a git URL (short, "(installed by pip from git)" beside
    it), or the commit of the local checkout an install from a folder points at (:func:`git_commit`); "unknown"
    when pip recorded neither (an install from an index or a wheel file)."""
    import json
    from urllib.parse import unquote, urlparse

    try:
        text = importlib.metadata.distribution(distribution).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
    try:
        record = json.loads(text) if text else {}
    except ValueError:
        return "unknown"
    commit = (record.get("vcs_info") or {}).get("commit_id")
    if isinstance(commit, str) and commit:
        return f"{commit[:7]} (installed by pip from git)"
    url = record.get("url", "")
    if "dir_info" in record and isinstance(url, str) and url.startswith("file://"):
        return git_commit(unquote(urlparse(url).path))
    return "unknown"


def kvstats_commit() -> str:
    """The commit kvstats runs from: its source checkout's (:func:`source_root`), else the one pip recorded at
    install (:func:`installed_commit`), else "unknown"."""
    found = git_commit(source_root())
    return found if found != "unknown" else installed_commit()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device() -> dict[str, Any]:
    import torch

    from kvstats.quant import ops

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = [torch.cuda.get_device_name(i) for i in range(count)]
    return {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": gpus, "extension": ops.HAS_EXTENSION,
            "kernels": ops.kernel_devices()}


def provenance(*, started: float, seeds: dict[str, Any] | None = None, argv: list[str] | None = None) -> dict:
    """The provenance block of a results file.

    Args:
        started: ``time.time()`` when the work began (gives the date and the wall time).
        seeds: every seed the run used, by role.
        argv: the command line (default ``sys.argv``).
    """
    argv = list(sys.argv if argv is None else argv)
    now = time.time()
    return {
        "kvstats_commit": kvstats_commit(),
        "versions": {name: _version(name) for name in PACKAGES} | {"python": platform.python_version()},
        "platform": platform.platform(),
        "device": _device(),
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "finished": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(now - started, 3),
        "command": shlex.join(argv),
        "seeds": dict(seeds or {}),
    }


def figures_commit(fig: str | os.PathLike) -> str:
    """The commit of the checkout the figures folder is in, else the one kvstats runs from (an installed copy: the
    commit pip recorded, :func:`kvstats_commit`)."""
    found = git_commit(Path(fig).parent)
    return found if found != "unknown" else kvstats_commit()
