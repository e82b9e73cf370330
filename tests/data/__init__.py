"""Tests of the tier data (synthetic K/V, the capture file format)."""
