"""kvstats: statistics that survive review for KV-cache quantizers of LLM attention.

    import kvstats
    q = kvstats.quantizer("turbo_prod", bits=4, dim=128, seed=0)   # any quantizer by name
    s = kvstats.scheme("kqv", bits=4, dim=128, seed=0)             # a K + V scheme at budget n
    kvstats.register(MyQuantizer); kvstats.register_scheme("mine", factory)   # your own
    ev = kvstats.evaluate("kqv", bits=4, data="gaussian")          # every metric, checked and planned

The tree has tiers (docs/design_notes.md), each importing only those below it: ``kvstats.quant`` (ops, rotations,
codebooks, quantizers, schemes), ``kvstats.measure`` (metrics, error6d, inference, stats, verdicts, testing),
``kvstats.hf`` (the generation cache, capture, baselines) and ``kvstats.run`` (evaluate, sensitivity, the study
runner, report, plots, the ``kvstats`` command); ``kvstats.data`` (synthetic K/V, the capture file format, the
shipped texts) and the private helpers sit at the bottom. The modules' short names users import —
``kvstats.stats``, ``kvstats.metrics``, ``kvstats.cache``, ``kvstats.quantizers``, ... (:data:`SHORT_NAMES`) — are
the same module objects under the names they had before the tiers (an import of one is an import of the other).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvstats")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "evaluate", "quantizer", "register", "register_scheme", "scheme"]

#: short module name -> its home in the tiers; ``import kvstats.<short>`` gives the very module object
SHORT_NAMES = {
    "kvstats.ops": "kvstats.quant.ops", "kvstats.packing": "kvstats.quant.packing",
    "kvstats.rotations": "kvstats.quant.rotations", "kvstats.codebooks": "kvstats.quant.codebooks",
    "kvstats.sphere": "kvstats.quant.sphere", "kvstats.attention": "kvstats.quant.attention",
    "kvstats.quantizers": "kvstats.quant.quantizers", "kvstats.schemes": "kvstats.quant.schemes",
    "kvstats.conformance": "kvstats.quant.conformance",
    "kvstats.metrics": "kvstats.measure.metrics", "kvstats.error6d": "kvstats.measure.error6d",
    "kvstats.inference": "kvstats.measure.inference", "kvstats.stats": "kvstats.measure.stats",
    "kvstats.verdicts": "kvstats.measure.verdicts", "kvstats.testing": "kvstats.measure.testing",
    "kvstats.cache": "kvstats.hf.cache", "kvstats.baselines": "kvstats.hf.baselines",
    "kvstats.data.real": "kvstats.hf.capture",
    "kvstats.evaluation": "kvstats.run.evaluation", "kvstats.sweep": "kvstats.run.sweep",
    "kvstats.study": "kvstats.run.study", "kvstats.report": "kvstats.run.report", "kvstats.plots": "kvstats.run.plots",
    "kvstats.paths": "kvstats.run.paths", "kvstats.cli": "kvstats.run.cli",
}


def _home(name: str) -> str | None:
    """The tiered name of a short module name or of one of its submodules (``kvstats.quantizers.base``)."""
    for short, home in SHORT_NAMES.items():
        if name == short or name.startswith(short + "."):
            return home + name[len(short):]
    return None


class _ShortNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a short module name as its tiered module (the same object, registered under both names)."""

    def find_spec(self, name, path=None, target=None):
        home = _home(name)
        if home is None:
            return None
        spec = importlib.util.find_spec(home)
        return importlib.machinery.ModuleSpec(name, self, is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec):
        return importlib.import_module(_home(spec.name))

    def exec_module(self, module):  # the tiered module is already executed
        sys.modules[module.__spec__.name if module.__spec__ else module.__name__] = module


if not any(isinstance(f, _ShortNames) for f in sys.meta_path):
    sys.meta_path.insert(0, _ShortNames())

# Attributes and submodules load on first use (PEP 562), so ``import kvstats.run.cli`` (``kvstats --help``) does
# not import torch: ``kvstats.quantizer``, ``kvstats.scheme``, ... and every submodule (``kvstats.metrics``).
_FUNCTIONS = {"quantizer": "kvstats.quant.quantizers", "register": "kvstats.quant.quantizers",
              "scheme": "kvstats.quant.schemes", "register_scheme": "kvstats.quant.schemes",
              "evaluate": "kvstats.run.evaluation"}


def __getattr__(name: str):
    if name in _FUNCTIONS:
        return getattr(importlib.import_module(_FUNCTIONS[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'kvstats' has no attribute {name!r}")
