"""``python -m kvstats.cli ARGS``: the ``kvstats`` command."""

import sys

from kvstats.cli import main

sys.exit(main())
