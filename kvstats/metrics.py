"""``kvstats.metrics``: the attention metrics: KL, top-k recall, errors of estimates.

A facade: the public names of :mod:`kvstats.measure.metrics`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.measure.metrics import *  # noqa: F403
from kvstats.measure.metrics import __all__  # noqa: F401
