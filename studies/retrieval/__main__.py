"""``python studies/retrieval``: run the study (kvstats.studies.retrieval)."""

import sys

from kvstats.studies.retrieval import main

sys.exit(main())
