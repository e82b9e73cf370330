"""Study: TurboQuant's distortions D_mse and D_prod vs bits, against its bounds and its printed table.

    python studies/turboquant_distortion --scale quick|paper [--scheduler ADDR]

Monte Carlo through the real quantizers (kvstats.quantizer("turbo_mse"/"turbo_prod")) at d = 128, b = 1..6:
unit vectors x uniform on the sphere, an independent unit y per x, fresh quantizer seeds per replicate;
D_mse = E‖x − x̂‖², D_prod = E(⟨y, x⟩ − ⟨y, x̂⟩)² (reported as d·D_prod, the numbers TurboQuant prints).
Exact values: D_mse from the exact Lloyd–Max codebook of f_d (kvstats.quant.codebooks.beta_codebook(d, b).d_mse),
D_prod = (π/2 − 1/d)·D_mse(b−1)/d (docs/references.md §3, derived; D_mse(0) = 1). Bounds (TurboQuant Thm 1, 2):
4^−b ≤ D_mse ≤ (√3π/2)·4^−b and 4^−b/d ≤ D_prod ≤ (√3π²/d)·4^−b for unit y.

Two known discrepancies are measured here too:
* the D_prod formula holds averaged over y's direction, not for every y: for y ∥ x it is
  ((π/2)·D_mse − E⟨r, x⟩²)/d (kvstats.inference.turbo_prod_distortion with cos² = 1);
* the randomized WHT is not a Haar rotation: the 1-hot vector e_1 maps to ±1/√d in every coordinate, the
  worst case for a scalar codebook (b = 2: squared error 0.255 vs D_mse 0.116); a Haar rotation gives ≈ D_mse.

D'Alberto's 2π (arXiv 2605.08114 §3.3): trading one MSE bit for one QJL bit multiplies the inner-product
error variance by 2π; measured as the ratio of turbo_prod's to turbo_mse's d·D_prod at equal b, paired by
replicate (same x, y), with D'Alberto's own sketch (the randomized Hadamard S = H·diag(s′) of his eq. 3,
rows="srht"), whose closed form is (π/2 − 1)·D_mse(b−1)/D_mse(b) → 4(π/2 − 1) = 2.28
(kvstats.inference.orthogonal_sketch_prod_distortion); TurboQuant's Gaussian rows, (π/2 − 1/d)·D_mse(b−1)/
D_mse(b) → 2π, beside it as a sensitivity row. TurboQuant's own claims use TurboQuant's Gaussian rows.

TurboQuant's 2.5-bit outlier configuration (arXiv 2504.19874, §4): the 32 channels of largest mean |x| of
keys with outlier channels at 3 bits, the other 96 at 2 bits, two independent turbo_mse instances (Haar
rotations: 96 is not a power of two), beside uniform turbo_mse at 2 and 3 bits (Haar) on the same keys.

Writes figures/turboquant_distortion.png, figures/turboquant_distortion_worst_case.png, figures/data/
turboquant_distortion{,_table,_worst_case}.csv and the claims file.

A package (docs/studies.md, "A study that outgrows one file"): cells (the study's declarations and its Monte Carlo
cells), analysis (the summary table and the paired 2π ratios), verdicts (the rules), figures, claims (and the
definitions); here the study on kvstats.study.protocol.Study and main.
"""

from __future__ import annotations

import pandas as pd

from kvstats import study
from kvstats.studies.turboquant_distortion.analysis import Analysis, bits_row, paired_ratios, two_pi_closed_form
from kvstats.studies.turboquant_distortion.cells import (
    ALPHA,
    BITS,
    METHODS,
    NORM_DTYPES,
    OUTLIER_CLAIMED_BITS,
    OUTLIER_DATA,
    OUTLIER_SPLIT,
    OUTLIER_VECTORS,
    PRINTED_DMSE,
    PRINTED_DPROD_TIMES_D,
    PRINTED_RTOL,
    SCALE,
    SKETCH_NAMES,
    STUDY,
    TWO_PI_SKETCH,
    VERSION,
    D,
    cell,
    exact_dmse,
    exact_dprod,
    outlier_cell,
    split_bits,
    worst_cell,
)
from kvstats.studies.turboquant_distortion.claims import (
    bounds_claim,
    definitions,
    dmse_values_claim,
    dprod_any_y_claim,
    dprod_values_claim,
    outlier_claim,
    two_pi_claim,
    wht_worst_case_claim,
)
from kvstats.studies.turboquant_distortion.figures import distortion_figure, worst_case_figure
from kvstats.studies.turboquant_distortion.verdicts import (
    any_y_verdict,
    bounds_verdict,
    outlier_verdict,
    rounding_text,
    two_pi_verdict,
    value_verdict,
)
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.sweep import grid

__all__ = ["POSITION", "ALPHA", "BITS", "D", "METHODS", "NORM_DTYPES", "OUTLIER_CLAIMED_BITS", "OUTLIER_DATA",
           "OUTLIER_SPLIT", "OUTLIER_VECTORS", "PRINTED_DMSE", "PRINTED_DPROD_TIMES_D", "PRINTED_RTOL", "SCALE",
           "SCALES", "SKETCH_NAMES", "STUDY", "TWO_PI_SKETCH", "VERSION", "Analysis", "any_y_verdict", "bounds_verdict",
           "cell", "exact_dmse", "exact_dprod", "main", "outlier_cell", "outlier_verdict", "paired_ratios",
           "rounding_text", "split_bits", "TurboQuantDistortion", "two_pi_closed_form", "two_pi_verdict",
           "value_verdict", "worst_cell"]

#: The scales this study runs at: its claims are decided at paper scale (synthetic draws, seconds to minutes), so the
#: full tier adds nothing to it (docs/studies.md, "Tiers").
SCALES = ("quick", "paper")
POSITION = 40  # place in figures/REPORT.md (kvstats.study.report.study_order)


class TurboQuantDistortion(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): three sweeps (distortions, worst case, outlier
    configuration), two figures and seven claims."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    scales = SCALES

    def cells(self, scale: str) -> study.Sweeps:
        cfg = SCALE[scale]
        return {STUDY: (cell, grid(method=list(METHODS), bits=list(BITS), d=D, vectors=cfg["vectors"],
                                   rep=list(range(cfg["reps"])))),
                f"{STUDY}_worst": (worst_cell, grid(rotation=["wht", "haar"], vector=["e1", "uniform"], bits=2, d=D,
                                                    rep=list(range(cfg["worst_reps"])))),
                f"{STUDY}_outliers": (outlier_cell, grid(config=["split", "uniform2", "uniform3"],
                                                         rep=list(range(cfg["outlier_reps"]))))}

    def analyse(self, tables, scale: str) -> Analysis:
        table, worst, outl = tables[STUDY], tables[f"{STUDY}_worst"], tables[f"{STUDY}_outliers"]
        w = worst.groupby(["rotation", "vector"])["sq_error"]
        return Analysis(cfg=SCALE[scale], scale=scale, tab=pd.DataFrame([bits_row(table, b) for b in BITS]),
                        worst_mean=w.mean(), worst_sd=w.std(),
                        ratios={"srht": paired_ratios(table, "turbo_prod:srht"),
                                "gaussian": paired_ratios(table, "turbo_prod")},
                        split_cost={name: split_bits(dt) for name, dt in NORM_DTYPES.items()},
                        outlier_errors={c_: g.sort_values("rep")["rel_error"].to_numpy()
                                        for c_, g in outl.groupby("config")})

    def figures(self, tables, a: Analysis) -> None:
        plots.write_csv(STUDY, tables[STUDY])
        plots.write_csv(f"{STUDY}_worst_case", tables[f"{STUDY}_worst"])
        plots.write_csv(f"{STUDY}_outliers", tables[f"{STUDY}_outliers"])
        plots.write_csv(f"{STUDY}_table", a.tab)
        plots.setup()
        distortion_figure(a.tab, a.cfg)
        worst_case_figure(tables[f"{STUDY}_worst"], a.cfg)

    def claims(self, a: Analysis) -> list[Claim]:
        return [dmse_values_claim(a), dprod_values_claim(a), bounds_claim(a), dprod_any_y_claim(a),
                wht_worst_case_claim(a), two_pi_claim(a), two_pi_claim(a, "gaussian"), outlier_claim(a)]

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a.cfg, a.scale)


def main(argv: list[str] | None = None) -> int:
    return TurboQuantDistortion().main(argv, echo=True)
