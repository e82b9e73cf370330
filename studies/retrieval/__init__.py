"""Study: retrieval through a quantized KV cache — pass/fail per trial, with intervals and paired exact tests.

    python studies/retrieval --scale quick|paper [--scheduler ADDR]

The field judges KV quantizers by retrieval (needle-in-a-haystack, passkey, RULER; NOVA-KV's headline result,
arXiv 2608.04074, RULER and LongBench results: needle retrieval at 2 bits on Qwen3-8B, 75.4 for NOVA-KV vs 25.3
for the best scalar method) and reports it as one accuracy, one seed, no interval, no paired test. This study
measures retrieval on SmolLM2-135M-Instruct and on Gemma 3 270M (fp32; kvstats.study.models, each model its own
sweeps and claims, ids of the second ending in ``-gemma3``) through kvstats.cache.KVStatsCache with every trial a
pass or a fail, so each accuracy gets a Wilson interval and each comparison an exact McNemar test on the same trials.

Tasks (a trial is one needle; every scheme and the fp model see the same prompts; docs/studies.md, "retrieval"):

* ``passkey``: a sentence "The pass key is 48213. Remember it. 48213 is the pass key." hidden in text, then
  "What is the pass key?" in the tokenizer's chat format (SmolLM2's; plain text for Gemma's, which has none); one
  needle per prompt. Small models lose it fast with length so it runs at short lengths only.
* ``induction``: five spans of 12 random tokens, each on its own line, at depths 10%, 30%, 50%, 70%, 90% of the
  text; the question repeats the first 6 tokens of each span on a new line, the answer is the next 3 (copying a
  span seen once: induction heads). Reaches 8,192 tokens (SmolLM2's context), 16,384 on Gemma 3.
* ``lookup``: a list "id 0417: 58213" lines filling the context; the question asks five ids, at the five depths.

Protocol. The context (text with needles) goes through the model once in full precision (sdpa); its K/V are
handed to each cache (:meth:`KVStatsCache.prefill`: every token stored as codes, no full-precision window; for
transformers' QuantizedCache its first ``update``), and the questions with their answers go through the cache in
one teacher-forced forward — the serving protocol of a full-precision prefill and a quantized cache that every
later token reads. A trial passes when the model's greedy prediction is every answer token (teacher forcing
gives exactly the logits of greedy decoding as long as it is right, so "all argmax right" = "greedy generation
returns the answer"). Attention KL: KL(p_exact ‖ p_quantized) of every question and answer query, every layer,
from the cache's records (kvstats schemes only).

Statistics. Accuracy with its Wilson 95% interval (kvstats.stats.proportion_ci); exact McNemar of each scheme
against the fp model and between schemes on the same trials (kvstats.stats.mcnemar), Holm within each (task,
length) family and, pooled over lengths, within each task; the needles of one prompt share its text (not
independent trials: the p-values describe these prompts). "Within δ" is tested on the paired difference's
Newcombe interval at 90% (TOST at α = 0.05) with δ = 0.05.

quick: passkey at 256 tokens (4 prompts), induction at 256 (2) and 1,024 (1), lookup at 256 (2), n ∈ {2, 4}
(NOVA-KV at 2);
paper: passkey at 256, 512 and 1,024 (18 prompts each: the 52 paired trials a ±5-point equivalence needs at the
least, cells.PASSKEY_PROMPTS), induction at 256–8,192, lookup at 256–2,048, n ∈ {2, 3, 4}; on Gemma 3 270M (a
32,768-token context) induction at 16,384 tokens too (2 prompts).
Writes figures/retrieval_heatmap_n2.png (and _n4), figures/retrieval_accuracy_vs_kl.png,
figures/data/retrieval_*.csv and the claims file. Needs the [models] extra (and [baselines] for transformers'
quantized caches).

The package: :mod:`~kvstats.studies.retrieval.cells` (the constants, the cell; the prompts, the prefill and the
pass rule are ``kvstats retrieval``'s, :mod:`kvstats.evaluation.retrieval`; the model and the per-layer schemes
are kvstats.evaluation's model engine), :mod:`~kvstats.studies.retrieval.analysis`,
:mod:`~kvstats.studies.retrieval.figures`, :mod:`~kvstats.studies.retrieval.claims`.
"""

from __future__ import annotations

from kvstats import study
from kvstats.evaluation.retrieval_tasks import INDUCTION_ANSWER, INDUCTION_CUE
from kvstats.hf.models import SMOLLM2
from kvstats.studies.retrieval.analysis import (
    NOVA_BITS,
    Analysis,
    accuracy_table,
    analyse,
    compact_trials,
    equivalence_rows,
    recovered_fraction,
    tests_table,
)
from kvstats.studies.retrieval.cells import (
    FORMATS_VERSION,
    MODELS_VERSION,
    SCALE,
    STUDY,
    VERSION,
    Prompt,
    build_prompt,
    cell,
    formats_cell,
    model_tasks,
    passed,
)
from kvstats.studies.retrieval.claims import (
    definitions,
    formats_claim,
    fp_claim,
    neutral_claim,
    nova_claim,
    schemes_claim,
)
from kvstats.studies.retrieval.figures import accuracy_vs_kl, heatmap
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.models import available_models, cell_model, file_suffix, per_model_claims

__all__ = ["INDUCTION_ANSWER", "INDUCTION_CUE", "POSITION", "SCALE", "STUDY", "VERSION", "Analysis", "Prompt",
           "Retrieval", "accuracy_table", "analyse", "build_prompt", "cell", "equivalence_rows", "main", "model_tasks",
           "passed",
           "recovered_fraction", "tests_table"]

POSITION = 97  # place in figures/REPORT.md: after model_damage


class Retrieval(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): one cell per prompt."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    versions = {f"{STUDY}_formats": FORMATS_VERSION, f"{STUDY}_gemma3": MODELS_VERSION,
                f"{STUDY}_gemma3_formats": MODELS_VERSION}

    def cells(self, scale: str) -> study.Sweeps:
        """SmolLM2's sweeps (``retrieval``, ``retrieval_formats``) and, for every other model installed, the same
        on its tokens and its tasks (``retrieval_<label>``, ``retrieval_<label>_formats``; each cell names the
        model)."""
        out = _model_sweeps(SCALE[scale], SMOLLM2)
        for model in available_models(scale=scale)[0]:
            if model != SMOLLM2:
                out.update(_model_sweeps(SCALE[scale], model))
        return out

    def analyse(self, tables, scale: str) -> Analysis:
        present, missing = available_models(scale=scale)
        others = {model: analyse(tables[f"{STUDY}{file_suffix(model)}"], scale,
                                 tables.get(f"{STUDY}{file_suffix(model)}_formats"), model=model)
                  for model in present if model != SMOLLM2}
        return analyse(tables[STUDY], scale, tables.get(f"{STUDY}_formats"), others=others, missing=missing)

    def figures(self, tables, a: Analysis) -> None:
        for m in (a, *a.others.values()):
            prefix = m.prefix
            # every trial (the headline accuracies and tests recompute from it): columns constant over the table
            # dropped and the attention KL rounded to 6 significant digits, so the table is small enough to commit
            plots.write_csv(f"{prefix}_trials", compact_trials(m.trials))
            plots.write_csv(f"{prefix}_accuracy", m.accuracy)
            plots.write_csv(f"{prefix}_depth", m.grid)
            plots.write_csv(f"{prefix}_tests", m.tests)
            for n in sorted({NOVA_BITS, 4} & set(m.cfg["bits"])):
                heatmap(m, n)
            accuracy_vs_kl(m)

    def claims(self, a: Analysis) -> list[Claim]:
        def of(m: Analysis) -> list[Claim]:
            return [c for c in (fp_claim(m), schemes_claim(m), formats_claim(m), nova_claim(m), neutral_claim(m))
                    if c is not None]

        ours = of(a)
        return ours + per_model_claims(STUDY, ours, {model: of(m) for model, m in a.others.items()}, a.missing)

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a)


def _model_sweeps(cfg: dict, model: str) -> study.Sweeps:
    """The schemes' and the formats' sweeps of one model: one cell per prompt of its tasks
    (:func:`~kvstats.studies.retrieval.cells.model_tasks`), the longest first (they bound the wall time); a model
    other than SmolLM2 named in its cells, so SmolLM2's keep their keys."""
    nova = {"nova_bits": list(cfg["nova_bits"])} if "nova_bits" in cfg else {}
    if "runs" in cfg:  # only the (scheme, n) pairs the scale's claims read
        nova["runs"] = [list(r) for r in cfg["runs"]]
    named = cell_model(model)
    prompts = sorted(((task, length, i) for task, lengths in model_tasks(cfg, model).items()
                      for length, count in lengths.items() for i in range(count)), key=lambda c: -c[1])
    cells = [{"task": task, "length": length, "prompt": i, "bits": list(cfg["bits"]),
              "calibration_tokens": cfg["calibration_tokens"], **nova, **named} for task, length, i in prompts]
    formats = [{"task": task, "length": length, "prompt": i, "formats": [list(f) for f in cfg["formats"]], **named}
               for task, length, i in prompts] if cfg.get("formats") else []
    name = f"{STUDY}{file_suffix(model)}"
    return {name: (cell, cells), f"{name}_formats": (formats_cell, formats)}


def main(argv: list[str] | None = None) -> int:
    return Retrieval().main(argv)
