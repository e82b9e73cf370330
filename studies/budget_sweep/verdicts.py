"""The verdict rules of the claims (kvstats.measure.verdicts)."""

from __future__ import annotations

import pandas as pd

from kvstats.measure import verdicts as V
from kvstats.studies.budget_sweep.cells import ALPHA, CROSSOVER, PAPER_RATIO


def kqv_lower(cells) -> V.Verdict:
    """Direction rule: KQV's metric is lower than the other scheme's. ``cells``: (Holm p, paired rank-biserial
    r of KQV − other) per cell; r < 0 is KQV lower."""
    return V.direction([V.cell_direction(p, r, expected_sign=-1, alpha=ALPHA) for p, r in cells])


def kqv_higher(cells) -> V.Verdict:
    """Direction rule: KQV's metric is higher (e.g. top-5 recall)."""
    return V.direction([V.cell_direction(p, r, expected_sign=+1, alpha=ALPHA) for p, r in cells])


#: the budgets at which finding 3 says something of its own: QKQV better (at n ∈ {4, 6} it says KQV is better,
#: which finding 1 already claims and tests)
CROSSOVER_DISTINCTIVE = tuple(n for n, better in CROSSOVER.items() if better == "qkqv")


def crossover_verdict(cells) -> V.Verdict:
    """Direction rule for finding 3's distinctive part. ``cells``: (n, Holm p, paired r of KQV − QKQV on the K
    error); only the cells at :data:`CROSSOVER_DISTINCTIVE` (QKQV claimed better: r > 0) decide. Counting the
    n ∈ {4, 6} cells too would let finding 1 (KQV better) carry this claim: with KQV better everywhere the
    crossover would read "partly" although QKQV is never better."""
    return V.direction([V.cell_direction(p, r, expected_sign=+1, alpha=ALPHA)
                        for n, p, r in cells if n in CROSSOVER_DISTINCTIVE],
                       what=f"(data, n) cells at n ∈ {{{', '.join(map(str, CROSSOVER_DISTINCTIVE))}}}")


def ratio_verdict(ci, estimate: float) -> V.Verdict:
    """Number rule for the 2.25× claim: median KL(QKQV)/median KL(KQV) at n = 4 against 2.25 inside the CI (the
    printed digits give no slack); the direction is the ratio above 1."""
    return V.number(float(PAPER_RATIO), ci, null=1.0, expected_sign=+1, estimate=estimate)


def energy_verdict(energy: pd.DataFrame) -> V.Verdict:
    """Rule for "the 6D error discriminates beyond scalar metrics": only the (pair, data) cells at n = 4 where
    neither the scalar the paper ranks schemes by (attention KL, paired Wilcoxon, Holm) nor any single one of the
    six 6D components (paired Wilcoxon, Holm over the six) separates the two schemes can show it; there the 6D
    energy permutation test decides (Holm over those cells, direction rule: for when it rejects at ALPHA). Where
    a scalar already separates, a separating 6D test re-detects that scalar, so those cells are not counted; with
    no such cell the grid cannot test the claim."""
    from statsmodels.stats.multitest import multipletests

    kl_open = energy[~energy["kl_separates"].astype(bool)]
    open_cells = kl_open[~kl_open["component_separates"].astype(bool)]
    if open_cells.empty:
        return V.not_testable(
            f"of the {len(energy)} (scheme pair, data) cells at n = 4, {len(energy) - len(kl_open)} separate on "
            f"attention KL and the other {len(kl_open)} on a single 6D component (Holm p < {ALPHA}), so no cell can "
            "show the 6D error discriminating beyond scalar metrics")
    p_holm = multipletests(open_cells["p"].to_numpy(), method="holm")[1]
    return V.direction([V.cell_direction(p, e, expected_sign=+1, alpha=ALPHA)
                        for p, e in zip(p_holm, open_cells["energy_distance"])],
                       what="(pair, data) cells where neither attention KL nor a single 6D component separates "
                            "the schemes")


#: "Super-linear" needs an exponent meaningfully above the quadratic baseline β = 1: β > 1 + SUPERLINEAR_MARGIN
SUPERLINEAR_MARGIN = 0.1


def superlinear_verdict(tab: pd.DataFrame) -> V.Verdict:
    """Direction rule over the (data, scheme) cells against the margin: for when the slope's CI lies above
    1 + SUPERLINEAR_MARGIN (super-linear by more than the margin), against when it lies below it (at most
    linear within the margin: 1.05 [1.03, 1.07] is no evidence of Jensen's amplification), undecided when the CI
    straddles it."""
    edge = 1 + SUPERLINEAR_MARGIN
    cells = [1 if r.lo > edge else -1 if r.hi < edge else 0 for r in tab.itertuples()]
    return V.direction(cells, what=f"(data, scheme) cells (slope of log KL on log direction error above {edge:g})")
