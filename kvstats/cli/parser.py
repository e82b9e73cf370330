"""The ``kvstats`` command: its parser, built from the registry of :mod:`kvstats.cli.registry`, where each
subcommand's module (``kvstats.cli.<name>``) registers it. Heavy imports happen inside the command functions so
``kvstats --help`` stays instant.
"""

from __future__ import annotations

import argparse
import sys

# the subcommands register themselves on import, in the order --help lists them
from kvstats.cli import capture, codebook, evaluate, info, recipe, reproduce, retrieval, sensitivity  # noqa: F401
from kvstats.cli.registry import COMMANDS

__all__ = ["ORDER", "build_parser", "main"]

#: The order ``kvstats --help`` lists the subcommands in (any other registered one follows).
ORDER = ("evaluate", "retrieval", "sensitivity", "recipe", "info", "reproduce", "capture", "codebook")


def build_parser() -> argparse.ArgumentParser:
    from kvstats import __version__

    parser = argparse.ArgumentParser(
        prog="kvstats", description="Statistics that survive review for KV-cache quantizers."
    )
    parser.add_argument("--version", action="version", version=f"kvstats {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in sorted(COMMANDS, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        help_text, arguments, fn = COMMANDS[name]
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


if __name__ == "__main__":
    sys.exit(main())
