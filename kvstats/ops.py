"""``kvstats.ops``: the op library: one typed wrapper per op and its pure-torch reference.

A facade: the public names of :mod:`kvstats.quant.ops`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.quant.ops import *  # noqa: F403
from kvstats.quant.ops import __all__  # noqa: F401
