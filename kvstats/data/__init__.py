"""Data: synthetic generators, real Q/K/V capture from a causal LM, and safetensors storage."""
