"""The probability of improvement beside the rank-biserial r, against brute force over the pairs."""

from __future__ import annotations

import numpy as np
import pytest

from kvstats import stats

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("a, b", [
    (RNG.normal(0, 1, 17), RNG.normal(0.4, 1, 23)),
    (np.array([1.0, 2, 2, 3, 5]), np.array([2.0, 2, 4, 6])),  # ties across the samples
])
def test_mann_whitney_prob_less_is_the_share_of_pairs_with_a_below_b(a, b):
    res = stats.mann_whitney(a, b)
    brute = np.mean([(x < y) + 0.5 * (x == y) for x in a for y in b])
    assert res.prob_less == pytest.approx(brute, abs=1e-12)
    assert res.prob_less == pytest.approx((1 - res.rank_biserial) / 2, abs=1e-12)
    assert "prob_less" in res.summary()


def test_wilcoxon_prob_less_is_the_share_of_pairs_in_which_a_is_below_b():
    a = RNG.normal(0, 1, 30)
    b = a + RNG.normal(0.3, 0.5, 30)
    b[:3] = a[:3]  # three ties count one half each
    res = stats.wilcoxon(a, b, n_resamples=199)
    assert res.prob_less == pytest.approx((np.sum(a < b) + 0.5 * np.sum(a == b)) / 30, abs=1e-12)
    assert "prob_less" in res.summary()


def test_unit_seeds_are_spawned_children_and_runs_with_neighbouring_seeds_share_no_unit():
    from kvstats._random import unit_seed

    children = np.random.SeedSequence(7).spawn(9)
    words = [c.generate_state(2, dtype=np.uint32) for c in children[:5]]
    assert [unit_seed(7, i) for i in range(5)] == [((int(h) << 32) | int(lo)) & (2**63 - 1) for h, lo in words]
    run0 = {unit_seed(0, i) for i in range(64)}
    run1 = {unit_seed(1, i) for i in range(64)}
    assert not run0 & run1  # with seed + i, 63 of the 64 units were shared
    with pytest.raises(TypeError, match="seed must be the run's int seed"):
        unit_seed(None, 0)


def test_evaluate_units_use_the_spawned_seeds():
    import torch

    from kvstats._random import unit_seed
    from kvstats.data.synthetic import generate
    from kvstats.evaluation.units import synthetic_units

    source = synthetic_units("gaussian", seed=3, dim=16, kv_heads=1, q_heads=2, seq=8, n_q=2)
    q, k, v = generate("gaussian", 1, 1, 8, 16, unit_seed(3, 2), q_heads=2, n_q=2)
    [(q2, k2, v2)] = source.unit(2)
    for got, want in ((q2, q), (k2, k), (v2, v)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
