"""kvstats.testing: the strategies produce the promised shapes, the assertions accept and reject as sized.

Sizing: assert_* run at alpha = 1e-6 (false alarm < 1e-6 per call for correct estimators); the
rejections are by construction > 20 standard errors away (comments).
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from kvstats import inference, metrics
from kvstats.testing import (
    HEAD_DIMS,
    assert_unbiased,
    assert_variance_matches,
    caches,
    query_key_pairs,
    unit_vectors,
    vectors,
)


def projected_qjl(m, scale=1.0):
    """QJL with Gaussian rows, sampled through the exact joint law of (s·q, s·k): a bivariate normal with
    covariance [[‖q‖², ⟨q,k⟩], [⟨q,k⟩, ‖k‖²]]. Same distribution as the d-dimensional sketch, O(m) per draw."""

    def est(q, k, seeds):
        rng = np.random.default_rng(int(seeds[0]))
        (a, _), (b, c) = np.linalg.cholesky(np.array([[q @ q, q @ k], [q @ k, k @ k]]))
        g0 = rng.standard_normal((len(seeds), m))
        sk_sign = np.sign(b * g0 + c * rng.standard_normal((len(seeds), m)))  # s·k = b g0 + c g1, s·q = a g0
        return scale * math.sqrt(math.pi / 2) / m * np.linalg.norm(k) * a * np.einsum("nm,nm->n", g0, sk_sign)

    return est


@given(cache=caches())
@settings(max_examples=30, deadline=None)
def test_caches_have_design_shapes_and_work_with_metrics(cache):
    q, k, v = cache
    b, hq, nq, d = q.shape
    assert k.shape == v.shape and k.shape[0] == b and k.shape[-1] == d and hq % k.shape[1] == 0
    assert d in HEAD_DIMS
    assert metrics.attention_kl(q, k, k) == 0.0
    assert metrics.topk_recall(q, k, k, top_k=1) == 1.0


@given(x=vectors(7, batch=(3,)), u=unit_vectors(batch=(4,), dtype=torch.float64))
@settings(max_examples=20, deadline=None)
def test_vectors_and_unit_vectors(x, u):
    assert x.shape == (3, 7) and bool((x.norm(dim=-1) > 0).all())
    torch.testing.assert_close(u.norm(dim=-1), torch.ones(4, dtype=torch.float64))


@given(pair=query_key_pairs(16))
@settings(max_examples=20, deadline=None)
def test_query_key_pairs_are_unit(pair):
    q, k = pair
    assert q.shape == k.shape == (16,)
    assert np.linalg.norm(q) == pytest.approx(1) and np.linalg.norm(k) == pytest.approx(1)
    assert -0.95 - 1e-12 <= q @ k <= 0.95 + 1e-12


Q = np.zeros(128)
Q[0] = 1.0
K = np.zeros(128)
K[0], K[1] = 0.6, 0.8  # <q, k> = 0.6, unit vectors


def test_assert_unbiased_accepts_qjl_and_rejects_shrunk():
    assert_unbiased(projected_qjl(64), Q, K, n_seeds=20_000)
    # shrunk by 2/π: bias -0.218 against se = 0.13 * 0.64 / sqrt(20000) ~ 6e-4: ~ 370 se
    with pytest.raises(AssertionError, match=r"estimator is biased: .*truth 0.6.*p = .* < alpha = 1e-06"):
        assert_unbiased(projected_qjl(64, scale=2 / math.pi), Q, K, n_seeds=20_000)


def test_assert_variance_matches_accepts_closed_form_and_rejects_jl_formula():
    var = inference.qjl_variance(Q, K, 64)
    assert_variance_matches(projected_qjl(64), Q, K, var, n_seeds=50_000)
    # the JL formula (1 + 0.36)/64 against the QJL (π/2 − 0.36)/64: ratio 0.89, i.e. log ratio -0.12 against
    # se(log s²) ~ sqrt(2/50000) = 0.0063: ~ 19 se (4.9 needed)
    with pytest.raises(AssertionError, match=r"does not match the closed form .*excludes 1"):
        assert_variance_matches(projected_qjl(64), Q, K, inference.jl_variance(Q, K, 64), n_seeds=50_000)


def test_check_unbiased_at_scale():
    # The check_unbiased protocol at scale: 3·10^5 draws of a vectorised (projected) QJL at d = 128, m = 64
    # (10^6 draws take ~10 s on a loaded 2-core machine; this keeps the suite short).
    r = inference.check_unbiased(projected_qjl(64), Q, K, n_draws=300_000, batch_size=100_000,
                                 variance_closed_form=inference.qjl_variance(Q, K, 64), confidence_level=1 - 1e-7)
    assert r.pvalue > 1e-7 and r.variance_ratio_ci[0] < 1 < r.variance_ratio_ci[1]
    assert r.n == 300_000
