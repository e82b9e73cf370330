"""``kvstats sensitivity``: per-layer sensitivity of a quantizer on a model (docs/evaluate.md, "Which layers").
Every option's value is refused with the option's own name before any work."""

from __future__ import annotations

import argparse
import sys

from kvstats.cli.evaluate import is_stdout
from kvstats.cli.registry import arg, current_folder_importable, seed_option, subcommand

__all__: list[str] = []


@subcommand(
    "sensitivity",
    help="per-layer sensitivity of a model to a quantizer: the output damage of quantizing each layer alone and "
         "of keeping it exact, and the smallest measured set of layers to keep exact for a target damage",
    args=[
        arg("--quantizer", required=True, help="a scheme, a quantizer (K and V) or module:Class, as for evaluate"),
        arg("--bits", type=int, required=True, help="budget n: bits per cache element"),
        arg("--model", default="smollm2",
            help="'smollm2' (default), 'gemma3-270m', a Hugging Face model folder or a .gguf file"),
        arg("--documents", type=int, default=8,
            help="how many documents (one segment each) every configuration runs (default 8; 0: all)"),
        arg("--text", nargs="+", default=None, metavar="PATH",
            help="your own documents instead of the shipped ones: text files (one document each, named by the file) "
                 "or folders of .txt files"),
        arg("--segment", type=int, default=128, help="tokens per document segment (default 128)"),
        arg("--target", type=float, default=None,
            help="the mean next-token KL (nats) to reach by keeping layers exact (default: half of quantizing all)"),
        arg("--seed", type=seed_option, default=0, help="the schemes' seed (default 0)"),
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
    import math
    from pathlib import Path

    current_folder_importable()
    from kvstats._files import check_output_path
    from kvstats._validation import check_int_range
    from kvstats.evaluation.sensitivity import sensitivity
    from kvstats.hf.capture import model_files

    if args.target is not None and not (math.isfinite(args.target) and args.target >= 0):
        raise ValueError(f"--target must be a finite number >= 0 (a mean next-token KL in nats), got {args.target}")
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
    if args.text is not None:
        from kvstats.data.texts import read_documents

        options["documents"] = read_documents(args.text)
    result = sensitivity(args.quantizer, bits=args.bits, model=args.model, documents_used=args.documents or None,
                         segment=args.segment, target=args.target, seed=args.seed, check=not args.no_check,
                         linear=not args.nonlinear, out=args.out, force=args.force, progress=not args.no_progress,
                         **options)
    if figure is not None:
        result.figure(figure, force=args.force)
        print(f"figure: {figure}", file=sys.stderr)
    if not (args.json and is_stdout(args.out)):  # --json --out /dev/stdout: the JSON is there already
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
