"""``kvstats retrieval``: retrieval through a quantized cache on a model, the fp model as control on the same trials
(docs/retrieval.md). Every option's value is refused with the option's own name before any work."""

from __future__ import annotations

import argparse
import sys

from kvstats.cli.evaluate import is_stdout
from kvstats.cli.registry import DTYPES, arg, current_folder_importable, seed_option, subcommand

__all__: list[str] = []


@subcommand(
    "retrieval",
    help="retrieval (passkey, induction, lookup) through a quantized KV cache on a model: accuracy with Wilson "
         "intervals, the fp model as control on the same trials, exact McNemar tests (Holm) and equivalence (TOST)",
    args=[
        arg("--quantizer", required=True, help="a scheme, a quantizer, a pair K/V or module:Class, as for evaluate"),
        arg("--bits", type=int, required=True, help="budget n: bits per cache element"),
        arg("--model", default="smollm2",
            help="'smollm2' (default), 'gemma3-270m', a Hugging Face model folder or a .gguf file"),
        arg("--compare", default=None, help="a second quantizer or scheme on the same trials"),
        arg("--match-bits", action="store_true",
            help="run --compare at its largest budget whose measured bits per element do not exceed the quantizer's"),
        arg("--tasks", nargs="+", default=["passkey", "induction", "lookup"],
            choices=["passkey", "induction", "lookup"], help="the tasks (default all three)"),
        arg("--lengths", type=int, nargs="+", default=[256, 1024], help="context lengths in tokens (default 256 1024)"),
        arg("--prompts", type=int, default=10, help="prompts per (task, length) (default 10)"),
        arg("--margin", type=float, default=0.05, help="equivalence margin δ of the TOST (default 0.05)"),
        arg("--alpha", type=float, default=0.05, help="level of the tests, Holm-corrected (default 0.05)"),
        arg("--discordance", type=float, default=0.1,
            help="the share of trials the caches are assumed to disagree on, for the plan (default 0.1)"),
        arg("--text", nargs="+", default=None, metavar="PATH",
            help="the haystack: your own text files or folders of .txt files instead of the shipped documents"),
        arg("--dtype", default=None, choices=["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
            help="the model's dtype (default float32)"),
        arg("--seed", type=seed_option, default=0, help="prompts and schemes (default 0; 'none': a fresh seed)"),
        arg("--rows", default=None, choices=["gaussian", "orthogonal", "srht"], help="sketch of every QJL stage"),
        arg("--no-check", action="store_true", help="skip the conformance checks (recorded in the results)"),
        arg("--nonlinear", action="store_true", help="the K estimator is not linear in the code (see evaluate)"),
        arg("--out", default=None,
            help="write the results JSON here (checked before any work; finished prompts are kept in OUT.units "
                 "until the end, so an interrupted run resumes)"),
        arg("--figure", default=None, help="write the heat map here (.png, .pdf or .svg)"),
        arg("--force", action="store_true", help="replace existing --out / --figure files"),
        arg("--json", action="store_true", help="print the results JSON instead of the table"),
        arg("--no-progress", action="store_true", help="no progress bar"),
    ],
)
def _retrieval(args: argparse.Namespace) -> int:
    from pathlib import Path

    current_folder_importable()
    from kvstats._files import check_output_path
    from kvstats._validation import check_int_range
    from kvstats.hf.capture import model_files

    check_int_range(args.bits, "--bits", 1, 8)
    check_int_range(args.prompts, "--prompts", 1, 1 << 20)
    for n in args.lengths:
        check_int_range(n, "--lengths", 64, 1 << 22)
    for flag, value, high in (("--alpha", args.alpha, 0.5), ("--margin", args.margin, 1.0),
                              ("--discordance", args.discordance, 1.0)):
        if not 0 < value < high:
            raise ValueError(f"{flag} must be in (0, {high:g}), got {value}")
    if args.match_bits and args.compare is None:
        raise ValueError("--match-bits has no effect without --compare: it sets the budget of the compared scheme")
    inputs = model_files(args.model)
    if args.out is not None:
        check_output_path(args.out, "--out", force=args.force, inputs=inputs)
    if args.figure is not None:
        if args.out is not None and Path(args.figure).resolve() == Path(args.out).resolve():
            raise ValueError(f"--figure {args.figure!r} is --out: give the figure its own path")
        if Path(args.figure).suffix.lower() not in (".png", ".pdf", ".svg"):
            raise ValueError(f"--figure must end in .png, .pdf or .svg, got {args.figure!r}")
        check_output_path(args.figure, "--figure", force=args.force, inputs=inputs)
    import torch

    from kvstats.evaluation.retrieval import evaluate_retrieval

    documents = None
    if args.text is not None:
        from kvstats.data.texts import read_documents

        documents = read_documents(args.text)
    options = {"rows": args.rows} if args.rows else {}
    ev = evaluate_retrieval(args.quantizer, bits=args.bits, model=args.model, compare=args.compare,
                            match_bits=args.match_bits, tasks=args.tasks, lengths=args.lengths, prompts=args.prompts,
                            margin=args.margin, alpha=args.alpha, discordance=args.discordance, seed=args.seed,
                            documents=documents, check=not args.no_check, linear=not args.nonlinear, out=args.out,
                            force=args.force, progress=not args.no_progress,
                            dtype=torch.float32 if args.dtype is None else getattr(torch, DTYPES[args.dtype]),
                            **options)
    if args.figure is not None:
        ev.figure(args.figure, force=args.force)
        print(f"figure: {args.figure}", file=sys.stderr)
    if not (args.json and is_stdout(args.out)):
        print(ev.to_json() if args.json else ev.table())
    if args.out:
        print(f"results: {args.out}", file=sys.stderr)
    return 0
