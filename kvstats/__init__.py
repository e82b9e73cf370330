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

from kvstats import ops, rotations  # noqa: E402
from kvstats.quantizers import quantizer, register  # noqa: E402
from kvstats.schemes import register_scheme, scheme  # noqa: E402

__all__ = ["__version__", "ops", "rotations", "quantizer", "register", "register_scheme", "scheme"]
