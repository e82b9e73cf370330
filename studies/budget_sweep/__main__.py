"""python studies/budget_sweep --scale quick|paper: run the study (kvstats reproduce runs it like this)."""

import sys

from kvstats.studies.budget_sweep import main

sys.exit(main())
