"""python studies/nova --scale quick|paper: run the study (kvstats reproduce runs it like this)."""

import sys

from kvstats.studies.nova import main

sys.exit(main())
