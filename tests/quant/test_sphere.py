"""The sphere-coordinate law f_d, sampling, distances to N(0, 1/d) and GOF tests, against closed forms."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from kvstats.quant.sphere import coordinate_law, gaussian_limit_distance, goodness_of_fit, sample_sphere


@pytest.mark.parametrize("d", [2, 3, 4, 5, 8, 64, 1024])
def test_law_matches_the_closed_form_density(d):
    law = coordinate_law(d)
    t = np.linspace(-0.999, 0.999, 101)
    log_c = special.gammaln(d / 2) - 0.5 * math.log(math.pi) - special.gammaln((d - 1) / 2)
    np.testing.assert_allclose(law.pdf(t), np.exp(log_c + (d - 3) / 2 * np.log1p(-t * t)), rtol=1e-10)
    assert law.mean() == pytest.approx(0.0, abs=1e-15)
    assert law.var() == pytest.approx(1.0 / d, rel=1e-12)


def test_special_cases():
    t = np.linspace(-0.99, 0.99, 51)
    np.testing.assert_allclose(coordinate_law(2).pdf(t), 1 / (math.pi * np.sqrt(1 - t * t)), rtol=1e-12)
    np.testing.assert_allclose(coordinate_law(3).pdf(t), 0.5, rtol=1e-12)
    np.testing.assert_allclose(coordinate_law(4).pdf(t), 2 / math.pi * np.sqrt(1 - t * t), rtol=1e-12)


def test_sample_sphere_shape_norm_seed_dtype():
    x = sample_sphere(1000, 96, seed=3)
    assert x.shape == (1000, 96) and x.dtype == torch.float64
    torch.testing.assert_close(torch.linalg.vector_norm(x, dim=1), torch.ones(1000, dtype=torch.float64))
    assert torch.equal(x, sample_sphere(1000, 96, seed=3))
    assert not torch.equal(x, sample_sphere(1000, 96, seed=4))
    assert sample_sphere(5, 8, seed=0, dtype=torch.float32).dtype == torch.float32


def test_sample_sphere_takes_the_seed_rule_generators_and_none():
    # a CPU generator is consumed in place: two calls continue one stream, and a generator seeded like the int
    # seed gives the int seed's vectors
    gen = torch.Generator().manual_seed(3)
    first, second = sample_sphere(100, 16, seed=gen), sample_sphere(100, 16, seed=gen)
    assert torch.equal(first, sample_sphere(100, 16, seed=3))
    assert not torch.equal(first, second)
    fresh = sample_sphere(100, 16, seed=None)
    torch.testing.assert_close(torch.linalg.vector_norm(fresh, dim=1), torch.ones(100, dtype=torch.float64))
    assert not torch.equal(fresh, sample_sphere(100, 16, seed=None))


@pytest.mark.parametrize("d", [2, 3, 4, 8, 16, 128])
def test_kl_matches_the_entropy_closed_form(d):
    # KL(f || N(0, σ²)) = -h(f) - E_f[log φ] = ½ log(2πe/d) - h(f_d), with h from scipy's Beta entropy
    # (digamma closed form); it cancels catastrophically at large d (1e-6 relative at d = 1024), so it is
    # the oracle only up to d = 128; beyond, the 3/(4d²) asymptote is (next test)
    oracle = 0.5 * math.log(2 * math.pi * math.e / d) - coordinate_law(d).entropy()
    assert gaussian_limit_distance(d).kl == pytest.approx(oracle, rel=1e-7, abs=1e-14)


@pytest.mark.parametrize("d", [8192, 32768, 10**6])
def test_kl_and_tv_large_d_asymptotes(d):
    # Edgeworth (derived): excess kurtosis of f_d is -6/(d+2), so KL → κ²/48 = 3/(4d²); measured TV·d → 0.3501
    r = gaussian_limit_distance(d)
    assert r.kl * d * d == pytest.approx(0.75, rel=5e-4)
    assert r.total_variation * d == pytest.approx(0.3501, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3, 4, 8, 64])
def test_tv_matches_quad_oracle(d):
    law, g = coordinate_law(d), stats.norm(0, d**-0.5)
    # ½∫|f - φ| on [-1, 1] by quad in θ (t = sin θ removes the d = 2 singularity) + the Gaussian tails
    inner = integrate.quad(lambda th: abs(law.pdf(math.sin(th)) - g.pdf(math.sin(th))) * math.cos(th),
                           -math.pi / 2, math.pi / 2, limit=500, epsabs=1e-13)[0]
    oracle = 0.5 * inner + g.sf(1.0)
    assert gaussian_limit_distance(d).total_variation == pytest.approx(oracle, rel=1e-8)


# Rejection rate under H0. Each repetition draws n = 200 i.i.d. coordinates (x[:, 0] of uniform unit
# vectors, d = 8) and tests at α = 0.05; over K repetitions the rejection count is Binomial(K, α) (KS
# exact p-values; CvM and the Monte Carlo AD are exact-level or very nearly so at n = 200). The
# accepted range [lo, hi] has Binomial tail probability < 1e-6 in total (5e-7 each side).
@pytest.mark.slow
@pytest.mark.parametrize("method, reps", [("ks", 300), ("cvm", 300), ("ad", 60)])
def test_rejection_rate_under_the_null(method, reps):
    alpha, n, d = 0.05, 200, 8
    lo = stats.binom.ppf(5e-7, reps, alpha)
    hi = stats.binom.isf(5e-7, reps, alpha)
    x = sample_sphere(n * reps, d, seed=11)[:, 0].numpy().reshape(reps, n)
    kw = {"n_mc": 199, "seed": 0} if method == "ad" else {}
    rejections = sum(goodness_of_fit(x[r], d, method, **{**kw, **({"seed": r} if kw else {})}).pvalue <= alpha
                     for r in range(reps))
    assert lo <= rejections <= hi


def test_gaussian_data_rejected_for_large_n():
    # Sizing: D = sup|F_8 - Φ_8| = 0.01861 (computed on a fine grid). By DKW, the empirical CDF of
    # n = 100000 Gaussian draws is within ε = √(ln(2e6)/(2n)) = 0.0085 of Φ with prob ≥ 1 - 1e-6, so the
    # KS statistic is ≥ D - ε ≈ 0.010, i.e. √n·D_n ≥ 3.2, whose Kolmogorov p-value is < 1e-8: rejection at
    # α = 1e-6 fails with probability < 1e-6.
    d, n = 8, 100_000
    t = np.linspace(-1, 1, 200_001)
    D = np.max(np.abs(coordinate_law(d).cdf(t) - stats.norm(0, d**-0.5).cdf(t)))
    eps = math.sqrt(math.log(2e6) / (2 * n))
    assert stats.kstwobign.sf(math.sqrt(n) * (D - eps)) < 1e-6
    z = np.random.default_rng(5).normal(0, d**-0.5, n)
    z = np.clip(z, -1, 1)  # outside [-1, 1] the law has no mass anyway
    res = goodness_of_fit(z, d, "ks")
    assert res.pvalue < 1e-6
    assert res.n == n and "Kolmogorov" in res.method and "S^7" in res.null_hypothesis
    assert "p-value" in res.summary() and res.to_dict()["d"] == d


def test_gof_accepts_torch_and_reports():
    x = sample_sphere(500, 16, seed=2)[:, 0]
    res = goodness_of_fit(x, 16, "cvm")
    assert 0 <= res.pvalue <= 1 and res.n == 500


@pytest.mark.parametrize(
    "call, exc, text",
    [
        (lambda: coordinate_law(1), ValueError, "d must be in"),
        (lambda: coordinate_law(2.5), TypeError, "d must be an int"),
        (lambda: sample_sphere(10, 1, seed=0), ValueError, "d must be in"),
        (lambda: sample_sphere(0, 4, seed=0), ValueError, "n must be in"),
        (lambda: sample_sphere(10, 4, seed=-1), ValueError, r"seed must be an int in \[0, 2\*\*63 - 1\] or None"),
        (lambda: sample_sphere(10, 4, seed=1.5), TypeError, r"seed must be an int in \[0, 2\*\*63 - 1\] or None"),
        (lambda: sample_sphere(10, 4, seed=0, dtype=torch.int32), TypeError, "dtype"),
        (lambda: gaussian_limit_distance(0), ValueError, "d must be in"),
        (lambda: goodness_of_fit(np.zeros((3, 4)), 4), ValueError, "1-D"),
        (lambda: goodness_of_fit(np.zeros(10), 4, "chi2"), ValueError, "method"),
        (lambda: goodness_of_fit(np.array([0.1, np.nan]), 4), ValueError, "non-finite"),
        (lambda: goodness_of_fit(np.zeros(10), 1), ValueError, "d must be in"),
    ],
)
def test_bad_input_names_the_argument(call, exc, text):
    with pytest.raises(exc, match=text):
        call()
