"""Metrics against independent oracles: scipy.special.rel_entr in float64, explicit head repetition, brute force.

All inputs are seeded; the comparisons are deterministic up to float64 rounding (tolerances ~1e-10), so a
correct implementation never fails. The one random test (energy permutation test) is sized in its comment.
"""

import itertools
import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstats.measure import error6d as E
from kvstats.measure import metrics as M


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _qk(seed, b=2, hq=6, hkv=2, nq=5, s=11, d=16, noise=0.3):
    g = _gen(seed)
    q = torch.randn(b, hq, nq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64)
    k_hat = k + noise * torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64)
    return q, k, k_hat


def _oracle_probs(q, k, visible=None):
    """Explicit GQA by repeating KV heads, scores and softmax in numpy float64."""
    q, k = q.numpy(), k.numpy()
    group = q.shape[1] // k.shape[1]
    kr = np.repeat(k, group, axis=1)  # head h uses kv head h // group
    s = np.einsum("bhnd,bhsd->bhns", q, kr) / math.sqrt(q.shape[-1])
    if visible is not None:
        s = np.where(visible, s, -np.inf)
    return scipy.special.softmax(s, axis=-1)


def _manual_causal(nq, s, offset):
    return np.array([[j <= offset + i for j in range(s)] for i in range(nq)])


@pytest.mark.parametrize("hq, hkv", [(1, 1), (4, 1), (6, 2), (8, 8), (8, 2)])
def test_kl_equals_rel_entr_with_explicit_gqa(hq, hkv):
    q, k, k_hat = _qk(hq * 10 + hkv, hq=hq, hkv=hkv)
    expected = scipy.special.rel_entr(_oracle_probs(q, k), _oracle_probs(q, k_hat)).sum(-1)
    got = M.attention_kl(q, k, k_hat, reduction="none")
    assert got.shape == (2, hq, 5)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-14)
    assert M.attention_kl(q, k, k_hat) == pytest.approx(expected.mean(), rel=1e-9)


@pytest.mark.parametrize("nq, s, offset", [(5, 11, None), (11, 11, None), (4, 9, 0), (3, 7, 2), (6, 4, 1)])
def test_causal_kl_and_recall_match_manual_mask(nq, s, offset):
    q, k, k_hat = _qk(nq + s, nq=nq, s=s)
    vis = _manual_causal(nq, s, s - nq if offset is None else offset)
    p, p_hat = _oracle_probs(q, k, vis), _oracle_probs(q, k_hat, vis)
    expected = scipy.special.rel_entr(p, p_hat).sum(-1)  # rel_entr(0, 0) = 0 on masked keys
    got = M.attention_kl(q, k, k_hat, causal=True, query_offset=offset, reduction="none")
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-14)
    # recall: each query ranks only its visible keys, top min(3, visible) of them (brute force on the prefix)
    rec = M.topk_recall(q, k, k_hat, top_k=3, causal=True, query_offset=offset, reduction="none")
    group = q.shape[1] // k.shape[1]
    ref = np.einsum("bhnd,bhsd->bhns", q.numpy(), np.repeat(k.numpy(), group, axis=1))
    est = np.einsum("bhnd,bhsd->bhns", q.numpy(), np.repeat(k_hat.numpy(), group, axis=1))
    for i in range(nq):
        seen = int(vis[i].sum())  # a prefix: keys 0 .. seen − 1
        want = _brute_recall(ref[:, :, i, :seen].reshape(-1, seen), est[:, :, i, :seen].reshape(-1, seen),
                             min(3, seen))
        np.testing.assert_array_equal(rec[:, :, i].reshape(-1).numpy(), want)
    assert M.topk_recall(q, k, k, top_k=3, causal=True, query_offset=offset) == 1.0


def test_kl_zero_iff_identical_and_positive_otherwise():
    q, k, k_hat = _qk(1)
    assert M.attention_kl(q, k, k.clone()) == 0.0
    assert bool((M.attention_kl(q, k, k_hat, reduction="none") > 0).all())
    # a constant shift of all logits of a query leaves softmax unchanged: KL of scores is 0
    s = torch.randn(3, 4, 9, dtype=torch.float64, generator=_gen(2))
    assert M.attention_kl_from_scores(s, s + 3.0) == pytest.approx(0.0, abs=1e-12)


def test_kl_from_scores_takes_logits_and_matches_attention_kl():
    q, k, k_hat = _qk(3, hq=4, hkv=4)
    d = q.shape[-1]
    s_ref = q @ k.transpose(-1, -2) / math.sqrt(d)
    s_q = q @ k_hat.transpose(-1, -2) / math.sqrt(d)
    torch.testing.assert_close(M.attention_kl_from_scores(s_ref, s_q, reduction="none"),
                               M.attention_kl(q, k, k_hat, reduction="none"), rtol=1e-12, atol=1e-15)


def test_float32_path_close_to_float64():
    q, k, k_hat = _qk(4)
    f32 = M.attention_kl(q.float(), k.float(), k_hat.float())
    f64 = M.attention_kl(q.float(), k.float(), k_hat.float(), double=True)
    assert f32 == pytest.approx(f64, rel=1e-4)
    assert M.attention_kl(q.half(), k.half(), k_hat.half()) > 0


def test_large_logits_are_stable():
    q, k, k_hat = _qk(5)
    kl = M.attention_kl(q * 300, k, k_hat, reduction="none")
    assert bool(torch.isfinite(kl).all()) and bool((kl >= 0).all())


def _brute_recall(a, b, top_k):
    # deterministic tie rule: lower index first among equal scores (python's sort is stable)
    def top(row):
        return set(sorted(range(len(row)), key=lambda j: -row[j])[:top_k])

    return np.array([len(top(x) & top(y)) / top_k for x, y in zip(a, b)])  # rows [N, S] -> [N]


@given(seed=st.integers(0, 2**31 - 1), top_k=st.integers(1, 8), levels=st.integers(2, 6))
@settings(max_examples=40, deadline=None)
def test_topk_recall_brute_force_with_ties(seed, top_k, levels):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, levels, size=(3, 8)).astype(np.float64)  # many ties
    b = rng.integers(0, levels, size=(3, 8)).astype(np.float64)
    got = M.topk_recall_from_scores(a, b, top_k=top_k, reduction="none").numpy()
    np.testing.assert_allclose(got, _brute_recall(a, b, top_k))
    assert ((got >= 0) & (got <= 1)).all()
    assert M.topk_recall_from_scores(a, a, top_k=top_k) == 1.0


@given(seed=st.integers(0, 2**31 - 1), top_k=st.integers(1, 8), levels=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_topk_recall_causal_ties_straddling_the_cut(seed, top_k, levels):
    # the top-k sets come from torch.topk plus a tie rule, not a full sort: ties at the k-th value (levels = 1:
    # every logit equal) and rows with fewer visible keys than k must match a stable sort of the visible keys
    rng = np.random.default_rng(seed)
    n, s = 6, 9
    a = rng.integers(0, levels, size=(2, n, s)).astype(np.float64)
    b = rng.integers(0, levels, size=(2, n, s)).astype(np.float64)
    got = M.topk_recall_from_scores(a, b, top_k=top_k, causal=True, reduction="none").numpy()
    expected = np.empty((2, n))
    for i in range(n):
        vis = s - n + i + 1  # causal, queries at the last n positions
        kk = min(top_k, vis)
        expected[:, i] = _brute_recall(a[:, i, :vis], b[:, i, :vis], kk)
    np.testing.assert_allclose(got, expected)


def test_topk_recall_identical_keys_and_gqa():
    q, k, k_hat = _qk(6, hq=8, hkv=2)
    assert M.topk_recall(q, k, k, top_k=5) == 1.0
    group = 4
    s_ref = (q @ k.repeat_interleave(group, 1).transpose(-1, -2)).numpy()
    s_q = (q @ k_hat.repeat_interleave(group, 1).transpose(-1, -2)).numpy()
    expected = _brute_recall(s_ref.reshape(-1, 11), s_q.reshape(-1, 11), 5).reshape(2, 8, 5)
    np.testing.assert_allclose(M.topk_recall(q, k, k_hat, top_k=5, reduction="none").numpy(), expected)


def test_geometric_errors_against_numpy():
    g = _gen(7)
    x = torch.randn(20, 9, dtype=torch.float64, generator=g)
    xh = x + 0.2 * torch.randn(20, 9, dtype=torch.float64, generator=g)
    xn, hn = x.numpy(), xh.numpy()
    cos = (xn * hn).sum(-1) / np.linalg.norm(xn, axis=-1) / np.linalg.norm(hn, axis=-1)
    np.testing.assert_allclose(M.direction_error(x, xh).numpy(), 1 - cos, rtol=1e-9)
    np.testing.assert_allclose(M.direction_error(x, xh, kind="angle").numpy(), np.arccos(cos), rtol=1e-9)
    rel = np.abs(np.linalg.norm(hn, axis=-1) - np.linalg.norm(xn, axis=-1)) / np.linalg.norm(xn, axis=-1)
    np.testing.assert_allclose(M.relative_norm_error(x, xh).numpy(), rel, rtol=1e-12)
    assert M.mse(x, xh) == pytest.approx(((xn - hn) ** 2).sum(-1).mean(), rel=1e-12)
    assert M.direction_error(xn, -xn, kind="angle", reduction="mean") == pytest.approx(math.pi)


def test_zero_vector_conventions():
    z, e = torch.zeros(1, 4), torch.tensor([[1.0, 0, 0, 0]])
    assert M.direction_error(z, z).item() == 0.0
    assert M.direction_error(z, e).item() == 1.0 and M.direction_error(e, z).item() == 1.0
    assert M.direction_error(z, e, kind="angle").item() == pytest.approx(math.pi / 2)
    assert M.relative_norm_error(z, z).item() == 0.0
    with pytest.raises(ValueError, match=r"x is zero at index \(0,\) where the estimate is not"):
        M.relative_norm_error(z, e)  # infinite: refused, not returned as inf (issue 30)
    with pytest.raises(ValueError, match="x is zero at index"):
        M.mse(z, e, relative=True)
    assert M.relative_norm_error(e, z).item() == 1.0


def test_relative_errors_of_rows_near_the_fp32_maximum_are_finite():
    # ‖x‖² of fp32 rows at 3e38 overflows fp32 (it gave NaN); float64 norms give the exact ratios.
    x = torch.full((2, 8), 3e38)
    x_hat = x * torch.tensor([[0.5], [1.0]])
    got = M.relative_norm_error(x, x_hat)
    assert torch.equal(got, torch.tensor([0.5, 0.0]))
    assert torch.allclose(M.mse(x, x_hat, relative=True, reduction="none"), torch.tensor([0.25, 0.0]))


def test_attention_output_error_against_oracle():
    q, k, k_hat = _qk(8, hq=4, hkv=2)
    g = _gen(9)
    v = torch.randn(2, 2, 11, 7, dtype=torch.float64, generator=g)
    v_hat = v + 0.1 * torch.randn(2, 2, 11, 7, dtype=torch.float64, generator=g)
    o = _oracle_probs(q, k) @ np.repeat(v.numpy(), 2, axis=1)
    o_hat = _oracle_probs(q, k_hat) @ np.repeat(v_hat.numpy(), 2, axis=1)
    expected = np.linalg.norm(o - o_hat, axis=-1) / np.linalg.norm(o, axis=-1)
    np.testing.assert_allclose(M.attention_output_error(q, k, v, k_hat, v_hat, reduction="none").numpy(),
                               expected, rtol=1e-9)
    assert M.attention_output_error(q, k, v, k, v) == 0.0


def test_error6d_rows_are_the_documented_means():
    trials = []
    for t in range(3):
        q, k, k_hat = _qk(20 + t, hq=4, hkv=2)
        g = _gen(30 + t)
        v = torch.randn(2, 2, 11, 16, dtype=torch.float64, generator=g)
        trials.append((q, k, v, k_hat, v + 0.1 * torch.randn(v.shape, dtype=torch.float64, generator=g)))
    stacked = [torch.stack(x) for x in zip(*trials)]
    e6 = E.error6d(*stacked)
    assert e6.shape == (3, 6) and e6.dtype == torch.float64
    for t, (q, k, v, kh, vh) in enumerate(trials):
        expected = [
            M.direction_error(k, kh, reduction="mean"), M.relative_norm_error(k, kh, reduction="mean"),
            M.direction_error(v, vh, reduction="mean"), M.relative_norm_error(v, vh, reduction="mean"),
            M.attention_kl(q, k, kh), M.attention_output_error(q, k, v, kh, vh),
        ]
        np.testing.assert_allclose(e6[t].numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(E.error6d(*trials[0]).numpy(), e6[:1].numpy())


def test_error6d_with_estimated_scores_uses_them_for_kl_and_output():
    """scores_hat replaces q k̂ᵀ/√d in components 4 and 5; oracle: float64 numpy softmax and explicit GQA."""
    q, k, k_hat = _qk(40, hq=4, hkv=2)
    g = _gen(41)
    v = torch.randn(2, 2, 11, 16, dtype=torch.float64, generator=g)
    v_hat = v + 0.1 * torch.randn(v.shape, dtype=torch.float64, generator=g)
    est = M.attention_scores(q, k) + 0.2 * torch.randn(2, 4, 5, 11, dtype=torch.float64, generator=g)
    e6 = E.error6d(q, k, v, k_hat, v_hat, scores_hat=est)[0].numpy()
    p, p_hat = _oracle_probs(q, k), scipy.special.softmax(est.numpy(), axis=-1)
    kl = scipy.special.rel_entr(p, p_hat).sum(-1).mean()
    vr, vhr = np.repeat(v.numpy(), 2, axis=1), np.repeat(v_hat.numpy(), 2, axis=1)
    o, o_hat = p @ vr, p_hat @ vhr
    out = (np.linalg.norm(o - o_hat, axis=-1) / np.linalg.norm(o, axis=-1)).mean()
    np.testing.assert_allclose(e6[4:], [kl, out], rtol=1e-10)
    np.testing.assert_allclose(e6[:4], E.error6d(q, k, v, k_hat, v_hat)[0, :4].numpy(), rtol=0)
    with pytest.raises(ValueError, match="scores_hat must have the shape"):
        E.error6d(q, k, v, k_hat, v_hat, scores_hat=est[..., :-1])


def test_distance_6d_is_the_scaled_euclidean_norm():
    rng = np.random.default_rng(7)
    e, m = rng.random((5, 6)), rng.random(6) + 0.5
    expected = [math.sqrt(sum((e[i, c] / m[c]) ** 2 for c in range(6))) for i in range(5)]
    np.testing.assert_allclose(E.distance_6d(e, m), expected, rtol=1e-14)
    np.testing.assert_allclose(E.distance_6d(torch.from_numpy(e), np.tile(m, (5, 1))), expected, rtol=1e-14)
    with pytest.raises(ValueError, match="scale must be positive"):
        E.distance_6d(e, np.zeros(6))
    with pytest.raises(ValueError, match=r"errors must be \[n_trials, 6\]"):
        E.distance_6d(e[:, :5], m[:5])


def test_6d_names_live_in_error6d_not_in_metrics():
    # The 6D error moved to its own module; metrics no longer forwards it (one home per name).
    for name in ("ERROR6D_COMPONENTS", "error6d", "distance_6d", "energy_distance", "energy_distance_6d",
                 "energy_test"):
        assert callable(getattr(E, name)) or isinstance(getattr(E, name), tuple)
        assert not hasattr(M, name)


def test_energy_distance_matches_scipy_in_1d():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(0.5, 2, size=30)
    ours = E.energy_distance(a[:, None], b[:, None], standardize=False)
    assert math.sqrt(ours) == pytest.approx(scipy.stats.energy_distance(a, b), rel=1e-12)
    assert E.energy_distance(a[:, None], a[:, None]) == 0.0


def test_energy_test_detects_shift_and_is_calibrated_in_size():
    # Shift 3 SD in one of 6 components, 40 vs 40: the observed statistic exceeds every permuted one (checked
    # offline: p sat at its floor 1/(R+1) for all of 100 data seeds; at 1.5 SD the worst of 100 was 0.014, so
    # 3 SD leaves a wide margin); we only require p <= 0.01.
    rng = np.random.default_rng(1)
    a = rng.normal(size=(40, 6))
    b = rng.normal(size=(40, 6))
    b[:, 4] += 3.0
    res = E.energy_test(a, b, n_resamples=999, seed=0)
    assert res.pvalue <= 0.01 and res.n == (40, 40)
    assert res.statistic == pytest.approx(E.energy_distance_6d(a, b), rel=1e-12)
    # Size: under H0 a permutation test with R = 19 rejects at p <= 0.05 with probability exactly 1/20 (the
    # observed statistic's rank among 20 exchangeable ones; ties have probability 0 for continuous data). Over
    # 300 null pairs the rejections are Binomial(300, 0.05); the count must not lie in either 5e-7 tail
    # (scipy): 1..37 rejections pass. A correct test fails w.p. < 1e-6; one that rejects at 0.15 instead of 0.05
    # fails w.p. 0.89, one that rejects always (p at its floor, as a broken permutation would) fails surely.
    law, rejected = scipy.stats.binom(300, 0.05), 0
    for i in range(300):
        null = np.random.default_rng(1000 + i).normal(size=(2, 20, 6))
        rejected += E.energy_test(null[0], null[1], n_resamples=19, seed=i).pvalue <= 0.05
    assert law.cdf(rejected) > 5e-7 and law.sf(rejected - 1) > 5e-7, rejected


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda q, k: M.attention_kl(q, k, k[..., :-1]), r"k_hat must have the shape of k"),
        (lambda q, k: M.attention_kl(q, k[:, :1].expand(2, 4, 11, 16)[:, :4], k[:, :1].expand(2, 4, 11, 16)),
         r"q.shape\[1\] \(q_heads = 6\) must be a multiple of k.shape\[1\].*got kv_heads = 4"),
        (lambda q, k: M.attention_kl(q[..., :8], k, k), r"k.shape\[-1\] \(head dim\) must equal q.shape\[-1\] = 8"),
        (lambda q, k: M.attention_kl(q[0], k, k), r"q must be 4-D"),
        (lambda q, k: M.attention_kl(q[:, :, :0], k, k), r"q is empty"),
        (lambda q, k: M.attention_kl(q, k, k, reduction="sum"), r"reduction must be 'mean' or 'none', got 'sum'"),
        (lambda q, k: M.topk_recall(q, k, k, top_k=0), r"top_k must be in \[1, .*\], got 0"),
        (lambda q, k: M.attention_kl(q.repeat(1, 1, 3, 1), k, k, causal=True), r"n_q = 15 queries > seq = 11"),
        (lambda q, k: M.attention_kl(q, k.int(), k), r"k must be float16.*int32"),
        (lambda q, k: M.attention_kl(q.tolist(), k, k), r"q must be a torch.Tensor or numpy.ndarray, got list"),
        (lambda q, k: E.energy_distance_6d(np.zeros((3, 5)), np.zeros((3, 6))), r"cloud_a must be \[n_trials, 6\]"),
    ],
)
def test_errors_name_argument_and_value(call, pattern):
    q, k, _ = _qk(0)
    with pytest.raises((ValueError, TypeError), match=pattern):
        call(q, k)


def test_nan_is_rejected_with_its_name():
    q, k, k_hat = _qk(0)
    k_hat[0, 1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="k_hat contains non-finite values"):
        M.attention_kl(q, k, k_hat)


# ----------------------------------------------------------------------------- huge inputs, few visible keys


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_finite_inputs_give_finite_correct_metrics(dtype):
    """q·kᵀ overflows fp32 at |q|,|k| ~ 1e20: the logits are promoted to fp64, the answers stay exact.

    Oracle: equal keys give KL 0, recall 1, output error 0; for k̂ ≠ k, the KL of x·1e20 inputs equals the KL
    of the same logits computed in float64 by scipy in the log domain (Σ p (log p − log p̂), log_softmax), a
    huge but finite number: p̂ underflows to 0 where p does not, so the ratio form p log(p/p̂) would be inf.
    """
    q, k, k_hat = _qk(3)
    big = 1e20 if dtype == torch.float32 else 1e100
    qb, kb, khb = (x.to(dtype) * big for x in (q, k, k_hat))
    assert M.attention_kl(qb, kb, kb) == 0.0
    assert M.topk_recall(qb, kb, kb) == 1.0
    assert M.attention_output_error(qb, kb, kb, kb, kb) == 0.0
    kl = M.attention_kl(qb, kb, khb, reduction="none")
    assert bool(torch.isfinite(kl).all())
    s_ref = np.einsum("bhnd,bhsd->bhns", qb.double().numpy(), np.repeat(kb.double().numpy(), 3, axis=1)) / 4.0
    s_hat = np.einsum("bhnd,bhsd->bhns", qb.double().numpy(), np.repeat(khb.double().numpy(), 3, axis=1)) / 4.0
    lp, lq = scipy.special.log_softmax(s_ref, -1), scipy.special.log_softmax(s_hat, -1)
    expected = np.where(lp > -np.inf, np.exp(lp) * (lp - lq), 0.0).sum(-1)
    assert np.isfinite(expected).all() and expected.max() > 1e30  # the inputs are far from benign
    np.testing.assert_allclose(kl.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_logits_overflowing_float64_raise_naming_the_arguments():
    q, k, _ = _qk(4)
    with pytest.raises(ValueError, match=r"q·kᵀ/√d overflows float64"):
        M.attention_kl(q * 1e200, k * 1e200, k * 1e200)


def test_kl_from_huge_fp32_logits_is_finite():
    """Logits ±3e38 (finite fp32) overflow the max-subtraction: recomputed in fp64, KL equals scipy's."""
    a = torch.tensor([[3e38, -3e38, 0.0]], dtype=torch.float32)
    b = torch.tensor([[-3e38, 3e38, 0.0]], dtype=torch.float32)
    got = M.attention_kl_from_scores(a, b)
    la = scipy.special.log_softmax(a.double().numpy(), -1)
    lb = scipy.special.log_softmax(b.double().numpy(), -1)
    expected = float((np.exp(la) * (la - lb)).sum())
    assert math.isfinite(got) and got == pytest.approx(expected, rel=1e-12)
    assert M.attention_kl_from_scores(a, a) == 0.0


def test_topk_recall_uses_min_of_k_and_visible_keys():
    """docs/metrics.md: k' = min(k, visible keys). Oracle: brute-force sets with k' per query."""
    q, k, k_hat = _qk(5, s=3, nq=3)
    # non-causal: S = 3 < top_k = 5, so k' = 3 and every key is in both top sets
    assert M.topk_recall(q, k, k_hat, top_k=5) == 1.0
    # causal prefill: query 0 sees 1 key, query 1 two, query 2 three -> each recall is 1 (all visible keys)
    got = M.topk_recall(q, k, k_hat, top_k=5, causal=True, reduction="none")
    assert got.shape == (2, 6, 3) and bool((got == 1.0).all())
    # S = 7, causal with offset 0: k' = min(5, i + 1); compare with brute force on the visible prefix
    q, k, k_hat = _qk(6, s=7, nq=7, noise=2.0)
    got = M.topk_recall(q, k, k_hat, top_k=5, causal=True, query_offset=0, reduction="none").numpy()
    s_ref = np.einsum("bhnd,bhsd->bhns", q.numpy(), np.repeat(k.numpy(), 3, axis=1))
    s_hat = np.einsum("bhnd,bhsd->bhns", q.numpy(), np.repeat(k_hat.numpy(), 3, axis=1))
    for i in range(7):
        kk = min(5, i + 1)
        a = s_ref[..., i, : i + 1].reshape(-1, i + 1)
        b = s_hat[..., i, : i + 1].reshape(-1, i + 1)
        want = _brute_recall(a, b, kk).reshape(got.shape[:2])
        np.testing.assert_allclose(got[..., i], want, rtol=0, atol=1e-15)
    assert got[..., 5:].min() < 1.0  # queries 5, 6 see more than k keys: noise 2.0 makes misses (not vacuous)
    scores = torch.from_numpy(s_ref)
    assert M.topk_recall_from_scores(scores, scores, top_k=9) == 1.0


@pytest.mark.parametrize("causal, offset", [(False, None), (True, None), (True, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_reference_reuse_is_identical_to_the_one_shot_calls(causal, offset, dtype):
    """AttentionReference serves several quantized logits (schemes): bit-identical to the *_from_scores calls,
    whose KL is in turn the float64 rel_entr definition; the reference's log-softmax and top-k sets are reused."""
    q, k, _ = _qk(11, nq=6, s=9)
    a = M.attention_scores(q, k, double=True).to(dtype)
    ref = M.AttentionReference(a, causal=causal, query_offset=offset)
    vis = _manual_causal(6, 9, 3 if offset is None else offset) if causal else None
    for noise in (0.1, 0.5, 2.0):  # three "schemes" against the one reference
        _, _, k_hat = _qk(11, nq=6, s=9, noise=noise)
        b = M.attention_scores(q, k_hat, double=True).to(dtype)
        b = torch.where(torch.arange(9) % 3 == 0, b.round(decimals=1), b)  # ties for the top-k tie rule
        opts = {"causal": causal, "query_offset": offset, "reduction": "none"}
        kl = ref.kl(b, reduction="none")
        assert torch.equal(kl, M.attention_kl_from_scores(a, b, **opts))
        # the textbook expression in the same dtype, term by term: the in-place evaluation rounds the same way
        mask = torch.as_tensor(vis) if causal else torch.ones(6, 9, dtype=torch.bool)
        lp = torch.log_softmax(a.masked_fill(~mask, -math.inf), -1)
        lq = torch.log_softmax(b.masked_fill(~mask, -math.inf), -1)
        plain = torch.where(lp == -math.inf, 0.0, lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)
        assert torch.equal(kl, plain)
        for top_k in (1, 3, 5):
            assert torch.equal(ref.topk_recall(b, top_k=top_k, reduction="none"),
                               M.topk_recall_from_scores(a, b, top_k=top_k, **opts))
        assert ref.kl(b) == M.attention_kl_from_scores(a, b, causal=causal, query_offset=offset)
        assert ref.kl(b, double=True) == M.attention_kl_from_scores(a, b, causal=causal, query_offset=offset,
                                                                     double=True)
    # against the float64 definition, without the rounding
    _, _, k_hat = _qk(11, nq=6, s=9, noise=0.3)
    b = M.attention_scores(q, k_hat, double=True).to(dtype)
    expected = scipy.special.rel_entr(_oracle_probs(q, k, vis), _oracle_probs(q, k_hat, vis)).sum(-1)
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(ref.kl(b, reduction="none").numpy(), expected, rtol=tol, atol=tol * 1e-3)
    assert set(ref._log_probs) == {dtype, torch.float64} and set(ref._top) == {1, 3, 5}


@pytest.mark.parametrize("window, offset", [(1, None), (3, None), (4, 2), (9, None)])
def test_attention_reference_sliding_window_is_the_banded_softmax(window, offset):
    """A sliding window of W keys: query i (position p = offset + i) sees keys p − W < j ≤ p, the rule of
    transformers' sliding_window_overlay, spelled out by hand here; KL against scipy's rel_entr of the banded
    float64 softmax, top-1 recall against the banded argmax. W ≥ every position is plain causal."""
    q, k, k_hat = _qk(23, nq=6, s=9, noise=0.4)
    off = 3 if offset is None else offset
    band = np.array([[off + i - window < j <= off + i for j in range(9)] for i in range(6)])
    ref = M.AttentionReference(M.attention_scores(q, k, double=True), causal=True, query_offset=offset,
                               window=window)
    assert np.array_equal(ref.visible.numpy(), band)
    b = M.attention_scores(q, k_hat, double=True)
    expected = scipy.special.rel_entr(_oracle_probs(q, k, band), _oracle_probs(q, k_hat, band)).sum(-1)
    np.testing.assert_allclose(ref.kl(b, reduction="none").numpy(), expected, rtol=1e-9, atol=1e-14)
    top1 = (_oracle_probs(q, k, band).argmax(-1) == _oracle_probs(q, k_hat, band).argmax(-1)).astype(float)
    np.testing.assert_array_equal(ref.topk_recall(b, top_k=1, reduction="none").numpy(), top1)
    if window >= off + 6:
        plain = M.AttentionReference(M.attention_scores(q, k, double=True), causal=True, query_offset=offset)
        assert torch.equal(ref.kl(b, reduction="none"), plain.kl(b, reduction="none"))
    else:
        assert not band[-1, 0]  # the window hides keys plain causal attention shows (the test is not vacuous)


def test_attention_reference_window_refuses_bad_input():
    a = torch.zeros(1, 2, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"window = 4 needs causal=True"):
        M.AttentionReference(a, window=4)
    with pytest.raises(ValueError, match=r"window must be in \[1, .*\], got 0"):
        M.AttentionReference(a, causal=True, window=0)


def test_attention_reference_huge_fp32_logits_and_bad_input():
    a = torch.tensor([[3e38, -3e38, 0.0]], dtype=torch.float32)
    b = torch.tensor([[-3e38, 3e38, 0.0]], dtype=torch.float32)
    ref = M.AttentionReference(a)
    assert ref.kl(b) == M.attention_kl_from_scores(a, b) and math.isfinite(ref.kl(b))
    assert ref.kl(a) == 0.0
    with pytest.raises(ValueError, match=r"scores_quant must have the shape of scores_ref \(1, 3\), got \(1, 4\)"):
        ref.kl(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"top_k must be in \[1, .*\], got 0"):
        ref.topk_recall(b, top_k=0)
    with pytest.raises(ValueError, match=r"reduction must be 'mean' or 'none', got 'sum'"):
        ref.kl(b, reduction="sum")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nq,s,offset", [(7, 7, 0), (5, 12, 7), (4, 15, 6), (1, 9, 8), (3, 3, 0)])
def test_in_place_causal_kl_and_recall_equal_the_public_functions(nq, s, offset, dtype):
    """causal_kl_and_recall_ (the cache records' one call on its own temporaries) gives the public
    attention_kl_from_scores / topk_recall_from_scores values bit for bit: queries from position 0 (fewer visible keys
    than top_k), a block inside the sequence, columns past the block's last query (a mask that formed every column),
    one query; ties (logits on a grid of 4 values); hidden keys holding real logits (the in-place mask must hide them)
    and already filled with finfo.min, as the cache masks them
    (an additive mask of finfo.min cannot overflow to -inf: a logit would need |s| > 1e31)."""
    gen = torch.Generator().manual_seed(nq * 100 + s)
    raw_a = torch.randint(0, 4, (2, 3, nq, s), generator=gen).to(dtype) * 0.5
    raw_b = raw_a + torch.randint(-1, 2, raw_a.shape, generator=gen).to(dtype) * 0.5
    hidden = ~M.attention.causal_visible(nq, s, offset)
    masked = tuple(t.masked_fill(hidden, torch.finfo(dtype).min) for t in (raw_a, raw_b))
    for (a, b), top_k in itertools.product(((raw_a, raw_b), masked), (1, 5)):
        kl = M.attention_kl_from_scores(a, b, causal=True, query_offset=offset, reduction="none")
        recall = M.topk_recall_from_scores(a, b, top_k=top_k, causal=True, query_offset=offset, reduction="none")
        got_kl, got_recall = M.causal_kl_and_recall_(a.clone(), b.clone(), top_k=top_k, query_offset=offset)
        assert got_kl.dtype == got_recall.dtype == torch.float64
        assert torch.equal(got_kl, kl.to(torch.float64)) and torch.equal(got_recall, recall)
        assert (kl > 0).any()  # the two logits really differ
        assert top_k > 1 or nq * s < 10 or (recall < 1).any()
