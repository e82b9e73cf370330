"""Tests of the tier studies (each study's cells, rules and claims at a tiny scale)."""
