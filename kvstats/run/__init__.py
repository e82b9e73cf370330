"""Running measurements for a user: the parts behind :func:`kvstats.evaluate` (units, comparison plan, resumable
unit store, provenance). The tier of the target layout (docs/design_notes.md) that sits above the quantizers,
the measurements and the Hugging Face side; the study runner and the report join it with the redesign.
"""
