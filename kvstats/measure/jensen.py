"""The Jensen bias of softmax under noisy logits: unbiased logits give biased weights (E[e^{s+ε}] = e^{s}·e^{σ²/2}
for Gaussian ε), so the attention KL of an unbiased estimator is positive. Closed forms of KL(p ‖ p̃) to second and
fourth order in σ and a Monte Carlo simulation to check them (docs/inference.md, "Jensen"). Re-exported by
:mod:`kvstats.measure.inference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.special
import scipy.stats
import torch

from kvstats._validation import check_int_range
from kvstats.measure._inputs import _vec
from kvstats.results import TestResult

__all__ = ["JensenResult", "jensen_simulation", "kl_noise_expansion", "kl_sigma4_coefficient"]


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
