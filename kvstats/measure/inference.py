"""Unbiasedness and variance checks of inner-product estimators against closed forms; the Jensen-bias simulation
(:mod:`kvstats.measure.jensen`) is importable from here.

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
from kvstats.measure._inputs import _vec
from kvstats.measure.jensen import JensenResult, jensen_simulation, kl_noise_expansion, kl_sigma4_coefficient
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
    "orthogonal_sketch_prod_distortion",
    "qjl_variance",
    "spherical_abs_moment",
    "turbo_prod_distortion",
    "turbo_prod_variance",
    "unbiasedness_test",
]


# ----------------------------------------------------------------------------------------------------------
# closed forms


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


def orthogonal_sketch_prod_distortion(d_mse_prev: float, d: int, *, scale: float = math.sqrt(math.pi / 2),
                                      y_norm2: float = 1.0) -> float:
    """D_prod of TurboQuant_prod(b) when the residual's sketch has m = d orthogonal rows of norm √d (D'Alberto's
    Hadamard sketch S = H·diag(s′), arXiv 2605.08114 eq. 3, or Haar rows), y uniform and independent of x::

        D_prod = (scale² + 1 − 2·scale·c_d) · D_mse(b−1) · ‖y‖² / d,    c_d = E|sᵀr|/(√d‖r‖)

    with ``c_d`` = :func:`spherical_abs_moment` (d) (= √d·E|u₁| ≈ √(2/π)·(1 + 1/(4d))): exact when S r/‖S r‖
    is uniform on the sphere (Haar rows); for the Hadamard sketch an approximation whose error is the residual's
    departure from that law (a kurtosis effect: 0.5–3% on TurboQuant_prod at d = 128, b = 2..6). Derivation:
    with S = √d·U (U orthogonal), u = U r/‖r‖ and z = U y, ⟨y, r⟩ − ⟨y, r̂⟩ = ‖r‖·⟨z, u − (scale/√d)·sign(u)⟩;
    z is uniform and independent of u, so the mean square is ‖r‖²·‖y‖²·(1 − 2·scale·‖u‖₁/√d + scale²)/d, and
    E‖u‖₁ = √d·c_d. With ``scale`` = √(π/2) (D'Alberto's and TurboQuant's constant) the factor is
    π/2 − 1 − 1/(2d) + O(d⁻²) → 0.571 as d grows, against π/2 − 1/d for Gaussian rows
    (:func:`turbo_prod_distortion`): an orthogonal sketch of m = d rows loses the JL term, so the sign step is
    the whole error. The ratio to TurboQuant_mse(b) at equal b tends to 4·(π/2 − 1) = 2.28, not 2π.
    """
    d = check_int_range(d, "d", 2, 2**62)
    d_mse_prev = float(d_mse_prev)
    if not 0.0 <= d_mse_prev <= 1.0:
        raise ValueError(f"d_mse_prev must be in [0, 1], got {d_mse_prev}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    y_norm2 = float(y_norm2)
    if not (math.isfinite(y_norm2) and y_norm2 >= 0):
        raise ValueError(f"y_norm2 must be a finite number >= 0, got {y_norm2}")
    c_d = spherical_abs_moment(d)
    return (scale**2 + 1.0 - 2.0 * scale * c_d) * d_mse_prev * y_norm2 / d


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
