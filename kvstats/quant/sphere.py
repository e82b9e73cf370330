"""The law of one coordinate of a uniform point on the sphere S^{d-1}; sampling; distance to N(0, 1/d); GOF.

For x uniform on S^{d-1} each coordinate t = x_i has density

    f_d(t) = Γ(d/2) / (√π Γ((d-1)/2)) · (1 - t²)^{(d-3)/2},   t ∈ [-1, 1],

i.e. t = 2B - 1 with B ~ Beta((d-1)/2, (d-1)/2). Mean 0, variance 1/d. d = 2 is the arcsine law
(U-shaped, singular at ±1), d = 3 the uniform law on [-1, 1], d = 4 the semicircle (2/π)√(1 - t²), and
for large d the law approaches N(0, 1/d). See docs/theory_sphere_law.md.

* :func:`coordinate_law` — the law as a frozen scipy distribution (scipy's Beta, not a re-derivation).
* :func:`sample_sphere` — uniform unit vectors (normalised Gaussians), seeded.
* :func:`gaussian_limit_distance` — total variation and KL(f_d ‖ N(0, 1/d)).
* :func:`goodness_of_fit` — KS, Cramér–von Mises or Anderson–Darling test of i.i.d. draws against f_d.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from scipy import integrate, optimize, special, stats

from kvstats._random import make_generator
from kvstats._validation import check_int_range
from kvstats.results import TestResult

__all__ = [
    "MAX_DIM",
    "coordinate_law",
    "sample_sphere",
    "GaussianLimitDistance",
    "gaussian_limit_distance",
    "SphereGOFResult",
    "goodness_of_fit",
]

#: Largest dimension accepted by the functions of this module (the Beta law is handled in log space by
#: scipy and stays accurate far beyond the head dims of real models; 2^20 is a sanity bound).
MAX_DIM = 2**20


def _check_dim(d) -> int:
    return check_int_range(d, "d", 2, MAX_DIM)


def coordinate_law(d: int):
    """The law f_d of one coordinate of a uniform point on S^{d-1}, as a frozen scipy distribution.

    ``scipy.stats.beta(a, a, loc=-1, scale=2)`` with a = (d - 1)/2, for any int d ≥ 2. Use its
    ``pdf``, ``cdf``, ``ppf``, ``rvs``, ``mean`` (0), ``var`` (1/d), ``entropy``.

    Raises:
        TypeError / ValueError: d not an int, or d < 2 (the message names ``d`` and the value).
    """
    d = _check_dim(d)
    a = (d - 1) / 2
    return stats.beta(a, a, loc=-1.0, scale=2.0)


def sample_sphere(n: int, d: int, seed: int | torch.Generator | None,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """n points uniform on the unit sphere S^{d-1}: [n, d] tensor, rows of unit norm.

    Each row is g / ‖g‖ with g ~ N(0, I_d) drawn in float64 on the CPU, then cast to ``dtype``. ``seed``
    follows the package's seed rule (docs/hostile_inputs.md): an int (same seed → same vectors), None (fresh
    entropy), or a CPU ``torch.Generator``, consumed in place.
    """
    n = check_int_range(n, "n", 1, 2**40)
    d = _check_dim(d)
    gen = make_generator(seed)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    g = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return (g / torch.linalg.vector_norm(g, dim=-1, keepdim=True)).to(dtype)


@dataclass(frozen=True)
class GaussianLimitDistance:
    """Distances between f_d and its Gaussian limit N(0, 1/d).

    Attributes:
        d: dimension.
        total_variation: sup_A |P_fd(A) - P_N(A)| = ½ ∫ |f_d - φ_d|, in [0, 1].
        kl: KL(f_d ‖ N(0, 1/d)) = ∫ f_d log(f_d / φ_d) in nats (finite: f_d ≪ N). The reverse direction
            KL(N ‖ f_d) is +∞ for every d, because N puts mass outside [-1, 1] where f_d is 0.
    """

    d: int
    total_variation: float
    kl: float

    def to_dict(self) -> dict:
        return {"d": self.d, "total_variation": self.total_variation, "kl": self.kl}


def _log_ratio(t: np.ndarray | float, law, gauss) -> np.ndarray:
    return law.logpdf(t) - gauss.logpdf(t)


def _sign_change_points(d: int) -> list[float]:
    """Points t ∈ (0, 1) where f_d(t) = φ_d(t).

    With u = t², g(u) = log f_d - log φ_d = const + ((d-3)/2) log(1-u) + d u / 2 has g'(u) = 0 only at
    u* = 3/d, so g is monotone on [0, u*] and on [u*, 1): at most one root on each piece (brentq).
    """
    law, gauss = coordinate_law(d), stats.norm(0.0, 1.0 / math.sqrt(d))

    def g(u: float) -> float:
        return float(_log_ratio(math.sqrt(u), law, gauss))

    pieces = [0.0, 1.0]
    if 0.0 < 3.0 / d < 1.0:
        pieces = [0.0, 3.0 / d, 1.0]
    roots = []
    for lo, hi in zip(pieces[:-1], pieces[1:]):
        hi = min(hi, 1.0 - 1e-15)  # g is ±inf at u = 1 when d != 3; stay just inside
        if g(lo) * g(hi) < 0:
            roots.append(math.sqrt(optimize.brentq(g, lo, hi, xtol=1e-300, rtol=1e-15, maxiter=500)))
    return sorted(roots)


def gaussian_limit_distance(d: int) -> GaussianLimitDistance:
    """Total variation and KL divergence between f_d and N(0, 1/d).

    * Total variation: with A = {f_d > φ_d}, TV = P_fd(A) - P_N(A); A is a union of intervals whose
      end points (where f_d = φ_d) are found by root finding (at most two per half-line, see
      :func:`_sign_change_points`), and the probabilities are exact differences of the two CDFs.
    * KL(f_d ‖ N(0, 1/d)) by ``scipy.integrate.quad`` of the non-negative integrand
      φ·(r log r - r + 1), r = f_d/φ_d, on [0, 1] (twice, by symmetry) plus the Gaussian mass outside
      [-1, 1] (where f_d = 0 the integrand is φ). Using r log r - r + 1 ≥ 0 instead of f log(f/φ)
      avoids cancellation at large d, where KL = O(1/d²). The end point t = 1 (singular for d = 2)
      is handled by quad's extrapolation; break points at multiples of 1/√d guide it at large d.
    """
    d = _check_dim(d)
    law, gauss = coordinate_law(d), stats.norm(0.0, 1.0 / math.sqrt(d))
    sigma = 1.0 / math.sqrt(d)

    # --- total variation, exact via CDFs on {f > φ}
    cuts = [0.0, *_sign_change_points(d), 1.0]
    tv_half = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        mid = 0.5 * (lo + hi)
        diff = (law.cdf(hi) - law.cdf(lo)) - (gauss.cdf(hi) - gauss.cdf(lo))
        if _log_ratio(mid, law, gauss) > 0:
            tv_half += diff
    # outside [-1, 1] only N has mass, so {f > φ} never includes it
    tv = 2.0 * tv_half

    # --- KL(f || N), integrated over θ with t = sin θ (dt = cos θ dθ). In θ, log f_d(sin θ) =
    # log f_d(0) + (d - 3) log cos θ exactly, which stays accurate up to θ = π/2 where t = sin θ
    # rounds to 1; the factor cos θ cancels the (1 - t²)^(-1/2) singularity of the d = 2 density.
    # log f_d(0) - log φ_d(0) = log[Γ(d/2) / (Γ((d-1)/2) √(d/2))]: both logs are O(log d) while their
    # difference is O(1/d), so it is taken from the Pochhammer ratio Γ(x + ½)/Γ(x) (accurate to
    # relative 1e-16) instead of subtracting the two logpdf values.
    log_g0 = float(gauss.logpdf(0.0))
    log_f0 = log_g0 + math.log(special.poch((d - 1) / 2, 0.5) / math.sqrt(d / 2))

    def integrand(th: float) -> float:
        t, c = math.sin(th), math.cos(th)
        if c <= 0.0:
            return 0.0
        log_f = log_f0 + (d - 3) * math.log(c)
        log_g = log_g0 - 0.5 * d * t * t
        x = log_f - log_g
        # φ·(r log r - r + 1)·cos θ with r = e^x, without cancellation near x = 0
        h = x * x * (0.5 + x * (1.0 / 3.0 + x / 8.0)) if abs(x) < 1e-3 else x * math.exp(x) - math.expm1(x)
        return math.exp(log_g) * h * c

    edges = sorted({0.0, *[math.asin(min(k * sigma, 1.0)) for k in (1, 2, 4, 8, 16, 40)], math.pi / 2})
    kl_half = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi > lo:
            # at d ≳ 10^4 quad reports "roundoff detected" while its error estimate is < 1e-17 (the
            # integrand is ~1e-9 there, O(1/d²)); the value is checked against the 0.75/d² asymptote
            # in tests/quant/test_sphere.py, so the warning is silenced rather than shown to every caller.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", integrate.IntegrationWarning)
                val, _ = integrate.quad(integrand, lo, hi, limit=200, epsabs=0.0, epsrel=1e-10)
            kl_half += val
    kl = 2.0 * kl_half + 2.0 * float(gauss.sf(1.0))
    return GaussianLimitDistance(d=d, total_variation=float(tv), kl=float(kl))


@dataclass(frozen=True)
class SphereGOFResult(TestResult):
    """Goodness of fit of i.i.d. draws to the sphere-coordinate law f_d (a :class:`TestResult`)."""

    d: int = 0


_METHODS = {
    "ks": "Kolmogorov-Smirnov (one-sample, scipy.stats.kstest, exact/asymptotic auto)",
    "cvm": "Cramer-von Mises (one-sample, scipy.stats.cramervonmises)",
    "ad": "Anderson-Darling (fully specified null; Monte Carlo p-value, scipy.stats.goodness_of_fit)",
}


def goodness_of_fit(samples, d: int, method: str = "ks", *, n_mc: int = 9999, seed: int = 0) -> SphereGOFResult:
    """Test H0: ``samples`` are i.i.d. draws from f_d (a fully specified law, nothing estimated).

    Pass draws that are independent: e.g. one coordinate per vector (``x[:, 0]``). The d coordinates
    of the same unit vector are dependent (Σ x_i² = 1), so pooling them makes the test invalid.

    Methods:
        "ks": one-sample Kolmogorov–Smirnov, ``scipy.stats.kstest(samples, law.cdf)``.
        "cvm": Cramér–von Mises, ``scipy.stats.cramervonmises(samples, law.cdf)``.
        "ad": Anderson–Darling A² against the fully specified f_d. ``scipy.stats.anderson`` is not
            usable here: its tables are for families with *estimated* parameters (normal, exponential,
            ...). A² is invariant under the probability integral transform, so the samples are mapped
            to u = F_d(x) and tested against U(0, 1) with all parameters known by
            ``scipy.stats.goodness_of_fit(uniform, u, known_params={loc: 0, scale: 1}, statistic="ad")``,
            whose p-value is a Monte Carlo estimate with ``n_mc`` null samples (seeded by ``seed``;
            p ≥ 1/(n_mc + 1), exact-level test).

    Returns:
        :class:`SphereGOFResult` with statistic, pvalue, method, null hypothesis and n.
    """
    d = _check_dim(d)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {sorted(_METHODS)}, got {method!r}")
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().cpu().double().numpy()
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(
            f"samples must be 1-D i.i.d. draws (e.g. x[:, 0]), got shape {x.shape}; "
            "coordinates of one unit vector are dependent and must not be pooled"
        )
    if x.size < 2:
        raise ValueError(f"samples must hold at least 2 values, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples contains non-finite values")
    law = coordinate_law(d)
    if method == "ks":
        res = stats.kstest(x, law.cdf)
        stat, p = float(res.statistic), float(res.pvalue)
    elif method == "cvm":
        res = stats.cramervonmises(x, law.cdf)
        stat, p = float(res.statistic), float(res.pvalue)
    else:
        n_mc = check_int_range(n_mc, "n_mc", 99, 10**7)
        seed = check_int_range(seed, "seed", 0, 2**63 - 1)
        u = law.cdf(x)
        res = stats.goodness_of_fit(
            stats.uniform, u, known_params={"loc": 0.0, "scale": 1.0}, statistic="ad",
            n_mc_samples=n_mc, rng=np.random.default_rng(seed),
        )
        stat, p = float(res.statistic), float(res.pvalue)
    return SphereGOFResult(
        statistic=stat,
        pvalue=p,
        method=_METHODS[method],
        null_hypothesis=f"samples are i.i.d. from f_d, the law of a coordinate of a uniform point on S^{d - 1}",
        n=int(x.size),
        d=d,
    )
