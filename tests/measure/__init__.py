"""Tests of the tier measure (metrics, 6D error, inference, statistics, verdicts, test helpers)."""
