"""``kvstats.cache``: the quantized KV cache for transformers.

A facade: the public names of :mod:`kvstats.hf.cache`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.hf.cache import *  # noqa: F403
from kvstats.hf.cache import __all__  # noqa: F401
