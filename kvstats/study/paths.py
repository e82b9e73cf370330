"""Where studies write: the figures folder, its data/ subfolder, and the path of one figure or table.

    figures_dir()                    # $KVSTATS_FIGURES_DIR, else figures/ of the source checkout, else ./figures
    figure_path("budget_sweep_kl")   # <figures>/budget_sweep_kl.png (folder created)
    data_path("budget_sweep_kl")     # <figures>/data/budget_sweep_kl.csv (folder created)
    use_tier("full")                 # from now on (and in subprocesses) figures_dir() is <figures>/full

Tiers (docs/studies.md, "Tiers"). The ``full`` scale writes into its own folder, ``<figures>/full`` (its figures,
``data/`` and claims), so a full run never overwrites the everyday ``paper`` report's files and the report can set
the two side by side, each row naming its tier. :func:`use_tier` selects the folder for this process and its
children (``$KVSTATS_TIER``); the cells store stays one (:func:`base_figures_dir`), shared by every tier.

Every writer of figures, tables and claims files (kvstats.study.plots, kvstats.study.report, the studies) asks here.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvstats.study.scales import FULL_TIER, SCALES

__all__ = ["FULL_TIER", "TIER_ENV", "base_figures_dir", "data_dir", "data_path", "default_figures_dir", "figure_path",
           "figures_dir", "tier_dir", "use_tier"]

#: The environment variable that names the tier this process writes (:func:`use_tier`).
TIER_ENV = "KVSTATS_TIER"


def base_figures_dir() -> Path:
    """``$KVSTATS_FIGURES_DIR``, else ``figures/`` of the source checkout kvstats runs from, else ``./figures``: the
    everyday (quick and paper) tier's folder, which holds the full tier's (:func:`tier_dir`)."""
    env = os.environ.get("KVSTATS_FIGURES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]  # kvstats/study/paths.py -> the checkout
    if (repo / "pyproject.toml").is_file() and (repo / "studies").is_dir():
        return repo / "figures"
    return Path.cwd() / "figures"


def tier_dir(scale: str, root: str | os.PathLike | None = None) -> Path:
    """The folder a run at ``scale`` writes: ``<root>/full`` for the full tier, ``root`` itself for quick and paper
    (``root`` defaults to :func:`base_figures_dir`)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}")
    base = Path(root) if root is not None else base_figures_dir()
    return base / FULL_TIER if scale == FULL_TIER else base


def use_tier(scale: str) -> Path:
    """Write this process's (and its children's) figures, tables and claims into ``scale``'s folder
    (:func:`tier_dir`; sets ``$KVSTATS_TIER``); returns that folder."""
    folder = tier_dir(scale)
    os.environ[TIER_ENV] = scale
    return folder


def figures_dir() -> Path:
    """The folder this process writes: :func:`base_figures_dir`, or its ``full/`` subfolder while the full tier is in
    use (:func:`use_tier`)."""
    return tier_dir(os.environ.get(TIER_ENV) or "paper")


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
