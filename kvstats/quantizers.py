"""``kvstats.quantizers``: the quantizers: the registry, the protocol's base classes.

A facade: the public names of :mod:`kvstats.quant.quantizers`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.quant.quantizers import *  # noqa: F403
from kvstats.quant.quantizers import __all__  # noqa: F401
