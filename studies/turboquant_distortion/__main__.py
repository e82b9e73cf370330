"""python studies/turboquant_distortion --scale quick|paper: run the study (kvstats reproduce runs it like this)."""

import sys

from kvstats.studies.turboquant_distortion import main

sys.exit(main())
