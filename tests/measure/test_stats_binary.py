"""Binary outcomes and equivalence: Wilson / Clopper–Pearson, exact McNemar with Newcombe's paired interval,
TOST and non-inferiority — each against scipy / statsmodels, a closed form or an exact enumeration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from statsmodels.stats.proportion import confint_proportions_2indep

from kvstats import stats
from kvstats.measure import verdicts
from kvstats.measure.stats._binary import _paired_difference_ci


# ------------------------------------------------------------------------------------------- a proportion
@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (10, 10), (47, 120), (1, 1)])
def test_wilson_is_the_closed_form_and_clopper_pearson_the_beta_quantiles(k, n):
    z = scipy.stats.norm.ppf(0.975)
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    wilson = stats.proportion_ci(k, n)
    assert wilson.statistic == p and wilson.successes == k and math.isnan(wilson.pvalue)
    assert wilson.confidence_interval == pytest.approx(((centre - half) / (1 + z * z / n),
                                                       (centre + half) / (1 + z * z / n)), abs=1e-12)
    cp = stats.proportion_ci(k, n, method="clopper-pearson")
    low = 0.0 if k == 0 else scipy.stats.beta.ppf(0.025, k, n - k + 1)
    high = 1.0 if k == n else scipy.stats.beta.ppf(0.975, k + 1, n - k)
    assert cp.confidence_interval == pytest.approx((low, high), abs=1e-12)


def test_a_proportion_from_outcomes_equals_one_from_counts():
    outcomes = [True, False, True, True, False, True, False]
    counted = stats.proportion_ci(4, 7)
    for given in (outcomes, np.array([1, 0, 1, 1, 0, 1, 0])):
        res = stats.proportion_ci(given)
        assert (res.statistic, res.confidence_interval, res.n, res.successes) == (
            counted.statistic, counted.confidence_interval, 7, 4)


@pytest.mark.parametrize("p", [0.02, 0.1, 0.37, 0.5, 0.81, 0.97])
def test_clopper_pearson_covers_at_least_nominally_exactly(p):
    # exact coverage: Σ_k P(Bin(n, p) = k)·[p in CI(k)] over every k, no sampling
    n = 30
    cover = sum(scipy.stats.binom.pmf(k, n, p) for k in range(n + 1)
                if stats.proportion_ci(k, n, method="clopper-pearson").confidence_interval.low <= p
                <= stats.proportion_ci(k, n, method="clopper-pearson").confidence_interval.high)
    assert cover >= 0.95


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(x=[1, 2, 0]), ValueError, "x must hold binary outcomes"),
    (dict(x=[]), ValueError, "non-empty 1-D"),
    (dict(x=5, n=4), ValueError, r"x \(successes\) must be in \[0, 4\], got 5"),
    (dict(x=[1, 0], method="wald"), ValueError, "method must be one of"),
    (dict(x=[1, 0], confidence_level=1.0), ValueError, "confidence_level must be in"),
])
def test_bad_proportion_inputs_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        stats.proportion_ci(**kwargs)


# ------------------------------------------------------------------------------------------------ McNemar
def _pairs(n11, n10, n01, n00):
    a = [1] * n11 + [1] * n10 + [0] * n01 + [0] * n00
    b = [1] * n11 + [0] * n10 + [1] * n01 + [0] * n00
    return a, b


@pytest.mark.parametrize("table", [(10, 7, 1, 2), (3, 0, 9, 8), (5, 4, 4, 5), (40, 12, 3, 1), (0, 1, 0, 0)])
def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs(table):
    n11, n10, n01, n00 = table
    res = stats.mcnemar(*_pairs(*table))
    assert res.table == ((n11, n10), (n01, n00)) and res.n == sum(table)
    assert res.pvalue == pytest.approx(scipy.stats.binomtest(min(n10, n01), n10 + n01, 0.5).pvalue, rel=1e-12)
    assert res.effect_size == pytest.approx((n10 - n01) / sum(table))
    assert res.proportions == pytest.approx(((n11 + n10) / sum(table), (n11 + n01) / sum(table)))
    lo, hi = res.confidence_interval
    assert -1 <= lo <= res.effect_size <= hi <= 1


def test_mcnemar_without_discordant_pairs_has_p_one():
    res = stats.mcnemar([1, 0, 1], [1, 0, 1])
    assert res.pvalue == 1.0 and res.effect_size == 0.0 and res.statistic == 0.0


@pytest.mark.parametrize("table", [(4, 2, 6, 3), (6, 3, 2, 1), (1, 1, 5, 5), (0, 3, 0, 7), (3, 2, 2, 3)])
def test_the_paired_interval_without_correlation_is_newcombes_independent_one(table):
    # adjusted φ = 0 (0 <= n11·n00 − n10·n01 <= n/2): method 10 is the hybrid score interval of two independent
    # proportions with the same margins
    n11, n10, n01, n00 = table
    assert 0 <= n11 * n00 - n10 * n01 <= sum(table) / 2
    n = sum(table)
    expected = confint_proportions_2indep(n11 + n10, n, n11 + n01, n, method="newcomb")
    assert _paired_difference_ci(*table, 0.95) == pytest.approx(tuple(map(float, expected)), abs=1e-12)


def _newcombe_10(r, s, t, u, level=0.95):
    """Newcombe (1998) method 10 transcribed from the paper's formulas, independently of kvstats: the Wilson
    limits by their closed form, φ adjusted (A − n/2 above n/2, 0 between 0 and n/2, A below 0)."""
    z = scipy.stats.norm.ppf(1 - (1 - level) / 2)
    n = r + s + t + u

    def wilson(k):
        p = k / n
        centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)

    p1, p2 = (r + s) / n, (r + t) / n
    (l1, u1), (l2, u2) = wilson(r + s), wilson(r + t)
    a = r * u - s * t
    c = a - n / 2 if a > n / 2 else (a if a < 0 else 0)
    margins = (r + s) * (t + u) * (r + t) * (s + u)
    phi = c / math.sqrt(margins) if margins else 0.0
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2),
            d + math.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))


@pytest.mark.parametrize("table", [(1, 1, 7, 12), (59, 6, 16, 80), (36, 12, 2, 0), (10, 7, 1, 2), (20, 3, 1, 25)])
def test_the_paired_interval_is_newcombes_method_10(table):
    assert _paired_difference_ci(*table, 0.95) == pytest.approx(_newcombe_10(*table), abs=1e-12)


def test_the_paired_interval_of_a_published_table():
    # Bentur et al. (2009), airway hyper-responsiveness before and after stem-cell transplantation, the paired
    # example of Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017), ch. 8: the
    # Newcombe square-and-add interval −0.507 to −0.026 of the difference −0.286
    res = stats.mcnemar(*_pairs(1, 1, 7, 12))
    assert res.effect_size == pytest.approx(-6 / 21)
    assert res.confidence_interval == pytest.approx((-0.507, -0.026), abs=6e-4)


@pytest.mark.slow
@pytest.mark.parametrize("cells", [(0.4, 0.1, 0.1, 0.4), (0.7, 0.2, 0.05, 0.05), (0.1, 0.3, 0.1, 0.5),
                                   (0.85, 0.1, 0.0, 0.05), (0.25, 0.25, 0.25, 0.25)])
def test_the_paired_interval_covers_near_nominally_exactly(cells):
    # exact coverage over every table of n = 20 pairs (multinomial, no sampling). Computed here: 0.951–0.998 at
    # these points (method 10 with the adjusted φ is near nominal to conservative).
    n, theta = 20, cells[1] - cells[2]
    cover = 0.0
    for n11 in range(n + 1):
        for n10 in range(n + 1 - n11):
            for n01 in range(n + 1 - n11 - n10):
                counts = (n11, n10, n01, n - n11 - n10 - n01)
                lo, hi = _paired_difference_ci(*counts, 0.95)
                if lo <= theta <= hi:
                    cover += scipy.stats.multinomial.pmf(counts, n, cells)
    assert 0.945 <= cover <= 0.999


def test_mcnemar_refuses_unpaired_or_non_binary_outcomes():
    with pytest.raises(ValueError, match="a and b must pair trial for trial, got 3 and 2"):
        stats.mcnemar([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="b must hold binary outcomes"):
        stats.mcnemar([1, 0], [1, 0.5])


# ------------------------------------------------------------------------------------- TOST, non-inferiority
RNG = np.random.default_rng(7)
A = RNG.normal(1.0, 0.3, 25)
B = A + RNG.normal(0.05, 0.1, 25)


def test_paired_tost_is_the_larger_of_two_one_sided_t_tests():
    d, delta = A - B, 0.12
    res = stats.equivalence(A, B, margin=delta)
    lower = scipy.stats.ttest_1samp(d, -delta, alternative="greater").pvalue
    upper = scipy.stats.ttest_1samp(d, delta, alternative="less").pvalue
    assert res.pvalue == pytest.approx(max(lower, upper), rel=1e-10)
    t90 = scipy.stats.t.ppf(0.95, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    assert res.confidence_interval == pytest.approx((d.mean() - t90, d.mean() + t90), rel=1e-10)
    assert res.conclusion == (-delta < res.confidence_interval.low and res.confidence_interval.high < delta)


def test_unpaired_tost_is_welchs_t_shifted_by_the_margin():
    x, y, delta = A, RNG.normal(1.02, 0.35, 31), 0.25
    res = stats.equivalence(x, y, margin=delta, paired=False)
    lower = scipy.stats.ttest_ind(x + delta, y, equal_var=False, alternative="greater").pvalue
    upper = scipy.stats.ttest_ind(x - delta, y, equal_var=False, alternative="less").pvalue
    assert res.pvalue == pytest.approx(max(lower, upper), rel=1e-10) and res.n == (25, 31)


@pytest.mark.parametrize("margin", [0.01, 0.05, 0.1, 0.3])
def test_tost_concludes_exactly_when_its_interval_is_inside_the_margin(margin):
    res = stats.equivalence(A, B, margin=margin)
    lo, hi = res.confidence_interval
    assert res.conclusion == (-margin < lo and hi < margin)


def test_noninferiority_is_one_sided_t_against_the_margin():
    d = A - B
    worse = stats.noninferiority(A, B, margin=0.1)  # lower is better: H0 mean(d) >= 0.1
    assert worse.pvalue == pytest.approx(scipy.stats.ttest_1samp(d, 0.1, alternative="less").pvalue, rel=1e-10)
    better = stats.noninferiority(A, B, margin=0.1, higher_is_better=True)  # H0 mean(d) <= -0.1
    assert better.pvalue == pytest.approx(scipy.stats.ttest_1samp(d, -0.1, alternative="greater").pvalue,
                                          rel=1e-10)


@pytest.mark.parametrize("kwargs, message", [
    (dict(margin=0), "margin must be a finite number > 0"), (dict(margin=float("nan")), "margin must be"),
    (dict(margin=0.1, alpha=0.6), r"alpha must be in \(0, 0.5\)"),
])
def test_bad_equivalence_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        stats.equivalence(A, B, **kwargs)
    with pytest.raises(ValueError, match="paired samples must have one length"):
        stats.equivalence(A, B[:-1], margin=0.1)
    # constant differences: no t statistic (p would be 0, 1 or NaN from a division by zero)
    for test in (stats.equivalence, stats.noninferiority):
        with pytest.raises(ValueError, match="paired differences a − b have no spread"):
            test([1.0, 2, 3, 4], [0.5, 1.5, 2.5, 3.5], margin=0.5)
        with pytest.raises(ValueError, match="a and b are both constant"):
            test([1.0, 1.0], [2.0, 2.0], margin=0.5, paired=False)


def test_the_equivalence_rule():
    assert verdicts.equivalence([(-0.05, 0.04), (-0.01, 0.09)], 0.1).verdict == "reproduced"
    assert verdicts.equivalence([(-0.05, 0.04), (-0.01, 0.2)], 0.1).verdict == "partly"
    v = verdicts.equivalence([(-0.05, 0.04), (0.15, 0.3)], 0.1, what="budgets")
    assert v.verdict == "not reproduced" and v.rule == "equivalence" and "1 different by more" in v.reason
    with pytest.raises(ValueError, match="margin must be > 0"):
        verdicts.equivalence([(0, 1)], -1)


# ----------------------------------------------------------------------------------- planning an equivalence
@pytest.mark.parametrize("margin, level", [(0.05, 0.9), (0.1, 0.9), (0.05, 0.95), (0.02, 0.9)])
def test_the_fewest_trials_for_an_equivalence_is_the_wilson_closed_form(margin, level):
    # two methods right on every trial: Newcombe's interval is ±z²/(n + z²) (Wilson's lower bound at p = 1)
    z = scipy.stats.norm.ppf((1 + level) / 2)
    expected = math.floor(z * z * (1 - margin) / margin) + 1
    n = stats.paired_equivalence_trials(margin, confidence_level=level)
    assert n == expected
    inside = [stats.mcnemar(np.ones(k, bool), np.ones(k, bool), confidence_level=level).confidence_interval
              for k in (n - 1, n)]
    assert inside[0].high >= margin > inside[1].high and -margin < inside[1].low


def test_thirty_passkey_trials_cannot_decide_a_five_point_equivalence():
    assert stats.paired_equivalence_trials(0.05) == 52
    ci = stats.mcnemar(np.ones(30, bool), np.ones(30, bool), confidence_level=0.9).confidence_interval
    assert verdicts.equivalence([(ci.low, ci.high)], 0.05).verdict == "inconclusive"


@pytest.mark.parametrize("kwargs, message", [
    ({"margin": 0.0}, "margin must be"), ({"margin": 1.5}, "margin must be"),
    ({"margin": 0.05, "accuracy": 1.2}, "accuracy must be"),
    ({"margin": 0.05, "confidence_level": 1.0}, "confidence_level"),
    ({"margin": 1e-6, "max_trials": 100}, "no n ≤ max_trials=100"),
])
def test_bad_planning_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        stats.paired_equivalence_trials(**kwargs)
