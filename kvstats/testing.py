"""``kvstats.testing``: property tests for your own quantizers (check_quantizer, assert_unbiased).

A facade: the public names of :mod:`kvstats.measure.testing`,
where they live (their ``__module__``) and are documented.
"""

from kvstats.measure.testing import *  # noqa: F403
from kvstats.measure.testing import __all__  # noqa: F401
