"""Where studies write: the figures folder, its data/ subfolder, and the path of one figure or table.

    figures_dir()                    # $KVSTATS_FIGURES_DIR, else figures/ of the source checkout, else ./figures
    figure_path("budget_sweep_kl")   # <figures>/budget_sweep_kl.png (folder created)
    data_path("budget_sweep_kl")     # <figures>/data/budget_sweep_kl.csv (folder created)

Every writer of figures, tables and claims files (kvstats.study.plots, kvstats.study.report, the studies) asks here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir", "data_path", "default_figures_dir", "figure_path", "figures_dir"]


def figures_dir() -> Path:
    """``$KVSTATS_FIGURES_DIR``, else ``figures/`` of the source checkout kvstats runs from, else ``./figures``."""
    env = os.environ.get("KVSTATS_FIGURES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]  # kvstats/study/paths.py -> the checkout
    if (repo / "pyproject.toml").is_file() and (repo / "studies").is_dir():
        return repo / "figures"
    return Path.cwd() / "figures"


#: The historical name of :func:`figures_dir` (kvstats.study.sweep and kvstats.study.report export it).
default_figures_dir = figures_dir


def data_dir(root: str | os.PathLike | None = None) -> Path:
    """``<figures>/data``: tables (CSV) and claims files."""
    return Path(root or figures_dir()) / "data"


def figure_path(name: str, root: str | os.PathLike | None = None, ext: str = "png") -> Path:
    """``<figures>/<name>.<ext>``, its folder created."""
    folder = Path(root or figures_dir())
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.{ext}"


def data_path(name: str, root: str | os.PathLike | None = None, ext: str = "csv") -> Path:
    """``<figures>/data/<name>.<ext>``, its folder created."""
    folder = data_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.{ext}"
