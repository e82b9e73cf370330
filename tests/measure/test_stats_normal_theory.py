"""kvstats.stats' written-out normal theory (t intervals, the standard error behind one, the z-test of two independent
estimates) and the least-squares slope, against scipy and statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from statsmodels.regression.linear_model import OLS
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

from kvstats import stats as S


@pytest.mark.parametrize("level", [0.95, 0.9])
def test_t_interval_is_scipys_and_statsmodels_t_interval(level):
    x = np.random.default_rng(1).lognormal(size=17)
    r = S.t_interval(x, level)
    ref = scipy.stats.ttest_1samp(x, 0.0).confidence_interval(confidence_level=level)
    assert r.statistic == pytest.approx(x.mean(), rel=1e-15)
    assert r.confidence_interval.low == pytest.approx(ref.low, rel=1e-12)
    assert r.confidence_interval.high == pytest.approx(ref.high, rel=1e-12)
    assert tuple(r.confidence_interval) == pytest.approx(DescrStatsW(x).tconfint_mean(1 - level), rel=1e-12)
    assert r.standard_error == pytest.approx(scipy.stats.sem(x), rel=1e-12) and r.df == 16
    assert math.isnan(r.pvalue) and r.confidence_level == level


def test_t_interval_evaluates_the_formula_as_written():
    """x̄ ± t·s/√n in that order: the studies' Monte Carlo intervals keep their last digits."""
    x = np.random.default_rng(2).normal(size=30)
    half = scipy.stats.t.ppf(0.975, 29) * x.std(ddof=1) / math.sqrt(30)
    assert tuple(S.t_interval(x).confidence_interval) == (float(x.mean() - half), float(x.mean() + half))


def test_log_ratio_t_interval_is_the_t_interval_of_the_log_ratios():
    rng = np.random.default_rng(3)
    b = rng.lognormal(size=12)
    a = b * rng.lognormal(0.7, 0.2, size=12)
    r = S.log_ratio_t_interval(a, b)
    ref = scipy.stats.ttest_1samp(np.log(a / b), 0.0).confidence_interval(confidence_level=0.95)
    assert r.statistic == pytest.approx(scipy.stats.gmean(a / b), rel=1e-12)
    assert tuple(r.confidence_interval) == pytest.approx((math.exp(ref.low), math.exp(ref.high)), rel=1e-12)
    assert r.standard_error == pytest.approx(scipy.stats.sem(np.log(a / b)), rel=1e-12)
    with pytest.raises(ValueError, match="positive"):
        S.log_ratio_t_interval(a, -b)
    with pytest.raises(ValueError, match="one length"):
        S.log_ratio_t_interval(a, b[:-1])


def test_t_standard_error_inverts_the_t_interval():
    rng = np.random.default_rng(4)
    samples = [rng.normal(size=n) for n in (3, 8, 40)]
    cis = [S.t_interval(x).confidence_interval for x in samples]
    se = S.t_standard_error([c.low for c in cis], [c.high for c in cis], [x.size for x in samples])
    np.testing.assert_allclose(se, [scipy.stats.sem(x) for x in samples], rtol=1e-12)
    # one n for every interval broadcasts
    assert S.t_standard_error([cis[1].low], [cis[1].high], 8)[0] == pytest.approx(scipy.stats.sem(samples[1]))
    with pytest.raises(ValueError, match="at least 2"):
        S.t_standard_error([0.0], [1.0], 1)


def test_z_difference_test_is_statsmodels_two_sample_z_test():
    """From the two means and their standard errors, the z-test equals statsmodels' unequal-variance two-sample
    z-test on the data (its standard error of a mean is s/√n as here)."""
    rng = np.random.default_rng(5)
    x1, x2 = rng.normal(0.3, 1.0, size=200), rng.normal(0.0, 2.0, size=150)
    r = S.z_difference_test(x1.mean(), scipy.stats.sem(x1), x2.mean(), scipy.stats.sem(x2))
    z, p = CompareMeans(DescrStatsW(x1), DescrStatsW(x2)).ztest_ind(usevar="unequal")
    assert r.statistic == pytest.approx(z, rel=1e-12) and r.pvalue == pytest.approx(p, rel=1e-12)
    assert r.effect_size == pytest.approx(x1.mean() - x2.mean())
    assert r.pvalue == pytest.approx(2 * scipy.stats.norm.sf(abs(z)), rel=1e-12)
    with pytest.raises(ValueError, match="standard errors"):
        S.z_difference_test(1.0, 0.0, 2.0, 0.0)


def test_ols_slope_is_scipys_and_statsmodels_slope():
    rng = np.random.default_rng(6)
    x = rng.normal(size=50)
    y = 1.5 * x + rng.normal(scale=0.3, size=50)
    slope = S.ols_slope(np.stack([x, y], axis=1))
    assert slope == pytest.approx(scipy.stats.linregress(x, y).slope, rel=1e-12)
    assert slope == pytest.approx(OLS(y, np.stack([np.ones_like(x), x], axis=1)).fit().params[1], rel=1e-12)
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        S.ols_slope(x)


def test_ols_slope_as_a_cluster_bootstrap_statistic():
    """Units of (x, y) rows: the bootstrap's estimate is the slope of the pooled points."""
    rng = np.random.default_rng(7)
    units = [np.stack([x, 2.0 * x + rng.normal(scale=0.1, size=5)], axis=1) for x in rng.normal(size=(30, 5))]
    r = S.cluster_bootstrap_ci(units, S.ols_slope, n_resamples=199, seed=0)
    assert r.statistic == pytest.approx(scipy.stats.linregress(*np.concatenate(units).T).slope, rel=1e-12)
    assert r.confidence_interval.low < 2.0 < r.confidence_interval.high
