"""The scales a study runs at, in a module light enough for the command line's ``--help`` (no numpy, no pandas).

``quick`` (minutes, small samples: the smoke run), ``paper`` (the everyday report: every verdict-bearing claim at the
sample size its power plan asks for, SmolLM2's rows, in about 20 minutes on 2 cores) and ``full`` (what needs more:
the second model's rows, descriptive sweeps, long contexts, every format at every budget; a Dask cluster's work,
written to its own folder, ``figures/full``: :func:`kvstats.study.paths.tier_dir`). docs/studies.md, "Tiers".
"""

from __future__ import annotations

__all__ = ["FULL_TIER", "SCALES"]

#: The scales every study script accepts (a study may declare fewer: ``SCALES = ("quick", "full")``).
SCALES = ("quick", "paper", "full")
#: The scale whose files live in their own folder, and that folder's name under the figures folder.
FULL_TIER = "full"
