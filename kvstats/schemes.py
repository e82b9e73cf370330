"""``kvstats.schemes``: the K + V schemes and their registry.

A facade: the public names of :mod:`kvstats.quant.schemes`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.quant.schemes import *  # noqa: F403
from kvstats.quant.schemes import __all__  # noqa: F401
