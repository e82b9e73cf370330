"""The registry of ``kvstats`` subcommands and the option types they share.

A subcommand is a decorated function ``fn(args) -> exit code``; :mod:`kvstats.cli.parser` builds the parser from
:data:`COMMANDS` (in registration order)::

    @subcommand("codebook", help="print one codebook", args=[arg("--dim", type=int, required=True)])
    def _codebook(args) -> int:
        ...
        return 0

Heavy imports happen inside the command functions so ``kvstats --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["COMMANDS", "DTYPES", "Arg", "arg", "current_folder_importable", "print_payload", "seed_option",
           "subcommand"]


@dataclass(frozen=True)
class Arg:
    """One argparse argument of a subcommand (:func:`arg`)."""

    flags: tuple[str, ...]
    options: dict = field(default_factory=dict)


def arg(*flags: str, **options) -> Arg:
    """One argparse argument of a subcommand: the same signature as ``parser.add_argument``."""
    return Arg(flags, options)


COMMANDS: dict[str, tuple[str, list[Arg], Callable[[argparse.Namespace], int]]] = {}


def subcommand(name: str, *, help: str, args: list[Arg] | None = None):
    """Register ``fn(args) -> exit code`` as ``kvstats NAME``."""

    def register(fn: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (help, list(args or []), fn)
        return fn

    return register


def current_folder_importable() -> None:
    """Put the current folder on ``sys.path`` (as ``python -m`` does), so a ``module:Class`` quantizer defined there
    imports."""
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def print_payload(payload: dict, as_json: bool) -> None:
    """A command's result: JSON, or one aligned ``key  value`` line per entry."""
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
        return
    width = max(len(k) for k in payload)
    for key, value in payload.items():
        print(f"{key:<{width}}  {value}")


def seed_option(text: str):
    """--seed: an int, or 'none' for fresh entropy (recorded in the results)."""
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or 'none', got {text!r}") from None


#: --dtype names of the capture and evaluate commands
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
          "fp16": "float16"}
