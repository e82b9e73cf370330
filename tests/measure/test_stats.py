"""Mann–Whitney, compare() and bootstrap against scipy, statsmodels, hand-computed cases and brute force.

Everything here is deterministic given the seeds; the checks whose outcome depends on the drawn data (the
bootstrap location and width checks, the paired-CI width) are sized in their comments so that another seed
fails a correct implementation with probability below 1e-6.
"""

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.multitest import multipletests

from kvstats.measure import stats as S
from kvstats.measure.stats._correlation import _spearman_rho
from kvstats.measure.stats._mann_whitney import _mwu_exact_cdf
from kvstats.results import TestResult


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
@pytest.mark.parametrize("n1, n2, ties", [(7, 5, False), (30, 25, False), (30, 25, True), (1500, 10, False),
                                          (400, 300, False)])
def test_u_and_p_equal_scipy(alternative, n1, n2, ties):
    rng = np.random.default_rng(n1 * n2)
    a, b = rng.normal(size=n1), rng.normal(0.3, 1, size=n2)
    if ties:
        a, b = np.round(a, 1), np.round(b, 1)
    r = S.mann_whitney(a, b, alternative=alternative)
    ref_asym = scipy.stats.mannwhitneyu(a, b, alternative=alternative, method="asymptotic")
    assert isinstance(r, TestResult)
    assert r.statistic == r.u1 == ref_asym.statistic
    assert r.p_asymptotic == pytest.approx(ref_asym.pvalue, rel=1e-12)
    if ties or n1 * n2 > S.EXACT_MAX_PAIRS:
        assert r.pvalue_method == "asymptotic" and math.isnan(r.p_exact) and r.pvalue == r.p_asymptotic
    else:
        ref_exact = scipy.stats.mannwhitneyu(a, b, alternative=alternative, method="exact").pvalue
        assert r.pvalue_method == "exact" and r.pvalue == pytest.approx(ref_exact, rel=1e-12)


def _exact_rational_cdf(n1, n2, u_max):
    """P(U <= u), u = 0..u_max, in exact integer arithmetic (Gaussian binomial coefficients), rounded once."""
    m, n = min(n1, n2), max(n1, n2)
    c = [1] + [0] * u_max
    for i in range(1, m + 1):
        for u in range(u_max, n + i - 1, -1):
            c[u] -= c[u - n - i]
        for u in range(i, u_max + 1):
            c[u] += c[u - i]
    total, acc, out = math.comb(m + n, m), 0, []
    for count in c:
        acc += count
        out.append(acc / total)  # int / int is correctly rounded
    return np.array(out)


@pytest.mark.slow
def test_exact_null_against_rational_arithmetic():
    # (300, 300) is the worst case measured at the cutoff (n1 n2 = 90 000 <= EXACT_MAX_PAIRS), whole lower half;
    # (20, 4000) is long and thin (80 000 pairs), checked over its lower tail.
    for n1, n2, u_max in [(300, 300, 45_000), (20, 4000, 5000), (12, 9, 54)]:
        ours = _mwu_exact_cdf(n1, n2, u_max)
        ref = _exact_rational_cdf(n1, n2, u_max)
        np.testing.assert_allclose(ours, ref, rtol=2e-11, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("n", [515, 600, 1000])
def test_large_samples_give_finite_asymptotic_p(n):
    # issue 16: scipy's exact null overflows above ~515 per group and took ~90 s at 600: asymptotic here
    rng = np.random.default_rng(n)
    a, b = rng.normal(size=n), rng.normal(size=n) + 0.1
    r = S.mann_whitney(a, b)
    ref = scipy.stats.mannwhitneyu(a, b, method="asymptotic")
    assert r.pvalue_method == "asymptotic" and "asymptotic" in r.method and math.isnan(r.p_exact)
    assert math.isfinite(r.pvalue) and r.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    with pytest.raises(ValueError, match=r"method='exact' is limited to n1\*n2 <= 100000"):
        S.mann_whitney(a, b, method="exact")
    out = S.compare(pd.DataFrame({"g": ["a"] * n + ["b"] * n, "x": np.concatenate([a, b])}), "x", "g")
    assert out["p"].iloc[0] == r.pvalue and out["p_method"].iloc[0] == "asymptotic"


def test_exact_at_the_cutoff_agrees_with_scipy_where_scipy_is_finite():
    # 316 x 316 = 99 856 pairs: exact; scipy's exact machinery still finite at N = 632 (its float phase agrees
    # with exact arithmetic to ~1e-10 here). Far tail: the means differ by 2 sd.
    rng = np.random.default_rng(316)
    a, b = rng.normal(size=316), rng.normal(2.0, 1, size=316)
    r = S.mann_whitney(a, b)
    assert r.pvalue_method == "exact" and r.pvalue < 1e-50
    assert r.pvalue == pytest.approx(scipy.stats.mannwhitneyu(a, b, method="exact").pvalue, rel=1e-8)


def test_effect_sizes_hand_computed():
    # a = [1, 2, 6], b = [3, 4, 5]: pairs with a > b: only 6 beats 3, 4, 5 -> U1 = 3, n1 n2 = 9.
    r = S.mann_whitney([1.0, 2.0, 6.0], [3.0, 4.0, 5.0])
    assert r.u1 == 3.0
    assert r.rank_biserial == pytest.approx(2 * 3 / 9 - 1)  # = -1/3: a tends to be smaller -> negative
    # Z = (U1 - n1 n2 / 2) / sqrt(n1 n2 (N + 1) / 12) = (3 - 4.5) / sqrt(9 * 7 / 12), N = 6, no ties
    z = (3 - 4.5) / math.sqrt(9 * 7 / 12)
    assert r.z == pytest.approx(z) and r.r_z == pytest.approx(z / math.sqrt(6))
    # other sample's U gives the same number with 1 - 2U/(n1 n2)
    assert r.rank_biserial == pytest.approx(1 - 2 * S.mann_whitney([3.0, 4.0, 5.0], [1.0, 2.0, 6.0]).u1 / 9)
    assert r.median_a == 2.0 and r.median_b == 4.0 and r.median_ratio == 0.5


def test_tie_corrected_z_hand_computed():
    # a = [1, 2, 2], b = [2, 3]: pooled ranks 1, 3, 3, 3, 5 -> tie group of size 3.
    # U1 = #(a > b) + 0.5 #(a = b) = 0 + 0.5 * 2 = 1; sigma^2 = 6/12 * ((6) - (27 - 3)/(5*4)) = 0.5 * 4.8 = 2.4
    r = S.mann_whitney([1.0, 2.0, 2.0], [2.0, 3.0])
    assert r.u1 == 1.0
    assert r.z == pytest.approx((1 - 3) / math.sqrt(2.4))
    assert r.r_z == pytest.approx(r.z / math.sqrt(5))
    assert r.pvalue_method == "asymptotic"


def test_far_tail_exact_versus_normal():
    # complete separation, 10 vs 10: exact two-sided p = 2 / C(20, 10) (only the two extreme orderings)
    a, b = np.arange(10.0), np.arange(10.0) + 100
    r = S.mann_whitney(a, b)
    assert r.rank_biserial == -1.0 and r.u1 == 0.0
    assert r.pvalue_method == "exact"
    assert r.p_exact == pytest.approx(2 / math.comb(20, 10), rel=1e-12)
    z = -50 / math.sqrt(100 * 21 / 12)
    assert r.z == pytest.approx(z)
    # scipy's asymptotic p uses a continuity correction: 2 Phi(-(50 - 0.5)/sigma)
    assert r.p_asymptotic == pytest.approx(2 * scipy.stats.norm.sf(49.5 / math.sqrt(175)), rel=1e-9)
    # 70 vs 70 (the paper's regime): exact 2/C(140,70) ~ 2e-41 against normal ~ 1e-23: 17 orders of magnitude
    r70 = S.mann_whitney(np.arange(70.0), np.arange(70.0) + 1000)
    assert r70.p_exact == pytest.approx(2 / math.comb(140, 70), rel=1e-9)
    assert r70.p_asymptotic / r70.p_exact > 1e15
    assert r70.r_z == pytest.approx(-4900 / 2 / math.sqrt(4900 * 141 / 12) / math.sqrt(140))
    assert abs(r70.r_z) < 0.87  # |Z/sqrt(N)| cannot reach the published 0.983 at this size


def test_null_cdf_matches_enumeration():
    n1, n2 = 4, 5
    counts = np.zeros(n1 * n2 + 1)
    for combo in itertools.combinations(range(n1 + n2), n1):  # positions of a in the ranking
        u = sum(pos - i for i, pos in enumerate(sorted(combo)))  # number of b's below each a
        counts[u] += 1
    np.testing.assert_allclose(S.mwu_null_cdf(n1, n2), np.cumsum(counts) / counts.sum(), rtol=1e-13)


@given(seed=st.integers(0, 2**31 - 1), n1=st.integers(1, 12), n2=st.integers(1, 12))
@settings(max_examples=40, deadline=None)
def test_hodges_lehmann_brute_force(seed, n1, n2):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n1), rng.normal(size=n2)
    shift, (lo, hi), how = S.hodges_lehmann(a, b)
    diffs = sorted(x - y for x in a for y in b)
    assert shift == pytest.approx(float(np.median(diffs)))
    # brute-force k: the largest k with P(U <= k - 1) <= alpha/2 from the enumerated null
    cdf = S.mwu_null_cdf(n1, n2)
    k = sum(1 for c in cdf if c <= 0.025 * (1 + 1e-12))
    if k == 0:
        assert (lo, hi) == (-math.inf, math.inf)
    else:
        assert (lo, hi) == (diffs[k - 1], diffs[-k]) and how == "exact"
        assert lo <= shift <= hi


def test_hodges_lehmann_ci_is_the_inversion_of_the_test():
    # For a shift D inside the exact CI, the exact two-sided test of a - D against b does not reject at 5%;
    # just outside it does (the CI is the set of shifts the test accepts).
    rng = np.random.default_rng(3)
    a, b = rng.normal(1, 1, size=15), rng.normal(size=12)
    _, (lo, hi), _ = S.hodges_lehmann(a, b)
    eps = 1e-9
    for inside in (lo + eps, hi - eps, (lo + hi) / 2):
        assert scipy.stats.mannwhitneyu(a - inside, b, method="exact").pvalue > 0.05
    for outside in (lo - eps, hi + eps):
        assert scipy.stats.mannwhitneyu(a - outside, b, method="exact").pvalue <= 0.05


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="a contains non-finite values"):
        S.mann_whitney([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(ValueError, match="b must have at least 1 value"):
        S.mann_whitney([1.0], [])
    with pytest.raises(ValueError, match="method='exact' needs samples without ties"):
        S.mann_whitney([1.0, 2.0], [2.0, 3.0], method="exact")
    with pytest.raises(ValueError, match="alternative must be .*got 'bigger'"):
        S.mann_whitney([1.0], [2.0], alternative="bigger")


def _table():
    rng = np.random.default_rng(11)
    rows = []
    for n in (2, 4):
        for scheme, loc in (("kv", 0.0), ("kqv", -0.8), ("qkqv", 0.4)):
            for x in rng.normal(loc * n / 2, 1, size=9):
                rows.append({"bits": n, "scheme": scheme, "kl": x})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_compare_holm_and_bh_equal_statsmodels():
    table = _table()
    out = S.compare(table, "kl", "scheme", within=["bits"])
    assert len(out) == 6 and list(out["bits"]) == [2, 2, 2, 4, 4, 4]
    # every row is the Mann-Whitney of the two groups
    for row in out.itertuples():
        xa = table.query("bits == @row.bits and scheme == @row.level_a")["kl"]
        xb = table.query("bits == @row.bits and scheme == @row.level_b")["kl"]
        assert row.p == pytest.approx(scipy.stats.mannwhitneyu(xa, xb, method="exact").pvalue, rel=1e-12)
    np.testing.assert_allclose(out["p_holm"], multipletests(out["p"], method="holm")[1], rtol=1e-12)
    np.testing.assert_allclose(out["p_bh"], multipletests(out["p"], method="fdr_bh")[1], rtol=1e-12)
    np.testing.assert_allclose(out["p_adj"], out["p_holm"])
    per_cell = S.compare(table, "kl", "scheme", within=["bits"], family="cell", correction="fdr_bh")
    for bits in (2, 4):
        sel = per_cell["bits"] == bits
        np.testing.assert_allclose(per_cell.loc[sel, "p_holm"], multipletests(per_cell.loc[sel, "p"], method="holm")[1])
    np.testing.assert_allclose(per_cell["p_adj"], per_cell["p_bh"])


@pytest.mark.slow
def test_compare_without_within_and_errors():
    out = S.compare(_table(), "kl", "scheme", levels=["kqv", "qkqv", "kv"])
    assert list(zip(out["level_a"], out["level_b"])) == [("kqv", "qkqv"), ("kqv", "kv"), ("qkqv", "kv")]
    assert (out["n_a"] == 18).all()
    with pytest.raises(ValueError, match="metric column 'nope' is not in table"):
        S.compare(_table(), "nope", "scheme")


def test_bootstrap_ci_matches_scipy_and_covers():
    rng = np.random.default_rng(5)
    x = rng.exponential(size=200)
    r = S.bootstrap_ci(x, np.mean, n_resamples=2000, seed=1)
    ref = scipy.stats.bootstrap((x,), np.mean, n_resamples=2000, rng=np.random.default_rng(1))
    assert r.statistic == pytest.approx(x.mean())
    assert r.confidence_interval == pytest.approx(tuple(ref.confidence_interval), rel=1e-12)
    lo, hi = r.confidence_interval
    assert lo < r.statistic < hi
    # the mean of 200 Exp(1) draws is Gamma(200, 1/200) exactly: outside its central 1 − 1e-7 range w.p. 1e-7
    law = scipy.stats.gamma(200, scale=1 / 200)
    assert law.ppf(5e-8) < r.statistic < law.isf(5e-8)
    # the 95% CI's width is the normal theory's 2·1.96·s/√n up to the bootstrap's resampling noise (~2% sd at
    # 2000 resamples) and BCa's skew correction (~2%): a factor of 1.33 either way is > 10 sd
    normal_width = 2 * 1.959964 * x.std(ddof=1) / math.sqrt(x.size)
    assert 0.75 < (hi - lo) / normal_width < 1.33


def test_ratio_ci_of_medians():
    rng = np.random.default_rng(6)
    a, b = rng.lognormal(np.log(2.25), 0.3, size=150), rng.lognormal(0, 0.3, size=150)
    r = S.ratio_ci(a, b, np.median, n_resamples=2000, seed=2)
    assert r.statistic == pytest.approx(np.median(a) / np.median(b))
    ref = scipy.stats.bootstrap((a, b), lambda x, y, axis=-1: np.median(x, axis) / np.median(y, axis),
                                n_resamples=2000, method="BCa", rng=np.random.default_rng(2))
    assert r.confidence_interval == pytest.approx(tuple(ref.confidence_interval), rel=1e-12)
    lo, hi = r.confidence_interval
    assert lo < r.statistic < hi
    # true ratio 2.25: the log of a sample median of 150 lognormal(·, 0.3) draws has sd ≈ 1.2533·0.3/√150 =
    # 0.0307, the log-ratio 0.0434; |log(ratio / 2.25)| < 5.5 sd fails w.p. ≈ 4e-8 (CLT for the median)
    assert abs(math.log(r.statistic / 2.25)) < 5.5 * 0.0434
    with pytest.raises(ValueError, match=r"median\(b\) is 0"):
        S.ratio_ci(a, np.zeros(5))


@pytest.mark.slow
def test_compare_within_as_a_string_is_one_column():
    # issue 17: within="bits" used to be iterated letter by letter
    table = _table()
    by_string = S.compare(table, "kl", by="scheme", within="bits")
    pd.testing.assert_frame_equal(by_string, S.compare(table, "kl", by="scheme", within=["bits"]))
    assert list(by_string.columns[:2]) == ["bits", "metric"] and len(by_string) == 6
    with pytest.raises(TypeError, match="within must be a column name or a list"):
        S.compare(table, "kl", by="scheme", within=3)


def _two_metric_table():
    table = _table()
    return table.assign(recall=np.random.default_rng(12).uniform(size=len(table)))


@pytest.mark.slow
def test_compare_applies_one_correction_over_several_metrics():
    table = _two_metric_table()
    out = S.compare(table, ["kl", "recall"], "scheme", within="bits")
    assert len(out) == 12 and list(out["metric"]) == ["kl"] * 6 + ["recall"] * 6
    # the kl rows are the single-metric run's raw p-values; the correction spans all 12 tests
    np.testing.assert_array_equal(out["p"][:6], S.compare(table, "kl", "scheme", within="bits")["p"])
    np.testing.assert_allclose(out["p_holm"], multipletests(out["p"], method="holm")[1], rtol=1e-12)
    np.testing.assert_allclose(out["p_bh"], multipletests(out["p"], method="fdr_bh")[1], rtol=1e-12)
    per_metric = S.compare(table, ["kl", "recall"], "scheme", within="bits", family="metric")
    for m in ("kl", "recall"):
        sel = per_metric["metric"] == m
        np.testing.assert_allclose(per_metric.loc[sel, "p_holm"],
                                   multipletests(per_metric.loc[sel, "p"], method="holm")[1], rtol=1e-12)


@pytest.mark.slow
def test_compare_paired_matches_units_and_uses_wilcoxon():
    rng = np.random.default_rng(13)
    rows = []
    for seed in range(25):
        base = rng.normal()
        for scheme, shift in (("kv", 0.0), ("kqv", -0.5), ("qkqv", 0.3)):
            if scheme == "qkqv" and seed == 0:
                continue  # unit 0 lacks qkqv: dropped from the pairs involving qkqv
            rows.append({"seed": seed, "scheme": scheme, "kl": base + shift + 0.4 * rng.normal()})
    table = pd.DataFrame(rows).sample(frac=1, random_state=1)  # order must not matter: matched on seed
    out = S.compare(table, "kl", "scheme", paired_by="seed", n_resamples=499)
    wide = table.pivot(index="seed", columns="scheme", values="kl")
    for row in out.itertuples():
        pair = wide[[row.level_a, row.level_b]].dropna()
        ref = scipy.stats.wilcoxon(pair[row.level_a], pair[row.level_b])
        assert row.n_pairs == len(pair) == (24 if "qkqv" in (row.level_a, row.level_b) else 25)
        assert row.p == pytest.approx(ref.pvalue, rel=1e-12) and row.p_method == "exact"
        assert row.median_difference == pytest.approx(np.median(pair[row.level_a] - pair[row.level_b]))
        # the minimum detectable effect at α/m, m = the 3 tests of the family
        mde = S.detectable_shift((pair[row.level_a] - pair[row.level_b]).to_numpy(), alpha=0.05 / 3)
        assert row.detectable_shift == pytest.approx(mde.extra["shift"], rel=1e-12)
    np.testing.assert_allclose(out["p_holm"], multipletests(out["p"], method="holm")[1], rtol=1e-12)
    with pytest.raises(ValueError, match=r"paired_by \['seed'\] does not identify a unit: level 'kqv' has 1 repeated"):
        S.compare(pd.concat([table, table[table["scheme"] == "kqv"].head(1)]), "kl", "scheme", paired_by="seed")


@pytest.mark.slow
def test_wilcoxon_equals_scipy_and_hand_computed_effect_size():
    # d = [1, -2, 3, 4]: ranks of |d| are 1, 2, 3, 4; W+ = 1 + 3 + 4 = 8, W- = 2, r = (8 - 2)/10 = 0.6
    r = S.wilcoxon(np.array([1.0, -2.0, 3.0, 4.0]))
    assert (r.w_plus, r.w_minus, r.rank_biserial) == (8.0, 2.0, pytest.approx(0.6))
    stat, p = r  # unpacks like scipy's result
    ref = scipy.stats.wilcoxon([1.0, -2.0, 3.0, 4.0])
    assert (stat, p) == (ref.statistic, pytest.approx(ref.pvalue, rel=1e-12)) and r.pvalue_method == "exact"
    rng = np.random.default_rng(21)
    for n, rounding, expected in [(30, None, "exact"), (80, None, "asymptotic"), (40, 1, "asymptotic"),
                                  (12, 1, "exact permutation")]:
        a = rng.normal(size=n)
        b = a - 0.3 + 0.8 * rng.normal(size=n)
        if rounding is not None:
            a, b = np.round(a, rounding), np.round(b, rounding)
        for alternative in ("two-sided", "less", "greater"):
            res = S.wilcoxon(a, b, alternative=alternative, n_resamples=199)
            scipy_ref = scipy.stats.wilcoxon(a, b, alternative=alternative)  # scipy's own "auto"
            assert res.pvalue_method == expected
            assert res.statistic == scipy_ref.statistic and res.pvalue == pytest.approx(scipy_ref.pvalue, rel=1e-12)
    with pytest.raises(ValueError, match="every one of the 3 paired differences is 0"):
        S.wilcoxon([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="a and b must have one length"):
        S.wilcoxon([1.0, 2.0], [1.0])


@pytest.mark.slow
def test_wilcoxon_rank_biserial_ci_is_scipys_bootstrap_of_the_closed_form():
    # independent statistic: r = 2 W+/S - 1 with W+ from scipy.stats.wilcoxon(alternative="greater"), S = n(n+1)/2
    rng = np.random.default_rng(22)
    d = rng.normal(0.4, 1, size=30)
    r = S.wilcoxon(d, n_resamples=999, seed=5)

    def closed_form(x):
        return 2 * scipy.stats.wilcoxon(x, alternative="greater", method="asymptotic").statistic / (30 * 31 / 2) - 1

    assert r.rank_biserial == pytest.approx(closed_form(d), rel=1e-12)
    ref = scipy.stats.bootstrap((d,), closed_form, vectorized=False, n_resamples=999, rng=np.random.default_rng(5))
    assert r.confidence_interval == pytest.approx(tuple(ref.confidence_interval), rel=1e-9)
    one_sign = S.wilcoxon(np.abs(d))
    assert one_sign.rank_biserial == 1.0 and one_sign.confidence_interval == (1.0, 1.0)


def test_paired_ratio_ci_is_scipys_paired_bootstrap():
    rng = np.random.default_rng(23)
    b = rng.lognormal(size=120)
    a = 1.3 * b * rng.lognormal(0, 0.2, size=120)  # strongly correlated pairs
    r = S.ratio_ci(a, b, np.mean, paired=True, n_resamples=1999, seed=4)
    ref = scipy.stats.bootstrap((a, b), lambda x, y, axis=-1: x.mean(axis) / y.mean(axis), paired=True,
                                n_resamples=1999, method="BCa", rng=np.random.default_rng(4))
    assert r.statistic == pytest.approx(a.mean() / b.mean()) and r.paired and r.ci_method == "BCa"
    assert r.confidence_interval == pytest.approx(tuple(ref.confidence_interval), rel=1e-12)
    unpaired = S.ratio_ci(a, b, np.mean, n_resamples=1999, seed=4)
    width = r.confidence_interval[1] - r.confidence_interval[0]
    # pairing removes the shared lognormal(0, 1) factor (sd 1) leaving sd 0.2: the paired CI is far narrower.
    # Sized by simulation: over 30,000 data seeds the width ratio had median 0.17, 1e-4 quantile 0.42 and
    # maximum 0.475, so a bound of 0.8 is far beyond a 1e-6 tail; ignoring the pairing gives a ratio near 1.
    assert width < 0.8 * (unpaired.confidence_interval[1] - unpaired.confidence_interval[0])
    with pytest.raises(ValueError, match="paired=True needs a and b of one length"):
        S.ratio_ci(a, b[:-1], paired=True)


@pytest.mark.slow
def test_spearman_equals_scipy_with_its_paired_bootstrap():
    rng = np.random.default_rng(24)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    r = S.spearman(x, y, n_resamples=999, seed=3)
    ref = scipy.stats.spearmanr(x, y)
    assert (r.statistic, r.pvalue) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue, rel=1e-12))
    boot = scipy.stats.bootstrap((x, y), lambda a, b: scipy.stats.spearmanr(a, b).statistic, paired=True,
                                 vectorized=False, n_resamples=999, rng=np.random.default_rng(3))
    assert r.confidence_interval == pytest.approx(tuple(boot.confidence_interval), rel=1e-12)
    with pytest.raises(ValueError, match="y is constant"):
        S.spearman(x, np.ones(40))


@pytest.mark.slow
def test_spearman_bootstrap_with_ties_equals_scipys_per_resample_statistic():
    # the CI's statistic runs on all resamples at once: with many ties (6 levels, 30 pairs) its BCa interval must
    # equal scipy.stats.bootstrap's with spearmanr called on each resample (the oracle), and row by row rho too
    rng = np.random.default_rng(25)
    x = rng.integers(0, 6, size=30).astype(float)
    y = x + rng.integers(0, 4, size=30)
    r = S.spearman(x, y, n_resamples=1999, seed=4)
    boot = scipy.stats.bootstrap((x, y), lambda a, b: scipy.stats.spearmanr(a, b).statistic, paired=True,
                                 vectorized=False, n_resamples=1999, rng=np.random.default_rng(4))
    assert r.confidence_interval == pytest.approx(tuple(boot.confidence_interval), rel=1e-12)
    rows_x, rows_y = rng.integers(0, 3, size=(50, 8)), rng.integers(0, 3, size=(50, 8))
    with np.errstate(invalid="ignore"):
        got = _spearman_rho(rows_x, rows_y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant rows: spearmanr warns and returns nan
        want = np.array([scipy.stats.spearmanr(a, b).statistic for a, b in zip(rows_x, rows_y)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_bootstrap_of_constant_data_is_the_point():
    r = S.bootstrap_ci(np.full(10, 2.5))
    assert r.confidence_interval == (2.5, 2.5) and r.ci_method == "constant data" and r.standard_error == 0.0


def test_paired_t_power_equals_noncentral_t():
    # power = P(T > t_crit) + P(T < -t_crit), T ~ noncentral t(n - 1, d sqrt(n))
    n, d = 20, 0.6
    crit = scipy.stats.t.isf(0.025, n - 1)
    closed = scipy.stats.nct.sf(crit, n - 1, d * math.sqrt(n)) + scipy.stats.nct.cdf(-crit, n - 1, d * math.sqrt(n))
    assert S.paired_t_power(d, n=n).power == pytest.approx(closed, rel=1e-9)
    solved = S.paired_t_power(d, power=closed)
    assert solved.solved_for == "n" and solved.n_pairs == pytest.approx(n, rel=1e-6) and solved.n_required == 20
    with pytest.raises(ValueError, match="give exactly two of effect_size, n, power"):
        S.paired_t_power(0.5)


def test_wilcoxon_power_is_the_rejection_rate():
    r = S.wilcoxon_power(0.5, 20, n_simulations=500, seed=7)
    rng = np.random.default_rng(7)
    d = rng.normal(0.5, 1.0, size=(500, 20))
    hits = sum(scipy.stats.wilcoxon(row, method="exact").pvalue < 0.05 for row in d)
    assert r.power == hits / 500 and r.confidence_interval[0] < r.power < r.confidence_interval[1]
    # under H0 the exact test's size is <= alpha (0.0497 at n = 30, discrete): with 4000 simulations the
    # rejection rate has sd 0.0034, so a 1 - 1e-6 Clopper-Pearson CI (half-width ~0.017) must contain it
    null = S.wilcoxon_power(0.0, 30, seed=8, confidence_level=1 - 1e-6)
    assert null.confidence_interval[0] < 0.0497 < null.confidence_interval[1]


@pytest.mark.slow
def test_docs_statistics_examples_run_as_written():
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "statistics.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    # the page's examples: overview, bootstrap, significance groups, power, binary outcomes, equivalence
    assert len(blocks) == 6
    for block in blocks:
        exec(compile(block, "docs/statistics.md", "exec"), {})


@pytest.mark.parametrize("zero_method", ["wilcox", "pratt", "zsplit"])
def test_wilcoxon_zero_methods_equal_scipy_and_rank_sums_add_up(zero_method):
    d = np.round(np.random.default_rng(3).normal(0.3, 1, size=40), 1)  # ties and 3 zeros
    r = S.wilcoxon(d, zero_method=zero_method, n_resamples=199)
    ref = scipy.stats.wilcoxon(d, zero_method=zero_method)
    assert r.statistic == ref.statistic and r.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    assert r.n_zero == 3 and r.pvalue_method == "asymptotic"
    used = 37 if zero_method == "wilcox" else 40  # wilcox drops the zeros; the others rank them
    zero_ranks = 0.0 if zero_method == "wilcox" else 6.0  # the three zeros share ranks 1, 2, 3
    assert r.w_plus + r.w_minus == used * (used + 1) / 2 - (zero_ranks if zero_method == "pratt" else 0.0)
    assert r.rank_biserial == pytest.approx((r.w_plus - r.w_minus) / (used * (used + 1) / 2))


def test_seeds_follow_the_package_rule():
    """One seed rule (kvstats._random.check_seed) for the statistics too: refused seeds name `seed`."""
    from kvstats.measure import stats as S

    x = np.arange(10.0)
    for bad, exc in ((True, TypeError), ("0", TypeError), (1.5, TypeError), (-1, ValueError), (2**70, ValueError)):
        with pytest.raises(exc, match="seed must be an int"):
            S.bootstrap_ci(x, seed=bad, n_resamples=99)
        with pytest.raises(exc, match="seed must be an int"):
            S.ratio_ci(x + 1, x + 2, seed=bad, n_resamples=99)
    fresh = S.bootstrap_ci(x, seed=None, n_resamples=99)
    again = S.bootstrap_ci(x, seed=fresh.extra["seed"], n_resamples=99)
    assert fresh.confidence_interval == again.confidence_interval


# ------------------------------------------------------------------------------------- means of few units


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 5, 8])
def test_mean_ci_covers_normal_data_at_few_units(n):
    """Coverage of the 95% CI of a mean over n normal units, by simulation (6000 data sets; the bootstrap with 999
    resamples). Measured: the t interval (n = 2) is exact, the studentized bootstrap covered 96.1% at 5 units and
    95.2% at 8 (1000 data sets); a 0.93 floor is 7+ binomial standard deviations below: P(fail) < 1e-12. BCa
    (52% at 2 units, 83% at 5, 91% at 8) fails it."""
    rng = np.random.default_rng(n)
    data = rng.normal(0.3, 2.0, (6000, n))
    hits = 0
    for i, row in enumerate(data):
        ci = S.mean_ci(row, n_resamples=999, seed=i).confidence_interval
        hits += ci.low <= 0.3 <= ci.high
    assert hits >= 0.93 * 6000
    method = S.mean_ci(data[0]).ci_method
    assert method == ("Student t" if n < S.T_INTERVAL_BELOW else "studentized bootstrap")


@pytest.mark.slow
def test_mean_ci_covers_skewed_data_better_than_t():
    """Lognormal(0, 1) units, n = 24 (a metric averaged over units is usually skewed): the studentized bootstrap
    covered 91.5% (1000 data sets), Student's t 87.4% and BCa 88.1%. With 2000 data sets a 0.885 floor is 4.8
    binomial sd below the studentized coverage (P(fail) < 1e-6) and above t's."""
    rng = np.random.default_rng(24)
    truth = math.exp(0.5)
    hits = hits_t = 0
    for i in range(2000):
        x = rng.lognormal(0.0, 1.0, 24)
        ci = S.mean_ci(x, n_resamples=999, seed=i).confidence_interval
        hits += ci.low <= truth <= ci.high
        ct = S.mean_ci(x, method="t").confidence_interval
        hits_t += ct.low <= truth <= ct.high
    assert hits >= 0.885 * 2000 and hits > hits_t


def test_mean_ci_t_below_5_units_and_constant_data_a_point():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    low, high = scipy.stats.t.interval(0.95, 3, loc=x.mean(), scale=scipy.stats.sem(x))
    assert S.mean_ci(x).confidence_interval == pytest.approx((low, high), rel=1e-12)
    assert tuple(S.mean_ci([2.0, 2.0, 2.0]).confidence_interval) == (2.0, 2.0)
    boot = S.mean_ci(np.random.default_rng(0).gamma(2.0, size=25), method="BCa", seed=3)
    assert boot.ci_method == "BCa" and boot.confidence_interval.low < boot.statistic < boot.confidence_interval.high


def test_confidence_intervals_are_objects_that_unpack():
    from kvstats.results import ConfidenceInterval

    r = S.bootstrap_ci([1.0, 2.0, 4.0, 8.0])
    lo, hi = r.confidence_interval
    assert (r.confidence_interval.low, r.confidence_interval.high) == (lo, hi) == tuple(r.confidence_interval)
    assert lo < hi and r.confidence_interval[0] == lo
    w = S.wilcoxon([1.0, 2, 3, 4, 5], [0.5, 2.5, 2, 3, 4])  # a plain pair given to a result becomes an object
    assert isinstance(w.confidence_interval, ConfidenceInterval)
    assert w.to_dict()["ci_high"] == w.confidence_interval.high


@pytest.mark.parametrize("d", [[0, 0, 1, -1.0], [0, 0, 0, 1, -1, 0, 0, 0, 2, 3.0], [0, 0, 0, 0, 1, -1.0]])
def test_wilcoxon_ci_is_never_nan_when_zeros_meet_a_pm1_pair(d):
    """Bootstrap resamples that hold only zero differences have r = 0 (W+ = W- = 0), not 0/0."""
    r = S.wilcoxon(d, np.zeros(len(d)))
    assert all(math.isfinite(v) for v in r.confidence_interval)
    assert -1.0 <= r.confidence_interval.low <= r.effect_size <= r.confidence_interval.high <= 1.0


@pytest.mark.parametrize("n", [1, 2, 8, 9, 20, 50, 51, 200])
def test_wilcoxon_min_pvalue_is_scipys_p_for_n_differences_of_one_sign(n):
    d = np.arange(1.0, n + 1)
    method = "exact" if n <= S.WILCOXON_EXACT_MAX_N else "asymptotic"
    assert S.wilcoxon_min_pvalue(n) == pytest.approx(scipy.stats.wilcoxon(d, method=method).pvalue, rel=1e-9)
    one = scipy.stats.wilcoxon(d, method=method, alternative="greater").pvalue
    assert S.wilcoxon_min_pvalue(n, "greater") == pytest.approx(one, rel=1e-9)


@pytest.mark.parametrize("n, family", [(12, 7), (16, 7), (30, 1), (60, 3)])
def test_detectable_shift_is_detected_with_the_stated_power(n, family):
    """Simulated power of the Wilcoxon test at the detectable shift (normal differences, 20,000 simulations:
    sd of the estimate 0.003) is within 0.05 of the 0.8 asked for (measured 0.795-0.801; the ARE 3/π
    approximation's own error is below 0.01)."""
    d = np.random.default_rng(n).normal(0.0, 1.5, n)
    r = S.detectable_shift(d, alpha=0.05 / family)
    assert r.extra["shift"] == pytest.approx(r.effect_size * np.std(d, ddof=1), rel=1e-12)
    sim = S.wilcoxon_power(r.effect_size, n, alpha=0.05 / family, n_simulations=20_000, seed=1)
    assert abs(sim.power - 0.8) < 0.05


def test_paired_t_power_where_statsmodels_answers_an_array():
    """At n·3/π = 47.7 pairs and α = 0.05/80, statsmodels' solve_power falls back to fsolve and answers a 1-element
    array; the solved d_z must still give the stated power (TTestPower.power recomputes it)."""
    from statsmodels.stats.power import TTestPower

    r = S.paired_t_power(n=50 * 3 / math.pi, power=0.8, alpha=0.05 / 80)
    achieved = TTestPower().power(effect_size=r.effect_size, nobs=50 * 3 / math.pi, alpha=0.05 / 80)
    assert achieved == pytest.approx(0.8, abs=1e-6)
    d = np.random.default_rng(5).normal(size=50)
    assert math.isfinite(S.detectable_shift(d, alpha=0.05 / 80).extra["shift"])


def test_detectable_shift_is_infinite_where_no_p_can_reach_alpha():
    r = S.detectable_shift(np.random.default_rng(0).normal(size=8), alpha=0.05 / 7)
    assert math.isinf(r.effect_size) and math.isinf(r.extra["shift"]) and "no Wilcoxon p-value" in r.extra["reason"]


@pytest.mark.slow
def test_cluster_bootstrap_covers_where_a_unit_bootstrap_does_not():
    """16 documents × 8 segments × 10 tokens, a document effect N(0, 1) and token noise N(0, 1): the pooled mean's
    CI must resample documents. Over 200 simulations (299 resamples each) the cluster bootstrap covered 94% and
    the bootstrap over segments 47% (measured at 400 simulations); thresholds 0.85 and 0.70 are 5.4 and 6.5
    binomial standard deviations away: a correct implementation fails with probability < 1e-7."""
    hits_cluster = hits_units = 0
    for s in range(200):
        rng = np.random.default_rng(1000 + s)
        units, labels = [], []
        for doc in range(16):
            effect = rng.normal(0.0, 1.0)
            for _ in range(8):
                units.append(effect + rng.normal(0.0, 1.0, 10))
                labels.append(doc)
        ci = S.cluster_bootstrap_ci(units, np.mean, clusters=labels, n_resamples=299, seed=s).confidence_interval
        naive = S.cluster_bootstrap_ci(units, np.mean, n_resamples=299, seed=s).confidence_interval
        hits_cluster += ci.low <= 0.0 <= ci.high
        hits_units += naive.low <= 0.0 <= naive.high
    assert hits_cluster >= 0.85 * 200 and hits_units <= 0.70 * 200


def test_cluster_bootstrap_estimate_is_the_pooled_statistic_and_unequal_units_work():
    units = [np.arange(5.0), np.arange(3.0) + 10, np.arange(7.0) - 4]
    r = S.cluster_bootstrap_ci(units, lambda x: np.quantile(x, 0.9), clusters=["a", "a", "b"], n_resamples=200)
    assert r.statistic == pytest.approx(np.quantile(np.concatenate(units), 0.9))
    assert r.n == (2, 3) and r.confidence_interval.low <= r.confidence_interval.high
    with pytest.raises(ValueError, match="one label per unit"):
        S.cluster_bootstrap_ci(units, clusters=[0, 1])


def test_cluster_bootstrap_of_paired_rows():
    """2-D units (rows of paired values) resample rows together: with one column it is the 1-D bootstrap draw for
    draw; the estimate of a ratio of column medians is that of the pooled rows; shapes must agree."""
    rng = np.random.default_rng(4)
    units = [rng.normal(size=int(k)) for k in rng.integers(3, 9, 10)]
    labels = [i // 3 for i in range(10)]
    flat = S.cluster_bootstrap_ci(units, np.mean, clusters=labels, n_resamples=300, seed=2)
    column = S.cluster_bootstrap_ci([u[:, None] for u in units], lambda x: float(np.mean(x[:, 0])), clusters=labels,
                                    n_resamples=300, seed=2)
    assert column.confidence_interval == flat.confidence_interval and column.statistic == flat.statistic
    pairs = [np.abs(rng.normal(size=(4, 2))) + [1.0, 2.0] for _ in range(8)]
    r = S.cluster_bootstrap_ci(pairs, lambda x: float(np.median(x[:, 0]) / np.median(x[:, 1])),
                               clusters=[i // 2 for i in range(8)], n_resamples=400)
    rows = np.concatenate(pairs)
    assert r.statistic == pytest.approx(np.median(rows[:, 0]) / np.median(rows[:, 1]))
    assert r.confidence_interval.low <= r.statistic <= r.confidence_interval.high
    with pytest.raises(ValueError, match="1-D or all 2-D with 2 columns"):
        S.cluster_bootstrap_ci([np.ones((2, 2)), np.ones((2, 3))])


@pytest.mark.slow
def test_cluster_bca_covers_a_pooled_median():
    """24 clusters × 32 lognormal values with a cluster effect N(0, 0.5²), the pooled median's 95% cluster BCa
    interval (499 resamples) over 300 data sets: measured 92-93.5% for the median at 128 values per cluster; a 0.83
    floor is 5.7 binomial sd below (P(fail) < 1e-8)."""
    rng = np.random.default_rng(3)
    big = np.concatenate([np.exp(rng.normal(0, 0.5) + rng.normal(0, 1.2, 32)) for _ in range(40000)])
    truth = float(np.median(big))
    hits = 0
    for s in range(300):
        units = [np.exp(rng.normal(0, 0.5) + rng.normal(0, 1.2, 32)) for _ in range(24)]
        ci = S.cluster_bootstrap_ci(units, np.median, n_resamples=499, seed=s).confidence_interval
        hits += ci.low <= truth <= ci.high
    assert hits >= 0.83 * 300


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_exact_p_at_complete_separation_matches_scipy(alternative):
    # U₁ = 0 or n₁n₂ (every a below, or above, every b): the far tail's complement is P(U ≤ −1) = 0, so the
    # one-sided p against the data is exactly 1 (it raised IndexError); scipy's exact distribution is the oracle.
    for a, b in (([1.0, 2, 3], [4.0, 5, 6, 7, 8]), ([4.0, 5, 6, 7, 8], [1.0, 2, 3]), ([1.0], [2.0]), ([2.0], [1.0])):
        want = scipy.stats.mannwhitneyu(a, b, alternative=alternative, method="exact").pvalue
        assert S.mann_whitney(a, b, alternative=alternative).pvalue == pytest.approx(want, rel=1e-12, abs=0)


def test_mann_whitney_at_5000_by_5000_gives_p_and_r_and_says_why_no_shift():
    # n1·n2 = 2.5e7 > HL_MAX_PAIRS: the p-value (normal approximation, scipy's) and r are computed, the
    # Hodges–Lehmann shift is absent with its reason (it was refused outright).
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.1, 1, 5000), rng.normal(0, 1, 5000)
    r = S.mann_whitney(a, b)
    ref = scipy.stats.mannwhitneyu(a, b, method="asymptotic")
    assert r.pvalue == pytest.approx(ref.pvalue, rel=1e-12) and r.pvalue_method == "asymptotic"
    assert r.rank_biserial == pytest.approx(2 * ref.statistic / 5000**2 - 1, rel=1e-12)
    assert math.isnan(r.hl_shift) and all(math.isnan(c) for c in r.confidence_interval)
    assert "not computed" in r.ci_of and "HL_MAX_PAIRS" in r.ci_of


def test_wilcoxon_large_n_skips_the_bootstrap_by_default_with_the_reason():
    rng = np.random.default_rng(6)
    a = rng.normal(0.05, 1, S.WILCOXON_BOOTSTRAP_MAX_N + 1)
    b = rng.normal(0, 1, a.size)
    r = S.wilcoxon(a, b)
    assert r.pvalue == pytest.approx(scipy.stats.wilcoxon(a - b).pvalue, rel=1e-12)
    assert all(math.isnan(c) for c in r.confidence_interval) and "n_resamples=9999" in r.ci_of
    small = S.wilcoxon(a[:200], b[:200], n_resamples=0)
    assert all(math.isnan(c) for c in small.confidence_interval) and "n_resamples=0" in small.ci_of
    with pytest.raises(ValueError, match="n_resamples"):
        S.wilcoxon(a[:20], b[:20], n_resamples=-1)


# ------------------------------------------------------------------- CIs at the edges of float64 (issue 30)
def _huge(scale: float) -> np.ndarray:
    return np.random.default_rng(3).lognormal(0, 1, 60) * scale


@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_mean_ci_is_scale_equivariant_down_to_the_last_bit_at_the_edges_of_float64(scale):
    # oracle: the same data at unit scale, times the scale. Multiplying by a power of two is exact, so the
    # interval, estimate and standard error equal the unit-scale ones times 2^k to rounding of one product.
    k = math.frexp(scale)[1]
    unit = _huge(1.0)
    for method in ("t", "studentized", "BCa"):
        big = S.mean_ci(unit * 2.0**k, method=method, n_resamples=999)
        ref = S.mean_ci(unit, method=method, n_resamples=999)
        assert all(math.isfinite(v) for v in (*big.confidence_interval, big.standard_error, big.statistic))
        for got, want in ((big.statistic, ref.statistic), (big.standard_error, ref.standard_error),
                          *zip(big.confidence_interval, ref.confidence_interval)):
            assert got == pytest.approx(want * 2.0**k, rel=1e-12), method


def test_bootstrap_and_cluster_cis_stay_finite_on_values_near_1e300():
    x = _huge(1e300)
    boot = S.bootstrap_ci(x, np.mean, n_resamples=999)
    ref = S.bootstrap_ci(x / 1e300, np.mean, n_resamples=999)  # the same resamples (same seed), unit scale
    assert math.isfinite(boot.standard_error)
    assert boot.standard_error == pytest.approx(ref.standard_error * 1e300, rel=1e-9)
    assert boot.confidence_interval == pytest.approx(tuple(v * 1e300 for v in ref.confidence_interval), rel=1e-9)
    units = [x[i:i + 6] for i in range(0, 60, 6)]
    clustered = S.cluster_bootstrap_ci(units, np.mean, n_resamples=999)
    unit = S.cluster_bootstrap_ci([u / 1e300 for u in units], np.mean, n_resamples=999)
    assert clustered.ci_method.startswith("BCa")  # the acceleration (cubes of 1e299) did not overflow
    assert clustered.confidence_interval == pytest.approx(tuple(v * 1e300 for v in unit.confidence_interval),
                                                          rel=1e-9)
    assert clustered.standard_error == pytest.approx(unit.standard_error * 1e300, rel=1e-9)


def test_a_statistic_that_overflows_float64_is_refused_by_name():
    x = _huge(1e200)
    with np.errstate(over="ignore"), \
            pytest.raises(ValueError, match=r"bootstrap interval of var is not finite .* max \|value\| = .*rescale"):
        S.bootstrap_ci(x, np.var, n_resamples=999)  # var of 1e200 values is 1e400: beyond float64


@pytest.mark.parametrize("call", [
    lambda n: S.bootstrap_ci(np.arange(20.0), np.mean, n_resamples=n),
    lambda n: S.ratio_ci(np.arange(1.0, 21.0), np.arange(2.0, 22.0), n_resamples=n),
    lambda n: S.mean_ci(np.arange(20.0), n_resamples=n),
    lambda n: S.cluster_bootstrap_ci([np.arange(5.0) + i for i in range(6)], np.mean, n_resamples=n),
    lambda n: S.spearman(np.arange(20.0), np.arange(20.0) ** 2 % 7, n_resamples=n),
    lambda n: S.wilcoxon(np.arange(20.0) - 7.5, n_resamples=n),
])
def test_too_few_resamples_for_the_level_are_refused(call):
    # n = 1 gave an "interval" of one resampled value that excluded the estimate; at 95% the tails need
    # n·0.025 ≥ 1, so 40 is the least accepted
    for n in (1, 39):
        with pytest.raises(ValueError, match=rf"n_resamples must be at least 40 for a 0.95 confidence .*got {n}"):
            call(n)
    assert all(math.isfinite(v) for v in call(40).confidence_interval)


def test_min_resamples_grows_with_the_level():
    from kvstats.measure.stats._common import min_resamples

    assert [min_resamples(level) for level in (0.5, 0.9, 0.95, 0.99)] == [4, 20, 40, 200]


@pytest.mark.parametrize("k", [-700, -400, 350, 400, 800])
def test_a_ratio_whose_estimate_is_zero_keeps_its_interval_at_any_scale(k):
    # at a 0 estimate the equivariance and invariance checks both hold: the rescaling must not pick the wrong law
    g = np.random.default_rng(0).normal(size=20)
    a, b = np.concatenate([g, -g]), np.random.default_rng(1).uniform(1, 2, 40)
    unit = S.ratio_ci(a, b, statistic=np.mean, n_resamples=999)
    scaled = S.ratio_ci(a * 2.0**k, b * 2.0**k, statistic=np.mean, n_resamples=999)
    assert scaled.confidence_interval == pytest.approx(unit.confidence_interval, rel=1e-12)


@pytest.mark.parametrize("scale", [1e105, 1e120, 1e140, 1e-120])
def test_bca_does_not_fall_back_between_1e100_and_1e150(scale):
    x = _huge(1.0)
    unit = S.bootstrap_ci(x, np.mean, n_resamples=999)
    big = S.bootstrap_ci(x * scale, np.mean, n_resamples=999)
    assert big.ci_method == unit.ci_method == "BCa"
    assert big.confidence_interval == pytest.approx(tuple(v * scale for v in unit.confidence_interval), rel=1e-12)


def test_a_statistic_undefined_on_some_resamples_of_moderate_data_keeps_its_non_finite_interval():
    # a zero median of b in some resamples: the interval reaches inf, as documented (not an overflow refusal)
    r = S.ratio_ci(np.arange(1.0, 22.0), np.array([0.0] * 10 + [1.0] * 11), statistic=np.median, n_resamples=999)
    assert math.isinf(r.confidence_interval[1])


def test_mean_ci_support_cuts_the_interval_to_what_the_mean_can_be():
    """A mean of non-negative values (a KL divergence) has no negative lower bound: with support (0, ∞) the interval
    is the unconstrained one intersected with [0, ∞) (oracle: the same call without support), labelled; data outside
    the support are refused."""
    import math

    from kvstats.measure import stats as S
    skewed = [0.01, 0.02, 0.0, 5.0, 0.03, 0.01]  # one large document: the studentized interval dips below 0
    free = S.mean_ci(skewed)
    cut = S.mean_ci(skewed, support=(0.0, math.inf))
    assert free.confidence_interval[0] < 0
    assert cut.confidence_interval[0] == 0.0 and cut.confidence_interval[1] == free.confidence_interval[1]
    assert cut.statistic == free.statistic and "intersected with the support [0, inf]" in cut.ci_method
    inside = S.mean_ci([1.0, 2.0, 3.0, 4.0, 5.0], support=(0.0, math.inf))
    assert inside.ci_method == S.mean_ci([1.0, 2.0, 3.0, 4.0, 5.0]).ci_method  # nothing cut, nothing said
    with pytest.raises(ValueError, match="support"):
        S.mean_ci([-0.1, 0.2, 0.3], support=(0.0, math.inf))
    with pytest.raises(ValueError, match="low < high"):
        S.mean_ci([0.1, 0.2, 0.3], support=(1.0, 0.0))
    with pytest.raises(TypeError, match="support"):
        S.mean_ci([0.1, 0.2, 0.3], support=0.0)
