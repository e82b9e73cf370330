"""Tests of the tier quant (ops, kernels, quantizers, schemes, the conformance kit)."""
