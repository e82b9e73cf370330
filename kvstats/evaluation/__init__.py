"""The user's evaluation of a quantizer: units (synthetic, capture, model), the sides and their checks, the
model-evaluation engine, the paired comparison, the resumable unit store, results and per-layer sensitivity
(docs/evaluate.md).

    from kvstats.evaluation import evaluate               # also kvstats.evaluate
    ev = evaluate("kqv", bits=4, data="gaussian")

A tier of the tree (docs/design_notes.md): it imports the study machinery and the tiers below; the command line
(kvstats.cli) imports it.
"""

from __future__ import annotations

import importlib

#: public name -> the module that holds it (loaded on first use: ``kvstats --help`` imports no torch)
_HOMES = {"evaluate": "kvstats.evaluation.evaluator", "Evaluation": "kvstats.evaluation.results",
          "InconclusiveWarning": "kvstats.evaluation.results", "ModelEvaluation": "kvstats.evaluation.model_evaluator",
          "QuantizerCheckError": "kvstats.evaluation.quantizer_sides", "sensitivity": "kvstats.evaluation.sensitivity",
          "evaluate_retrieval": "kvstats.evaluation.retrieval", "RetrievalEvaluation": "kvstats.evaluation.retrieval",
          "recipe": "kvstats.evaluation.recipe_run", "Recipe": "kvstats.evaluation.recipe_run",
          "LayerMap": "kvstats.evaluation.layer_recipe"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'kvstats.evaluation' has no attribute {name!r}")
