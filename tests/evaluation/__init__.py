"""Tests of the tier evaluation (kvstats.evaluate on synthetic data, captures and models)."""
