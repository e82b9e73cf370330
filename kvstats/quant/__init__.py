"""The quantizers and what they are built from: the op library's wrappers (:mod:`kvstats.quant.ops`), bit packing,
rotations and sketches, the Lloyd–Max codebooks and the sphere law they are solved on, the attention math a scheme
computes, the quantizers themselves, the schemes (a K and a V quantizer) and the conformance kit they owe.

The lowest tier of the tree (docs/design_notes.md): it imports nothing of measure/, hf/ or run/.
"""
