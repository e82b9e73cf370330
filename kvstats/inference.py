"""``kvstats.inference``: closed forms of the estimators' bias and variance.

A facade: the public names of :mod:`kvstats.measure.inference`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.measure.inference import *  # noqa: F403
from kvstats.measure.inference import __all__  # noqa: F401
