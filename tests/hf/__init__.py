"""Tests of the tier hf (the cache inside transformers, architectures, capture, baselines)."""
