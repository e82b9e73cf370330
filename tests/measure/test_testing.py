"""kvstats.testing: the strategies produce the promised shapes, the assertions accept and reject as sized.

Sizing: assert_* run at alpha = 1e-6 (false alarm < 1e-6 per call for correct estimators); the
rejections are by construction > 20 standard errors away (comments).
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from kvstats.measure import inference, metrics
from kvstats.measure.testing import (
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
    # accept at alpha = 1e-7 (a correct estimator fails w.p. 1e-7; the t test's normal tail at n = 20000 of
    # bounded estimates); the rejection below keeps the default alpha = 1e-6, whose message it checks
    assert_unbiased(projected_qjl(64), Q, K, n_seeds=20_000, alpha=1e-7)
    # shrunk by 2/π: bias -0.218 against se = 0.13 * 0.64 / sqrt(20000) ~ 6e-4: ~ 370 se
    with pytest.raises(AssertionError, match=r"estimator is biased: .*truth 0.6.*p = .* < alpha = 1e-06"):
        assert_unbiased(projected_qjl(64, scale=2 / math.pi), Q, K, n_seeds=20_000)


def test_assert_variance_matches_accepts_closed_form_and_rejects_jl_formula():
    var = inference.qjl_variance(Q, K, 64)
    # accept at alpha = 1e-7: the kurtosis-aware CI at n = 50000 fails a correct closed form w.p. ≈ 1e-7
    assert_variance_matches(projected_qjl(64), Q, K, var, n_seeds=50_000, alpha=1e-7)
    # the JL formula (1 + 0.36)/64 against the QJL (π/2 − 0.36)/64: ratio 0.89, i.e. log ratio -0.12 against
    # se(log s²) ~ sqrt(2/50000) = 0.0063: ~ 19 se (4.9 needed at the default alpha = 1e-6)
    with pytest.raises(AssertionError, match=r"does not match the closed form .*excludes 1"):
        assert_variance_matches(projected_qjl(64), Q, K, inference.jl_variance(Q, K, 64), n_seeds=50_000)


def test_check_unbiased_at_scale():
    # The check_unbiased protocol at scale: 3·10^5 draws of a vectorised (projected) QJL at d = 128, m = 64
    # (10^6 draws take ~10 s on a loaded 2-core machine; this keeps the suite short).
    r = inference.check_unbiased(projected_qjl(64), Q, K, n_draws=300_000, batch_size=100_000,
                                 variance_closed_form=inference.qjl_variance(Q, K, 64), confidence_level=1 - 1e-7)
    assert r.pvalue > 1e-7 and r.variance_ratio_ci[0] < 1 < r.variance_ratio_ci[1]
    assert r.n == 300_000


def _constant(value):
    def est(q, k, seeds):
        return np.full(len(seeds), value)

    return est


def test_assert_unbiased_judges_deterministic_estimators_by_rounding():
    # issue 16: a deterministic estimator off by 8e-8 (fp32 rounding of <q, k> = 0.6) was called biased, t = -inf
    fp32 = float(np.float32(Q) @ np.float32(K))
    assert_unbiased(_constant(0.6 + 8e-8), Q, K, n_seeds=1000)
    assert_unbiased(_constant(fp32), Q, K, n_seeds=1000)
    # nearly deterministic: noise of sd 1e-9 around a rounding-size bias is rounding too
    assert_unbiased(lambda q, k, s: 0.6 + 8e-8 + 1e-9 * np.random.default_rng(int(s[0])).standard_normal(len(s)),
                    Q, K, n_seeds=1000)
    # a real bias of 1e-3 is 100x the tolerance rtol * |q||k| = 1e-5 * 1
    with pytest.raises(AssertionError, match=r"biased beyond floating-point rounding: .*deterministic.*"
                                             r"rtol\*scale = 1e-05\*1 = 1e-05"):
        assert_unbiased(_constant(0.601), Q, K, n_seeds=1000)
    with pytest.raises(ValueError, match="rtol must be a number in"):
        assert_unbiased(_constant(0.6), Q, K, rtol=-1.0)


def test_assert_variance_matches_on_a_constant_estimator_is_finite_and_clear():
    with pytest.raises(AssertionError, match=r"estimator variance 0 does not match the closed form 0.01: all 1000 "
                                             r"draws equal 0.6 \(a deterministic estimator") as info:
        assert_variance_matches(_constant(0.6), Q, K, 0.01, n_seeds=1000)
    assert "nan" not in str(info.value)
    r = inference.unbiasedness_test(np.full(100, 2.0), 2.0, variance_closed_form=1.0)
    assert r.variance_ratio == 0.0 and r.variance_ratio_ci == (0.0, 0.0) and r.variance_pvalue == 0.0
    with pytest.raises(ValueError, match="variance must be a finite number > 0, got 0"):
        assert_variance_matches(_constant(0.6), Q, K, 0)


def test_strategies_refuse_degenerate_sizes_and_overflowing_scales():
    for bad in (0, 1):
        with pytest.raises(ValueError, match=rf"d must be in \[2, .*got {bad}"):
            vectors(bad)
        with pytest.raises(ValueError, match=rf"d must be in \[2, .*got {bad}"):
            caches(d=bad)
        with pytest.raises(ValueError, match=rf"d must be in \[2, .*got {bad}"):
            query_key_pairs(bad)
    with pytest.raises(ValueError, match=r"seq must be in \[1, .*got 0"):
        caches(seq=0)
    with pytest.raises(ValueError, match=r"batch entries must be in \[1, .*got 0"):
        vectors(4, batch=(0,))
    # fp16 max is 65504: a draw of 8 sd at scale 1e5 would be 8e5 -> inf
    with pytest.raises(ValueError, match=r"scale=100000 does not fit torch.float16: .*max 65504"):
        vectors(4, dtype=torch.float16, scale=1e5)
    with pytest.raises(ValueError, match="scale=0 does not fit"):
        vectors(4, scale=0.0)


@given(x=vectors(64, batch=(32,), dtype=torch.float16, scale=8000.0))
@settings(max_examples=20, deadline=None)
def test_fp16_vectors_at_the_largest_allowed_scale_are_finite(x):
    assert x.dtype == torch.float16 and bool(torch.isfinite(x).all()) and bool((x.norm(dim=-1) > 0).all())


def test_docs_testing_examples_run_as_written():
    # issue 17: every python block of docs/testing.md runs in a fresh namespace; test functions it defines run too
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "docs/testing.md", "exec"), namespace)
        for name, obj in namespace.items():
            if name.startswith("test_") and callable(obj):
                obj()
