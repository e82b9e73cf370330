"""python studies/qjl_variance --scale quick|paper: run the study (kvstats reproduce runs it like this)."""

import sys

from kvstats.studies.qjl_variance import main

sys.exit(main())
