"""Synthetic Q/K/V generators: shapes, dtypes, seeds, and the stated laws (checked statistically).

Sizing of the statistical checks. Each check is a test whose p-value is uniform (or super-uniform: exact
binomial tests, KS with scipy's exact ``kstwo`` law) when the implementation is correct, failing only below
p = P_MIN = 1e-7, or a statistic that is exactly standard normal (a sample mean of Gaussians) or whose exact
law is known (the sample variance: χ²) failing only at |z| > Z_MAX = 5.5 (normal two-sided 3.8e-8, χ² 3.8e-8
at n = 262,144). A test's failure probability for a correct implementation is at most the sum over its
checks (union bound; K and V counted separately), stated next to each test and below 1e-6. All draws are
seeded, so a run is deterministic; the probabilities are over the seed. Power: at the sample sizes used
(262,144 coordinates per tensor) a 5 % scale error, a normal law instead of t_10, or df off by one at
df ≤ 3 give KS p-values below 1e-14 (scratch check), far below P_MIN (df = 10 vs 11 is below the resolution).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from kvstats.data.synthetic import (
    KINDS,
    attention_entropy,
    generate,
    generate_keys,
    outlier_channel_indices,
    synthetic_queries,
)

P_MIN = 1e-7  # per-check level of the p-value checks (module docstring)
Z_MAX = 5.5  # per-check |z| bound: two-sided 3.8e-8 for a standard normal


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_shapes_and_dtypes(kind, dtype):
    q, k, v = generate(kind, 2, 3, 17, 24, 0, q_heads=6, n_q=5, dtype=dtype)
    assert q.shape == (2, 6, 5, 24) and k.shape == v.shape == (2, 3, 17, 24)
    assert q.dtype == k.dtype == v.dtype == dtype
    assert all(t.is_contiguous() and bool(torch.isfinite(t).all()) for t in (q, k, v))


def test_q_heads_default_to_heads_and_odd_d():
    q, k, _ = generate("gaussian", 1, 4, 9, 7, 1)
    assert q.shape == (1, 4, 16, 7) and k.shape == (1, 4, 9, 7)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_tensors_different_seed_different(kind):
    a = generate(kind, 2, 2, 32, 16, 123, q_heads=4, outlier_channels=3)
    b = generate(kind, 2, 2, 32, 16, 123, q_heads=4, outlier_channels=3)
    c = generate(kind, 2, 2, 32, 16, 124, q_heads=4, outlier_channels=3)
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y)
        assert not torch.equal(x, z)
    g = generate(kind, 2, 2, 32, 16, torch.Generator().manual_seed(123), q_heads=4, outlier_channels=3)
    for x, y in zip(a, g):
        assert torch.equal(x, y)


def _coords(kind, **params):
    # 2 × 4 × 512 × 64 = 262,144 coordinates each of K and V (drawn from the same law).
    _, k, v = generate(kind, 2, 4, 512, 64, 7, n_q=1, dtype=torch.float64, **params)
    return k.flatten().numpy(), v.flatten().numpy()


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_gaussian_law(scale):
    # Per tensor: KS at p > 1e-7 (exact kstwo p-value: 1e-7), |z| of the mean < 5.5 (exactly normal: 3.8e-8),
    # |z| of the variance < 5.5 (n·var/scale² ~ χ²_{n−1}, exact two-sided 3.8e-8). K and V: 2 × 1.8e-7
    # = 3.5e-7 per test. A 5 % scale error gives KS p ~ 1e-35 and a variance z ≈ 36 at this n.
    k, v = _coords("gaussian", scale=scale)
    for x in (k, v):
        assert stats.kstest(x, stats.norm(scale=scale).cdf).pvalue > P_MIN
        assert abs(x.mean()) * math.sqrt(x.size) / scale < Z_MAX
        # variance: sample var has sd ≈ scale² √(2/n)
        assert abs(x.var() / scale**2 - 1) / math.sqrt(2 / x.size) < Z_MAX


@pytest.mark.parametrize("df", [1.0, 3.0, 10.0])
def test_heavy_tail_is_student_t_with_tail_index_df(df):
    # Per tensor: KS at p > 1e-7 and an exact binomial test of the tail count at p > 1e-7 (a two-sided
    # binomtest p-value is super-uniform: P(p ≤ 1e-7) ≤ 1e-7). K and V: 4 × 1e-7 = 4e-7 per test.
    k, v = _coords("heavy_tail", df=df)
    law = stats.t(df)
    for x in (k, v):
        assert stats.kstest(x, law.cdf).pvalue > P_MIN
        # tail: the count beyond the 0.999 two-sided quantile is Binomial(n, 1e-3) (expected 262).
        count = _tail_count(x, law)
        assert stats.binomtest(count, x.size, 1e-3).pvalue > P_MIN, f"tail count {count} for df={df}"


def _tail_count(x: np.ndarray, law) -> int:
    """Coordinates beyond the law's 0.999 two-sided quantile: Binomial(x.size, 1e-3) under the law."""
    return int(np.count_nonzero(np.abs(x) > law.ppf(1 - 5e-4)))


def test_heavy_tail_tail_count_rejects_a_wrong_df():
    # Power check of the tail test above at its level: df=4 data against the df=3 quantile (expected count 54
    # instead of 262) gives p = 2.5e-52 here, and p < 1e-39 for any count ≤ 80 (P(count > 80) ≈ 1e-3 at df=4).
    _, k, _ = generate("heavy_tail", 2, 4, 512, 64, 7, n_q=1, dtype=torch.float64, df=4.0)
    x = k.flatten().numpy()
    assert stats.binomtest(_tail_count(x, stats.t(3.0)), x.size, 1e-3).pvalue < P_MIN


@pytest.mark.parametrize("rank", [1, 3, 8])
def test_low_rank_has_rank_r(rank):
    _, k, v = generate("low_rank", 2, 2, 200, 32, 3, dtype=torch.float64, rank=rank, noise=0.0)
    for x in (k, v):
        s = torch.linalg.svdvals(x)  # [b, h, 32]
        assert bool((s[..., rank - 1] > 1e-3 * s[..., 0]).all())
        assert bool((s[..., rank:] < 1e-10 * s[..., :1]).all())


def test_low_rank_noise_and_norm():
    rank, noise, d = 4, 0.05, 64
    _, k, _ = generate("low_rank", 2, 4, 4096, d, 5, n_q=1, dtype=torch.float64, rank=rank, noise=noise)
    s = torch.linalg.svdvals(k)
    # signal singular values ≈ √(seq·d/r), noise ones ≈ noise·(√seq + √d): a wide gap at r
    assert bool((s[..., rank] / s[..., rank - 1] < 5 * noise).all())
    sq = (k**2).sum(-1).flatten()
    # E‖x‖² = d(1 + noise²); ‖x‖² = (d/r)·χ²_r + noise² χ²_d, var ≈ 2d²/r; 32768 vectors
    z = (sq.mean() - d * (1 + noise**2)) / (math.sqrt(2 * d * d / rank) / math.sqrt(sq.numel()))
    assert abs(float(z)) < Z_MAX  # CLT (skewness of the mean 0.008): ≈ 4e-8; the gap check has a > 10× margin


def test_outlier_channels_by_index_scale_k_and_v():
    plain = generate("gaussian", 1, 2, 64, 16, 9)
    out = generate("gaussian", 1, 2, 64, 16, 9, outlier_channels=[2, 11], outlier_scale=4.0, value_outlier_scale=2.0)
    mask = torch.zeros(16, dtype=torch.bool)
    mask[[2, 11]] = True
    torch.testing.assert_close(out[1][..., mask], 4.0 * plain[1][..., mask])
    torch.testing.assert_close(out[1][..., ~mask], plain[1][..., ~mask])
    torch.testing.assert_close(out[2][..., mask], 2.0 * plain[2][..., mask])


@pytest.mark.parametrize("kind", KINDS)
def test_outlier_channels_by_count(kind):
    """K's outlier channels are the 3 drawn ones, ×6; V's channels are untouched by default.

    Channel magnitude: over the 1536 tokens of a channel, the mean |x| — the median |x| for heavy_tail,
    where one |t_3| draw above ~1.7e3 (probability 4.5e-5 among the 98,304 of V) would double a channel
    mean. Sizing, for a correct generator:
    * heavy_tail: with m0 = 0.765 the median of |t_3|, all 128 channel medians (K before scaling, V) lie in
      [m0/1.4, 1.4·m0] except with probability 128·(P(Bin(1536, 0.363) ≥ 769) + P(Bin(1536, 0.377) ≥ 768))
      = 1.1e-20; then K's outliers are ≥ 4.3·m0 (top 3, ratio ≥ 3.06) and V's ratio is ≤ 1.96.
    * gaussian: channel means of |N(0, 1)| are 0.798 with sd 0.015: every bound is > 20 sd away.
    * low_rank: channel means are √(2/π)·(mean over the 3 heads of σ_c), σ_c² = 8·Beta(4, 28) + noise²
      (rank 8 of d = 64): 64·P(a channel ≥ 1.9 × their median) = 1e-9 (numerical convolution), and the
      fluctuations of the median and of the sampled means (≈ 3 %) leave V's ratio ≥ 2 below ~1e-7;
      P(one channel > 6 × another) = 4e-14, so K's top 3 and ratio fail with probability < 1e-10.
    """
    idx = outlier_channel_indices(3, 64, 11)
    assert len(idx) == 3 and len(set(idx)) == 3
    _, k, v = generate(kind, 1, 3, 512, 64, 11, outlier_channels=3, outlier_scale=6.0)

    def magnitude(x):  # [channels]
        a = x.abs().flatten(0, 2)
        return a.median(dim=0).values if kind == "heavy_tail" else a.mean(dim=0)

    mag = magnitude(k)
    assert set(torch.topk(mag, 3).indices.tolist()) == set(idx)
    assert float(mag.max() / mag.median()) > 3.0
    vmag = magnitude(v)
    assert float(vmag.max() / vmag.median()) < 2.0  # values untouched by default


def test_queries_are_peaked_and_peak_controls_entropy():
    seq = 1024
    ent = []
    for peak in (2.0, 8.0, 16.0):
        q, k, _ = generate("gaussian", 1, 4, seq, 64, 0, q_heads=8, n_q=64, peak=peak)
        ent.append(attention_entropy(q, k).mean().item())
    assert ent[0] > ent[1] > ent[2]
    assert ent[1] < math.log(seq) - 2  # default-like peak: far from uniform
    assert ent[2] < 1.0  # a few keys dominate
    # the attention mass on the 2 focus keys (n_focus=2) dominates at a high peak
    q, k, _ = generate("gaussian", 1, 4, seq, 64, 0, q_heads=8, n_q=64, peak=16.0)
    p = torch.softmax(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 8.0, -1)
    assert p.topk(2, dim=-1).values.sum(-1).mean().item() > 0.8


def test_query_key_correlation_controls_mass_on_the_focus_keys():
    _, k, _ = generate("gaussian", 1, 2, 512, 64, 0, n_q=1)
    mass = []
    for rho in (0.3, 0.6, 0.95):
        q, focus = synthetic_queries(k, 4, 64, 1, peak=8.0, query_key_correlation=rho)
        assert q.shape == (1, 4, 64, 64) and focus.shape == (1, 4, 64, 2)
        p = torch.softmax(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 8.0, -1)
        mass.append(torch.gather(p, -1, focus).sum(-1).mean().item())
    assert mass[0] < mass[1] < mass[2]
    assert mass[2] > 0.5


def test_synthetic_queries_on_real_like_keys_are_reproducible():
    _, k, _ = generate("heavy_tail", 1, 3, 100, 64, 2, n_q=1)
    a = synthetic_queries(k, 9, 8, 5)
    b = synthetic_queries(k, 9, 8, 5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="q_heads"):
        synthetic_queries(k, 4, 8, 5)


@pytest.mark.parametrize(
    "kwargs, exc, needle",
    [
        ({"kind": "cauchy"}, ValueError, "kind"),
        ({"d": 1}, ValueError, "d must"),
        ({"seq": 0}, ValueError, "seq"),
        ({"q_heads": 5}, ValueError, "q_heads"),
        ({"dtype": torch.int32}, TypeError, "dtype"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": 1.5}, TypeError, "seed"),
        ({"df": 3.0}, TypeError, "df"),  # df is not a gaussian parameter
        ({"kind": "heavy_tail", "df": 0.0}, ValueError, "df"),
        ({"kind": "heavy_tail", "df": float("nan")}, ValueError, "df"),
        ({"kind": "low_rank", "rank": 0}, ValueError, "rank"),
        ({"kind": "low_rank", "rank": 17}, ValueError, "rank"),
        ({"kind": "low_rank", "noise": -0.1}, ValueError, "noise"),
        ({"query_key_correlation": 0.0}, ValueError, "query_key_correlation"),
        ({"query_key_correlation": 1.5}, ValueError, "query_key_correlation"),
        ({"peak": -1.0}, ValueError, "peak"),
        ({"scale": 0.0}, ValueError, "scale"),
        ({"outlier_channels": [3, 16]}, ValueError, "outlier_channels"),
        ({"outlier_channels": [3, 3]}, ValueError, "outlier_channels"),
        ({"outlier_channels": 17}, ValueError, "outlier_channels"),
        ({"outlier_channels": "3"}, TypeError, "outlier_channels"),
        ({"n_focus": 0}, ValueError, "n_focus"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, exc, needle):
    args = {"kind": "gaussian", "batch": 1, "heads": 2, "seq": 8, "d": 16, "seed": 0}
    args.update(kwargs)
    with pytest.raises(exc, match=needle):
        generate(**args)


# ------------------------------------------------------------------------------------- numeric safety


@pytest.mark.parametrize(
    "kind, params, dtype, needle",
    [
        ("heavy_tail", {"df": 1e-3}, torch.float32, r"df=0\.001.*df >= "),
        ("heavy_tail", {"df": 0.05}, torch.float32, r"df=0\.05.*df >= "),
        ("gaussian", {"scale": 1e5}, torch.float16, r"scale=100000\.0 .*float16 \(max 6\.55e\+04\)"),
        ("heavy_tail", {"scale": 1e5}, torch.float16, r"scale=100000\.0 .*float16"),
        ("low_rank", {"scale": 3e37, "rank": 1}, torch.float32, r"scale=3e\+37"),
        ("gaussian", {"peak": 1e300}, torch.float32, r"peak=1e\+300"),
        ("gaussian", {"outlier_channels": 2, "outlier_scale": 1e4, "scale": 10.0}, torch.float16, "outlier scale"),
    ],
)
def test_parameters_the_dtype_cannot_hold_are_refused(kind, params, dtype, needle):
    """The reproducers of the hostile-input issue: each ends in a ValueError with the numbers, not inf/NaN."""
    with pytest.raises(ValueError, match=needle):
        generate(kind, 2, 4, 512, 64, 0, dtype=dtype, **params)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("df", [0.02, 0.1, 0.3, 1.0, 3.0])
def test_refusal_threshold_follows_the_student_t_tail(df, dtype):
    """Oracle: scipy's t tail. generate refuses exactly when the expected number of the 2·n coordinates with
    |t_df| above the dtype's max exceeds 1e-6, and otherwise returns finite tensors. Cases within a factor
    100 of the threshold are skipped (the test is about the rule, not about the boundary's rounding)."""
    n = 2 * 4 * 256 * 32
    expected = 2 * n * 2 * stats.t.sf(torch.finfo(dtype).max, df)
    if 1e-8 < expected < 1e-4:
        pytest.skip("too close to the threshold to be a clean case")
    if expected > 1e-6:
        with pytest.raises(ValueError, match=f"df={df!r}"):
            generate("heavy_tail", 2, 4, 256, 32, 0, dtype=dtype, df=df)
    else:
        q, k, v = generate("heavy_tail", 2, 4, 256, 32, 0, dtype=dtype, df=df)
        assert all(bool(torch.isfinite(t).all()) for t in (q, k, v))


def test_extreme_but_representable_draws_stay_finite():
    """df = 0.5 in float64 (draws up to ~1e20+) and scale near the fp16 limit give finite Q, K, V."""
    for kind, params, dtype in (("heavy_tail", {"df": 0.5}, torch.float64),
                                ("gaussian", {"scale": 1000.0}, torch.float16),
                                ("low_rank", {"scale": 1e30}, torch.float32)):
        q, k, v = generate(kind, 2, 4, 256, 32, 3, dtype=dtype, **params)
        assert all(bool(torch.isfinite(t).all()) for t in (q, k, v)), (kind, params)
        assert float(k.double().abs().max()) > 0.5 * params.get("scale", 1.0)


def test_queries_for_huge_keys_aim_at_their_focus():
    """Keys with norms beyond float64's sqrt(max) (1e200): the queries are still finite and peaked on their
    focus keys (the norms are computed on rescaled keys). Oracle: the same keys divided by 1e200 give
    queries 1e200 times larger, bit for bit up to rounding."""
    _, k, _ = generate("gaussian", 1, 2, 64, 16, 4, n_q=1, dtype=torch.float64)
    q_small, focus_small = synthetic_queries(k, 2, 8, 9)
    q_big, focus_big = synthetic_queries(k * 1e200, 2, 8, 9)
    assert torch.equal(focus_small, focus_big) and bool(torch.isfinite(q_big).all())
    torch.testing.assert_close(q_big * 1e200, q_small, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="peak=1e"):
        synthetic_queries(k.float(), 2, 8, 9, peak=1e300)


def test_tiny_df_draws_follow_the_student_t_law_far_in_the_tail():
    """df = 0.02 in float64: about 1 draw in 1000 has χ²_df below 1e-300, where the direct formula z/√(χ²/df)
    underflowed to inf; those draws now go through log χ². Oracle: scipy's t(df) — the KS test on all
    524,288 coordinates and an exact binomial test of the count beyond 1e150 (expected 2·n·sf(1e150) ≈ 500,
    mostly reached through the log path: χ² < 1e-300 means |x| > |z|·1.4e149), each at p > 1e-7 (exact
    kstwo and binomtest p-values are (super-)uniform): a correct sampler fails the test with probability
    ≤ 2e-7. Power at that level: clamping χ² at 1e-300 instead of the log path leaves 0 draws beyond 1e150,
    binomial p ~ 1e-216 (scratch check)."""
    df = 0.02
    _, k, v = generate("heavy_tail", 2, 4, 512, 64, 7, n_q=1, dtype=torch.float64, df=df)
    x = torch.cat([k.flatten(), v.flatten()]).numpy()
    assert np.isfinite(x).all()
    assert stats.kstest(x, stats.t(df).cdf).pvalue > P_MIN
    p_far = 2 * stats.t.sf(1e150, df)
    far = int((np.abs(x) > 1e150).sum())
    assert x.size * p_far > 50  # the check has power
    assert stats.binomtest(far, x.size, p_far).pvalue > P_MIN, (far, x.size * p_far)


@pytest.mark.parametrize(("kind", "params"), [
    ("gaussian", {}),
    ("heavy_tail", {"df": 1.5, "outlier_channels": 3, "outlier_scale": 4.0}),
    ("low_rank", {"rank": 4, "noise": 0.1, "outlier_channels": [0, 5]}),
])
def test_generate_keys_draws_generates_keys_without_values_or_queries(kind, params):
    """Oracle: generate(...)[1] for the same seed, bit for bit; a generator seed ends where V would start."""
    _, k, v = generate(kind, 2, 3, 40, 16, 123, q_heads=6, n_q=5, dtype=torch.float64, **params)
    keys = generate_keys(kind, 2, 3, 40, 16, 123, dtype=torch.float64, **params)
    assert keys.dtype == torch.float64 and torch.equal(keys, k)
    gen = torch.Generator().manual_seed(7)
    keys = generate_keys(kind, 2, 3, 40, 16, gen, **params)
    _, k, v = generate(kind, 2, 3, 40, 16, 7, **params)
    assert torch.equal(keys, k)
    if not params.get("outlier_channels"):  # V is the next draw on the generator (no outliers applied to it)
        v_next = generate_keys(kind, 2, 3, 40, 16, gen, **params)
        assert torch.equal(v_next, v)


def test_generate_keys_refuses_bad_arguments_as_generate_does():
    with pytest.raises(ValueError, match="seq"):
        generate_keys("gaussian", 1, 1, 0, 8, 0)
    with pytest.raises(TypeError, match="dtype"):
        generate_keys("gaussian", 1, 1, 4, 8, 0, dtype=torch.int32)
    with pytest.raises(ValueError, match="do not fit"):
        generate_keys("heavy_tail", 1, 1, 4, 8, 0, df=1e-3)
