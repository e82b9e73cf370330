"""kvstats: statistics that survive review for KV-cache quantizers of LLM attention.

    import kvstats
    q = kvstats.quantizer("turbo_prod", bits=4, dim=128, seed=0)   # any quantizer by name
    s = kvstats.scheme("kqv", bits=4, dim=128, seed=0)             # a K + V scheme at budget n
    kvstats.register(MyQuantizer); kvstats.register_scheme("mine", factory)   # your own
    ev = kvstats.evaluate("kqv", bits=4, data="gaussian")          # every metric, checked and planned

The tree has tiers (docs/design_notes.md), each importing only those below it: ``kvstats.data`` (synthetic K/V,
the capture file format, the shipped texts), ``kvstats.quant`` (ops, rotations, codebooks, quantizers, schemes),
``kvstats.measure`` (metrics, error6d, inference, stats, verdicts, testing), ``kvstats.hf`` (the generation cache,
capture, baselines), ``kvstats.study`` (the sweep runner, the study protocol, claims, report, plots),
``kvstats.evaluation`` (evaluate, the model-evaluation engine, sensitivity) and ``kvstats.cli`` (the ``kvstats``
command); the private helpers sit at the bottom. Every module has one name. A few modules users import by a
short name are facades that re-export their home's public names: :mod:`kvstats.ops`, :mod:`kvstats.quantizers`,
:mod:`kvstats.schemes`, :mod:`kvstats.metrics`, :mod:`kvstats.error6d`, :mod:`kvstats.inference`,
:mod:`kvstats.stats`, :mod:`kvstats.testing` and :mod:`kvstats.cache`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvstats")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "evaluate", "evaluate_retrieval", "quantizer", "register", "register_scheme", "scheme"]

# Attributes load on first use (PEP 562), so ``import kvstats.cli.parser`` (``kvstats --help``) does not import torch.
_FUNCTIONS = {"quantizer": "kvstats.quant.quantizers", "register": "kvstats.quant.quantizers",
              "scheme": "kvstats.quant.schemes", "register_scheme": "kvstats.quant.schemes",
              "evaluate": "kvstats.evaluation.evaluator",
              "evaluate_retrieval": "kvstats.evaluation.retrieval"}


def __getattr__(name: str):
    if name in _FUNCTIONS:
        return getattr(importlib.import_module(_FUNCTIONS[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'kvstats' has no attribute {name!r}")
