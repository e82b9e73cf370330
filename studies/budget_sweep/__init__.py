"""Study: KV vs KQV vs QKQV (and a KIVI-style min-max baseline) at budgets n = 2..6 — D'Alberto's findings.

    python studies/budget_sweep --scale quick|paper [--scheduler ADDR]

D'Alberto (arXiv 2605.08114) compares KV (TurboQuant_mse on K and V), KQV (QJL-corrected TurboQuant_prod on V
only) and QKQV (on both) at n bits per element. Every claim is verdicted first under the paper's own definition:
the QJL stage uses the randomized Hadamard sketch of its eq. 3 (``rows="srht"``, S = H·diag(s′), m = d). The
dense Gaussian and the orthogonal sketches are sensitivity rows at n = 4.

Sweep: data × scheme × sketch × n, each cell `trials` trials. Synthetic data: a trial draws a fresh cache
(kvstats.data.synthetic.generate) and two query sets, the generator's peaked queries (each aims at focus keys)
and isotropic queries q ~ N(0, I) independent of the keys; both are scored on the same quantized cache (one
encode per trial). Real data (SmolLM2-135M): the shipped public-domain text is split into its separate
documents, each captured on its own (cached under .cache/), and one trial is one disjoint window of `window`
consecutive tokens of one document (its keys and values; queries = the window's last n_q positions, causal).
The data of a trial do not depend on the scheme, sketch or n, so every scheme sees the same data: the design
is paired and the scheme comparisons are paired Wilcoxon tests over trials; the 2.25× claim, made with
Mann–Whitney, is shown with both. Quantizer seeds (rotation, QJL sketch) are fresh per trial; minmax has no
random state, so across its trials only the data (the window, on real data) vary.

Writes figures/budget_sweep_{kl,top5,crossover,kl_ratio,n4}.png and beside them in figures/data/:
budget_sweep_trials.csv (every trial; not kept in git), budget_sweep_wilcoxon.csv (paired tests, Holm over the
whole table), budget_sweep_mannwhitney.csv (KQV vs QKQV KL at n = 4, the paper's test),
budget_sweep_kl_ratio.csv, budget_sweep_crossover.csv, budget_sweep_energy.csv, budget_sweep_claims.json,
budget_sweep_definitions.json.

A package (docs/studies.md, "A study that outgrows one file"): cells (the study's declarations, the real documents,
a trial's data and references, the cell and the grid), analysis (the trial table, the paired tests, the ratios, the
crossover, the 6D energy tests, the super-linear fit), verdicts (the rules), figures, claims, definitions; here the
study on kvstats.study.protocol.Study and main.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstats import study
from kvstats.studies.budget_sweep.analysis import (
    Analysis,
    add_d6,
    analyse,
    component_tests,
    data_label,
    paired_family_size,
    superlinear_table,
    trial_table,
    write_tables,
)
from kvstats.studies.budget_sweep.cells import (
    ALPHA,
    BUDGETS,
    CROSSOVER,
    DOCUMENT_TITLES,
    E6,
    FINDING1_METRICS,
    METRICS,
    MODELS_VERSION,
    NO_SKETCH,
    PAPER_N,
    PAPER_P,
    PAPER_R,
    PAPER_RATIO,
    PEAKED,
    PRIMARY_QUERIES,
    QJL_SCHEMES,
    QUERY_MODELS,
    REAL_D,
    REAL_DATA,
    REAL_QUERIES,
    SCALE,
    SCHEMES,
    SENSITIVITY_BUDGETS,
    SENSITIVITY_SKETCHES,
    SKETCH,
    SKETCH_OPTIONS,
    STUDY,
    SYNTHETIC,
    SYNTHETIC_HEADS,
    VERSION,
    cell,
    documents,
    formats_cells,
    make_scheme,
    model_cells,
    real_windows,
    sweep_cells,
    trial_data,
    trial_error6d_reference,
    trial_metrics,
    trial_reference,
    window_count,
)
from kvstats.studies.budget_sweep.claims import (
    bits_held,
    claims,
    equal_budget_claim,
    published_triple,
    real_claims,
    triple_text,
)
from kvstats.studies.budget_sweep.definitions import definitions
from kvstats.studies.budget_sweep.figures import figures
from kvstats.studies.budget_sweep.verdicts import (
    crossover_verdict,
    energy_verdict,
    kqv_higher,
    kqv_lower,
    ratio_verdict,
    superlinear_verdict,
)
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.models import available_models, per_model_claims

__all__ = ["POSITION", "ALPHA", "BUDGETS", "CROSSOVER", "DOCUMENT_TITLES", "E6", "FINDING1_METRICS", "METRICS",
           "NO_SKETCH", "PAPER_N", "PAPER_P", "PAPER_R", "PAPER_RATIO", "PEAKED", "PRIMARY_QUERIES", "QJL_SCHEMES",
           "QUERY_MODELS", "REAL_D", "REAL_QUERIES", "SCALE", "SCHEMES", "SENSITIVITY_BUDGETS",
           "SENSITIVITY_SKETCHES", "SKETCH", "SKETCH_OPTIONS", "STUDY", "SYNTHETIC", "SYNTHETIC_HEADS", "VERSION",
           "add_d6", "Analysis", "bits_held", "BudgetSweep",
           "equal_budget_claim", "cell", "component_tests", "crossover_verdict", "data_label",
           "documents",
           "energy_verdict", "kqv_higher", "kqv_lower", "main", "make_scheme", "paired_family_size",
           "published_triple", "ratio_verdict", "real_windows", "superlinear_table", "superlinear_verdict",
           "sweep_cells", "trial_data", "trial_error6d_reference", "trial_metrics", "trial_reference", "triple_text"]

POSITION = 70  # place in figures/REPORT.md (kvstats.study.report.study_order)


@dataclass(frozen=True, eq=False)
class Analyses:
    """The combined analysis (synthetic and SmolLM2 rows: every published row), and one analysis per real model of
    its rows alone (``real``: data label -> Analysis; the per-model rows and their comparison), and the models that
    did not run."""

    main: Analysis
    real: dict
    missing: dict


class BudgetSweep(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): one sweep (data × scheme × sketch × n), the
    deployed formats' sweep and a second model's real rows (``budget_sweep_gemma3``), its tests, figures, claims
    and definitions."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    versions = {f"{STUDY}_gemma3": MODELS_VERSION}

    def cells(self, scale: str) -> study.Sweeps:
        n_windows = window_count(SCALE[scale], capture=True)
        out = {STUDY: (cell, sweep_cells(scale, n_windows)),
               f"{STUDY}_formats": (cell, formats_cells(scale, n_windows))}
        if "gemma3-270m" in available_models(scale=scale)[0]:
            gemma = window_count(SCALE[scale], capture=True, data="gemma3")
            out[f"{STUDY}_gemma3"] = (cell, model_cells(scale, "gemma3", gemma))
        return out

    def analyse(self, tables, scale: str) -> Analyses:
        table = trial_table(tables[STUDY])
        main = analyse(table, scale, window_count(SCALE[scale]), tables.get(f"{STUDY}_formats"))
        real = {"smollm2": analyse(table[table["data"] == "smollm2"].copy(), scale, window_count(SCALE[scale]))}
        if f"{STUDY}_gemma3" in tables and len(tables[f"{STUDY}_gemma3"]):
            real["gemma3"] = analyse(trial_table(tables[f"{STUDY}_gemma3"]), scale,
                                     window_count(SCALE[scale], data="gemma3"))
        return Analyses(main, real, available_models(scale=scale)[1])

    def figures(self, tables, a: Analyses) -> None:
        write_tables(a.main)
        figures(a.main.primary, a.main.labels, a.main.ratios, a.main.cross,
                f"{a.main.cfg['trials']} trials (synthetic), {a.main.n_windows} windows (real)")
        if "gemma3" in a.real:
            g = a.real["gemma3"]
            plots.write_csv(f"{STUDY}_gemma3_wilcoxon", g.pairs)
            plots.write_csv(f"{STUDY}_gemma3_kl_ratio", g.ratios)

    def claims(self, a: Analyses) -> list[Claim]:
        ours = real_claims(a.real["smollm2"], "smollm2")
        theirs = {REAL_DATA[data]: real_claims(r, data) for data, r in a.real.items() if data != "smollm2"}
        return claims(a.main) + ours + per_model_claims(STUDY, ours, theirs, a.missing)

    def definitions(self, a: Analyses) -> dict[str, str]:
        return definitions(a.main.cfg, a.main.n_windows)


def main(argv: list[str] | None = None) -> int:
    return BudgetSweep().main(argv, echo=True)
