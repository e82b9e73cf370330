"""Unbiasedness and variance checks of inner-product estimators against closed forms; Jensen-bias simulation.

Derivations are sketched in docs/inference.md. Summary of the closed forms (all for fixed q, k; the
randomness is the sketch / rotation):

* Gaussian JL, ``(1/m) Σᵢ (sᵢ·q)(sᵢ·k)``: ``Var = (‖q‖²‖k‖² + ⟨q,k⟩²)/m`` (Isserlis).
* QJL, ``(√(π/2)/m)·‖k‖·Σᵢ (sᵢ·q) sign(sᵢ·k)`` with Gaussian rows: ``Var = ((π/2)‖q‖²‖k‖² − ⟨q,k⟩²)/m``.
* TurboQuant_prod's QJL step on the residual r (m = d): ``((π/2)‖y‖²‖r‖² − ⟨r,y⟩²)/d``.
* Rows uniform on the sphere of radius √d: ``E|sᵀk| = ‖k‖·c_d``, ``c_d = √d·Γ(d/2)/(√π·Γ((d+1)/2))``
  (→ √(2/π) as d → ∞; ratio ``c_d/√(2/π) = 1 + 1/(4d) + O(d⁻²)``, 1.00391 at d = 64).

An estimator callable has the signature ``estimator(q, k, seeds) -> estimates`` with ``seeds`` a 1-D
``np.ndarray`` of distinct non-negative integers and one estimate per seed; estimates for different seeds
must be independent. A vectorised estimator may draw a whole batch from one generator seeded with the
batch's first seed (``np.random.default_rng(int(seeds[0]))``, or a torch.Generator): :func:`check_unbiased`
never repeats a seed, so different batches get different streams. (Seeding with the whole array,
``default_rng(seeds)``, also works but hashes every seed: ~1 s per 250 000.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.special
import scipy.stats
import torch

from kvstats._validation import check_int_range
from kvstats.results import TestResult

__all__ = [
    "JensenResult",
    "UnbiasednessResult",
    "check_unbiased",
    "jensen_simulation",
    "jl_variance",
    "kl_noise_expansion",
    "kl_sigma4_coefficient",
    "mse_bias_factor",
    "qjl_variance",
    "spherical_abs_moment",
    "turbo_prod_distortion",
    "turbo_prod_variance",
    "unbiasedness_test",
]


# ----------------------------------------------------------------------------------------------------------
# closed forms


def _vec(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim < 1 or arr.shape[-1] < 1:
        raise ValueError(f"{name} must be a vector [..., d], got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains non-finite values (first seen: {arr[~np.isfinite(arr)][0]})")
    return arr


def _norms_dot(q, k, qn: str, kn: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k = _vec(q, qn), _vec(k, kn)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{kn}.shape[-1] must equal {qn}.shape[-1] = {q.shape[-1]}, got {k.shape[-1]}")
    return (q * q).sum(-1), (k * k).sum(-1), (q * k).sum(-1)


def _scalar(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def qjl_variance(q, k, m: int) -> float | np.ndarray:
    """Variance of the QJL estimator with ``m`` Gaussian rows: ``((π/2)‖q‖²‖k‖² − ⟨q,k⟩²)/m``.

    Each term ``X = √(π/2)‖k‖(s·q)sign(s·k)`` has ``E X = ⟨q,k⟩`` and ``E X² = (π/2)‖k‖²‖q‖²``.
    Broadcasts over leading axes of ``q [..., d]`` and ``k [..., d]``.
    """
    m = check_int_range(m, "m", 1, 2**62)
    qq, kk, qk = _norms_dot(q, k, "q", "k")
    return _scalar((math.pi / 2 * qq * kk - qk**2) / m)


def jl_variance(q, k, m: int) -> float | np.ndarray:
    """Variance of the unquantized Gaussian JL estimator ``(1/m)⟨Sq, Sk⟩``: ``(‖q‖²‖k‖² + ⟨q,k⟩²)/m``."""
    m = check_int_range(m, "m", 1, 2**62)
    qq, kk, qk = _norms_dot(q, k, "q", "k")
    return _scalar((qq * kk + qk**2) / m)


def turbo_prod_variance(residual, y, d: int) -> float | np.ndarray:
    """Variance of TurboQuant_prod's inner product given the residual ``r`` (QJL with m = d rows on r).

    ``Var(⟨y, x̂⟩ | r) = ((π/2)‖y‖²‖r‖² − ⟨r,y⟩²)/d``: the MSE stage's error ``−⟨y, r⟩`` is exactly what
    the unbiased QJL estimate of ``⟨y, r⟩`` adds back, so only QJL's variance remains.
    """
    d = check_int_range(d, "d", 1, 2**62)
    rr, yy, ry = _norms_dot(residual, y, "residual", "y")
    return _scalar((math.pi / 2 * yy * rr - ry**2) / d)


def mse_bias_factor(d_mse: float) -> float:
    """Multiplicative bias of an MSE-optimal quantizer for inner products: ``E⟨y, x̂⟩ = (1 − D_mse)⟨y, x⟩``.

    For unit ``x``, a Lloyd–Max codebook (centroid condition ``E[x | cell] = level``) gives
    ``E⟨x̂, x⟩ = E‖x̂‖² = 1 − D_mse``; a Haar rotation makes ``E[x̂ | x]`` parallel to ``x``. At 1 bit in
    the Gaussian limit ``D_mse = 1 − 2/π = 0.3634``, so the factor is ``2/π`` (docs/references.md §3).
    """
    d_mse = float(d_mse)
    if not 0.0 <= d_mse <= 1.0:
        raise ValueError(f"d_mse must be in [0, 1] (MSE of unit vectors), got {d_mse}")
    return 1.0 - d_mse


def turbo_prod_distortion(
    d_mse_prev: float,
    d: int,
    *,
    y_norm2: float = 1.0,
    cos2: float | None = None,
    residual_parallel2: float | None = None,
) -> float:
    """Inner-product distortion ``D_prod = E|⟨y,x⟩ − ⟨y,x̂⟩|²`` of TurboQuant_prod(b) for a unit ``x``.

    ``D_mse(b−1)`` is the MSE of the (b−1)-bit stage. Averaged over the direction of ``y`` (or, the same,
    for a Haar rotation and ``y`` independent of ``x``)::

        D_prod = (π/2 − 1/d) · D_mse(b−1) · ‖y‖² / d        (docs/references.md §3)

    This is **not** exact for every ``y``: the residual has a component along ``x``
    (``E⟨r, x⟩ = D_mse``), so ``E⟨r,y⟩²`` depends on the angle between ``x`` and ``y``. With a Haar
    rotation, ``E[r rᵀ] = A·xxᵀ + B·(I − xxᵀ)``, ``A = E⟨r,x⟩²``, ``B = (D_mse − A)/(d − 1)``, and::

        D_prod(y) = ‖y‖² · [(π/2)·D_mse − A·cos²θ − B·(1 − cos²θ)] / d

    which is returned when ``cos2 = cos²θ`` and ``residual_parallel2 = A`` are given. For ``y = x``
    (cos²θ = 1) at b = 2, ``A ≈ D_mse²`` and the distortion is ≈ 23% below the averaged formula.
    """
    d = check_int_range(d, "d", 2, 2**62)
    d_mse_prev = float(d_mse_prev)
    if not 0.0 <= d_mse_prev <= 1.0:
        raise ValueError(f"d_mse_prev must be in [0, 1], got {d_mse_prev}")
    if (cos2 is None) != (residual_parallel2 is None):
        raise ValueError("cos2 and residual_parallel2 must be given together "
                         f"(got cos2={cos2!r}, residual_parallel2={residual_parallel2!r})")
    if cos2 is None:
        return (math.pi / 2 - 1.0 / d) * d_mse_prev * y_norm2 / d
    if not 0.0 <= cos2 <= 1.0:
        raise ValueError(f"cos2 must be in [0, 1], got {cos2}")
    a = float(residual_parallel2)
    if not 0.0 <= a <= d_mse_prev:
        raise ValueError(f"residual_parallel2 must be in [0, d_mse_prev = {d_mse_prev}], got {a}")
    b = (d_mse_prev - a) / (d - 1)
    return y_norm2 * (math.pi / 2 * d_mse_prev - a * cos2 - b * (1.0 - cos2)) / d


def spherical_abs_moment(d: int) -> float:
    """``c_d = E|sᵀk|/‖k‖`` for ``s`` uniform on the sphere of radius √d: ``√d·Γ(d/2)/(√π·Γ((d+1)/2))``.

    ``sᵀk/‖k‖ = √d·u₁`` with ``u₁`` a coordinate of a uniform unit vector, density ∝ (1 − t²)^{(d−3)/2};
    ``E|u₁| = Γ(d/2)/(√π·Γ((d+1)/2))``. The QJL estimator with such rows is unbiased with scale
    ``1/(m·c_d)`` instead of the Gaussian ``√(π/2)/m``; ``c_d·√(π/2) = 1 + 1/(4d) + O(d⁻²)``.
    """
    d = check_int_range(d, "d", 1, 2**62)
    return math.exp(0.5 * math.log(d) + math.lgamma(d / 2) - 0.5 * math.log(math.pi) - math.lgamma((d + 1) / 2))


# ----------------------------------------------------------------------------------------------------------
# unbiasedness


@dataclass(frozen=True)
class UnbiasednessResult(TestResult):
    """Result of :func:`unbiasedness_test` / :func:`check_unbiased`.

    ``statistic`` is the t statistic of the mean error, ``pvalue`` its two-sided p (H0: zero bias),
    ``effect_size`` the bias in units of the estimator's standard deviation, ``confidence_interval`` the
    CI of the bias (mean error). Fields: ``bias``, ``truth``, ``mean``, ``variance`` (sample),
    ``variance_closed_form``, ``variance_ratio`` (sample / closed form) with ``variance_ratio_ci``
    (valid for non-normal estimates, see :func:`unbiasedness_test`) and ``variance_pvalue`` (H0: ratio = 1),
    ``kurtosis`` (non-excess).
    """

    bias: float = math.nan
    truth: float = math.nan
    mean: float = math.nan
    variance: float = math.nan
    variance_closed_form: float = math.nan
    variance_ratio: float = math.nan
    variance_ratio_ci: tuple[float, float] = (math.nan, math.nan)
    variance_pvalue: float = math.nan
    kurtosis: float = math.nan

    def summary(self) -> str:
        return self.summary_with(("bias", "truth", "mean", "variance", "variance_closed_form", "variance_ratio",
                                  "variance_ratio_ci", "variance_pvalue", "kurtosis"))


def unbiasedness_test(
    estimates,
    truth: float,
    *,
    variance_closed_form: float | None = None,
    confidence_level: float = 0.99,
) -> UnbiasednessResult:
    """Test ``E[estimate] = truth`` and compare the sample variance with a closed form.

    Bias: one-sample t test of the errors ``eᵢ = estimateᵢ − truth`` (``t = ē/(s/√n)``, n − 1 df,
    two-sided), CI ``ē ± t_{n−1}·s/√n``; valid for any estimator with finite variance at large n (CLT).

    Variance: ratio ``R = s²/σ²_cf``. The textbook χ² interval for a variance assumes normal data: its
    width uses ``Var(s²) = 2σ⁴/(n−1)``, but in general ``Var(s²) = (μ₄ − σ⁴(n−3)/(n−1))/n``, so for
    kurtosis κ ≠ 3 it is wrong by a factor ≈ √((κ−1)/2) in width — for sign-sketch estimators at small
    m, or heavy-tailed data, badly so. We use the delta method on ``log s²``:
    ``SE(log s²) = √((κ̂ − (n−3)/(n−1))/n)`` with κ̂ the sample kurtosis ``m₄/m₂²``, and
    ``CI(R) = R·exp(±z_{1−α/2}·SE)``; ``variance_pvalue`` tests ``log R = 0`` with the same SE. Valid when
    the fourth moment is finite and n is large (≥ 10⁴ recommended: κ̂ itself must settle).

    Identical estimates (sample variance 0): t is ±inf (0 when the bias is exactly 0) and p is 0 or 1 —
    exact for the sample, but a deterministic estimator's error is rounding, not sampling noise: judge it
    against a rounding tolerance (:func:`kvstats.testing.assert_unbiased` does); the variance ratio is 0
    with the CI ``(0, 0)`` and ``variance_pvalue`` 0; ``kurtosis`` and ``effect_size`` are nan (undefined).

    Args:
        estimates: 1-D array of independent estimates.
        truth: the true value (e.g. ``⟨q, k⟩`` in fp64).
        variance_closed_form: σ² predicted by theory (optional).
        confidence_level: level of both CIs.
    """
    e = np.asarray(estimates.detach().cpu().double().numpy() if isinstance(estimates, torch.Tensor) else estimates,
                   dtype=np.float64).ravel()
    if e.size < 3:
        raise ValueError(f"estimates must hold at least 3 values, got {e.size}")
    if not np.isfinite(e).all():
        raise ValueError(f"estimates contains non-finite values (first seen: {e[~np.isfinite(e)][0]})")
    level = float(confidence_level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}")
    truth = float(truth)
    n = e.size
    mean = float(e[0]) if e.min() == e.max() else float(e.mean())  # identical values: exact mean, variance 0
    centred = e - mean
    m2 = float(np.mean(centred**2))
    var = m2 * n / (n - 1)
    se = math.sqrt(var / n)
    bias = mean - truth
    t = bias / se if se > 0 else (0.0 if bias == 0 else math.copysign(math.inf, bias))
    p = float(2 * scipy.stats.t.sf(abs(t), n - 1))
    tcrit = float(scipy.stats.t.isf((1 - level) / 2, n - 1))
    kurt = float(np.mean(centred**4) / m2**2) if m2 > 0 else math.nan
    ratio, ratio_ci, vp = math.nan, (math.nan, math.nan), math.nan
    if variance_closed_form is not None:
        vcf = float(variance_closed_form)
        if not vcf > 0:
            raise ValueError(f"variance_closed_form must be > 0, got {variance_closed_form}")
        ratio = var / vcf
        if var == 0.0:  # identical estimates: log R = -inf, the kurtosis (hence the delta-method SE) undefined
            ratio_ci, vp = (0.0, 0.0), 0.0
        else:
            se_log = math.sqrt(max(kurt - (n - 3) / (n - 1), 0.0) / n)
            z = float(scipy.stats.norm.isf((1 - level) / 2))
            ratio_ci = (ratio * math.exp(-z * se_log), ratio * math.exp(z * se_log))
            vp = float(2 * scipy.stats.norm.sf(abs(math.log(ratio)) / se_log)) if se_log > 0 else math.nan
    else:
        vcf = math.nan
    return UnbiasednessResult(
        statistic=t,
        pvalue=p,
        method="one-sample t test of the estimation error; variance ratio CI by the delta method with the "
        "sample kurtosis",
        null_hypothesis=f"E[estimate] = truth ({truth:.6g})",
        n=n,
        effect_size=bias / math.sqrt(var) if var > 0 else math.nan,
        effect_size_name="bias / sd",
        confidence_interval=(bias - tcrit * se, bias + tcrit * se),
        ci_of="bias (mean error)",
        confidence_level=level,
        bias=bias,
        truth=truth,
        mean=mean,
        variance=var,
        variance_closed_form=vcf,
        variance_ratio=ratio,
        variance_ratio_ci=ratio_ci,
        variance_pvalue=vp,
        kurtosis=kurt,
    )


def check_unbiased(
    estimator: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    q,
    k,
    *,
    n_draws: int = 100_000,
    truth: float | None = None,
    variance_closed_form: float | None = None,
    confidence_level: float = 0.99,
    seed: int = 0,
    batch_size: int = 100_000,
) -> UnbiasednessResult:
    """Run ``estimator(q, k, seeds)`` over ``n_draws`` independent seeds and test it for bias.

    Seeds are drawn without repetition as 63-bit integers from ``np.random.default_rng(seed)``, passed in
    batches of ``batch_size`` (the estimator should be vectorised over the batch). ``q`` and ``k`` are
    passed as given (numpy fp64 recommended). ``truth`` defaults to ``⟨q, k⟩`` computed in fp64.
    See :func:`unbiasedness_test` for the tests and intervals.
    """
    n_draws = check_int_range(n_draws, "n_draws", 3, 10**10)
    batch_size = check_int_range(batch_size, "batch_size", 1, 10**10)
    if not callable(estimator):
        raise TypeError(f"estimator must be callable, got {type(estimator).__name__}")
    if truth is None:
        qv, kv = _vec(q, "q"), _vec(k, "k")
        if qv.shape != kv.shape or qv.ndim != 1:
            raise ValueError(f"truth=None needs 1-D q and k of one shape, got {qv.shape} and {kv.shape}")
        truth = float(qv @ kv)
    rng = np.random.default_rng(seed)
    seeds = np.unique(rng.integers(0, 2**63 - 1, size=n_draws + n_draws // 100 + 8, dtype=np.int64))
    seeds = rng.permutation(seeds)[:n_draws]  # distinct, in random order
    if seeds.size < n_draws:  # astronomically unlikely: 63-bit collisions
        raise RuntimeError("could not draw enough distinct seeds")
    out = []
    for start in range(0, n_draws, batch_size):
        chunk = seeds[start : start + batch_size].astype(np.int64)
        est = estimator(q, k, chunk)
        est = np.asarray(est.detach().cpu().double().numpy() if isinstance(est, torch.Tensor) else est,
                         dtype=np.float64).ravel()
        if est.size != chunk.size:
            raise ValueError(f"estimator must return one estimate per seed: got {est.size} for {chunk.size} seeds")
        out.append(est)
    return unbiasedness_test(np.concatenate(out), truth, variance_closed_form=variance_closed_form,
                             confidence_level=confidence_level)


# ----------------------------------------------------------------------------------------------------------
# Jensen bias


@dataclass(frozen=True, eq=False)
class JensenResult(TestResult):
    """Result of :func:`jensen_simulation`. ``statistic`` = mean KL(p ‖ p̃) over draws, CI its normal CI.

    Fields (arrays are per key): ``p`` (reference weights), ``sigma2`` (noise variances used),
    ``mean_weights`` (E p̃ over draws), ``inflation`` (measured E[e^{s+ε}]/e^{s} = mean e^{ε}),
    ``inflation_theory`` (e^{σ²/2}), ``kl_second_order`` (½ Σ pᵢ(1 − pᵢ)σᵢ²), ``kl_fourth_order`` (the
    expansion of E[KL] through O(σ⁴), see :func:`kl_noise_expansion`), ``kl_jensen_bound``
    (log Σ pᵢ e^{σᵢ²/2}, an upper bound on E[KL]), ``kl_mean_field`` (KL(p ‖ p_mf) with
    p_mf ∝ pᵢ e^{σᵢ²/2}, the normalised expected *unnormalised* weights; 0 iff σ² is constant on the
    support of p; ≈ ⅛Var_p(σ²)), ``kl_bias`` (KL(p ‖ E p̃), measured: the actual mean attention also moves
    because the normaliser is random, so this is not exactly ``kl_mean_field``, and not 0 for uniform σ²).
    """

    p: np.ndarray | None = None
    sigma2: np.ndarray | None = None
    mean_weights: np.ndarray | None = None
    inflation: np.ndarray | None = None
    inflation_theory: np.ndarray | None = None
    kl_second_order: float = math.nan
    kl_fourth_order: float = math.nan
    kl_jensen_bound: float = math.nan
    kl_mean_field: float = math.nan
    kl_bias: float = math.nan
    mode: str = ""

    def summary(self) -> str:
        deviation = float(np.max(np.abs(self.inflation / self.inflation_theory - 1)))
        return self.summary_with(("mode", "kl_second_order", "kl_fourth_order", "kl_jensen_bound", "kl_mean_field",
                                  "kl_bias"), **{"max |inflation/theory - 1|": deviation})


def kl_noise_expansion(p, sigma2) -> tuple[float, float]:
    """E[KL(p ‖ softmax(log p + ε))] for independent ``εᵢ ~ N(0, σᵢ²)``, through second and fourth order.

    ``KL = log Σ pᵢe^{εᵢ} − Σ pᵢεᵢ = κ₂/2 + κ₃/6 + κ₄/24 + …`` with κⱼ the cumulants of the key-indexed
    variable ε under p (for one draw). Taking expectations (Isserlis; odd terms vanish), with
    ``Aⱼ = Σ pᵢʲσᵢ²`` and ``Bⱼ = Σ pᵢʲσᵢ⁴``::

        E[KL] = ½(A₁ − A₂)                                                       (order σ²)
              + ⅛(B₁ − A₁²) + (1/24)(−18B₂ + 24B₃ + 12A₁A₂ − 18A₂²) + O(σ⁶)    (order σ⁴)

    ``B₁ − A₁² = Var_p(σ²)``. For diffuse attention (Σpᵢ² → 0) the σ⁴ term is ``⅛Var_p(σ²) ≥ 0``: the
    error grows superlinearly in the noise variance exactly when σ² varies over the keys that carry the
    weight (e.g. correlated with the scores). With uniform σ² the ⅛Var_p term vanishes and the remaining
    O(Σpᵢ²) terms decide the sign: negative for flat attention, positive for p = (0.9, 0.1)
    (:func:`kl_sigma4_coefficient`).

    Returns:
        (second_order, through_fourth_order).
    """
    p, s2 = np.asarray(p, dtype=np.float64), np.asarray(sigma2, dtype=np.float64)
    a1, a2 = float(p @ s2), float((p**2) @ s2)
    b1, b2, b3 = float(p @ s2**2), float((p**2) @ s2**2), float((p**3) @ s2**2)
    second = 0.5 * (a1 - a2)
    fourth = (b1 - a1**2) / 8 + (-18 * b2 + 24 * b3 + 12 * a1 * a2 - 18 * a2**2) / 24
    return second, second + fourth


def kl_sigma4_coefficient(p, profile) -> float:
    """The σ⁴ coefficient c of ``E[KL] = a·σ̄² + c·σ̄⁴ + O(σ⁶)`` for the noise profile ``σᵢ² = σ̄²·profileᵢ``.

    From :func:`kl_noise_expansion` (its fourth-order term is homogeneous of degree 2 in σ², so it is
    ``c·σ̄⁴``): ``c = ⅛(B₁ − A₁²) + (1/24)(−18B₂ + 24B₃ + 12A₁A₂ − 18A₂²)`` with the profile in place of
    σ². E[KL]/σ̄² rises with the noise level at small σ̄² iff c > 0. Uniform profile on p = (0.9, 0.1):
    c = 0.0207 > 0; on flat p over S keys: c = −(S − 1)/(4S²) < 0.

    Args:
        p: [S] attention weights (non-negative, summing to 1).
        profile: [S] finite non-negative relative noise variances, or a scalar (uniform).
    """
    p = _vec(p, "p")
    if p.ndim != 1 or (p < 0).any() or abs(p.sum() - 1.0) > 1e-9:
        raise ValueError(f"p must be a 1-D vector of non-negative weights summing to 1, got shape {p.shape}, "
                         f"sum {p.sum()!r}")
    w = np.broadcast_to(np.asarray(profile, dtype=np.float64), p.shape)
    if (w < 0).any() or not np.isfinite(w).all():
        raise ValueError(f"profile must be finite and >= 0, got {profile!r}")
    second, fourth = kl_noise_expansion(p, w)
    return float(fourth - second)


def _noise_profile(scores: np.ndarray, sigma2, mode: str) -> np.ndarray:
    if np.ndim(sigma2) == 1:
        s2 = np.asarray(sigma2, dtype=np.float64)
        if s2.shape != scores.shape:
            raise ValueError(f"sigma2 given per key must have the shape of scores {scores.shape}, got {s2.shape}")
        if (s2 < 0).any() or not np.isfinite(s2).all():
            raise ValueError("sigma2 must be finite and >= 0")
        return s2
    level = float(sigma2)
    if not (level >= 0 and math.isfinite(level)):
        raise ValueError(f"sigma2 must be a finite value >= 0, got {sigma2}")
    if mode == "uniform":
        return np.full_like(scores, level)
    if mode == "correlated":
        lift = scores - scores.min()
        if lift.sum() == 0:
            return np.full_like(scores, level)
        return level * lift * scores.size / lift.sum()  # mean over keys = sigma2, increasing in the score
    raise ValueError(f"mode must be 'uniform' or 'correlated', got {mode!r}")


def jensen_simulation(
    scores,
    sigma2,
    mode: str = "uniform",
    n_draws: int = 100_000,
    seed: int = 0,
    *,
    confidence_level: float = 0.95,
) -> JensenResult:
    """Attention under Gaussian logit noise: how softmax turns logit errors into attention errors.

    Logits ``s`` (one query, S keys) get independent noise ``εᵢ ~ N(0, σᵢ²)``; ``p = softmax(s)``,
    ``p̃ = softmax(s + ε)``. Profiles (``sigma2`` a scalar σ̄²): ``"uniform"``: σᵢ² = σ̄²;
    ``"correlated"``: σᵢ² = σ̄²·S·(sᵢ − min s)/Σⱼ(sⱼ − min s) (same mean, increasing in the score, as for
    QJL/TurboQuant where larger ‖k‖ means larger logits and larger variance). An array ``sigma2 [S]``
    sets the profile directly.

    Facts checked (derivations in docs/inference.md):

    * Weight inflation (Jensen): ``E[e^{sᵢ+εᵢ}]/e^{sᵢ} = e^{σᵢ²/2}`` exactly (lognormal mean).
    * Exact identity per draw: ``KL(p ‖ p̃) = log Σᵢ pᵢe^{εᵢ} − Σᵢ pᵢεᵢ`` (the cumulant generating
      function of ε under p, minus its mean), hence ``E[KL] ≤ log Σᵢ pᵢ e^{σᵢ²/2}`` (Jensen).
    * Small noise: ``E[KL] = ½ Σᵢ pᵢ(1 − pᵢ)σᵢ² + O(σ⁴)`` (second-order expansion, ``½Var_p(ε)``).
    * Uniform σ²: the inflation ``e^{σ²/2}`` is common to all keys and cancels in softmax
      (``E[KL] ≤ σ²/2`` for every σ). Correlated σ²: it does not cancel; the mean-field weights
      ``p_mf ∝ pᵢ e^{σᵢ²/2}`` move mass towards the noisiest keys, and E[KL] gains the term
      ``⅛ Var_p(σ²)`` (= KL(p ‖ p_mf) to leading order), which grows like σ⁴. Through fourth order
      (:func:`kl_noise_expansion`), E[KL]/σ̄² increases with the noise level — softmax amplifies the
      error superlinearly — iff the σ⁴ coefficient is positive; for diffuse attention (Σpᵢ² → 0) that is
      iff σ² varies over the keys that carry the weight.
    """
    s = np.asarray(scores.detach().cpu().double().numpy() if isinstance(scores, torch.Tensor) else scores,
                   dtype=np.float64)
    if s.ndim != 1 or s.size < 2:
        raise ValueError(f"scores must be 1-D with at least 2 keys, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError(f"scores contains non-finite values (first seen: {s[~np.isfinite(s)][0]})")
    n_draws = check_int_range(n_draws, "n_draws", 2, 10**9)
    s2 = _noise_profile(s, sigma2, mode)
    logp = scipy.special.log_softmax(s)
    p = np.exp(logp)
    rng = np.random.default_rng(seed)
    kl = np.empty(n_draws)
    sum_w = np.zeros_like(s)
    sum_exp = np.zeros_like(s)
    batch = max(1, int(4_000_000 // s.size))
    sd = np.sqrt(s2)
    work = np.empty((min(batch, n_draws), s.size))
    for start in range(0, n_draws, batch):
        nb = min(batch, n_draws - start)
        eps = rng.standard_normal((nb, s.size))
        eps *= sd
        # log Σ p e^ε = m + log Σ e^(log p + ε − m), m the row maximum (the logsumexp of scipy, formed in place
        # on one buffer: the shifted weights e^(log p + ε − m) then also give the noisy softmax p̃ = w / Σ w)
        w = np.add(eps, logp, out=work[:nb])
        m = w.max(axis=-1)
        w -= m[:, None]
        np.exp(w, out=w)
        total = w.sum(axis=-1)
        kl[start : start + nb] = np.maximum(m + np.log(total) - eps @ p, 0.0)
        sum_w += (1.0 / total) @ w  # Σ over draws of p̃
        sum_exp += np.exp(eps, out=eps).sum(0)
    mean_w = sum_w / n_draws
    mean_kl = float(kl.mean())
    se = float(kl.std(ddof=1) / math.sqrt(n_draws))
    z = float(scipy.stats.norm.isf((1 - confidence_level) / 2))
    second, fourth = kl_noise_expansion(p, s2)
    jensen = float(scipy.special.logsumexp(logp + s2 / 2))
    kl_mf = max(jensen - float(p @ s2) / 2, 0.0)
    kl_bias = float(np.sum(scipy.special.rel_entr(p, mean_w)))
    return JensenResult(
        statistic=mean_kl,
        pvalue=math.nan,
        method=f"Monte Carlo, {n_draws} draws of Gaussian logit noise ({mode if np.ndim(sigma2) == 0 else 'custom'})",
        null_hypothesis="none (simulation)",
        n=n_draws,
        effect_size=kl_mf,
        effect_size_name="systematic KL(p || p_mf)",
        confidence_interval=(mean_kl - z * se, mean_kl + z * se),
        ci_of="E[KL(p || p_noisy)]",
        confidence_level=confidence_level,
        p=p,
        sigma2=s2,
        mean_weights=mean_w,
        inflation=sum_exp / n_draws,
        inflation_theory=np.exp(s2 / 2),
        kl_second_order=second,
        kl_fourth_order=fourth,
        kl_jensen_bound=jensen,
        kl_mean_field=kl_mf,
        kl_bias=kl_bias,
        mode=mode if np.ndim(sigma2) == 0 else "custom",
        extra={"kl_se": se},
    )
