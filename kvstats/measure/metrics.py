"""Error metrics of a KV-cache quantizer: attention KL, top-k recall, attention-output and geometric K/V errors.

Shapes follow docs/design_notes.md: queries ``q`` are ``[B, Hq, Nq, d]``, keys and values ``k, v`` are
``[B, Hkv, S, d]`` (values may have their own last dim ``dv``), with ``Hq`` a multiple of ``Hkv``
(grouped-query attention): query head ``h`` attends with KV head ``h // (Hq // Hkv)``. Inputs may be torch
tensors or numpy arrays, fp16/bf16/fp32/fp64. Arithmetic is fp32, or fp64 when ``double=True`` or when an
input is already fp64. Reductions return a Python float; ``reduction="none"`` returns a tensor.

Attention probabilities are ``p = softmax(q kᵀ / √d)`` per query, computed with ``log_softmax`` (no
overflow, no ``log(0)`` from underflow of ``p``).

Causal mask. With ``causal=True`` the ``Nq`` queries sit at absolute positions
``query_offset, …, query_offset + Nq − 1`` and query ``i`` sees keys ``0 … query_offset + i`` (inclusive).
The default ``query_offset = S − Nq`` puts the queries at the end of the sequence (decode, or prefill
with ``Nq = S``: the usual lower-triangular mask). Masked keys get probability exactly 0 in both the
reference and the quantized distribution.

Zero vectors (geometric errors): the direction of a zero vector is undefined; we define ``1 − cos = 0``
(angle 0) when both ``x`` and ``x̂`` are zero and ``1 − cos = 1`` (angle π/2, "no directional
information") when exactly one is zero. The relative norm error is ``0`` when both are zero and ``+inf``
when ``x = 0 ≠ x̂`` (a relative error with zero reference is unbounded; it is reported, not hidden).
The same rule holds for the relative attention-output error when ``o = 0``. The geometric errors live in
:mod:`kvstats.measure.geometric` and are importable from here.

The 6D error built from these metrics, its distance and the energy tests on its clouds live in
:mod:`kvstats.measure.error6d` (docs/metrics_error6d.md), which builds on this module.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvstats._validation import check_int_range
from kvstats.measure._inputs import (
    Reduction,
    _check_qk,
    _check_reduction,
    _check_same_shape,
    _prep,
    _reduce,
    _relative,
    _scores,
    _work_dtype,
)
from kvstats.measure.geometric import direction_error, mse, relative_norm_error
from kvstats.quant import attention

__all__ = [
    "AttentionReference",
    "attention_kl",
    "attention_kl_from_scores",
    "attention_output_error",
    "attention_output_error_from_scores",
    "attention_scores",
    "direction_error",
    "mse",
    "relative_norm_error",
    "topk_recall",
    "topk_recall_from_scores",
]


def attention_scores(q, k, *, double: bool = False) -> torch.Tensor:
    """Scaled attention logits ``s = q kᵀ / √d`` with grouped-query heads.

    Args:
        q: queries ``[B, Hq, Nq, d]``.
        k: keys ``[B, Hkv, S, d]``, ``Hq`` a multiple of ``Hkv``; query head ``h`` uses KV head
            ``h // (Hq // Hkv)``.
        double: compute in fp64.

    Returns:
        ``[B, Hq, Nq, S]`` logits in fp32 (fp64 when ``double`` or an input is fp64).
    """
    q, k = _prep(q, "q"), _prep(k, "k")
    _check_qk(q, k)
    return _scores(q, k, _work_dtype(double, q, k))


def _score_pair(q: torch.Tensor, k: torch.Tensor, k_hat: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact and quantized logits in one dtype (fp64 for both when either overflowed fp32)."""
    a, b = _scores(q, k, dtype, "k"), _scores(q, k_hat, dtype, "k_hat")
    if a.dtype != b.dtype:
        a, b = a.double(), b.double()
    return a, b


def _causal_visible(nq: int, s: int, query_offset: int | None, device) -> torch.Tensor:
    """Boolean [Nq, S]: True where query i (absolute position offset + i) may see key j (j <= offset + i)."""
    if query_offset is None:
        if s - nq < 0:
            raise ValueError(
                f"causal=True with n_q = {nq} queries > seq = {s} keys needs an explicit query_offset >= 0, "
                f"got the default query_offset = seq - n_q = {s - nq}"
            )
    else:
        query_offset = check_int_range(query_offset, "query_offset", 0, 2**62)
    return attention.causal_visible(nq, s, query_offset, device)


# ----------------------------------------------------------------------------------------------------------
# attention KL


def attention_kl_from_scores(
    scores_ref,
    scores_quant,
    *,
    causal: bool = False,
    query_offset: int | None = None,
    reduction: Reduction = "mean",
    double: bool = False,
) -> float | torch.Tensor:
    """KL divergence between the attention distributions of two sets of logits.

    ``KL(p ‖ p̂) = Σ_j p_j (log p_j − log p̂_j)`` with ``p = softmax(scores_ref)`` and
    ``p̂ = softmax(scores_quant)`` over the last axis. The inputs are *logits*, i.e. whatever goes
    into the softmax: if your estimator returns raw inner products ``⟨q, k⟩``, divide by ``√d`` first
    (:func:`attention_kl` does this for you). Use this form when a quantizer estimates scores directly
    (e.g. QJL's asymmetric inner-product estimator) and has no reconstructed keys.

    Args:
        scores_ref, scores_quant: ``[..., Nq, S]`` logits of the same shape.
        causal, query_offset: causal mask, see the module docstring.
        reduction: ``"mean"`` (float, mean over all queries) or ``"none"`` (tensor ``[..., Nq]``).
        double: compute in fp64.

    Returns:
        KL in nats, ``≥ 0``, exactly 0 when the logits are equal (tiny negative rounding is clamped to 0).
    """
    _check_reduction(reduction)
    a = _prep(scores_ref, "scores_ref", min_dim=2)
    b = _prep(scores_quant, "scores_quant", min_dim=2)
    _check_same_shape(a, "scores_ref", b, "scores_quant")
    dtype = _work_dtype(double, a, b)
    visible = _causal_visible(a.shape[-2], a.shape[-1], query_offset, a.device) if causal else None
    kl = _kl_logits(a.to(dtype), b.to(dtype), visible)
    return _reduce(kl, reduction)


def _log_probs(logits: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    return torch.log_softmax(attention.mask_logits(logits, visible), dim=-1)


class _RefLogProbs(NamedTuple):
    """The reference side of the KL: ``log p``, ``p`` and where ``p = 0`` (masked or underflowed)."""

    lp: torch.Tensor
    p: torch.Tensor
    p_zero: torch.Tensor


def _ref_log_probs(a: torch.Tensor, visible: torch.Tensor | None) -> _RefLogProbs:
    lp = _log_probs(a, visible)
    return _RefLogProbs(lp, lp.exp(), lp == float("-inf"))


def _kl_logits(a: torch.Tensor, b: torch.Tensor, visible: torch.Tensor | None,
               ref: _RefLogProbs | None = None) -> torch.Tensor:
    """KL per query from logits; log_softmax subtracts each row's maximum first (no overflow of exp).

    Logits near the fp32 limit can still overflow in the subtraction (s_max − s_min > 3.4e38): the
    computation is then redone in fp64, and an fp64 failure raises (finite result or a clear error).
    ``ref``: ``_ref_log_probs(a, visible)`` when already computed.
    """
    kl = _kl_terms(a, b, visible, ref)
    if not bool(torch.isfinite(kl).all()) and a.dtype != torch.float64:
        kl = _kl_terms(a.double(), b.double(), visible)
    if not bool(torch.isfinite(kl).all()):
        raise ValueError(f"attention KL is not finite for logits of magnitude up to "
                         f"{max(a.abs().max().item(), b.abs().max().item()):.3g}; rescale the inputs")
    return kl


def _kl_terms(a: torch.Tensor, b: torch.Tensor, visible: torch.Tensor | None,
              ref: _RefLogProbs | None = None) -> torch.Tensor:
    """``Σ_j p_j (log p_j − log q_j)`` per query, in place on ``log q`` (the same roundings as ``p · (lp − lq)``)."""
    if ref is None:
        ref = _ref_log_probs(a, visible)
    terms = _log_probs(b, visible).neg_().add_(ref.lp).mul_(ref.p)
    return terms.masked_fill_(ref.p_zero, 0.0).sum(-1).clamp_min(0.0)  # p = 0: 0·log 0 = 0


def attention_kl(
    q,
    k,
    k_hat,
    *,
    causal: bool = False,
    query_offset: int | None = None,
    reduction: Reduction = "mean",
    double: bool = False,
) -> float | torch.Tensor:
    """KL of the attention distribution with quantized keys from the one with exact keys.

    ``KL(p ‖ p̂) = Σ_j p_j (log p_j − log p̂_j)``, ``p = softmax(q kᵀ/√d)``, ``p̂ = softmax(q k̂ᵀ/√d)``,
    per query, with ``d = q.shape[-1]``. Values never enter (see :func:`attention_output_error`).

    Args:
        q: queries ``[B, Hq, Nq, d]``.
        k, k_hat: exact and reconstructed keys ``[B, Hkv, S, d]`` (GQA: ``Hq`` a multiple of ``Hkv``).
        causal, query_offset: causal mask, see the module docstring.
        reduction: ``"mean"`` (float: mean over ``B·Hq·Nq`` queries) or ``"none"`` (``[B, Hq, Nq]``).
        double: compute in fp64.
    """
    _check_reduction(reduction)
    q, k, k_hat = _prep(q, "q"), _prep(k, "k"), _prep(k_hat, "k_hat")
    _check_qk(q, k)
    _check_same_shape(k, "k", k_hat, "k_hat")
    dtype = _work_dtype(double, q, k, k_hat)
    visible = _causal_visible(q.shape[2], k.shape[2], query_offset, q.device) if causal else None
    kl = _kl_logits(*_score_pair(q, k, k_hat, dtype), visible)
    return _reduce(kl, reduction)


# ----------------------------------------------------------------------------------------------------------
# top-k recall


def topk_recall_from_scores(
    scores_ref,
    scores_quant,
    *,
    top_k: int = 5,
    causal: bool = False,
    query_offset: int | None = None,
    reduction: Reduction = "mean",
) -> float | torch.Tensor:
    """Fraction of the reference top-k keys that are also in the quantized top-k, per query.

    ``recall = |T_k(s) ∩ T_k(ŝ)| / k'`` where ``T_k(s)`` is the set of the ``k'`` keys with the largest
    logits and ``k' = min(top_k, number of visible keys)``. In ``[0, 1]``; 1 when the logits are equal.

    Ties are broken deterministically: keys are ranked by a *stable* descending sort, so among equal
    logits the lower key index ranks first. Masked keys rank last and never count.

    Args:
        scores_ref, scores_quant: ``[..., Nq, S]`` logits of the same shape (any monotone scaling is fine).
        top_k: ``k ≥ 1``; a query that sees fewer keys uses ``k' = min(k, visible keys)``.
        causal, query_offset: causal mask, see the module docstring.
        reduction: ``"mean"`` (float) or ``"none"`` (tensor ``[..., Nq]``).
    """
    _check_reduction(reduction)
    a = _prep(scores_ref, "scores_ref", min_dim=2)
    b = _prep(scores_quant, "scores_quant", min_dim=2)
    _check_same_shape(a, "scores_ref", b, "scores_quant")
    top_k = check_int_range(top_k, "top_k", 1, 2**62)
    visible = _causal_visible(a.shape[-2], a.shape[-1], query_offset, a.device) if causal else None
    return _reduce(_recall(a, b, top_k, visible), reduction)


def _top_membership(scores: torch.Tensor, k_eff: torch.Tensor) -> torch.Tensor:
    """Whether each key is among the ``k_eff`` first of a stable descending sort of ``scores`` ``[..., S]``.

    Without sorting all S keys: ``t`` = the k_eff-th largest value (``torch.topk``); every key above ``t`` is in,
    and of the keys equal to ``t`` the lowest-indexed ``k_eff − #(scores > t)`` are in (the stable sort's tie
    rule). When the (k_eff + 1)-th largest value is below ``t`` (no tie straddles the cut, the usual case) that
    is simply ``scores >= t``. O(S) per query where the sort costs O(S log S); the same sets.
    """
    s_len = scores.shape[-1]
    k_eff = k_eff.to(torch.int64).unsqueeze(-1)  # [..., 1], 1 <= k_eff <= S
    top = torch.topk(scores, min(int(k_eff.max()) + 1, s_len), dim=-1, sorted=True).values  # descending
    kth = top.gather(-1, k_eff - 1)
    nxt = top.gather(-1, k_eff.clamp_max(top.shape[-1] - 1))  # the (k_eff + 1)-th largest where it exists
    if not bool(((nxt == kth) & (k_eff < s_len)).any()):
        return scores >= kth
    above = scores > kth
    tied = scores == kth
    room = k_eff - above.sum(-1, keepdim=True)  # how many of the tied keys fit, >= 1
    return above | (tied & (tied.cumsum(-1) <= room))


def _k_eff(shape: torch.Size, top_k: int, visible: torch.Tensor | None, device) -> torch.Tensor:
    """``k' = min(top_k, visible keys)`` per query, ``shape[:-1]``."""
    if visible is None:
        return torch.full(shape[:-1], min(top_k, shape[-1]), device=device)
    return visible.sum(-1).clamp_max(top_k).expand(shape[:-1])


def _recall(a: torch.Tensor, b: torch.Tensor, top_k: int, visible: torch.Tensor | None,
            ref_top: torch.Tensor | None = None) -> torch.Tensor:
    """Recall per query; ``ref_top``: the reference membership ``_top_membership(a, k_eff)`` when already known."""
    b = attention.mask_logits(b, visible)
    k_eff = _k_eff(b.shape, top_k, visible, b.device)
    if ref_top is None:
        ref_top = _top_membership(attention.mask_logits(a, visible), k_eff)
    hits = (ref_top & _top_membership(b, k_eff)).sum(-1)
    return hits.to(torch.float64) / k_eff.to(torch.float64)


def causal_kl_and_recall_(scores_ref: torch.Tensor, scores_quant: torch.Tensor, *, top_k: int,
                          query_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_kl_from_scores`` and ``topk_recall_from_scores`` (``causal=True``, ``reduction="none"``) of the
    same two logits in one call, the same values bit for bit, for a caller that owns both tensors and discards them
    (the cache's attention records): the causally hidden keys are set to ``-inf`` in place, in the columns from
    ``query_offset`` on (the only ones the mask hides anything in), where the public functions check and mask full
    copies of both. Logits ``[..., N, S]`` fp32/fp64 of one shape, ``S ≥ query_offset + 1``; returns (KL, recall),
    each ``[..., N]`` float64. Both inputs are modified."""
    visible = _causal_visible(*scores_ref.shape[-2:], query_offset, scores_ref.device)
    for t in (scores_ref, scores_quant):
        t[..., query_offset:].masked_fill_(~visible[:, query_offset:], float("-inf"))
    kl = _kl_logits(scores_ref, scores_quant, None)
    k_eff = _k_eff(scores_ref.shape, top_k, visible, scores_ref.device)
    hits = (_top_membership(scores_ref, k_eff) & _top_membership(scores_quant, k_eff)).sum(-1)
    return kl.to(torch.float64), hits.to(torch.float64) / k_eff.to(torch.float64)


def topk_recall(
    q,
    k,
    k_hat,
    *,
    top_k: int = 5,
    causal: bool = False,
    query_offset: int | None = None,
    reduction: Reduction = "mean",
    double: bool = False,
) -> float | torch.Tensor:
    """Top-k recall of attention with quantized keys (docs/references.md §5: k = 5).

    The reference top-k are the keys with the largest ``q kᵀ/√d``; the quantized top-k use ``q k̂ᵀ/√d``.
    See :func:`topk_recall_from_scores` for the formula and tie rule. (The argument is ``top_k``, not
    ``k``, because ``k`` is the key tensor.)

    Args:
        q: ``[B, Hq, Nq, d]``; k, k_hat: ``[B, Hkv, S, d]``.
        reduction: ``"mean"`` or ``"none"`` (``[B, Hq, Nq]``).
    """
    _check_reduction(reduction)
    q, k, k_hat = _prep(q, "q"), _prep(k, "k"), _prep(k_hat, "k_hat")
    _check_qk(q, k)
    _check_same_shape(k, "k", k_hat, "k_hat")
    top_k = check_int_range(top_k, "top_k", 1, 2**62)
    dtype = _work_dtype(double, q, k, k_hat)
    visible = _causal_visible(q.shape[2], k.shape[2], query_offset, q.device) if causal else None
    return _reduce(_recall(*_score_pair(q, k, k_hat, dtype), top_k, visible), reduction)


# ----------------------------------------------------------------------------------------------------------
# one reference, many quantized logits


class AttentionReference:
    """The exact attention's logits prepared once for the KL and top-k recall of many quantized logits.

    ``ref = AttentionReference(scores_ref, causal=True)``; then ``ref.kl(s)`` equals
    ``attention_kl_from_scores(scores_ref, s, causal=True)`` and ``ref.topk_recall(s, top_k=5)`` equals
    ``topk_recall_from_scores(scores_ref, s, top_k=5, causal=True)`` number for number (the same operations in the
    same order), for any quantized logits ``s``. The reference's ``log p = log_softmax(scores_ref)`` (per work
    dtype) and its top-k sets (per ``top_k``) are computed on first use and reused by every later call: the saving
    when one reference serves many schemes (one log-softmax and one top-k selection of ``[..., Nq, S]`` per scheme).

    Args:
        scores_ref: ``[..., Nq, S]`` exact logits (what goes into the softmax, e.g. :func:`attention_scores`).
        causal, query_offset: the causal mask of every comparison, see the module docstring.
        window: a sliding window of ``window`` keys within the causal mask (a query at position p sees keys
            p − window < j ≤ p: :func:`kvstats.quant.attention.window_visible`, as a Gemma 2/3 or Mistral
            sliding-window layer); None: plain causal. Needs ``causal=True``.
    """

    def __init__(self, scores_ref, *, causal: bool = False, query_offset: int | None = None,
                 window: int | None = None):
        self.logits = _prep(scores_ref, "scores_ref", min_dim=2)
        self.causal = bool(causal)
        if window is not None and not causal:
            raise ValueError(f"window = {window} needs causal=True (a sliding window is a causal mask), got "
                             f"causal={causal!r}")
        nq, s = self.logits.shape[-2], self.logits.shape[-1]
        if window is not None:
            window = check_int_range(window, "window", 1, 2**62)
            _causal_visible(nq, s, query_offset, self.logits.device)  # its checks of query_offset
            self.visible = attention.window_visible(nq, s, window, query_offset, self.logits.device)
        else:
            self.visible = _causal_visible(nq, s, query_offset, self.logits.device) if causal else None
        self.window = window
        self._log_probs: dict[torch.dtype, _RefLogProbs] = {}
        self._top: dict[int, torch.Tensor] = {}

    def _quant(self, scores_quant) -> torch.Tensor:
        b = _prep(scores_quant, "scores_quant", min_dim=2)
        _check_same_shape(self.logits, "scores_ref", b, "scores_quant")
        return b

    def kl(self, scores_quant, *, reduction: Reduction = "mean", double: bool = False) -> float | torch.Tensor:
        """``KL(p ‖ p̂)`` per query as :func:`attention_kl_from_scores` (``[..., Nq]`` for ``reduction="none"``)."""
        _check_reduction(reduction)
        b = self._quant(scores_quant)
        dtype = _work_dtype(double, self.logits, b)
        a = self.logits.to(dtype)
        lp = self._log_probs.get(dtype)
        if lp is None:
            lp = self._log_probs[dtype] = _ref_log_probs(a, self.visible)
        return _reduce(_kl_logits(a, b.to(dtype), self.visible, lp), reduction)

    def topk_recall(self, scores_quant, *, top_k: int = 5, reduction: Reduction = "mean") -> float | torch.Tensor:
        """Top-k recall per query as :func:`topk_recall_from_scores` (same tie rule, ``k' = min(k, visible)``)."""
        _check_reduction(reduction)
        b = self._quant(scores_quant)
        top_k = check_int_range(top_k, "top_k", 1, 2**62)
        ref_top = self._top.get(top_k)
        if ref_top is None:
            k_eff = _k_eff(self.logits.shape, top_k, self.visible, self.logits.device)
            ref_top = self._top[top_k] = _top_membership(attention.mask_logits(self.logits, self.visible), k_eff)
        return _reduce(_recall(self.logits, b, top_k, self.visible, ref_top), reduction)


# ----------------------------------------------------------------------------------------------------------
# attention output


def attention_output_error(
    q,
    k,
    v,
    k_hat,
    v_hat,
    *,
    causal: bool = False,
    query_offset: int | None = None,
    reduction: Reduction = "mean",
    double: bool = False,
) -> float | torch.Tensor:
    """Relative error of the attention output, ``‖o − ô‖ / ‖o‖`` per query.

    ``o = softmax(q kᵀ/√d) v`` and ``ô = softmax(q k̂ᵀ/√d) v̂`` (both K and V errors enter).
    Zero ``o``: 0 if ``ô = 0`` too, else +inf.

    Args:
        q: ``[B, Hq, Nq, d]``; k, k_hat: ``[B, Hkv, S, d]``; v, v_hat: ``[B, Hkv, S, dv]``.
        reduction: ``"mean"`` (float) or ``"none"`` (``[B, Hq, Nq]``).
    """
    _check_reduction(reduction)
    q, k, k_hat = _prep(q, "q"), _prep(k, "k"), _prep(k_hat, "k_hat")
    v, v_hat = _prep(v, "v"), _prep(v_hat, "v_hat")
    _check_qk(q, k)
    _check_same_shape(k, "k", k_hat, "k_hat")
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be [batch, kv_heads, seq, dv] with leading dims {tuple(k.shape[:3])} of k, "
                         f"got shape {tuple(v.shape)}")
    _check_same_shape(v, "v", v_hat, "v_hat")
    dtype = _work_dtype(double, q, k, k_hat, v, v_hat)
    visible = _causal_visible(q.shape[2], k.shape[2], query_offset, q.device) if causal else None
    logits, logits_hat = _score_pair(q, k, k_hat, dtype)
    err = _output_error(logits, logits_hat, v.to(logits.dtype), v_hat.to(logits.dtype), visible)
    return _reduce(err, reduction)


def attention_output_error_from_scores(
    scores_ref,
    scores_quant,
    v,
    v_hat,
    *,
    causal: bool = False,
    query_offset: int | None = None,
    reduction: Reduction = "mean",
    double: bool = False,
) -> float | torch.Tensor:
    """``‖o − ô‖ / ‖o‖`` per query from logits: ``o = softmax(scores_ref) v``, ``ô = softmax(scores_quant) v̂``.

    The form of :func:`attention_output_error` for a scheme that estimates its logits directly
    (``Scheme.scores(q, code) / √d``): the attention it computes is exactly this ``ô``.

    Args:
        scores_ref, scores_quant: ``[B, Hq, Nq, S]`` logits of the same shape.
        v, v_hat: ``[B, Hkv, S, dv]`` (GQA: ``Hq`` a multiple of ``Hkv``).
        reduction: ``"mean"`` (float) or ``"none"`` (``[B, Hq, Nq]``).
    """
    _check_reduction(reduction)
    a = _prep(scores_ref, "scores_ref", min_dim=4)
    b = _prep(scores_quant, "scores_quant", min_dim=4)
    _check_same_shape(a, "scores_ref", b, "scores_quant")
    v, v_hat = _prep(v, "v"), _prep(v_hat, "v_hat")
    if a.dim() != 4 or v.dim() != 4 or v.shape[0] != a.shape[0] or v.shape[2] != a.shape[3] \
            or a.shape[1] % v.shape[1]:
        raise ValueError(f"v must be [batch, kv_heads, seq, dv] matching scores_ref [batch, q_heads, n_q, seq] = "
                         f"{tuple(a.shape)} (q_heads a multiple of kv_heads), got shape {tuple(v.shape)}")
    _check_same_shape(v, "v", v_hat, "v_hat")
    dtype = _work_dtype(double, a, b, v, v_hat)
    visible = _causal_visible(a.shape[-2], a.shape[-1], query_offset, a.device) if causal else None
    return _reduce(_output_error(a.to(dtype), b.to(dtype), v.to(dtype), v_hat.to(dtype), visible), reduction)


def _output_error(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor, v_hat: torch.Tensor,
                  visible: torch.Tensor | None) -> torch.Tensor:
    o, o_hat = attention.attend(a, v, visible), attention.attend(b, v_hat, visible)
    return _relative(torch.linalg.vector_norm(o - o_hat, dim=-1), torch.linalg.vector_norm(o, dim=-1),
                     "the exact attention output o (softmax(scores_ref)·v)")
