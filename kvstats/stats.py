"""``kvstats.stats``: the statistical tests and intervals, scipy.stats style results.

A facade: the public names of :mod:`kvstats.measure.stats`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.measure.stats import *  # noqa: F403
from kvstats.measure.stats import __all__  # noqa: F401
