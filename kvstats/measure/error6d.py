"""The 6D error of a KV-cache quantizer, the distance between 6D errors and the energy tests on their clouds.

Definitions and reasons: docs/metrics_error6d.md. The six components are means of the per-item metrics of
:mod:`kvstats.metrics` over one trial; their names, in order, are :data:`ERROR6D_COMPONENTS`, and the same
names are the columns of every table that holds them (e.g. figures/data/budget_sweep_trials.csv).

    e = error6d(q, k, v, k_hat, v_hat)                 # [T, 6] fp64, one row per trial
    ref = Error6DReference(q, k, v)                    # the exact attention once, for many schemes:
    e = error6d(q, k, v, k_hat, v_hat, reference=ref)  # the same numbers
    d = distance_6d(e, scale=np.median(e, axis=0))     # [T]: ‖e / m‖, one number per trial
    res = energy_test(e_a, e_b)                        # do two clouds of 6D errors differ?
"""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch

from kvstats._validation import check_int_range
from kvstats.measure._inputs import _check_qk, _check_same_shape, _prep, _relative, _scores, _work_dtype
from kvstats.measure.geometric import direction_error, relative_norm_error
from kvstats.measure.metrics import (
    AttentionReference,
    attention_kl,
    attention_kl_from_scores,
    attention_output_error,
    attention_output_error_from_scores,
    attention_scores,
)
from kvstats.quant import attention
from kvstats.results import TestResult

__all__ = [
    "ERROR6D_COMPONENTS",
    "Error6DReference",
    "distance_6d",
    "energy_distance",
    "energy_distance_6d",
    "energy_test",
    "error6d",
]

#: Names of the six columns returned by :func:`error6d`, in order (also the column names of the studies' tables).
ERROR6D_COMPONENTS = ("k_direction", "k_norm", "v_direction", "v_norm", "attention_kl", "output_error")


def _as_trials(tensors: list, names: tuple) -> list[torch.Tensor]:
    """``_prep`` each input and add the trial axis to 4-D inputs; every one must then be 5-D with q's trials."""
    ts = [_prep(x, n) for x, n in zip(tensors, names)]
    if ts[0].dim() == 4:
        ts = [t.unsqueeze(0) for t in ts]
    for t, n in zip(ts, names):
        if t.dim() != 5:
            raise ValueError(f"{n} must be 5-D [trials, batch, heads, seq, d] (or 4-D for one trial), "
                             f"got shape {tuple(t.shape)}")
        if t.shape[0] != ts[0].shape[0]:
            raise ValueError(f"{n}.shape[0] (trials) must equal q.shape[0] = {ts[0].shape[0]}, got {t.shape[0]}")
    return ts


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *t.shape[2:])


class Error6DReference:
    """The exact side of :func:`error6d`'s attention components, computed once for many quantized caches.

    ``ref = Error6DReference(q, k, v, causal=..., double=...)`` holds the exact logits ``q kᵀ/√d`` as a
    :class:`~kvstats.metrics.AttentionReference` (its ``log p`` computed on first use, then reused) and the
    exact output ``o = softmax(q kᵀ/√d) v`` with ``‖o‖``. ``error6d(q, k, v, k_hat, v_hat, reference=ref)``
    (with or without ``scores_hat``) then returns the same numbers as without ``reference``: the same
    operations in the same order, the exact side taken from here instead of recomputed per scheme.

    Args:
        q, k, v: as :func:`error6d` (``[T, B, H, N, d]`` or without ``T``).
        causal, query_offset, double: as :func:`error6d`; a call with ``reference`` must use the same.
    """

    def __init__(self, q, k, v, *, causal: bool = False, query_offset: int | None = None, double: bool = True):
        q5, k5, v5 = _as_trials([q, k, v], ("q", "k", "v"))
        self.n_trials = q5.shape[0]
        self.shapes = (tuple(q5.shape), tuple(k5.shape), tuple(v5.shape))
        self.causal, self.query_offset, self.double = bool(causal), query_offset, bool(double)
        q4, k4, v4 = map(_flat, (q5, k5, v5))
        _check_qk(q4, k4)
        logits = _scores(q4, k4, _work_dtype(double, q4, k4))
        self.attention = AttentionReference(logits, causal=causal, query_offset=query_offset)
        dtype = _work_dtype(double, logits, v4)
        self.output = attention.attend(logits.to(dtype), v4.to(dtype), self.attention.visible)
        self.output_norm = torch.linalg.vector_norm(self.output, dim=-1)

    def check(self, shapes: tuple, causal: bool, query_offset: int | None, double: bool) -> None:
        """ValueError unless this reference was built for these inputs' shapes and options."""
        if shapes != self.shapes:
            raise ValueError(f"reference was built for q, k, v of shapes {self.shapes}, got {shapes}")
        if (bool(causal), query_offset, bool(double)) != (self.causal, self.query_offset, self.double):
            raise ValueError(f"reference was built with causal={self.causal}, query_offset={self.query_offset}, "
                             f"double={self.double}; got causal={causal}, query_offset={query_offset}, "
                             f"double={double}")

    def serves(self, q4, k4, k_hat4, v4, v_hat4, est, from_keys: bool) -> bool:
        """Whether :mod:`kvstats.metrics` would work in this reference's dtypes for these inputs (else recompute)."""
        logits, dtype = self.attention.logits, self.output.dtype
        if from_keys:
            return (est.dtype == logits.dtype == dtype == _work_dtype(self.double, q4, k4, k_hat4, v4, v_hat4))
        return _work_dtype(self.double, logits, est, v4, v_hat4) == dtype

    def output_error(self, logits_hat: torch.Tensor, v_hat: torch.Tensor) -> torch.Tensor:
        """``‖o − ô‖/‖o‖`` per query, ``ô = softmax(logits_hat) v̂`` (as ``attention_output_error*``)."""
        dtype = self.output.dtype
        o_hat = attention.attend(logits_hat.to(dtype), v_hat.to(dtype), self.attention.visible)
        return _relative(torch.linalg.vector_norm(self.output - o_hat, dim=-1), self.output_norm,
                         "the exact attention output o")

def error6d(
    q,
    k,
    v,
    k_hat,
    v_hat,
    *,
    scores_hat=None,
    scores=None,
    causal: bool = False,
    query_offset: int | None = None,
    double: bool = True,
    reference: Error6DReference | None = None,
) -> torch.Tensor:
    """Per-trial 6-vector of errors (docs/metrics_error6d.md gives the definition and its reasons).

    For each trial ``t`` the row is, in the order of :data:`ERROR6D_COMPONENTS`:

    0. ``k_direction``: mean over the trial's ``B·Hkv·S`` keys of ``1 − cos(k, k̂)``;
    1. ``k_norm``: mean over the keys of ``|‖k̂‖ − ‖k‖| / ‖k‖``;
    2. ``v_direction``, 3. ``v_norm``: the same for values;
    4. ``attention_kl``: mean over the trial's ``B·Hq·Nq`` queries of ``KL(p ‖ p̂)``
       (:func:`~kvstats.metrics.attention_kl`);
    5. ``output_error``: mean over the queries of ``‖o − ô‖/‖o‖``
       (:func:`~kvstats.metrics.attention_output_error`).

    ``p̂`` and ``ô`` use the logits ``q k̂ᵀ/√d`` of the reconstructed keys, or ``scores_hat`` when given:
    the logits a scheme estimates itself (``Scheme.scores(q, code) / √d``, e.g. QJL's asymmetric
    estimator), i.e. the attention the scheme actually computes. ``scores`` (with ``scores_hat``) replaces the
    reference logits ``q kᵀ/√d`` for a model whose attention transforms them (another softmax scale, Gemma 2's
    soft cap): both then come from the caller, computed the same way.

    Args:
        q: ``[T, B, Hq, Nq, d]`` (or ``[B, Hq, Nq, d]`` for one trial).
        k, k_hat: ``[T, B, Hkv, S, d]``; v, v_hat: ``[T, B, Hkv, S, dv]`` (or without ``T``).
        scores_hat: optional estimated logits ``[T, B, Hq, Nq, S]`` (or without ``T``).
        scores: optional reference logits of the same shape (needs ``scores_hat``; not with ``reference``).
        causal, query_offset: causal mask, see :mod:`kvstats.quant.attention`.
        double: fp64 arithmetic (default: the 6D cloud feeds statistics).
        reference: ``Error6DReference(q, k, v, causal=causal, query_offset=query_offset, double=double)``
            when already computed (one serves every scheme of a trial): the same numbers, without recomputing
            the exact logits, ``log p`` and output.

    Returns:
        fp64 tensor ``[T, 6]``.
    """
    names = ("q", "k", "v", "k_hat", "v_hat")
    inputs = [q, k, v, k_hat, v_hat]
    if scores is not None and (scores_hat is None or reference is not None):
        raise ValueError("scores= (reference logits) needs scores_hat= and no reference=: both logits come from the "
                         "caller")
    if scores_hat is not None:
        names += ("scores_hat",)
        inputs.append(scores_hat)
    if scores is not None:
        names += ("scores",)
        inputs.append(scores)
    ts = _as_trials(inputs, names)
    q5, k5, v5, kh5, vh5 = ts[:5]
    n_trials = q5.shape[0]
    q4, k4, v4, kh4, vh4 = map(_flat, ts[:5])
    if reference is not None:
        if not isinstance(reference, Error6DReference):
            raise TypeError(f"reference must be an Error6DReference, got {type(reference).__name__}")
        reference.check((tuple(q5.shape), tuple(k5.shape), tuple(v5.shape)), causal, query_offset, double)
    opts = dict(causal=causal, query_offset=query_offset, reduction="none", double=double)
    if reference is not None:
        if scores_hat is None:
            _check_same_shape(k4, "k", kh4, "k_hat")
            est = _scores(q4, kh4, reference.attention.logits.dtype, "k_hat")
        else:
            est = _flat(ts[5])
        if not reference.serves(q4, k4, kh4, v4, vh4, est, scores_hat is None):
            reference = None  # work dtypes differ from the reference's (fp32 overflow, mixed inputs): recompute
    if scores_hat is None and reference is None:
        attention_cols = [attention_kl(q4, k4, kh4, **opts), attention_output_error(q4, k4, v4, kh4, vh4, **opts)]
    elif reference is None:
        ref = attention_scores(q4, k4, double=double) if scores is None else _flat(ts[6])
        est = _flat(ts[5])
        _check_scores_hat(est, ref, n_trials, ts[5])
        attention_cols = [attention_kl_from_scores(ref, est, **opts),
                          attention_output_error_from_scores(ref, est, v4, vh4, **opts)]
    else:
        if scores_hat is not None:
            _check_scores_hat(est, reference.attention.logits, n_trials, ts[5])
        _check_same_shape(v4, "v", vh4, "v_hat")
        attention_cols = [reference.attention.kl(est, reduction="none", double=double),
                          reference.output_error(est, vh4)]
    cols = [
        direction_error(k5, kh5, double=double),
        relative_norm_error(k5, kh5, double=double),
        direction_error(v5, vh5, double=double),
        relative_norm_error(v5, vh5, double=double),
        *attention_cols,
    ]
    return torch.stack([c.reshape(n_trials, -1).to(torch.float64).mean(-1) for c in cols], dim=-1)


def _check_scores_hat(est: torch.Tensor, ref: torch.Tensor, n_trials: int, given: torch.Tensor) -> None:
    if est.shape != ref.shape:
        raise ValueError(f"scores_hat must have the shape of the logits q kᵀ [trials, batch, q_heads, n_q, seq] "
                         f"= {(n_trials, *ref.shape[1:])} per trial, got {tuple(given.shape)}")


def distance_6d(errors, scale) -> np.ndarray:
    """6D distance per trial: ``‖e / m‖ = √(Σ_c (e_c / m_c)²)`` over the six components.

    Dividing by a per-component scale ``m`` (e.g. each component's median over the trials being compared)
    makes the components unitless, so that each weighs alike and one scale serves every scheme.

    Args:
        errors: ``[n, 6]`` rows of :func:`error6d` (tensor, array or DataFrame with the six columns).
        scale: ``[6]`` (one scale per component) or ``[n, 6]`` (per row), positive and finite.

    Returns:
        float64 array ``[n]``.
    """
    e = _as_cloud(errors, "errors")
    if e.shape[1] != 6:
        raise ValueError(f"errors must be [n_trials, 6] (rows of error6d), got shape {e.shape}")
    m = np.asarray(scale.detach().cpu().numpy() if isinstance(scale, torch.Tensor) else scale, dtype=np.float64)
    if m.shape not in ((6,), e.shape):
        raise ValueError(f"scale must have shape (6,) or {e.shape}, got {m.shape}")
    if not (np.isfinite(m).all() and (m > 0).all()):
        raise ValueError(f"scale must be positive and finite, got min {m.min()!r}")
    return np.sqrt(((e / m) ** 2).sum(axis=1))


def _as_cloud(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n_points, n_components], got shape {x.shape}")
    if x.shape[0] < 1:
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains non-finite values (first seen: {x[~np.isfinite(x)][0]})")
    return x


def _standardized(a: np.ndarray, b: np.ndarray, standardize: bool) -> np.ndarray:
    pooled = np.concatenate([a, b])
    if not standardize:
        return pooled
    scale = pooled.std(axis=0, ddof=1) if len(pooled) > 1 else np.ones(pooled.shape[1])
    scale = np.where(scale > 0, scale, 1.0)
    return (pooled - pooled.mean(axis=0)) / scale


def _pairwise(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))


def _energy_from_distances(dist: np.ndarray, idx_a: np.ndarray, idx_b: np.ndarray) -> np.ndarray:
    """V-statistic energy distance for (batched) index sets idx_a [..., n], idx_b [..., m]."""
    dab = dist[idx_a[..., :, None], idx_b[..., None, :]].mean(axis=(-1, -2))
    daa = dist[idx_a[..., :, None], idx_a[..., None, :]].mean(axis=(-1, -2))
    dbb = dist[idx_b[..., :, None], idx_b[..., None, :]].mean(axis=(-1, -2))
    return 2.0 * dab - daa - dbb


def energy_distance(cloud_a, cloud_b, *, standardize: bool = True) -> float:
    """Energy distance between two point clouds ``[n, p]`` and ``[m, p]`` (Székely & Rizzo).

    ``ℰ = 2·mean‖aᵢ − bⱼ‖ − mean‖aᵢ − aᵢ'‖ − mean‖bⱼ − bⱼ'‖`` with all means over all ordered pairs,
    diagonal included (the V-statistic; always ``≥ 0``, 0 iff the empirical distributions coincide).
    For ``p = 1`` and ``standardize=False``, ``√ℰ`` equals ``scipy.stats.energy_distance``.

    ``standardize=True`` first centres each component and divides it by its standard deviation in the
    *pooled* sample (components with zero spread are left unscaled), so that components with different
    units (KL in nats, relative errors) weigh alike. Pooled scaling is invariant under permutations of
    the group labels, so the permutation test on standardized clouds stays exact.
    """
    a, b = _as_cloud(cloud_a, "cloud_a"), _as_cloud(cloud_b, "cloud_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"cloud_b must have {a.shape[1]} components like cloud_a, got {b.shape[1]}")
    pooled = _standardized(a, b, standardize)
    dist = _pairwise(pooled)
    n = len(a)
    return float(max(_energy_from_distances(dist, np.arange(n), np.arange(n, len(pooled))), 0.0))


def energy_distance_6d(cloud_a, cloud_b, *, standardize: bool = True) -> float:
    """:func:`energy_distance` between two 6D error clouds ``[n, 6]`` from :func:`error6d`."""
    for x, name in ((cloud_a, "cloud_a"), (cloud_b, "cloud_b")):
        shape = tuple(x.shape)
        if len(shape) != 2 or shape[1] != 6:
            raise ValueError(f"{name} must be [n_trials, 6] (rows of error6d), got shape {shape}")
    return energy_distance(cloud_a, cloud_b, standardize=standardize)


def energy_test(
    cloud_a,
    cloud_b,
    *,
    standardize: bool = True,
    n_resamples: int = 9999,
    seed: int = 0,
) -> TestResult:
    """Multivariate two-sample test: energy-distance permutation test (Székely & Rizzo 2004).

    H0: both clouds are draws from the same distribution. The statistic is :func:`energy_distance`
    (scaled by ``n·m/(n+m)``, which does not change the p-value); the null distribution comes from
    ``scipy.stats.permutation_test`` relabelling the pooled points (exact when ``n_resamples`` exceeds
    the number of distinct splits, else random with p = (#{ℰ* ≥ ℰ} + 1)/(n_resamples + 1)). One-sided:
    large distances are evidence against H0. Consistent against all alternatives with finite means.

    Returns:
        :class:`~kvstats.results.TestResult` with ``statistic`` = energy distance, ``effect_size`` =
        the same distance (on the standardized scale), ``extra`` = n_resamples, standardize, e_statistic.
    """
    a, b = _as_cloud(cloud_a, "cloud_a"), _as_cloud(cloud_b, "cloud_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"cloud_b must have {a.shape[1]} components like cloud_a, got {b.shape[1]}")
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"energy_test needs at least 2 points per cloud, got n_a = {len(a)}, n_b = {len(b)}")
    n_resamples = check_int_range(n_resamples, "n_resamples", 1, 10**8)
    pooled = _standardized(a, b, standardize)
    dist = _pairwise(pooled)
    n, m = len(a), len(b)

    def statistic(ia, ib, axis=-1):
        ia, ib = np.moveaxis(ia, axis, -1).astype(np.intp), np.moveaxis(ib, axis, -1).astype(np.intp)
        return _energy_from_distances(dist, ia, ib)

    batch = max(1, int(2e7 // (len(pooled) ** 2)))
    res = scipy.stats.permutation_test(
        (np.arange(n), np.arange(n, n + m)),
        statistic,
        permutation_type="independent",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="greater",
        batch=batch,
        rng=np.random.default_rng(seed),
    )
    e = float(max(res.statistic, 0.0))
    return TestResult(
        statistic=e,
        pvalue=float(res.pvalue),
        method=f"energy-distance permutation test ({n_resamples} resamples, "
        f"{'pooled-SD standardized' if standardize else 'raw'} components)",
        null_hypothesis="the two clouds are drawn from the same multivariate distribution",
        n=(n, m),
        effect_size=e,
        effect_size_name="energy distance",
        extra={"n_resamples": n_resamples, "standardize": standardize, "e_statistic": e * n * m / (n + m)},
    )
