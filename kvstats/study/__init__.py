"""The study machinery: the sweep runner (resumable cells in parallel), its workers, the study protocol, claims,
the report, figures, the figures folder, provenance and strict JSON (docs/studies.md).

    from kvstats import study
    from kvstats.study import plots

    run = study.start("budget_sweep", __doc__)          # one command line, one runner, one claims writer
    class BudgetSweep(study.Study): ...                  # the typed protocol (kvstats.study.protocol)

A tier of the tree (docs/design_notes.md): it imports the tiers below it (hf, measure, quant, data), and the user's
evaluation (kvstats.evaluation) and the command line (kvstats.cli) import it.
"""

from __future__ import annotations

import importlib

__all__ = ["Study", "StudyRun", "Sweeps", "start"]


def __getattr__(name: str):  # the protocol's names load on first use: kvstats.study.paths stays light
    if name in __all__:
        return getattr(importlib.import_module("kvstats.study.protocol"), name)
    raise AttributeError(f"module 'kvstats.study' has no attribute {name!r}")
