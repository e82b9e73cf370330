"""``kvstats.error6d``: the 6D error of a scheme and the distance between schemes' clouds.

A facade: the public names of :mod:`kvstats.measure.error6d`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.measure.error6d import *  # noqa: F403
from kvstats.measure.error6d import __all__  # noqa: F401
