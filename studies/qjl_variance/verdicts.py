"""The verdict rules of the claims (kvstats.measure.verdicts)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import scipy.stats

from kvstats.measure import verdicts
from kvstats.measure.stats import t_interval, t_standard_error, wilcoxon, z_difference_test
from kvstats.studies.qjl_variance.cells import ALPHA, TAIL_PAIRS, THEOREM_36, UNBIASED_ATOL, D


def z_identity(estimates, expected, ses, *, what: str) -> verdicts.Verdict:
    """Identity rule on z-scores: (estimate − expected)/SE within ± the two-sided Bonferroni critical value
    z_{ALPHA/(2k)} for k values (a Monte Carlo estimate agrees with a closed form up to its sampling error)."""
    est, exp_, se = (np.asarray(x, float) for x in (estimates, np.broadcast_to(expected, np.shape(estimates)), ses))
    if (se <= 0).any():
        raise ValueError(f"ses must be > 0, got {se.tolist()}")
    crit = float(scipy.stats.norm.isf(ALPHA / (2 * len(est))))
    return verdicts.identity(list((est - exp_) / se), 0.0, atol=crit, what=f"{what} (|z| ≤ {crit:.2f})")


def spiky_verdict(ratios: dict) -> verdicts.Verdict:
    """Eq. (3) "unbiased for any r": identity rule on E⟨r, r̂⟩/‖r‖² = 1 within UNBIASED_ATOL over the sparsities."""
    return verdicts.identity(list(ratios.values()), 1.0, atol=UNBIASED_ATOL, what="sparsities k")


def tail_verdict(rows: list[dict]) -> verdicts.Verdict:
    """Lemma 3.5: bound rule, the tail probability at most δ, per (ε, δ); a cell passes when its estimate is ≤ δ,
    fails significantly when its CI lies above δ. The pairs of one sketch share it, so the CI is a t-interval
    over the independent sketches of their per-sketch tail fractions (a binomial interval over all pairs would
    treat them as independent). Combined over (ε, δ) via one rule by scaling each to estimate/δ ≤ 1."""
    est, cis = [], []
    for r in rows:
        frac = np.asarray(r["hits_per_sketch"], float) / TAIL_PAIRS
        tail = t_interval(frac)
        mean, (lo, hi) = tail.statistic, tail.confidence_interval
        est.append(mean / r["delta"])
        cis.append((lo / r["delta"], hi / r["delta"]))
    return verdicts.bound(est, cis, 1.0, what="(ε, δ) settings (tail probability / δ)")


def scores_verdict(rows: list[dict]) -> verdicts.Verdict:
    """Theorem 3.6 read as "failure probability ≤ 1/n": bound rule on the per-trial failure fraction
    (Clopper–Pearson CI), scaled by each row's n (``keys``, default THEOREM_36's), ≤ 1."""
    est, cis = [], []
    for r in rows:
        n = r.get("keys", THEOREM_36["n"])
        n = THEOREM_36["n"] if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)
        ci = scipy.stats.binomtest(r["failures"], r["n"]).proportion_ci(1 - ALPHA)
        est.append(r["failures"] / r["n"] * n)
        cis.append((ci.low * n, ci.high * n))
    return verdicts.bound(est, cis, 1.0, what="settings (failure fraction × n)")


def outlier_verdict(by_scale: dict) -> verdicts.Verdict:
    """The outlier sketch lowers the inner-product error at equal sign bits: direction rule over the outlier
    scales, Wilcoxon paired by replicate (same keys and queries), split error lower."""
    cells = []
    for single, split in by_scale.values():
        w = wilcoxon(np.asarray(split), np.asarray(single))
        cells.append(verdicts.cell_direction(w.pvalue, w.effect_size, expected_sign=-1, alpha=ALPHA))
    return verdicts.direction(cells, what="outlier scales")


def bits_verdict(bits: dict) -> verdicts.Verdict:
    """QJL's "3 bits, zero overhead, > 5× memory": per configuration (plain, with the outlier split), total bits
    per coordinate = 3 within half a printed unit (identity), no side information (identity, side = 0), and
    16/total > 5 (bound rule, lower). Combined."""
    parts = []
    for cfg in ("plain", "split"):
        total, side, ratio = bits[f"{cfg}_total"], bits[f"{cfg}_side"], bits[f"{cfg}_ratio"]
        parts += [verdicts.identity([total], 3.0, atol=verdicts.printed_half_unit("3"), what=f"{cfg}: bits"),
                  verdicts.identity([side], 0.0, atol=1e-12, what=f"{cfg}: side bits"),
                  verdicts.bound([ratio], [(ratio, ratio)], 5.0, upper=False, what=f"{cfg}: fp16 / QJL")]
    return verdicts.combine(parts)


def orthogonal_verdict(g: pd.DataFrame, o: pd.DataFrame) -> verdicts.Verdict:
    """Orthogonalised rows lower the variance at m ≤ d: direction rule over the (m, cos) points with m ≤ d,
    two-sided z-test on the difference of the independent Monte Carlo estimates."""
    cells = []
    gi, oi = g.set_index(["m", "cos"]), o.set_index(["m", "cos"])
    for key in gi.index:
        if key[0] > D or key not in oi.index:
            continue
        se_g, se_o = (float(t_standard_error(t.loc[key, "var_lo"], t.loc[key, "var_hi"], t.loc[key, "sketches"]))
                      for t in (gi, oi))
        test = z_difference_test(oi.loc[key, "var"], se_o, gi.loc[key, "var"], se_g)  # orthogonal − Gaussian
        cells.append(verdicts.cell_direction(test.pvalue, test.effect_size, expected_sign=-1, alpha=ALPHA))
    return verdicts.direction(cells, what="(m ≤ d, cos) points")


def jl_verdict(rows) -> verdicts.Verdict:
    """"QJL's distortion is no worse than unquantized JL's": the direction rule over cos cells, each for the claim
    when the paired difference QJL − JL is significantly negative (t-test), against when significantly
    positive. Where the two are equal in truth the cell is inconclusive (0), so it does not count for."""
    cells = [verdicts.cell_direction(r["p"], r["mean_diff"], expected_sign=-1, alpha=ALPHA) for r in rows]
    return verdicts.direction(cells, what="cos∠(q, k) cells")
