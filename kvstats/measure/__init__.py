"""The measurements: metrics (attention KL, top-k recall, geometric and output errors), the 6D error, the inference
checks against closed forms, the statistics (tests with effect sizes, CIs, power), the verdict rules, and the test
helpers for code built on kvstats (:mod:`kvstats.measure.testing`).

Above quant/ in the tree, below hf/ and run/ (docs/design_notes.md).
"""
