"""The verdict rules of the claims (kvstats.measure.verdicts) and the sample sizes of their tests
(kvstats.study.sample_plans, issue 50)."""

from __future__ import annotations

import pandas as pd

from kvstats.measure import verdicts as V
from kvstats.studies.budget_sweep.cells import ALPHA, CROSSOVER, PAPER_RATIO
from kvstats.study.claims import SampleSize
from kvstats.study.sample_plans import (
    hardest,
    interval_sample,
    paired_cells,
    paired_sample,
)


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


# ------------------------------------------------------------------------------------ sample sizes (issue 50)

#: the direction claims' effect of interest, relative to the other scheme's median: a gap under a tenth of it is too
#: small to call one scheme the winner (the paper's own gap, KL at n = 4, is 2.25×: KQV 56% lower)
RELATIVE_EFFECT = 0.10
#: top-5 recall's, absolute: one of the five reference tokens lost in every fourth query
TOP5_EFFECT = 0.05
#: the 2.25× claim's number rule: the distance at stake between the published ratio and no difference (1×)
RATIO_EFFECT = float(PAPER_RATIO) - 1.0


def direction_sample(cells: pd.DataFrame, family: int, *, unit: str, relative: bool = True) -> SampleSize:
    """The sample size of a direction claim over rows of the paired table (``cells``: paired Wilcoxon tests, Holm
    over a family of ``family`` tests): :func:`kvstats.study.sample_plans.paired_sample` at Holm's first step
    ALPHA/family, rank-based on each cell's Hodges–Lehmann standard error, for a shift of RELATIVE_EFFECT × the other
    scheme's median (``relative``) or of TOP5_EFFECT."""
    words = (f"a shift of {RELATIVE_EFFECT:.0%} of the other scheme's median" if relative
             else f"a shift of {TOP5_EFFECT:g} in top-5 recall")
    return paired_sample(paired_cells(cells, scale="median_b" if relative else None),
                         effect=RELATIVE_EFFECT if relative else TOP5_EFFECT, effect_words=words,
                         alpha=ALPHA / family, unit=unit, relative=relative)


def ratio_sample(rows: pd.DataFrame, unit: str) -> SampleSize:
    """The sample size of the 2.25× claim: per row of the ratio table (its 95% bootstrap CI of median KL(QKQV) /
    median KL(KQV) over ``n_trials``) :func:`kvstats.study.sample_plans.interval_sample` for the distance
    RATIO_EFFECT; the hardest row."""
    return hardest([interval_sample((r.ci_low, r.ci_high), int(r.n_trials), effect=RATIO_EFFECT,
                                    effect_words=f"the distance {RATIO_EFFECT:g} between the published {PAPER_RATIO}× "
                                                 "and no difference (1×)",
                                    test=f"number rule on the 95% BCa {r.ci_method.split(' (')[0]} CI of the ratio of "
                                         "medians",
                                    unit=unit, mde_of="ratio's distance from 1")
                    for r in rows.itertuples()])


def superlinear_sample(tab: pd.DataFrame) -> SampleSize:
    """The sample size of the super-linear claim: per (data, scheme) cell its slope's 95% bootstrap CI over
    ``trials`` against 1 + SUPERLINEAR_MARGIN (:func:`kvstats.study.sample_plans.interval_sample` for the distance
    SUPERLINEAR_MARGIN: the quadratic baseline β = 1 below the edge, β = 1.2 above it); the hardest cell."""
    edge = 1 + SUPERLINEAR_MARGIN
    return hardest([interval_sample((r.lo, r.hi), int(r.trials), effect=SUPERLINEAR_MARGIN,
                                    effect_words=f"a slope {SUPERLINEAR_MARGIN:g} from the edge {edge:g} (the "
                                                 "quadratic baseline β = 1)",
                                    test=f"95% BCa bootstrap CI of the slope β against {edge:g}",
                                    unit="trials (windows on real data)", mde_of="distance of β from the edge")
                    for r in tab.itertuples()])
