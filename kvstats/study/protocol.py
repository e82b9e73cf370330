"""The study shell: one command line, one runner, one claims writer and one timing for every study.

A study script (``studies/<name>.py``) declares its name and its place in the report and runs like this::

    from kvstats import study

    STUDY = "budget_sweep"
    POSITION = 70                                   # report order: smaller first (see kvstats.study.report)

    def main(argv=None) -> int:
        run = study.start(STUDY, __doc__, argv, position=POSITION)
        table = run.sweep(cell, cells, version=VERSION)       # kvstats.study.sweep.Sweep with the run's options
        ...                                                   # figures, tables (kvstats.study.plots), claims
        return run.finish(claims)                             # write_claims + "<study> done in …" + exit code 0

``start`` parses the common command line (:func:`kvstats.study.sweep.study_args`: ``--scale``, ``--scheduler``,
``--n-jobs``, ``--no-progress``, ``--recompute``), selects the scale's folder (:func:`kvstats.study.paths.use_tier`:
the full tier writes under ``figures/full``) and starts the clock; a study that runs at fewer scales than
:data:`kvstats.study.sweep.SCALES` declares them (``SCALES = ("quick", "full")`` at module level: its claims are all
descriptive, so the everyday paper tier takes them from the full tier) and is refused at the others; ``sweep`` runs
a sweep with those options and counts computed and cached cells; ``finish`` writes the claims (with the scale, the
study's position and the fingerprint of its code) and prints the wall time. Every cell's key holds the fingerprint of
the code its cell function runs (:mod:`kvstats.study.fingerprint`), so an edit that can move a number recomputes the
cells it can move, and no others.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvstats.study.claims_files import write_claims, write_definitions
from kvstats.study.fingerprint import function_fingerprint, study_fingerprint
from kvstats.study.paths import use_tier
from kvstats.study.sweep import SCALES, Sweep, study_args

__all__ = ["Study", "StudyRun", "Sweeps", "start"]

#: name -> (cell function, cells): the sweeps a study declares (:meth:`Study.cells`)
Sweeps = Mapping[str, tuple[Callable[..., list[dict]], Sequence[Mapping[str, Any]]]]


@dataclass
class StudyRun:
    """One run of a study: its name, parsed command line, report position, clock and cell counts."""

    name: str
    args: argparse.Namespace
    position: int | None = None
    started: float = field(default_factory=time.perf_counter)
    computed: int = 0
    cached: int = 0
    #: defining module of a cell function -> its code fingerprint (:meth:`cell_code`)
    codes: dict = field(default_factory=dict)

    @property
    def scale(self) -> str:
        """``"quick"``, ``"paper"`` or ``"full"`` (:data:`kvstats.study.sweep.SCALES`)."""
        return self.args.scale

    def sweep(self, cell: Callable[..., list[dict]], cells: Sequence[Mapping[str, Any]], *, version: str,
              name: str | None = None) -> pd.DataFrame:
        """Run ``cells`` through :class:`kvstats.study.sweep.Sweep` (named ``name``, default the study's) with the run's
        scheduler, workers, progress bar and recompute flag; return its table."""
        table = Sweep(name or self.name, cell, list(cells), version=f"{version}+code.{self.cell_code(cell)}").run(
            scheduler=self.args.scheduler, n_jobs=self.args.n_jobs, progress=not self.args.no_progress,
            recompute=self.args.recompute)
        info = table.attrs.get("sweep", {})
        self.computed += int(info.get("computed") or 0)
        self.cached += int(info.get("cached") or 0)
        return table

    def cell_code(self, cell: Callable[..., list[dict]]) -> str:
        """The fingerprint of the code a cell function runs (:func:`kvstats.study.fingerprint.function_fingerprint`),
        part of every cell's key: a cell stored by other code is computed again. Once per defining module and run."""
        module = getattr(cell, "__module__", None)
        if module not in self.codes:
            self.codes[module] = function_fingerprint(cell)
        return self.codes[module]

    def elapsed(self) -> float:
        """Wall seconds since :func:`start`."""
        return time.perf_counter() - self.started

    def finish(self, claims: Sequence[Mapping[str, Any]], *, definitions: Mapping[str, str] | None = None,
               echo: bool = True) -> int:
        """Write the claims (``figures/data/<study>_claims.json``, with scale and position) and the definitions
        (:func:`kvstats.study.report.write_definitions`: what the study's terms mean, generated from its
        configuration), print the wall time and the cell counts; return 0, the study's exit code."""
        write_claims(self.name, claims, scale=self.scale, position=self.position, echo=echo,
                     code=study_fingerprint(self.name))
        if definitions is not None:
            write_definitions(self.name, definitions)
        print(f"{self.name} done in {self.elapsed():.1f} s ({self.computed} cells computed, {self.cached} cached)")
        return 0


def start(name: str, description: str | None = None, argv: Sequence[str] | None = None, *,
          position: int | None = None, scales: Sequence[str] = SCALES) -> StudyRun:
    """Parse the study's command line (``--scale`` one of ``scales``, the ones the study runs at), write into that
    scale's folder (:func:`kvstats.study.paths.use_tier`) and start its clock."""
    args = study_args(description, argv, scales=scales)
    use_tier(args.scale)
    return StudyRun(name, args, position)


class Study:
    """A study on the typed protocol: it declares its sweeps, its analysis, its figures and its claims; the
    runner does the rest (command line, sweeps with the run's options, CSVs, claims, definitions, timing).

    Subclasses set ``name`` (``STUDY``), ``version`` (``VERSION``, the cells' cache version), ``position``
    (report order) and implement:

    * ``cells(scale)`` -> :data:`Sweeps`, ``{sweep name: (cell function, cells)}``, run in that order;
    * ``analyse(tables, scale)`` -> the study's analysis (any object; typically a frozen dataclass) from the
      sweeps' tables;
    * ``figures(tables, analysis)`` — write figures and CSVs (kvstats.study.plots);
    * ``claims(analysis)`` -> a list of :class:`kvstats.study.claims.Claim`;
    * ``definitions(analysis)`` -> ``{term: definition}`` or None (default).

    ``main(argv)`` is the script's entry point: ``sys.exit(MyStudy().main())``; ``echo`` prints each claim's verdict
    line (as :meth:`StudyRun.finish`).
    """

    name: str = ""
    version: str = ""
    #: sweep name -> its cache version, for a sweep whose cells changed apart from the others' (default ``version``)
    versions: Mapping[str, str] = {}
    position: int | None = None
    description: str | None = None
    #: the scales the study runs at (a study of descriptive claims alone leaves out ``paper``)
    scales: Sequence[str] = SCALES

    def cells(self, scale: str) -> Sweeps:
        raise NotImplementedError

    def analyse(self, tables: Mapping[str, pd.DataFrame], scale: str) -> Any:
        raise NotImplementedError

    def figures(self, tables: Mapping[str, pd.DataFrame], analysis: Any) -> None:
        raise NotImplementedError

    def claims(self, analysis: Any) -> list:
        raise NotImplementedError

    def definitions(self, analysis: Any) -> Mapping[str, str] | None:
        return None

    def run_sweeps(self, run: StudyRun) -> dict[str, pd.DataFrame]:
        """Run the declared sweeps with the run's options: ``{sweep name: table}``. A study with a sweep built from
        another's results overrides this (and calls it for the declared ones)."""
        return {name: run.sweep(cell, cells, version=self.versions.get(name, self.version), name=name)
                for name, (cell, cells) in self.cells(run.scale).items()}

    def main(self, argv: Sequence[str] | None = None, *, echo: bool = True) -> int:
        run = start(self.name, self.description, argv, position=self.position, scales=self.scales)
        tables = self.run_sweeps(run)
        analysis = self.analyse(tables, run.scale)
        self.figures(tables, analysis)
        return run.finish(self.claims(analysis), definitions=self.definitions(analysis), echo=echo)

