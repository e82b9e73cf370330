"""``kvstats reproduce``: every study script that runs at the scale, then the tier's REPORT.md (docs/studies.md).

``--scale paper`` (the everyday report) writes figures/ and sets the full tier's rows (figures/full) beside its own;
``--scale full`` writes figures/full (kvstats.study.paths.use_tier), best through a Dask cluster (``--scheduler``).
A study that does not run at the scale (its ``SCALES``) is skipped and named."""

from __future__ import annotations

import argparse
import sys

from kvstats.cli.registry import arg, subcommand
from kvstats.study.scales import SCALES

__all__: list[str] = []


@subcommand(
    "reproduce",
    help="run every study script (figures/*.png, figures/data/*.csv) and rebuild figures/REPORT.md",
    args=[
        arg("--scale", choices=list(SCALES), default="quick",
            help="quick (smoke run), paper (the everyday report, ~20 min on 2 cores) or full (figures/full: the "
                 "second model, descriptive sweeps, long contexts; a cluster's work) (default quick)"),
        arg("--studies-dir", default=None,
            help="folder of study scripts (default: the studies shipped with kvstats, kvstats.studies)"),
        arg("--only", nargs="*", default=None, help="run only these studies (names without .py)"),
        arg("--scheduler", default=None, help="Dask scheduler address (default: joblib on all cores)"),
        arg("--n-jobs", type=int, default=None, help="joblib workers (default: all cores; 1 runs cells in this "
                                                     "process)"),
        arg("--isolate", action="store_true",
            help="run each study in its own Python process (default: all in this process, sharing one pool of "
                 "joblib workers, which saves each study's start-up: imports and worker spawn)"),
    ],
)
def _reproduce(args: argparse.Namespace) -> int:
    import os
    import subprocess
    import time
    from pathlib import Path

    studies_dir = Path(args.studies_dir) if args.studies_dir else _shipped_studies()
    if not studies_dir.is_dir():
        raise FileNotFoundError(f"--studies-dir {studies_dir} is not a folder")
    scripts = sorted(study_entries(studies_dir), key=lambda p: p.stem)
    if args.only:
        unknown = set(args.only) - {p.stem for p in scripts}
        if unknown:
            raise ValueError(f"--only names unknown studies {sorted(unknown)}; known: {[p.stem for p in scripts]}")
        scripts = [p for p in scripts if p.stem in args.only]
    if not scripts:
        print(f"no study scripts in {studies_dir}")
        return 0
    from kvstats.study.paths import use_tier
    from kvstats.study.report import DEFAULT_PREAMBLE, build_report, script_scales, study_order, write_timings

    runs_at = {p.stem: script_scales(p) for p in scripts}
    skipped = {p.stem: runs_at[p.stem] for p in scripts if args.scale not in runs_at[p.stem]}
    for name, scales in sorted(skipped.items()):
        print(f"skipping {name}: it runs at {', '.join(scales)} scale"
              + (" (the report takes its rows from the full tier)" if args.scale == "paper" else ""))
    scripts = [p for p in scripts if p.stem not in skipped]
    if not scripts:
        print(f"no study runs at {args.scale} scale in {studies_dir}")
        return 0
    folder = use_tier(args.scale)  # the full tier writes figures/full; the study scripts (and subprocesses) inherit it
    extra = (["--scale", args.scale] + (["--scheduler", args.scheduler] if args.scheduler else [])
             + (["--n-jobs", str(args.n_jobs)] if args.n_jobs is not None else []))
    env = dict(os.environ, MPLBACKEND="Agg")

    if not args.isolate and not args.scheduler and args.n_jobs != 1:
        from kvstats.study.sweep import warm_workers

        warm_workers()  # the joblib pool starts while the first studies run
    by_name = {p.stem: p for p in scripts}
    timings: dict[str, float] = {}
    failed: dict[str, int] = {}
    t_all = time.perf_counter()
    for i, name in enumerate(study_order(by_name), 1):
        print(f"[{i}/{len(scripts)}] {name}", flush=True)
        t0 = time.perf_counter()
        if args.isolate:
            code = subprocess.run([sys.executable, str(by_name[name]), *extra], env=env).returncode
        else:
            code = _run_script(by_name[name], extra)
        timings[name] = time.perf_counter() - t0
        if code != 0:  # keep going: the other studies and the report are still worth having
            print(f"study {name} failed (exit {code})", file=sys.stderr)
            failed[name] = code
    write_timings(timings, scale=args.scale, figures_dir=folder,
                  note=f"{os.cpu_count()} CPUs, " + (f"Dask {args.scheduler}" if args.scheduler else
                                                     f"joblib, {args.n_jobs or os.cpu_count()} worker(s)"))
    # the report holds what this run ran (a partial run reports only its studies) and, beside a paper run's, the
    # full tier's rows
    # (the timings as recorded: the report is rebuilt from the folder's files alone, tests/studies/test_committed.py)
    report = build_report(folder, scale=args.scale, studies=study_order(by_name), preamble=DEFAULT_PREAMBLE,
                          failed=sorted(failed))
    print(f"all studies done in {time.perf_counter() - t_all:.0f} s; report: {report}")
    if failed:
        print(f"failed studies: {', '.join(failed)}", file=sys.stderr)
        return next(iter(failed.values()))
    return 0


def study_entries(studies_dir):
    """The studies of a folder: each script ``<name>.py`` and each package ``<name>/`` that runs as a program (has a
    ``__main__.py``); names starting with ``_`` are helpers, not studies."""
    return [p for p in studies_dir.iterdir() if not p.name.startswith(("_", "."))
            and ((p.suffix == ".py" and p.is_file()) or (p.is_dir() and (p / "__main__.py").is_file()))]


def _shipped_studies():
    """The folder of the study scripts installed with kvstats (``kvstats.studies``; ``studies/`` in the repository)."""
    from importlib.resources import files
    from pathlib import Path

    return Path(str(files("kvstats.studies")))


def _run_script(path, argv: list[str]) -> int:
    """Run a study script or package in this process as ``__main__`` (like ``python path *argv``); its exit code."""
    import os
    import runpy
    import traceback

    os.environ.setdefault("MPLBACKEND", "Agg")
    saved = sys.argv
    sys.argv = [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # noqa: BLE001 - report the study's failure like a subprocess would
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved
