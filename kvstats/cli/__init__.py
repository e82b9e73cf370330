"""The ``kvstats`` command: :func:`main` (``kvstats ARGS``), with the parser :mod:`kvstats.cli.parser` builds from
the registry (:mod:`kvstats.cli.registry`), where each subcommand's module (evaluate, sensitivity, info, reproduce,
capture, codebook) registers it. The top tier of the tree (docs/design_notes.md): nothing in kvstats imports it.

    from kvstats.cli import main
    main(["codebook", "--dim", "64", "--bits", "3"])
"""

from kvstats.cli.parser import main

__all__ = ["main"]
