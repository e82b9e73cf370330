"""The KS distance's confidence interval (kvstats.stats.ks_distance_interval): Kolmogorov's asymptotic constant,
coverage of a known distance by simulation, and the equivalence rule it feeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from kvstats import stats
from kvstats.measure import verdicts


def test_the_half_width_is_kolmogorovs_asymptotic_constant_at_large_n():
    # sqrt(n)·sup|F_n − F| → Kolmogorov's law: 1.35810 at 95% (Smirnov's table), independent of scipy's kstwo
    n = 200_000
    low, high = stats.ks_distance_interval(0.5, n)
    assert (high - low) / 2 * math.sqrt(n) == pytest.approx(1.35810, rel=2e-3)
    assert stats.ks_distance_interval(0.001, n)[0] == 0.0  # clipped at the distance's support


def test_the_interval_covers_a_known_distance():
    # N(μ, 1) drawn, N(0, 1) the model: Δ = sup|Φ(x − μ) − Φ(x)| = 2Φ(μ/2) − 1. Coverage ≥ 95% by construction
    # (conservative); 2000 seeded replicates: a 95%-covering interval falls below 92% with probability < 1e-8
    # (binomial, z = 6.2), so a wrong half-width (e.g. the one-sided or 1/n one) is caught without flakiness.
    mu, n, reps = 0.1, 500, 2000
    delta = 2 * scipy.stats.norm.cdf(mu / 2) - 1
    rng = np.random.default_rng(20261207)
    covered = 0
    for _ in range(reps):
        d = scipy.stats.kstest(rng.normal(mu, 1, n), scipy.stats.norm.cdf).statistic
        low, high = stats.ks_distance_interval(d, n)
        covered += low <= delta <= high
    assert covered / reps >= 0.92


def test_the_equivalence_rule_on_ks_intervals_gives_every_outcome():
    n = 32768
    assert verdicts.equivalence([stats.ks_distance_interval(0.003, n)], 0.02).verdict == "reproduced"
    assert verdicts.equivalence([stats.ks_distance_interval(0.10, n)], 0.02).verdict == "not reproduced"
    undecided = verdicts.equivalence([stats.ks_distance_interval(0.015, n)], 0.02, n=n)
    assert undecided.verdict == "inconclusive" and "would decide" in undecided.reason


@pytest.mark.parametrize("kwargs, error, message", [
    ({"distance": 1.5, "n": 10}, ValueError, "distance must be a KS distance"),
    ({"distance": float("nan"), "n": 10}, ValueError, "distance must be a KS distance"),
    ({"distance": 0.1, "n": 0}, ValueError, "n must be in"),
    ({"distance": 0.1, "n": 10.0}, TypeError, "n must be an int"),
    ({"distance": 0.1, "n": 10, "confidence_level": 1.0}, ValueError, "confidence_level"),
])
def test_bad_ks_interval_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        stats.ks_distance_interval(**kwargs)
