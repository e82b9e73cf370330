"""The verdict rules of the claims (kvstats.measure.verdicts)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvstats.measure import verdicts
from kvstats.measure.stats import wilcoxon
from kvstats.studies.turboquant_distortion.cells import ALPHA, OUTLIER_CLAIMED_BITS, PRINTED_RTOL


def two_pi_verdict(ratios: dict) -> verdicts.Verdict:
    """D'Alberto's "2π-fold variance": the number rule per bit width b on the paired ratio CI
    (turbo_prod / turbo_mse d·D_prod, one sketch), null 1 (no amplification), combined over b."""
    return verdicts.combine([verdicts.number(2 * math.pi, (lo, hi), null=1.0, expected_sign=1, estimate=est)
                             for est, lo, hi in ratios.values()])


#: The norm storage the paper's 2.5 bits imply: two float16 norms per 128 coordinates (the payload is 2.25)
OUTLIER_PAPER_NORMS = "float16"


def outlier_verdict(bits_by_dtype: dict, split: np.ndarray, uniform2: np.ndarray) -> verdicts.Verdict:
    """TurboQuant's 2.5-bit configuration: (1) its cost is 2.5 bits per coordinate with the paper's norm storage
    (:data:`OUTLIER_PAPER_NORMS`; identity rule, atol 1e-9 — kvstats' float32 default costs more and is stated
    beside it, not held against the paper); (2) it has lower distortion than uniform 2-bit turbo_mse on keys with
    outlier channels (direction rule, Wilcoxon paired by replicate). Combined."""
    if OUTLIER_PAPER_NORMS not in bits_by_dtype:
        raise ValueError(f"bits_by_dtype must hold the paper's norm storage {OUTLIER_PAPER_NORMS!r}, got "
                         f"{sorted(bits_by_dtype)}")
    cost = verdicts.identity([bits_by_dtype[OUTLIER_PAPER_NORMS]["total"]], OUTLIER_CLAIMED_BITS, atol=1e-9,
                             what=f"configurations ({OUTLIER_PAPER_NORMS} norms, as the paper counts them)")
    w = wilcoxon(split, uniform2)
    better = verdicts.direction([verdicts.cell_direction(w.pvalue, w.effect_size, expected_sign=-1, alpha=ALPHA)],
                                what="data sets (split below uniform 2-bit)")
    return verdicts.combine([cost, better])


def value_verdict(published: dict, exact: dict) -> verdicts.Verdict:
    """A printed table of values against the exact values: the number rule per entry with one declared relative
    tolerance (:data:`PRINTED_RTOL`, the same for every entry: the printed digits give no slack), combined. The
    Monte Carlo CI holding the exact value is the implementation check, stated beside it."""
    return verdicts.combine([verdicts.number(published[b], (exact[b], exact[b]), null=None, rtol=PRINTED_RTOL)
                             for b in published])


def rounding_text(published: dict, exact: dict) -> str:
    """Each printed entry against the exact value rounded to its printed digits (:func:`verdicts.rounding`)."""
    return "; ".join(f"b = {b}: {verdicts.rounding(str(published[b]), exact[b])}" for b in published)


def bounds_verdict(tab: pd.DataFrame) -> verdicts.Verdict:
    """TurboQuant's bounds by the bound rule on measured/limit (1 = the bound) with the CIs, each side of each
    distortion; combined."""
    parts = []
    for col, lo_col, hi_col, name in (("turbo_mse_d_mse", "lower_d_mse", "upper_d_mse", "D_mse"),
                                      ("turbo_prod_d_prod_x_d", "lower_d_prod_x_d", "upper_d_prod_x_d", "d·D_prod")):
        for lim_col, upper in ((hi_col, True), (lo_col, False)):
            lim = tab[lim_col].to_numpy()
            est = tab[col].to_numpy() / lim
            cis = list(zip(tab[f"{col}_lo"].to_numpy() / lim, tab[f"{col}_hi"].to_numpy() / lim))
            parts.append(verdicts.bound(list(est), cis, 1.0, upper=upper,
                                        what=f"bit widths ({name} / its {'upper' if upper else 'lower'} bound)"))
    return verdicts.combine(parts)


def any_y_verdict(tab: pd.DataFrame) -> verdicts.Verdict:
    """The averaged formula against the y = x measurement: the number rule per b ≥ 2 (no direction part: a
    distortion's only null, 0, is its trivial bound), combined."""
    return verdicts.combine([verdicts.number(r.exact_d_prod_x_d, (r.turbo_prod_d_prod_parallel_x_d_lo,
                                                                  r.turbo_prod_d_prod_parallel_x_d_hi),
                                             null=None, estimate=r.turbo_prod_d_prod_parallel_x_d)
                             for r in tab.itertuples() if r.bits >= 2])
