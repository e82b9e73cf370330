"""kvstats: statistics that survive review for KV-cache quantizers of LLM attention.

    import kvstats
    q = kvstats.quantizer("turbo_prod", bits=4, dim=128, seed=0)   # any quantizer by name
    s = kvstats.scheme("kqv", bits=4, dim=128, seed=0)             # a K + V scheme at budget n
    kvstats.register(MyQuantizer); kvstats.register_scheme("mine", factory)   # your own

Modules: sphere, codebooks, rotations, quantizers, schemes, ops (the compiled kernels), data, metrics,
inference, stats, sweep, plots, report. See README.md and docs/.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvstats")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "ops", "rotations", "evaluate", "quantizer", "register", "register_scheme", "scheme"]

# Attributes and submodules load on first use (PEP 562), so ``import kvstats.cli`` (``kvstats --help``) does
# not import torch: ``kvstats.quantizer``, ``kvstats.scheme``, ... and every submodule (``kvstats.metrics``).
_FUNCTIONS = {"quantizer": "kvstats.quantizers", "register": "kvstats.quantizers",
              "scheme": "kvstats.schemes", "register_scheme": "kvstats.schemes", "evaluate": "kvstats.evaluation"}


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name in _FUNCTIONS:
        return getattr(importlib.import_module(_FUNCTIONS[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'kvstats' has no attribute {name!r}")
