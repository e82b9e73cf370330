"""``kvstats recipe``: a per-layer, per-K/V precision recipe under bit budgets, measured and checked
(docs/recipe.md). Every option's value is refused with the option's own name before any work."""

from __future__ import annotations

import argparse
import sys

from kvstats.cli.evaluate import is_stdout
from kvstats.cli.registry import DTYPES, arg, seed_option, subcommand

__all__: list[str] = []


@subcommand(
    "recipe",
    help="a format per layer and per K/V under bit budgets: isolated damage of each candidate format on each "
         "layer's K and V, the map that minimises it under the budget (scipy milp) with its bootstrap stability, "
         "its measured damage against the predicted sum (additivity) and against uniform precision at equal bits",
    args=[
        arg("--formats", nargs="+", required=True,
            help="candidate formats: name@bits of registered quantizers (int_token@2, nvfp4@4, fp8_e4m3@8) or exact"),
        arg("--budgets", type=float, nargs="+", required=True, help="mean bits per element the codes hold"),
        arg("--model", default="smollm2",
            help="'smollm2' (default), 'gemma3-270m', a Hugging Face model folder or a .gguf file"),
        arg("--documents", type=int, default=8, help="documents, one segment each (default 8; 0: all)"),
        arg("--text", nargs="+", default=None, metavar="PATH", help="your own documents (text files or folders)"),
        arg("--segment", type=int, default=128, help="tokens per document segment (default 128)"),
        arg("--dtype", default=None, choices=["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
            help="the model's dtype (default float32)"),
        arg("--margin", type=float, default=0.2,
            help="additivity margin, a fraction of the predicted damage (default 0.2)"),
        arg("--resamples", type=int, default=200, help="bootstrap resamples for each map's stability (default 200)"),
        arg("--alpha", type=float, default=0.05, help="level of the comparison with uniform precision, Holm"),
        arg("--seed", type=seed_option, default=0, help="the quantizers' seed (default 0)"),
        arg("--per-layer", action="store_true",
            help="one format per layer for K and V together, as engines store one KV-cache dtype per layer"),
        arg("--refine", type=int, default=3,
            help="other maps the bootstrap resamples chose, measured end to end beside the solver's (default 3)"),
        arg("--export", default=None, metavar="FOLDER",
            help="write each budget's solver map there (map_<budget>bits.json, kvstats-kv-layer-map/1) and, where "
                 "engines can hold it, its per-layer KV dtypes (map_<budget>bits.engine.json)"),
        arg("--out", default=None, help="write the results JSON here (finished documents kept in OUT.units)"),
        arg("--force", action="store_true", help="replace existing files"),
        arg("--json", action="store_true", help="print the results JSON instead of the table"),
        arg("--no-progress", action="store_true", help="no progress lines"),
    ],
)
def _recipe(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kvstats._files import check_output_path
    from kvstats._validation import check_int_range
    from kvstats.evaluation.layer_recipe import format_width
    from kvstats.hf.capture import model_files

    for f in args.formats:
        try:
            format_width(f)
        except ValueError as exc:
            raise ValueError(f"--formats: {exc}") from None
    check_int_range(args.documents, "--documents", 0, 1 << 20)
    if args.documents == 1:
        raise ValueError("--documents must be 0 (all) or at least 2, got 1")
    check_int_range(args.segment, "--segment", 2, 1 << 20)
    check_int_range(args.resamples, "--resamples", 10, 1 << 20)
    check_int_range(args.refine, "--refine", 0, 1 << 10)
    if not 0 < args.margin < 1:
        raise ValueError(f"--margin must be in (0, 1), got {args.margin}")
    if not 0 < args.alpha < 1:
        raise ValueError(f"--alpha must be in (0, 1), got {args.alpha}")
    inputs = model_files(args.model)
    if args.out is not None:
        check_output_path(args.out, "--out", force=args.force, inputs=inputs)
    maps = {}
    if args.export is not None:
        folder = Path(args.export)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--export {args.export!r} is a file, not a folder")
        maps = {b: folder / f"map_{b:g}bits.json" for b in args.budgets}
        for path in maps.values():
            check_output_path(path, "--export", force=args.force, inputs=inputs)
            check_output_path(_engine_path(path), "--export", force=args.force, inputs=inputs)
    import torch

    from kvstats.evaluation.recipe_run import recipe

    documents = None
    if args.text is not None:
        from kvstats.data.texts import read_documents

        documents = read_documents(args.text)
    result = recipe(args.formats, budgets=args.budgets, model=args.model, documents_used=args.documents or None,
                    segment=args.segment, documents=documents, seed=args.seed, margin=args.margin,
                    resamples=args.resamples, alpha=args.alpha, out=args.out, force=args.force,
                    progress=not args.no_progress, tie_kv=args.per_layer, refine=args.refine,
                    dtype=torch.float32 if args.dtype is None else getattr(torch, DTYPES[args.dtype]))
    for b, path in maps.items():
        _export(result.map(b), path, args.force, result.config["dtype"])
    if not (args.json and is_stdout(args.out)):
        print(result.to_json() if args.json else result.table())
    return 0


def _engine_path(path):
    return path.with_name(path.name.removesuffix(".json") + ".engine.json")


def _export(m, path, force: bool, dtype: str) -> None:
    """The layer map at ``path``, and its engine forms beside it where engines can hold it (else why not, and an
    engine file of an earlier run there removed: ``--force`` allowed replacing it, and it described another map)."""
    import json

    from kvstats._files import write_output
    from kvstats.evaluation.recipe_export import engine_export

    path.parent.mkdir(parents=True, exist_ok=True)
    m.save(path, force=force)
    print(f"map: {path}", file=sys.stderr)
    try:
        engine = engine_export(m)
    except ValueError as exc:
        _engine_path(path).unlink(missing_ok=True)
        print(f"  no engine form: {exc}", file=sys.stderr)
        return
    engine["measured_dtype"] = dtype  # "auto" layers were measured at this dtype; an engine runs the checkpoint's
    write_output(_engine_path(path), (json.dumps(engine, indent=2) + "\n").encode())
    print(f"  engine form: {_engine_path(path)} (per-layer spec {engine['layer_spec']})", file=sys.stderr)
