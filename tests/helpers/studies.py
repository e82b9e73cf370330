"""Loading the studies (scripts and packages) as modules and running one at a tiny scale through the study shell."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from kvstats.study.report import (
    read_claims,
)
from kvstats.study.sweep import Sweep

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def study_paths() -> dict[str, Path]:
    """Every study: name -> its script studies/<name>.py or its package studies/<name>/ (kvstats.cli.reproduce)."""
    from kvstats.cli.reproduce import study_entries

    return {p.stem: p for p in study_entries(STUDIES)}


def load_study(name: str):
    """A study as a module: a package ``studies/<name>/`` is ``kvstats.studies.<name>`` (its ``__init__`` holds what
    tests read: SCALE, POSITION, main, its cells and rules); a script ``studies/<name>.py`` is imported from its file
    as the module ``<name>``."""
    if (STUDIES / name).is_dir():
        return importlib.import_module(f"kvstats.studies.{name}")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, STUDIES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_run(study, cell, cells, tmp_path):
    return Sweep(f"test_{study}", cell, cells).run(n_jobs=1, cache_dir=tmp_path, progress=False)


def run_tiny(name: str, tiny: dict, tmp_path, monkeypatch, patch: dict | None = None) -> list[dict]:
    """Run studies/<name>.py main() through the study shell at a tiny 'quick' scale into tmp_path, with the module
    attributes in ``patch`` replaced (e.g. a shorter list of methods); its claims."""
    mod = load_study(name)
    monkeypatch.setitem(mod.SCALE, "quick", tiny)
    for attribute, value in (patch or {}).items():
        monkeypatch.setattr(mod, attribute, value)
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    assert mod.main(["--scale", "quick", "--n-jobs", "1", "--no-progress"]) == 0
    claims = read_claims(tmp_path / "figures" / "data" / f"{name}_claims.json")
    assert {c["position"] for c in claims} == {mod.POSITION} and {c["scale"] for c in claims} == {"quick"}
    return claims
