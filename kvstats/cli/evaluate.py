"""``kvstats evaluate``: a user's quantizer measured on synthetic data, a capture or a model (docs/evaluate.md).
Every option's value is refused with the option's own name before any work."""

from __future__ import annotations

import argparse
import sys

from kvstats.cli.registry import DTYPES, arg, current_folder_importable, seed_option, subcommand

__all__: list[str] = []


@subcommand(
    "evaluate",
    help="every metric of a quantizer or scheme (attention KL, top-k recall, the 6D components, bits per "
         "element held) with CIs over independent units, after the conformance checks; or, with --model, its output "
         "damage on a language model (next-token KL tail, top-1, perplexity); optionally a paired comparison",
    args=[
        arg("--quantizer", required=True,
            help="a scheme (kv, kqv, qkqv, minmax, kivi), a quantizer (turbo_mse, fp8_e4m3, nvfp4, int_token, ...) "
                 "used for K and V, a pair K/V of quantizers with optional widths (fp8_e4m3/nvfp4 at --bits 6, "
                 "int_token@8/int_token@4; the budget is the mean width), or module:Class (imported from the "
                 "current folder too, as python -m does)"),
        arg("--bits", type=int, required=True, help="budget n: bits per cache element"),
        arg("--data", default=None,
            help="a synthetic kind (gaussian, heavy_tail, low_rank; default gaussian) or a capture file from "
                 "`kvstats capture`"),
        arg("--model", default=None,
            help="evaluate on a language model instead: 'smollm2', 'gemma3-270m', a Hugging Face model folder or a "
                 ".gguf file (output damage over teacher-forced segments of the shipped documents)"),
        arg("--text", nargs="+", default=None, metavar="PATH",
            help="--model: your own documents instead of the shipped ones: text files (one document each, named by "
                 "the file) or folders of .txt files"),
        arg("--segment", type=int, default=None, help="--model: tokens per segment (default 128)"),
        arg("--segments-per-document", type=int, default=1,
            help="--model: disjoint segments of each document (default 1; 0: all)"),
        arg("--exact-window", type=int, default=0,
            help="--model: the most recent tokens the cache keeps exact (default 0)"),
        arg("--dtype", default=None, choices=["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
            help="--model: the model's dtype (default float32)"),
        arg("--units", type=int, default=None,
            help="independent units (synthetic: draws, default 16; capture: disjoint windows, default all)"),
        arg("--window", type=int, default=None, help="capture: tokens per unit (default 64)"),
        arg("--layers", type=int, nargs="+", default=None, help="capture: the stored layers to use (default all)"),
        arg("--compare", default=None, help="a second quantizer or scheme, compared on the same units (Wilcoxon)"),
        arg("--match-bits", action="store_true",
            help="run --compare at its largest budget whose measured bits per element do not exceed the quantizer's"),
        arg("--alpha", type=float, default=0.05, help="level of the comparison, Holm-corrected (default 0.05)"),
        arg("--seed", type=seed_option, default=0,
            help="unit i uses child i of SeedSequence(seed) (default 0; 'none': a fresh seed)"),
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
    import warnings

    current_folder_importable()
    from kvstats.evaluation.evaluator import evaluate
    from kvstats.measure.stats import InferenceOptions

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
        common = dict(compare=args.compare, match_bits=args.match_bits, inference=InferenceOptions(alpha=args.alpha),
                      seed=args.seed,
                      check=not args.no_check, linear=not args.nonlinear, out=args.out, force=args.force,
                      progress=not args.no_progress, **options)
        if args.model is not None:
            if args.data is not None or args.units is not None:
                raise ValueError("give --data (and --units) or --model, not both")
        elif args.dtype is not None:
            raise ValueError("--dtype is for --model (a capture keeps the dtype it was captured in)")
        elif args.text is not None:
            raise ValueError("--text is for --model (its documents); a capture holds its own text: `kvstats capture "
                             "--text`")
        if args.model is not None:
            import torch

            from kvstats.data.texts import read_documents

            texts = None if args.text is None else read_documents(args.text)
            ev = evaluate(args.quantizer, bits=args.bits, model=args.model, segment=args.segment, documents=texts,
                          segments_per_document=args.segments_per_document or None,
                          full_precision_window=args.exact_window,
                          dtype=None if args.dtype is None else getattr(torch, DTYPES[args.dtype]), **common)
        else:
            ev = evaluate(args.quantizer, bits=args.bits, data=args.data or "gaussian", units=args.units,
                          window=args.window, layers=args.layers, top_k=args.top_k, dim=args.dim, **common)
    if not (args.json and is_stdout(args.out)):  # --json --out /dev/stdout: the JSON is there already
        print(ev.to_json() if args.json else ev.table())
    if args.out:
        print(f"results: {args.out}", file=sys.stderr)
    return 0


def is_stdout(path) -> bool:
    """Whether ``path`` is this process's standard output (``--out /dev/stdout``, piped or redirected)."""
    import os

    if path is None:
        return False
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError):  # no such file; a stdout without a descriptor (captured)
        return False


def _check_evaluate_options(args: argparse.Namespace) -> None:
    """The options' values, refused with the option's own name before any work (evaluate names its arguments),
    and options that would have no effect (--match-bits without --compare, --layers or --window without a
    capture)."""
    from pathlib import Path

    from kvstats._files import check_output_path
    from kvstats._validation import check_int_range
    from kvstats.data.synthetic import KINDS

    if args.match_bits and args.compare is None:
        raise ValueError("--match-bits has no effect without --compare: it sets the budget of the compared scheme")
    where = f"--model {args.model}" if args.model is not None else \
        f"synthetic data {args.data or 'gaussian'}" if (args.data or "gaussian") in KINDS else None
    for flag, value, what in (("--layers", args.layers, "the stored layers"), ("--window", args.window,
                                                                               "the tokens of a unit")):
        if where is not None and value is not None:
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            raise ValueError(f"{flag} {shown} has no effect on {where}: it sets {what} of a capture file (--data "
                             "CAPTURE)")

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
