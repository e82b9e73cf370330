"""The verdict rules of the claims (kvstats.measure.verdicts) and their sample sizes planned by power
(kvstats.study.sample_plans)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import scipy.stats

from kvstats.measure import verdicts
from kvstats.measure.stats import t_interval, t_standard_error, wilcoxon, z_difference_test
from kvstats.studies.qjl_variance.cells import ALPHA, SCALING_MARGIN, TAIL_PAIRS, THEOREM_36, UNBIASED_ATOL, D
from kvstats.study.claims import SampleSize
from kvstats.study.sample_plans import (
    EXACT,
    PairedCell,
    binomial_sample,
    hardest,
    interval_sample,
    paired_sample,
    tost_sample,
)

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

#: Effects of interest of the claims tested for a difference or a bound (issue 50), each the smallest that matters.
#: Orthogonal rows lower the variance, and QJL's variance differs from unquantized JL's, by VARIANCE_RTOL (2%) of the
#: reference variance: the tolerance within which this study calls a variance equal to another.
VARIANCE_EFFECT = VARIANCE_RTOL
#: D'Alberto's π/2: Var·m π/2 against the unquantized JL value 1, the amplification at stake (π/2 − 1).
SQRT_PI_2_EFFECT = math.pi / 2 - 1
#: The outlier sketch: a 10% lower mean squared error than the single sketch's — what its second norm costs in bits
#: (2.5 against 2.25 bits per coordinate with float32 norms, 11% more), which spent on rows instead would lower the
#: variance (∝ 1/m) by about as much.
OUTLIER_EFFECT = 0.1
#: Theorem 3.6: its m is a union bound over the n keys, so the failure rate expected at it is far below 1/n: planned as
#: 0 (the bound's gap is then the whole 1/n).
THEOREM_36_EXPECTED = 0.0


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
    cells = [verdicts.cell_direction(test.pvalue, test.effect_size, expected_sign=-1, alpha=ALPHA)
             for test, _, _ in _orthogonal_tests(g, o)]
    return verdicts.direction(cells, what="(m ≤ d, cos) points")


def _orthogonal_tests(g: pd.DataFrame, o: pd.DataFrame):
    """Per (m ≤ d, cos) point: the z-test of orthogonal − Gaussian rows' variance, the Gaussian rows' variance and the
    fewer sketches of the two."""
    gi, oi = g.set_index(["m", "cos"]), o.set_index(["m", "cos"])
    for key in gi.index:
        if key[0] > D or key not in oi.index:
            continue
        se_g, se_o = (float(t_standard_error(t.loc[key, "var_lo"], t.loc[key, "var_hi"], t.loc[key, "sketches"]))
                      for t in (gi, oi))
        yield (z_difference_test(oi.loc[key, "var"], se_o, gi.loc[key, "var"], se_g), float(gi.loc[key, "var"]),
               int(min(gi.loc[key, "sketches"], oi.loc[key, "sketches"])))


def jl_verdict(rows) -> verdicts.Verdict:
    """"QJL's distortion is no worse than unquantized JL's": the direction rule over cos cells, each for the claim
    when the paired difference QJL − JL is significantly negative (t-test), against when significantly
    positive. Where the two are equal in truth the cell is inconclusive (0), so it does not count for."""
    cells = [verdicts.cell_direction(r["p"], r["mean_diff"], expected_sign=-1, alpha=ALPHA) for r in rows]
    return verdicts.direction(cells, what="cos∠(q, k) cells")


# ------------------------------------------------------------------------------ sample sizes planned by power


def lemma35_expected(eps: float, m: int) -> float:
    """The tail P(|Prod − ⟨q, k⟩| > ε) of the Gaussian approximation N(0, (π/2)/m) of QJL's error at cos = 0 (uniform
    independent unit q, k: |cos| ~ 1/√d): the tail Lemma 3.5's bound claim is planned against."""
    return float(2 * scipy.stats.norm.sf(eps / math.sqrt(math.pi / 2 / m)))


def equivalent_sample(expected, lows, highs, n, margin: float, *, relative: bool = False, effect_words: str,
                      unit: str = "sketches") -> SampleSize | str:
    """The sample size of :func:`equivalent_to`'s claim: per estimate the paired TOST within ±``margin`` for a true
    difference 0 (:func:`kvstats.study.sample_plans.tost_sample`, level ALPHA), the sd of one unit's estimate
    ``se·√n`` (over |expected| when ``relative``) read back from its 95% t-interval; the hardest estimate's. An
    estimate the same in every unit (sd 0) is decided without sampling."""
    lows = np.asarray(lows, float)
    n = np.broadcast_to(np.asarray(n, float), lows.shape)
    sd = t_standard_error(lows, highs, n) * np.sqrt(n)
    if relative:
        sd = sd / np.abs(np.broadcast_to(np.asarray(expected, float), lows.shape))
    return _tost_hardest(sd, n, margin, effect_words=effect_words, unit=unit)


def _tost_hardest(sds, ns, margin: float, *, effect_words: str, unit: str) -> SampleSize | str:
    plans = [tost_sample(float(sd), int(n), margin=margin, effect_words=effect_words, unit=unit, alpha=ALPHA)
             for sd, n in zip(sds, ns) if sd > 0]
    return dataclasses.replace(hardest(plans), test=f"TOST within ±{margin:.3g}, α = {ALPHA:g}, hardest of "
                                                    f"{len(plans)} estimate(s)") if plans else EXACT


def spiky_sample(spiky: pd.DataFrame) -> SampleSize | str:
    """The sample size of :func:`spiky_verdict`'s claim: per sparsity the TOST within ±UNBIASED_ATOL over its sketches
    (sd of the per-sketch ratio), the hardest; a sparsity whose ratio is the same in every sketch (r = ±e_i with the
    Hadamard sketch) is decided without sampling."""
    g = spiky.groupby("k")["ratio"]
    return _tost_hardest(g.std(ddof=1).to_numpy(), g.count().to_numpy(), UNBIASED_ATOL,
                         effect_words=f"the margin ±{UNBIASED_ATOL:g} on E⟨r, r̂⟩/‖r‖² − 1 with a true bias 0",
                         unit="sketches")


def scaling_sample(rows: list[dict]) -> SampleSize | str:
    """The sample size of :func:`scaling_verdict`'s claim: per log ratio the TOST within ±log SCALING_MARGIN for a true
    ratio 1, the sd ``se·√n`` of one sketch read back from the 90% bootstrap interval over n sketches per cell
    (``se = width/(2·z_{1−ALPHA})``); the hardest."""
    cells = {(int(r["keys"]), int(r["d"])): r for r in rows}
    keys, dims = sorted({k for k, _ in cells}), sorted({d for _, d in cells})
    trials = min(int(r["n"]) for r in rows)
    cis = ([needed_m_log_ratio(cells[keys[-1], d], cells[keys[0], d], per_log_n=True)[1] for d in dims]
           + [needed_m_log_ratio(cells[k, dims[-1]], cells[k, dims[0]], per_log_n=False)[1] for k in keys])
    z = scipy.stats.norm.isf(ALPHA)
    sds = [(hi - lo) / (2 * z) * math.sqrt(trials) for lo, hi in cis]
    return _tost_hardest(sds, [trials] * len(sds), math.log(SCALING_MARGIN), unit="sketches per cell",
                         effect_words=f"the margin ±log {SCALING_MARGIN:g} on the log ratio of m* with a true ratio 1")


def tail_sample(rows: list[dict]) -> SampleSize:
    """The sample size of :func:`tail_verdict`'s claim: per (ε, δ) the tail/δ's 95% t-interval over the sketches
    (:func:`kvstats.study.sample_plans.interval_sample`) for the gap |P/δ − 1| between the bound and the tail
    expected (:func:`lemma35_expected`); the hardest."""
    plans = []
    for r in rows:
        tail = t_interval(np.asarray(r["hits_per_sketch"], float) / TAIL_PAIRS)
        lo, hi = tail.confidence_interval
        gap = abs(lemma35_expected(r["eps"], r["m"]) / r["delta"] - 1)
        plans.append(interval_sample((lo / r["delta"], hi / r["delta"]), len(r["hits_per_sketch"]), effect=gap,
                                     effect_words=f"the gap |P/δ − 1| = {gap:.3f} at ε = {r['eps']:g}, δ = "
                                                  f"{r['delta']:g} (the Gaussian tail expected)",
                                     test="bound rule on the 95% t-interval over sketches (tail / δ)",
                                     unit="sketches", mde_of="tail/δ − 1"))
    return hardest(plans)


def scores_sample(rows: list[dict]) -> SampleSize:
    """The sample size of :func:`scores_verdict`'s claim: "failure rate ≤ 1/n" by the exact binomial test at ALPHA/2
    one-sided (the two-sided Clopper–Pearson interval's upper end), expecting THEOREM_36_EXPECTED; the hardest."""
    plans = []
    for r in rows:
        n = r.get("keys", THEOREM_36["n"])
        n = THEOREM_36["n"] if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)
        plans.append(binomial_sample(int(r["failures"]), int(r["n"]), limit=1 / n, expected=THEOREM_36_EXPECTED,
                                     alpha=ALPHA / 2, unit="sketches",
                                     effect_words=f"a failure rate {THEOREM_36_EXPECTED:g} against the limit "
                                                  f"1/n = 1/{n}"))
    return hardest(plans)


def orthogonal_sample(g: pd.DataFrame, o: pd.DataFrame) -> SampleSize:
    """The sample size of :func:`orthogonal_verdict`'s claim: per point the z-test of the difference as a normal
    interval (:func:`kvstats.study.sample_plans.interval_sample`), relative to the Gaussian rows' variance, for
    VARIANCE_EFFECT; the hardest."""
    z = scipy.stats.norm.isf(ALPHA / 2)
    plans = [interval_sample(((test.effect_size - z * test.standard_error) / var_g,
                              (test.effect_size + z * test.standard_error) / var_g), n,
                             effect=VARIANCE_EFFECT, unit="sketches per row kind",
                             effect_words=f"a {VARIANCE_EFFECT:.0%} lower variance than the Gaussian rows'",
                             test=f"two-sided z-test of independent Monte Carlo variances, α = {ALPHA:g} per point",
                             mde_of="relative variance difference (of the Gaussian rows')")
             for test, var_g, n in _orthogonal_tests(g, o)]
    return hardest(plans)


def jl_sample(rows) -> SampleSize:
    """The sample size of :func:`jl_verdict`'s claim: per cos the paired t-test's normal interval of the mean
    difference QJL − JL relative to JL's variance (:func:`kvstats.study.sample_plans.interval_sample`), for
    VARIANCE_EFFECT; the hardest."""
    z = scipy.stats.norm.isf(ALPHA / 2)
    plans = []
    for r in rows:
        se = r["sd_diff"] / math.sqrt(r["sketches"]) / r["var_jl"]
        mean = r["mean_diff"] / r["var_jl"]
        plans.append(interval_sample((mean - z * se, mean + z * se), int(r["sketches"]), effect=VARIANCE_EFFECT,
                                     effect_words=f"a difference of {VARIANCE_EFFECT:.0%} of JL's variance",
                                     test=f"paired t-test over sketches, α = {ALPHA:g} per cos (normal approximation)",
                                     unit="sketches", mde_of="relative difference (of JL's variance)"))
    return hardest(plans)


def outlier_sample(by_scale: dict) -> SampleSize:
    """The sample size of :func:`outlier_verdict`'s claim: paired Wilcoxon cells (one per outlier scale, level
    ALPHA) for OUTLIER_EFFECT of the single sketch's median error."""
    cells = [PairedCell.from_differences(np.asarray(split) - np.asarray(single), abs(float(np.median(single))))
             for single, split in by_scale.values()]
    return paired_sample(cells, effect=OUTLIER_EFFECT, alpha=ALPHA, unit="replicates",
                         effect_words=f"a {OUTLIER_EFFECT:.0%} lower mean squared error than the single sketch's")
