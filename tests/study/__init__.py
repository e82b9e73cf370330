"""Tests of the tier study (the sweep runner, its workers, the study protocol, reproducibility)."""
