"""Study: the QJL inner-product estimator — unbiasedness, variance vs m and vs cos∠(q, k), Gaussian vs
orthogonalised rows; and the error distributions of TurboQuant_mse (biased) vs TurboQuant_prod (unbiased).

    python studies/qjl_variance --scale quick|paper [--scheduler ADDR]

QJL (kvstats.quantizer("qjl", m=..., rows=...)) at d = 128 on unit pairs (q, k) with cos∠(q, k) = c exactly
(k uniform, q = c·k + √(1 − c²)·u, u uniform ⟂ k). A cell draws `sketches` independent sketch seeds and
`pairs` pairs per sketch; the error e = Prod(q, k) − ⟨q, k⟩. The variance over sketches is E e² (the
estimator is unbiased), estimated by the mean over sketches of the per-sketch mean e² with a t-interval
over the independent sketches. Closed forms (Gaussian rows): QJL ((π/2) − c²)/m; unquantized JL (1 + c²)/m.
Orthogonalised rows have no closed form (docs/references.md §4): measured. The orthogonal rows' constant: with the
Gaussian √(π/2) instead of the exact spherical constant, the estimator is biased by the factor
1/spherical_sign_scale ratio (1.0039 at d = 64): measured at d = 64, m = 64, q = k.

TurboQuant's figure 1: histograms of ⟨y, x̂⟩ − ⟨y, x⟩ for turbo_mse(b) and turbo_prod(b), b = 1..4, d = 128,
unit x uniform and unit y with ⟨y, x⟩ = 0.5: turbo_mse is biased by −D_mse(b)·⟨y, x⟩ (factor 1 − D_mse,
2/π at b = 1 in the Gaussian limit), turbo_prod is centred at 0.

Further rows: D'Alberto's eq. (3) "unbiased for any r" with the Hadamard sketch (rows="srht", m = d) on unit r
with k nonzero entries ±1/√k, k = 1..d (ratio E⟨r, r̂⟩/‖r‖² = E Prod(r, r)); QJL's Lemma 3.5 (tail probability
at m = ⌈(4/3)(1+ε)ε⁻² log(2/δ)⌉) and Theorem 3.6 (softmax scores within 1 ± 3ε at m = ⌈2r²ε⁻² log n⌉) by
Monte Carlo with Gaussian rows; QJL's outlier sketch (equal sign-bit budget with and without the split, keys
with outlier channels); QJL's bit accounting (kvstats BitBudget).

Writes figures/qjl_variance.png, figures/qjl_variance_errors.png, figures/data/qjl_variance*.csv, claims.

A package (docs/studies.md, "A study that outgrows one file"): cells (the study's declarations, the estimator's cells
and the further rows'), analysis (aggregates over sketches, the error summary, the JL comparison), verdicts (the
rules), figures, claims (and the definitions); here the study on kvstats.study.protocol.Study and main.
"""

from __future__ import annotations

from kvstats import study
from kvstats.studies.qjl_variance.analysis import Analysis, aggregate, error_summary, jl_comparison
from kvstats.studies.qjl_variance.cells import (
    ALPHA,
    COS_AT_M,
    COS_VALUES,
    LEMMA_35,
    M_AT_COS,
    M_VALUES,
    OUTLIER_DATA,
    OUTLIER_KEYS,
    OUTLIER_M_TOTAL,
    OUTLIER_QUERIES,
    OUTLIER_SCALES,
    QJL_BITS,
    SCALE,
    SPARSITY,
    SPIKY_PAIRS,
    SPIKY_ROWS,
    STUDY,
    TAIL_PAIRS,
    THEOREM_36,
    THEOREM_36_SCALING,
    UNBIASED_ATOL,
    VERSION,
    D,
    cell,
    control_m,
    error_cell,
    jl_cell,
    outlier_cell,
    qjl_bits,
    scores_cell,
    spiky_cell,
    tail_cell,
    unit_pairs,
    variance_cells,
)
from kvstats.studies.qjl_variance.claims import (
    benchmarks_claim,
    bits_claim,
    closed_form_claim,
    definitions,
    eq3_claim,
    jl_claim,
    lemma35_claim,
    orthogonal_claim,
    outlier_claim,
    scale_factor_claim,
    sqrt_pi_2_claim,
    theorem36_claim,
    theorem36_scaling_claim,
    turboquant_claim,
    unbiased_claim,
)
from kvstats.studies.qjl_variance.figures import errors_figure, variance_figure
from kvstats.studies.qjl_variance.verdicts import (
    bits_verdict,
    equivalent_to,
    jl_verdict,
    needed_m_log_ratio,
    orthogonal_verdict,
    outlier_verdict,
    scaling_verdict,
    scores_verdict,
    spiky_verdict,
    tail_verdict,
)
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.sweep import grid

__all__ = ["POSITION", "ALPHA", "COS_AT_M", "COS_VALUES", "D", "LEMMA_35", "M_AT_COS", "M_VALUES", "OUTLIER_DATA",
           "OUTLIER_KEYS", "OUTLIER_M_TOTAL", "OUTLIER_QUERIES", "OUTLIER_SCALES", "QJL_BITS", "SCALE", "SCALES",
           "SPARSITY", "SPIKY_PAIRS", "SPIKY_ROWS", "STUDY", "TAIL_PAIRS", "THEOREM_36", "THEOREM_36_SCALING",
           "UNBIASED_ATOL", "VERSION", "Analysis", "bits_verdict", "cell", "error_cell", "jl_cell", "jl_comparison",
           "jl_verdict", "main", "needed_m_log_ratio", "scaling_verdict", "control_m", "orthogonal_verdict",
           "outlier_cell", "outlier_verdict", "qjl_bits", "QjlVariance", "scores_cell", "scores_verdict", "spiky_cell",
           "spiky_verdict", "tail_cell", "tail_verdict", "unit_pairs", "equivalent_to"]

#: The scales this study runs at: its claims are decided at paper scale (synthetic draws, seconds to minutes), so the
#: full tier adds nothing to it (docs/studies.md, "Tiers").
SCALES = ("quick", "paper")
POSITION = 50  # place in figures/REPORT.md (kvstats.study.report.study_order)


# written as CSVs as swept
FURTHER_TABLES = ("spiky", "lemma35", "theorem36", "outliers", "theorem36_scaling", "jl", "theorem36_control")


class QjlVariance(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): six sweeps, two figures and eleven claims."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    scales = SCALES

    def cells(self, scale: str) -> study.Sweeps:
        cfg = SCALE[scale]
        return {
            STUDY: (cell, variance_cells(cfg)),
            f"{STUDY}_errors": (error_cell, grid(method=["turbo_mse", "turbo_prod"], bits=[1, 2, 3, 4], d=D,
                                                 vectors=cfg["err_vectors"])),
            f"{STUDY}_spiky": (spiky_cell, grid(rows=list(SPIKY_ROWS), k=list(SPARSITY), d=D,
                                                sketches=cfg["spiky_sketches"], pairs=SPIKY_PAIRS)),
            f"{STUDY}_lemma35": (tail_cell, [{"eps": e, "delta": dl, "d": D, "trials": cfg["tail_trials"]}
                                             for e, dl in LEMMA_35]),
            f"{STUDY}_theorem36": (scores_cell, grid(eps=list(THEOREM_36["eps"]), d=D, trials=cfg["theorem_trials"])),
            f"{STUDY}_theorem36_scaling": (scores_cell, grid(eps=THEOREM_36_SCALING["eps"],
                                                             d=list(THEOREM_36_SCALING["d"]),
                                                             trials=cfg["scaling_trials"],
                                                             keys=list(THEOREM_36_SCALING["keys"]))),
            f"{STUDY}_theorem36_control": (scores_cell, grid(eps=THEOREM_36_SCALING["eps"], d=D,
                                                             trials=cfg["scaling_trials"],
                                                             keys=list(THEOREM_36_SCALING["keys"]),
                                                             sketch_m=control_m())),
            f"{STUDY}_outliers": (outlier_cell, grid(outlier_scale=list(OUTLIER_SCALES),
                                                     rep=list(range(cfg["outlier_reps"])))),
            f"{STUDY}_jl": (jl_cell, grid(m=M_AT_COS, cos=list(COS_VALUES), d=D, sketches=cfg["sketches"],
                                          pairs=cfg["pairs"])),
        }

    def analyse(self, tables, scale: str) -> Analysis:
        table = tables[STUDY]
        table = table.assign(constant=table["constant"].fillna("exact") if "constant" in table else "exact")
        return Analysis(SCALE[scale], scale, table, aggregate(table), error_summary(tables[f"{STUDY}_errors"]),
                        *(tables[f"{STUDY}_{t}"] for t in FURTHER_TABLES))

    def figures(self, tables, a: Analysis) -> None:
        for t in FURTHER_TABLES:
            plots.write_csv(f"{STUDY}_{t}", tables[f"{STUDY}_{t}"])
        plots.write_csv(STUDY, a.agg)
        plots.setup()
        variance_figure(a.main_tab, a.cfg)
        errors_figure(tables[f"{STUDY}_errors"], a.cfg)
        plots.write_csv(f"{STUDY}_errors", a.err_tab)

    def claims(self, a: Analysis) -> list[Claim]:
        return [unbiased_claim(a), closed_form_claim(a), orthogonal_claim(a), scale_factor_claim(a),
                turboquant_claim(a), eq3_claim(a), sqrt_pi_2_claim(a), sqrt_pi_2_claim(a, "gaussian"), lemma35_claim(a),
                theorem36_claim(a), theorem36_scaling_claim(a), jl_claim(a),
                outlier_claim(a), bits_claim(a), benchmarks_claim()]

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a.cfg, a.scale)


def main(argv: list[str] | None = None) -> int:
    return QjlVariance().main(argv, echo=True)  # echo: the claims are printed, as before
