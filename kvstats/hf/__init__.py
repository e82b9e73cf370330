"""The Hugging Face side: the generation cache that stores K and V through a scheme (:mod:`kvstats.hf.cache`),
capture of real queries, keys and values from a model (:mod:`kvstats.hf.capture`), and transformers' own quantized
caches as baselines (:mod:`kvstats.hf.baselines`).

Above quant/ and measure/, below run/ (docs/design_notes.md). Needs the [models] extra (transformers).
"""
