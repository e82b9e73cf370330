"""kvstats: statistics that survive review for KV-cache quantizers of LLM attention."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvstats")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

from kvstats import ops, rotations  # noqa: E402

__all__ = ["__version__", "ops", "rotations"]
