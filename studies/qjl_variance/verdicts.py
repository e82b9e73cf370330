"""The verdict rules of the claims (kvstats.measure.verdicts)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import scipy.stats

from kvstats.measure import verdicts
from kvstats.measure.stats import t_interval, t_standard_error, wilcoxon, z_difference_test
from kvstats.studies.qjl_variance.cells import ALPHA, SCALING_MARGIN, TAIL_PAIRS, THEOREM_36, UNBIASED_ATOL, D

#: bootstrap resamples of the needed-m ratios (percentile intervals of a difference of log medians)
SCALING_RESAMPLES = 4999


#: Declared margins of the identity claims, each in its quantity's units and below the alternative it must tell apart.
#: Lemma 3.2's unbiasedness: |bias| < 0.002·‖q‖‖k‖ (unit vectors), a fiftieth of one m = 128 sketch's standard
#: deviation (≈ 0.11).
UNBIASED_MARGIN = 0.002
#: The variance's closed form: within ±2% of it (the JL alternative (1 + cos²)/m is ≥ 26% away at cos ≤ 0.3).
VARIANCE_RTOL = 0.02
#: The orthogonal rows' scale factor: E[Prod]/⟨q, k⟩ within ±0.001 of the predicted value, a quarter of the
#: predicted bias 0.0039 at d = 64, so the rule tells the Gaussian constant from the exact one.
SCALE_MARGIN = 0.001
#: TurboQuant's inner-product bias at ⟨y, x⟩ = 0.5: within ±0.002 (0.4% of ⟨y, x⟩) of the prediction.
TURBO_MARGIN = 0.002


def equivalent_to(estimates, expected, lows, highs, n, margin: float, *, relative: bool = False,
                  what: str) -> verdicts.Verdict:
    """Equivalence rule on Monte Carlo estimates against a closed form: the (1 − 2·ALPHA) t-interval of
    ``estimate − expected`` (of ``estimate/expected − 1`` when ``relative``) inside ±``margin`` is *equivalent*,
    wholly outside is *different*. ``lows, highs`` are the estimates' 95% t-intervals over ``n`` independent
    sketches (the standard error is recovered from them, :func:`kvstats.measure.stats.t_standard_error`). Symmetric
    in noise: a noisy estimate is *inconclusive*, where a z-score inside ±z_crit would have called it equal."""
    est = np.asarray(estimates, float)
    exp_ = np.broadcast_to(np.asarray(expected, float), est.shape)
    n = np.broadcast_to(np.asarray(n, float), est.shape)
    se = t_standard_error(lows, highs, n)
    if (se <= 0).any():
        raise ValueError(f"the intervals must have positive width, got standard errors {se.tolist()}")
    diff, scale = (est / exp_ - 1, np.abs(exp_)) if relative else (est - exp_, np.ones_like(est))
    half = scipy.stats.t.ppf(1 - ALPHA, n - 1) * se / scale
    return verdicts.equivalence(list(zip(diff - half, diff + half)), margin, what=what, n=int(n.min()),
                                alpha=ALPHA, unit="sketches")


def spiky_verdict(spiky: pd.DataFrame) -> verdicts.Verdict:
    """Eq. (3) "unbiased for any r": the equivalence rule on E⟨r, r̂⟩/‖r‖² − 1 within ±UNBIASED_ATOL at every
    sparsity k, each k's (1 − 2·ALPHA) t-interval over its independent sketches (one ``ratio`` per sketch, the
    mean over its vectors). "For any r" is universal: one sparsity whose interval lies outside the margin makes it
    not reproduced."""
    cis, n = [], []
    for _k, g in spiky.groupby("k", sort=True):
        lo, hi = t_interval(g["ratio"].to_numpy(float), confidence_level=1 - 2 * ALPHA).confidence_interval
        cis.append((lo - 1.0, hi - 1.0))
        n.append(len(g))
    return verdicts.equivalence(cis, UNBIASED_ATOL, what="sparsities k", n=min(n), alpha=ALPHA, unit="sketches")


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
    (Clopper–Pearson CI), scaled by each row's n (``keys``, default THEOREM_36's), ≤ 1: met when the CI's upper
    end is (0 failures in N sketches meet it only for N ≥ 3.69·n)."""
    est, cis, plans = [], [], []
    for r in rows:
        n = r.get("keys", THEOREM_36["n"])
        n = THEOREM_36["n"] if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)
        ci = scipy.stats.binomtest(r["failures"], r["n"]).proportion_ci(1 - ALPHA)
        est.append(r["failures"] / r["n"] * n)
        cis.append((ci.low * n, ci.high * n))
        plans.append(verdicts.plan_from_binomial(int(r["failures"]), int(r["n"]), 1 / n, alpha=ALPHA,
                                                 unit="sketches", scale=n))
    return verdicts.bound(est, cis, 1.0, what="settings (failure fraction × n)", plan=verdicts.hardest(plans))


def needed_m_log_ratio(a: dict, b: dict, *, per_log_n: bool) -> tuple[float, tuple[float, float]]:
    """log of the ratio of the sketch sizes that two cells need for one fixed error, cell ``a`` over cell ``b``.

    The largest score deviation of a sketch scales as 1/√m (the inner-product errors do), so the m at which the
    median deviation reaches a fixed target is m* ∝ m·median(dev)²; ``per_log_n`` divides each m* by log n (the
    theorem's growth). Returns the estimate and the percentile bootstrap (1 − 2·ALPHA) interval over the two
    cells' independent sketches (the TOST interval of :func:`scaling_equivalence`).
    """
    wa, wb = (np.asarray(c["worst_per_sketch"], float) for c in (a, b))
    offset = math.log(a["m"] / b["m"])
    if per_log_n:
        offset -= math.log(math.log(a["keys"]) / math.log(b["keys"]))

    def stat(x, y, axis=-1):
        return 2 * (np.log(np.median(x, axis=axis)) - np.log(np.median(y, axis=axis))) + offset

    ci = scipy.stats.bootstrap((wa, wb), stat, paired=False, confidence_level=1 - 2 * ALPHA, method="percentile",
                               n_resamples=SCALING_RESAMPLES, random_state=0).confidence_interval
    return float(stat(wa, wb)), (float(ci.low), float(ci.high))


def scaling_verdict(rows: list[dict]) -> verdicts.Verdict:
    """Theorem 3.6's scaling: "the m needed grows as log n and does not depend on d", by the equivalence rule on
    the log ratios of the needed sketch size m* (:func:`needed_m_log_ratio`) within ±log SCALING_MARGIN:
    m*/log n between the largest and smallest n at every d, and m* between the largest and smallest d at every n.
    A sketch size that did not grow with n would give m*/log n a ratio of log(4096)/log(64) = 2 over the grid,
    far outside the margin: the claim can fail."""
    cells = {(int(r["keys"]), int(r["d"])): r for r in rows}
    keys, dims = sorted({k for k, _ in cells}), sorted({d for _, d in cells})
    trials = min(int(r["n"]) for r in rows)
    margin = math.log(SCALING_MARGIN)
    by_n = [needed_m_log_ratio(cells[keys[-1], d], cells[keys[0], d], per_log_n=True)[1] for d in dims]
    by_d = [needed_m_log_ratio(cells[k, dims[-1]], cells[k, dims[0]], per_log_n=False)[1] for k in keys]
    return verdicts.combine([
        verdicts.equivalence(by_n, margin, what=f"dimensions (log of m*/log n, n = {keys[-1]} over {keys[0]})",
                             n=trials, alpha=ALPHA, unit="sketches"),
        verdicts.equivalence(by_d, margin, what=f"key counts (log of m*, d = {dims[-1]} over {dims[0]})",
                             n=trials, alpha=ALPHA, unit="sketches")])


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
