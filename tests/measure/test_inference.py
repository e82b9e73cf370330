"""Closed forms and checks of kvstats.inference against in-test estimators, quadrature and Monte Carlo.

Sizing: every Monte Carlo assertion is a z-test at |z| <= 5.5 (two-sided normal tail 4e-8) or a CI at
level 1 - 1e-7, so a correct implementation fails with probability < 1e-6 across this file; the
"rejects" assertions are sized so the wrong value sits >= 11 standard errors from the right one.
"""

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special
import scipy.stats
import torch

from kvstats.measure import inference as I

LEVEL = 1 - 1e-7
Z = 5.5


def _unit_pair(d, cos, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=d)
    q /= np.linalg.norm(q)
    w = rng.normal(size=d)
    w -= (w @ q) * q
    w /= np.linalg.norm(w)
    return q, cos * q + math.sqrt(1 - cos**2) * w


def _torch_gen(seeds):
    return torch.Generator().manual_seed(int(seeds[0]))  # seeds are distinct: one stream per batch


def qjl_estimator(m, scale=1.0):
    """In-test QJL: S [m, d] i.i.d. N(0,1) per seed, (√(π/2)/m)·‖k‖·⟨Sq, sign(Sk)⟩, times `scale`."""

    def est(q, k, seeds):
        g = _torch_gen(seeds)
        qt, kt = torch.as_tensor(q), torch.as_tensor(k)
        s = torch.randn(len(seeds), m, qt.numel(), generator=g, dtype=torch.float64)
        sq, sk = s @ qt, s @ kt
        return scale * math.sqrt(math.pi / 2) / m * kt.norm() * (sq * torch.sign(sk)).sum(-1)

    return est


def jl_estimator(m):
    def est(q, k, seeds):
        g = _torch_gen(seeds)
        s = torch.randn(len(seeds), m, len(q), generator=g, dtype=torch.float64)
        return ((s @ torch.as_tensor(q)) * (s @ torch.as_tensor(k))).sum(-1) / m

    return est


@pytest.mark.slow
def test_qjl_accepted_and_variance_matches_closed_form():
    # n = 10000 draws at m = 256, d = 16: the t test has exact size alpha (CLT on a sum of 256 terms), the
    # variance-ratio CI is at level 1 - 1e-7.
    q, k = _unit_pair(16, 0.5)
    r = I.check_unbiased(qjl_estimator(256), q, k, n_draws=10_000, batch_size=2_500, confidence_level=LEVEL,
                         variance_closed_form=I.qjl_variance(q, k, 256))
    assert r.pvalue > 1e-7
    assert r.variance_ratio_ci[0] < 1 < r.variance_ratio_ci[1]
    assert r.truth == pytest.approx(0.5)
    assert r.variance_closed_form == pytest.approx((math.pi / 2 - 0.25) / 256)


def test_shrunk_estimator_rejected():
    # 2/π-scaled QJL (the 1-bit MSE bias): bias = -0.3634 * 0.5 = -0.18 against se = 0.046/sqrt(2000) = 0.001:
    # z ~ -180, far beyond the 5.5 threshold.
    q, k = _unit_pair(32, 0.5, seed=1)
    r = I.check_unbiased(qjl_estimator(256, scale=2 / math.pi), q, k, n_draws=2_000, confidence_level=LEVEL)
    assert r.pvalue < 1e-7 and r.statistic < -100
    assert r.bias == pytest.approx((2 / math.pi - 1) * 0.5, rel=0.05)


def test_jl_variance_and_sign_step_inflation():
    # Near-orthogonal q, k: QJL variance is π/2 times the JL variance (docs/references.md §4).
    q, k = _unit_pair(16, 0.0, seed=2)
    r = I.check_unbiased(jl_estimator(64), q, k, n_draws=10_000, confidence_level=LEVEL,
                         variance_closed_form=I.jl_variance(q, k, 64))
    assert r.pvalue > 1e-7 and r.variance_ratio_ci[0] < 1 < r.variance_ratio_ci[1]
    assert I.qjl_variance(q, k, 64) / I.jl_variance(q, k, 64) == pytest.approx(math.pi / 2, rel=1e-12)
    # broadcasting over leading axes
    qs = np.stack([q, k])
    np.testing.assert_allclose(I.qjl_variance(qs, k, 8), [I.qjl_variance(q, k, 8), I.qjl_variance(k, k, 8)])


def test_variance_ci_is_valid_for_non_normal_data():
    # Exponential(1): variance 1, kurtosis 9. The chi-square CI would be ~2x too narrow; ours must cover 1
    # at level 1 - 1e-7 (n = 200000: the delta method is accurate there; fails w.p. ≈ 1e-7), and its width
    # must be the delta method's with the sample kurtosis (deterministic given x).
    x = np.random.default_rng(3).exponential(size=200_000)
    r = I.unbiasedness_test(x, 1.0, variance_closed_form=1.0, confidence_level=LEVEL)
    assert r.variance_ratio_ci[0] < 1 < r.variance_ratio_ci[1]
    n = len(x)
    assert r.kurtosis == pytest.approx(scipy.stats.kurtosis(x, fisher=False, bias=True), rel=1e-9)
    width = math.log(r.variance_ratio_ci[1] / r.variance_ratio_ci[0])
    chi2_width = 2 * scipy.stats.norm.isf((1 - LEVEL) / 2) * math.sqrt(2 / n)
    assert width / chi2_width == pytest.approx(math.sqrt((r.kurtosis - (n - 3) / (n - 1)) / 2), rel=1e-9)
    # κ̂ = m₄/m₂² is far above the normal's 3: m₄ is a mean of non-negative terms (x − x̄)⁴ with mean ≈ 9 and
    # E[X²] ≈ 14833 (the 8th central moment of Exp(1)), so by the one-sided bound for non-negative sums
    # P(m₄ < 7) ≤ exp(−n·2²/(2·14833)) ≈ e^-27; m₂ has sd √(8/n) = 0.0063, so m₂ > 1.05 is an 8-sd event:
    # κ̂ > 7/1.05² = 6.3 but for probability < 1e-11
    assert r.kurtosis > 6


def test_spherical_abs_moment_quadrature_and_monte_carlo():
    for d in (3, 4, 8, 64, 128):
        dens = scipy.stats.beta((d - 1) / 2, (d - 1) / 2, loc=-1, scale=2)  # coordinate law, docs/references.md §1
        quad = scipy.integrate.quad(lambda t, dens=dens: abs(t) * dens.pdf(t), -1, 1, points=[0])[0]
        assert I.spherical_abs_moment(d) == pytest.approx(math.sqrt(d) * quad, rel=1e-9)
    factor = I.spherical_abs_moment(64) / math.sqrt(2 / math.pi)
    assert factor == pytest.approx(1.0039137, abs=1e-7)  # docs/references.md §4: ≈ 1.004 at d = 64 (confirmed)
    assert factor == pytest.approx(1 + 1 / 256, abs=1e-5)
    # Monte Carlo at d = 8 with explicit spherical rows: factor 1.0317; rel. se = 0.74/sqrt(2e5) = 0.0017
    g = torch.Generator().manual_seed(4)
    s = torch.randn(200_000, 8, generator=g, dtype=torch.float64)
    s = s / s.norm(dim=-1, keepdim=True) * math.sqrt(8)
    k = torch.randn(8, generator=g, dtype=torch.float64)
    x = (s @ k).abs() / k.norm()
    se = float(x.std() / math.sqrt(len(x)))
    assert abs(float(x.mean()) - I.spherical_abs_moment(8)) < Z * se
    assert abs(float(x.mean()) - math.sqrt(2 / math.pi)) > 11 * se


def _haar(n, d, g):
    a = torch.randn(n, d, d, generator=g, dtype=torch.float64)
    qm, rm = torch.linalg.qr(a)
    return qm * torch.sign(torch.diagonal(rm, dim1=-2, dim2=-1)).unsqueeze(-2)


def test_mse_bias_factor_and_turbo_prod_distortion_by_monte_carlo():
    # In-test TurboQuant_prod(b=2) at d = 8: Haar rotation, exact 1-bit Lloyd–Max level c = E|u1| of f_d,
    # residual r, QJL with a d x d Gaussian S. n = 100000 trials: rel. se of E[e^2] ~ 0.6%, the 1/d term
    # of the formula is 8.6% of it (>= 14 se), so the rounded (π/2)·D/d is rejected.
    d, n = 8, 100_000
    g = torch.Generator().manual_seed(5)
    c = I.spherical_abs_moment(d) / math.sqrt(d)
    d_mse = 1 - d * c**2
    assert I.mse_bias_factor(1 - 2 / math.pi) == pytest.approx(2 / math.pi)  # Gaussian limit, 0.6366
    x = torch.zeros(d, dtype=torch.float64)
    x[0] = 1.0
    rot = _haar(n, d, g)  # rows: Π
    x_mse = (rot.transpose(-1, -2) @ (c * torch.sign(rot @ x)).unsqueeze(-1)).squeeze(-1)
    r = x - x_mse
    s = torch.randn(n, d, d, generator=g, dtype=torch.float64)
    qjl = math.sqrt(math.pi / 2) / d * r.norm(dim=-1, keepdim=True) * (
        s.transpose(-1, -2) @ torch.sign(s @ r.unsqueeze(-1))).squeeze(-1)
    x_prod = x_mse + qjl
    y = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = y / y.norm(dim=-1, keepdim=True)

    def mean_se(v):
        return float(v.mean()), float(v.std() / math.sqrt(len(v)))

    m, se = mean_se((r * r).sum(-1))  # D_mse of the 1-bit stage = 1 - d c^2
    assert abs(m - d_mse) < Z * se
    m, se = mean_se((x * x_mse).sum(-1))  # E<x, x̂_mse> = 1 - D_mse
    assert abs(m - I.mse_bias_factor(d_mse)) < Z * se + 1e-12
    # averaged over y: D_prod = (π/2 − 1/d) D_mse / d
    e2 = ((y * (x_prod - x)).sum(-1)) ** 2
    m, se = mean_se(e2)
    assert abs(m - I.turbo_prod_distortion(d_mse, d)) < Z * se
    assert abs(m - math.pi / 2 * d_mse / d) > 11 * se
    # unbiased: E<y, x̂_prod - x> = 0
    mb, seb = mean_se((y * (x_prod - x)).sum(-1))
    assert abs(mb) < Z * seb
    # y = x: the averaged formula does not hold; the general one with A = E<r, x>^2 does
    ex2 = ((x * (x_prod - x)).sum(-1)) ** 2
    mx, sex = mean_se(ex2)
    a = float(((r * x).sum(-1) ** 2).mean())
    assert abs(mx - I.turbo_prod_distortion(d_mse, d, cos2=1.0, residual_parallel2=a)) < Z * sex
    assert abs(mx - I.turbo_prod_distortion(d_mse, d)) > 11 * sex


def test_jensen_weight_inflation_matches_lognormal_mean():
    # mean of e^ε over n = 200000 draws, σ² <= 1.0: rel. se <= sqrt(e - 1)/sqrt(n) = 0.0029 per key;
    # 5.7 se per key, 16 keys × 2 modes: union bound 32 × 1.2e-8 = 3.8e-7 (the lognormal's skew 6.2 leaves the
    # sample mean's skew at 0.014: an Edgeworth correction of < 50% of that tail at 5.7 sd).
    scores = np.linspace(-1, 2, 16)
    for mode in ("uniform", "correlated"):
        r = I.jensen_simulation(scores, 0.5, mode, n_draws=200_000, seed=7)
        se = np.sqrt(np.expm1(r.sigma2)) / math.sqrt(r.n)
        assert np.all(np.abs(r.inflation / r.inflation_theory - 1) < 5.7 * se + 1e-12)
        assert r.statistic <= r.kl_jensen_bound
    np.testing.assert_allclose(I.jensen_simulation(scores, 0.5, "uniform", 10).inflation_theory, math.exp(0.25))


def test_jensen_kl_expansion_and_superlinear_condition():
    # Diffuse attention (flat logits over 512 keys): E[KL]/σ̄² stays at ≈ ½ for uniform σ² and grows with σ̄²
    # for score-correlated σ², as the σ⁴ term ⅛Var_p(σ²) predicts. MC se of E[KL]/σ̄² is ~0.001 here;
    # the growth 0.584 -> 0.615 is > 25 se.
    scores = np.linspace(0, 1, 512)
    ratios = {}
    for mode in ("uniform", "correlated"):
        for s2 in (0.1, 1.0):
            r = I.jensen_simulation(scores, s2, mode, n_draws=6_000, seed=8)
            se = r.extra["kl_se"]
            # through fourth order; the neglected O(σ⁶) is < 1% of the value at σ̄² <= 1 (offline check)
            assert abs(r.statistic - r.kl_fourth_order) < Z * se + 0.01 * r.statistic
            ratios[mode, s2] = (r.statistic / s2, se / s2)
    grow_c = ratios["correlated", 1.0][0] - ratios["correlated", 0.1][0]
    grow_u = ratios["uniform", 1.0][0] - ratios["uniform", 0.1][0]
    assert grow_c > 11 * ratios["correlated", 1.0][1]
    assert grow_u < Z * ratios["uniform", 1.0][1]
    # uniform σ²: no systematic (mean-field) error; correlated: positive
    assert I.jensen_simulation(scores, 1.0, "uniform", 10).kl_mean_field == pytest.approx(0, abs=1e-12)
    assert I.jensen_simulation(scores, 1.0, "correlated", 10).kl_mean_field > 0.01


def test_kl_noise_expansion_small_noise_is_half_var():
    p = scipy.special.softmax(np.random.default_rng(9).normal(size=12))
    s2 = np.full(12, 1e-4)
    second, fourth = I.kl_noise_expansion(p, s2)
    assert second == pytest.approx(0.5 * 1e-4 * (1 - (p**2).sum()))
    assert fourth == pytest.approx(second, rel=1e-3)


@pytest.mark.parametrize(
    "call, exc, pattern",
    [
        (lambda: I.qjl_variance(np.ones(3), np.ones(4), 8), ValueError, r"k.shape\[-1\] must equal q.shape\[-1\] = 3"),
        (lambda: I.qjl_variance(np.ones(3), np.ones(3), 0), ValueError, r"m must be in \[1, .*got 0"),
        (lambda: I.mse_bias_factor(1.5), ValueError, r"d_mse must be in \[0, 1\].*1.5"),
        (lambda: I.turbo_prod_distortion(0.3, 8, cos2=1.0), ValueError, "must be given together"),
        (lambda: I.unbiasedness_test([1.0, np.nan, 2.0], 0.0), ValueError, "estimates contains non-finite"),
        (lambda: I.check_unbiased(lambda q, k, s: np.zeros(1), np.ones(2), np.ones(2), n_draws=10), ValueError,
         "one estimate per seed: got 1 for 10"),
        (lambda: I.jensen_simulation(np.zeros(4), 0.1, "bogus"), ValueError, "mode must be .*'bogus'"),
    ],
)
def test_errors_name_argument_and_value(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["uniform", "correlated"])
def test_jensen_simulation_equals_the_scipy_logsumexp_form_and_the_kl_definition(mode):
    """Oracles, on the function's own noise stream (default_rng(seed), batches of 4e6 // S draws: two batches
    here): the former implementation (scipy.special.logsumexp per batch) to rounding, and per draw the float64
    definition KL(p ‖ softmax(s + ε)) = Σ rel_entr(p, p̃) and the mean of p̃ and e^ε."""
    scores = np.random.default_rng(4).normal(scale=2.0, size=256)
    n_draws, seed = 20_000, 11
    r = I.jensen_simulation(scores, 0.5, mode, n_draws=n_draws, seed=seed)
    logp = scipy.special.log_softmax(scores)
    p = np.exp(logp)
    rng = np.random.default_rng(seed)
    batch = 4_000_000 // scores.size
    eps = np.concatenate([rng.standard_normal((min(batch, n_draws - i), scores.size)) * np.sqrt(r.sigma2)
                          for i in range(0, n_draws, batch)])
    lse = scipy.special.logsumexp(logp + eps, axis=-1)
    kl_former = np.maximum(lse - eps @ p, 0.0)
    p_noisy = scipy.special.softmax(scores + eps, axis=-1)
    kl_definition = scipy.special.rel_entr(p, p_noisy).sum(-1)
    np.testing.assert_allclose(kl_former, kl_definition, rtol=1e-9)
    for kl in (kl_former, kl_definition):
        np.testing.assert_allclose(r.statistic, kl.mean(), rtol=1e-12)
        np.testing.assert_allclose(r.extra["kl_se"], kl.std(ddof=1) / math.sqrt(n_draws), rtol=1e-9)
    np.testing.assert_allclose(r.mean_weights, np.exp(logp + eps - lse[:, None]).mean(0), rtol=1e-12)
    np.testing.assert_allclose(r.mean_weights, p_noisy.mean(0), rtol=1e-12)
    np.testing.assert_allclose(r.inflation, np.exp(eps).mean(0), rtol=1e-12)  # summed per batch there


def test_orthogonal_sketch_prod_distortion_against_monte_carlo():
    """The QJL residual step with D'Alberto's Hadamard sketch (m = d orthogonal rows of norm √d) on a uniformly
    random unit r and an independent uniform unit y: E(⟨y, r⟩ − ⟨y, r̂⟩)² = (c² + 1 − 2c·c_d)/d exactly, since
    S r/‖S r‖ is uniform for uniform r whatever the orthogonal S. Sizing: the squared error has relative sd ≈ √2,
    so 100,000 draws give a relative SE of 0.45% and the 3% tolerance is 6.7 SE (false failure < 1e-10)."""
    from kvstats.quant.rotations import srht_sketch

    d, n = 64, 100_000
    gen = torch.Generator().manual_seed(7)
    r = torch.randn(n, d, generator=gen, dtype=torch.float64)
    r /= r.norm(dim=-1, keepdim=True)
    y = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y /= y.norm(dim=-1, keepdim=True)
    s = srht_sketch(d, d, 3)
    r_hat = math.sqrt(math.pi / 2) / d * torch.sign(r @ s.T) @ s
    mc = float(((y * (r - r_hat)).sum(-1) ** 2).mean())
    closed = I.orthogonal_sketch_prod_distortion(1.0, d)
    assert mc == pytest.approx(closed, rel=0.03)
    # far from the Gaussian-rows value (π/2 − 1/d)/d: the orthogonal sketch has no JL term
    assert closed < 0.4 * I.turbo_prod_distortion(1.0, d)
    assert closed * d == pytest.approx(math.pi / 2 - 1, rel=0.02)
    with pytest.raises(ValueError, match="d_mse_prev"):
        I.orthogonal_sketch_prod_distortion(1.5, d)
    with pytest.raises(ValueError, match="scale"):
        I.orthogonal_sketch_prod_distortion(0.5, d, scale=-1.0)
    with pytest.raises(ValueError, match="y_norm2"):
        I.orthogonal_sketch_prod_distortion(0.5, d, y_norm2=float("nan"))
