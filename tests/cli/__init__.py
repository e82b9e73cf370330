"""Tests of the tier cli (the kvstats command)."""
