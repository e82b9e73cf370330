"""Study: NOVA-KV (calibrated, attention-aware transform coding) against the data-oblivious schemes on real K/V.

    python studies/nova --scale quick|paper [--scheduler ADDR] [--n-jobs N]

Data: SmolLM2-135M-Instruct (30 layers, 9 query / 3 KV heads, d = 64) over the shipped public-domain text,
cut in two at "The Preamble to the Constitution": NOVA-KV is *calibrated* on one forward pass over the first
part (the Declaration of Independence, ≈1700 tokens: Σ_Q from its 3 query heads per KV head, μ_K, C_K, the
k-means codebooks) and *measured* on a separate forward pass over the rest (Constitution, Bill of Rights,
Lincoln, ≈1850 tokens), whose queries never enter the calibration.

Per layer and budget n ∈ {2, 3}: the held-out cache (all its tokens) is encoded by nova, kqv, qkqv, kv and
a KIVI-style min-max (K per channel in groups of d tokens, V per token; as in studies/budget_sweep.py),
and the last ``n_q`` held-out queries attend causally. Per (layer, query head) unit: mean attention
KL(p_ref ‖ p_quant) over the queries (scores from each scheme's own estimator), mean top-5 recall, mean
relative attention-output error, mean squared logit error; and KL and top-5 recall again with the attention
sink (token 0, which draws ≈40% of the attention mass in mid layers) kept in full precision: the cache without
token 0 is encoded and token 0's exact logit prepended, as deployments of 2-bit caches usually do (the
primary numbers quantize every token). At ``--scale paper`` also ``nova_insample``
(calibrated on the measured text itself: the price of holding the queries out). With several seeds
(``SCALE[...]["seeds"]``) units are averaged over seeds before the tests.

Statistics: per n and metric, nova against each other scheme by the Wilcoxon signed-rank test over
(layer, KV head) units (:func:`kvstats.stats.wilcoxon`: the metrics averaged over the KV head's 3 query heads,
which share its quantized keys; every scheme sees the same keys and queries, so the design is paired),
matched-pairs rank-biserial r of nova − other (negative: nova smaller), Holm over the whole table. The figure
keeps the Mann–Whitney r over (layer, query head) units. Verdicts (kvstats.measure.verdicts): "NOVA beats the scalar
methods" by the direction rule over the comparisons (baseline × {KL, top-5 recall}, min-max included); the
bit count by the identity rule at half a unit of the printed 2.22; Parseval by the identity rule per (layer,
KV head); equal-volume grouping by the direction rule over stratified − contiguous differences.

Grouping (n = 2): each nova KV head regrouped with contiguous eigen-ranks (:func:`regrouped`: same transform
rows, codebooks refitted with the same seed and iterations), held-out coefficient MSE and attention KL of both.

Ablation (n = 2, :data:`ABLATION_ARMS`): the key transform (attention-aware vs a randomized Hadamard rotation)
crossed with the key quantizer (group VQ vs a per-coefficient scalar codebook, ``group_dim=1``), and the value
path (rotated min-max vs the KLT value transform with group VQ, ``value_codec="nova"``), every arm calibrated on
the calibration text with nova's seed; Wilcoxon over (layer, KV head) units, Holm per claim family
(figures/data/nova_ablation.csv).

Generalized Parseval on real data (per layer and KV head, nova at n = 2): mean ‖y − ŷ‖² over the held-out keys
vs the mean squared logit error E_q[(qᵀ(k − k̂))²] over the calibration queries (equal up to the ridge)
and over the held-out queries (how far the calibrated metric carries over).

Writes figures/nova_attention.png, nova_layers.png, nova_parseval.png and in figures/data/: nova_units.csv
(every unit × scheme × n × seed), nova_tests.csv, nova_parseval.csv, nova_bits.csv, nova_grouping.csv,
nova_ablation.csv, nova_claims.json,
nova_definitions.json.
quick: layers 0, 5, ..., 25 (6 layers, 54 units per scheme), 64 queries; paper: layers 0, 3, ..., 27 (10 layers: 30
test units of a KV head, 90 query-head units), 256 queries, nova_insample; full: all 30 layers (90 test units, 270
query-head units) and the second model.

A package (docs/studies.md, "A study that outgrows one file"): cells (the study's declarations, the captures, the
schemes, the cell with its grouping, ablation and Parseval rows), analysis (units, tests, bit counts), verdicts (the
rules), figures, claims (and the definitions); here the study on kvstats.study.protocol.Study and main.
"""

from __future__ import annotations

import dataclasses

from kvstats import study
from kvstats.hf.models import SMOLLM2
from kvstats.studies.nova.analysis import (
    Analysis,
    ablation_tests,
    bits_table,
    data_text,
    grouping_tests,
    kv_units,
    tests,
    unit_table,
)
from kvstats.studies.nova.cells import (
    ABLATION_ARMS,
    ABLATION_BUDGETS,
    ABLATION_FAMILIES,
    ALPHA,
    BUDGETS,
    CLAIM_METRICS,
    GROUPING_BUDGETS,
    METRICS,
    OBLIVIOUS,
    PARSEVAL_RTOL,
    PUBLISHED_BITS,
    QJL_ROWS,
    SCALE,
    SPLIT_AT,
    STUDY,
    TEXTS,
    VERSION,
    WILCOXON_RESAMPLES,
    ablation_scheme,
    cell,
    contiguous,
    ensure_captures,
    layer_qkv,
    make_scheme,
    model_layers,
    regrouped,
    rotated_top_energy,
)
from kvstats.studies.nova.claims import (
    ablation_claims,
    beats_claim,
    bits_claim,
    definitions,
    grouping_claim,
    heldout_claim,
    minmax_claim,
    parseval_claim,
    ruler_claim,
    sink_claim,
    spectrum_claim,
    throughput_claim,
)
from kvstats.studies.nova.figures import attention_figure, layers_figure, parseval_figure
from kvstats.studies.nova.verdicts import (
    ablation_verdict,
    beats_verdict,
    bits_verdict,
    grouping_verdict,
    parseval_verdict,
)
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.models import available_models, cell_model, file_suffix, per_model_claims, run_models
from kvstats.study.sweep import grid

__all__ = ["POSITION", "ABLATION_ARMS", "ABLATION_BUDGETS", "ABLATION_FAMILIES", "ALPHA", "BUDGETS", "CLAIM_METRICS",
           "GROUPING_BUDGETS", "METRICS", "OBLIVIOUS", "PARSEVAL_RTOL", "PUBLISHED_BITS", "QJL_ROWS", "SCALE",
           "SPLIT_AT", "STUDY", "TEXTS", "VERSION", "WILCOXON_RESAMPLES", "ablation_scheme", "ablation_tests",
           "ablation_verdict", "Analysis", "beats_verdict", "bits_verdict", "cell", "contiguous", "ensure_captures",
           "grouping_tests", "grouping_verdict", "kv_units", "layer_qkv", "main", "make_scheme", "Nova",
           "parseval_verdict", "regrouped", "rotated_top_energy", "spectrum_claim", "tests", "unit_table"]

POSITION = 80  # place in figures/REPORT.md (kvstats.study.report.study_order)


class Nova(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): one sweep over layers and seeds, its tables, three
    figures and up to nine claims."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__

    def cells(self, scale: str) -> study.Sweeps:
        """SmolLM2's sweep (``nova``) and, for every other model installed, the same on its captures
        (``nova_<label>``: each cell names the model, so SmolLM2's keep their keys)."""
        cfg, out = SCALE[scale], {}
        for model in run_models(scale):
            ensure_captures(model)  # once here (cached), never in parallel workers
            out[f"{STUDY}{file_suffix(model)}"] = (
                cell, grid(layer=model_layers(cfg, model), seed=list(cfg["seeds"]), n_q=cfg["n_q"],
                           insample=cfg["insample"], **cell_model(model)))
        return out

    def analyse(self, tables, scale: str) -> Analysis:
        present, missing = available_models(scale=scale)
        others = {model: self._analyse(tables[f"{STUDY}{file_suffix(model)}"], scale, model)
                  for model in present if model != SMOLLM2}
        return dataclasses.replace(self._analyse(tables[STUDY], scale, SMOLLM2), others=others, missing=missing)

    @staticmethod
    def _analyse(table, scale: str, model: str) -> Analysis:
        cfg = SCALE[scale]
        pars = table[table["kind"] == "parseval"].dropna(axis=1, how="all")
        pars = pars.groupby(["layer", "kv_head"], as_index=False).mean(numeric_only=True)
        units = unit_table(table)
        tst = tests(units)
        bits = bits_table()
        grp = table[table["kind"] == "grouping"].dropna(axis=1, how="all")
        grp = grp.groupby(["n", "layer", "kv_head"], as_index=False).mean(numeric_only=True)
        gtst = grouping_tests(grp)
        schemes = ["nova"] + (["nova_insample"] if cfg["insample"] else []) + list(OBLIVIOUS)
        abl = table[table["kind"] == "ablation"].dropna(axis=1, how="all")
        abl = abl.groupby(["scheme", "n", "layer", "head", "kv_head"], as_index=False).mean(numeric_only=True)
        return Analysis(cfg, scale, units, tst, pars, bits, gtst, schemes, data_text(units, cfg, scale, model),
                        abl, ablation_tests(abl), model=model)

    def figures(self, tables, a: Analysis) -> None:
        plots.write_csv(f"{STUDY}_bits", a.bits)  # bit accounting: the same for every model
        plots.setup()
        for m in (a, *a.others.values()):
            table = tables[m.prefix]
            plots.write_csv(f"{m.prefix}_units", table[table["kind"] == "unit"].dropna(axis=1, how="all"))
            plots.write_csv(f"{m.prefix}_parseval", m.pars)
            plots.write_csv(f"{m.prefix}_tests", m.tst)
            plots.write_csv(f"{m.prefix}_grouping", m.grp)
            plots.write_csv(f"{m.prefix}_ablation", m.ablation_tests)
            attention_figure(m)
            layers_figure(m)
            parseval_figure(m)

    def claims(self, a: Analysis) -> list[Claim]:
        def of(m: Analysis, model_free: bool) -> list[Claim]:
            """``m``'s claims; ``model_free``: with the rows no model's data decide (the bit accounting, the
            paper's own benchmarks), which only SmolLM2's list carries."""
            out = [*(beats_claim(m, n) for n in BUDGETS), minmax_claim(m), sink_claim(m),
                   bits_claim(m) if model_free else None, parseval_claim(m), spectrum_claim(m), grouping_claim(m),
                   *ablation_claims(m), *((ruler_claim(), throughput_claim()) if model_free else ()),
                   heldout_claim(m)]
            return [c for c in out if c is not None]

        ours = of(a, True)
        theirs = {model: of(m, False) for model, m in a.others.items()}
        return ours + per_model_claims(STUDY, ours, theirs, a.missing)

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a)


def main(argv: list[str] | None = None) -> int:
    return Nova().main(argv, echo=True)
