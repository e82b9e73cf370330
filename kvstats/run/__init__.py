"""Running measurements for a user and for the studies: evaluate (synthetic data, captures, a model), per-layer
sensitivity, the study runner (sweeps of resumable cells), the study shell, the report, figures, paths and the
``kvstats`` command.

The top tier of the tree (docs/design_notes.md): it may import every other tier, none imports it.
"""
