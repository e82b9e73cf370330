"""``python studies/end_to_end``: run the study (kvstats.studies.end_to_end)."""

import sys

from kvstats.studies.end_to_end import main

sys.exit(main())
