"""Attention with grouped-query heads: scores, the causal mask and the attend step, in one place.

Every part of kvstats that computes attention — the metrics (:mod:`kvstats.metrics`), the schemes'
estimator attention (:class:`kvstats.schemes.Scheme`), the transformers cache (:mod:`kvstats.cache`) and the
studies — calls these functions, so a number is computed the same way wherever it appears.

Shapes: queries ``q`` ``[B, Hq, N, d]``; keys ``k`` ``[B, Hkv, S, d]``; values ``v`` ``[B, Hkv, S, dv]``;
``Hq = G·Hkv`` (grouped-query attention, GQA): query head ``h`` reads KV head ``h // G``, the grouping of
transformers' ``repeat_kv``. Grouping is a reshape of ``q`` to ``[B, Hkv, G·N, d]`` (no copy of K or V).

Causal mask: the ``N`` queries sit at absolute positions ``query_offset, …, query_offset + N − 1`` and
query ``i`` sees keys ``0 … query_offset + i``. The default ``query_offset = S − N`` puts the queries at the
end of the sequence (decode; prefill with ``N = S`` gives the usual lower triangle).

These functions do arithmetic only: they do not cast or validate beyond the shape relations they need.
The public entry points (metrics, schemes, cache) check their arguments and choose the dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = [
    "apply_weights",
    "attend",
    "attention_weights",
    "causal_visible",
    "soft_cap",
    "softmax_with_sinks",
    "window_visible",
    "gqa_group",
    "group_queries",
    "inner_tolerance",
    "mask_logits",
    "scores",
    "ungroup",
]


def gqa_group(q_heads: int, kv_heads: int) -> int:
    """Query heads per KV head, ``G = Hq / Hkv``; ValueError unless ``Hq`` is a positive multiple of ``Hkv``."""
    if kv_heads < 1 or q_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"query heads ({q_heads}) must be a positive multiple of the KV heads ({kv_heads})")
    return q_heads // kv_heads


def group_queries(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, Hq, N, d]`` -> ``[B, Hkv, G·N, d]``: the queries of each KV head's group side by side."""
    b, hq, n, d = q.shape
    return q.reshape(b, kv_heads, gqa_group(hq, kv_heads) * n, d)


def ungroup(x: torch.Tensor, q_heads: int, n_q: int) -> torch.Tensor:
    """``[B, Hkv, G·N, X]`` -> ``[B, Hq, N, X]`` (the inverse of :func:`group_queries` on the first three axes)."""
    return x.reshape(x.shape[0], q_heads, n_q, x.shape[-1])


def scores(
    q: torch.Tensor,
    k,
    *,
    scale: float | None = None,
    inner: Callable[[torch.Tensor, object], torch.Tensor] | None = None,
    kv_heads: int | None = None,
) -> torch.Tensor:
    """Attention logits with grouped-query heads: ``s = scale · ⟨q, k⟩`` -> ``[B, Hq, N, S]``.

    Args:
        q: queries ``[B, Hq, N, d]``.
        k: keys ``[B, Hkv, S, d]``, or anything ``inner`` accepts (a quantizer's code).
        scale: ``None`` divides by ``√d`` (the standard ``1/√d``); a number multiplies (``1.0``: raw inner
            products, transformers' ``module.scaling``).
        inner: ``inner(q_grouped [B, Hkv, G·N, d], k) -> [B, Hkv, G·N, S]``; default the exact product
            ``q_grouped @ kᵀ`` (a quantizer's ``inner`` gives its estimator of the same).
        kv_heads: ``Hkv`` when ``k`` is not a tensor (default ``k.shape[1]``).
    """
    b, hq, n, d = q.shape
    hkv = k.shape[1] if kv_heads is None else kv_heads
    grouped = group_queries(q, hkv)
    raw = grouped @ k.transpose(-1, -2) if inner is None else inner(grouped, k)
    raw = ungroup(raw, hq, n)
    if scale is None:
        return raw / math.sqrt(d)
    return raw if scale == 1.0 else raw * scale  # (x · 1.0 is x: no pass over the logits for raw products)


def inner_tolerance(scores: torch.Tensor, q: torch.Tensor, x_hat: torch.Tensor) -> float:
    """How far a linear estimator's ``scores`` of queries ``q`` [..., d] may lie from ⟨q, x̂⟩ (x̂ [..., d]) and still
    be that inner product up to float rounding: 10⁻⁴·max|scores| + 10⁻⁵·max‖q‖·max‖x̂‖ + 10⁻⁶ (fp32 sums of d
    products of that size round by far less; a different estimator is off by its own error, orders more)."""
    def top_norm(t: torch.Tensor) -> float:
        return float(t.double().norm(dim=-1).max()) if t.numel() else 0.0

    big = float(scores.double().abs().max()) if scores.numel() else 0.0
    return 1e-4 * big + 1e-5 * top_norm(q) * top_norm(x_hat) + 1e-6


def causal_visible(n_q: int, n_k: int, query_offset: int | None = None, device=None) -> torch.Tensor:
    """Boolean ``[N, S]``: True where query ``i`` (at position ``query_offset + i``) may see key ``j``.

    ``j ≤ query_offset + i``; ``query_offset`` defaults to ``S − N`` (ValueError when ``N > S`` then).
    """
    if query_offset is None:
        query_offset = n_k - n_q
        if query_offset < 0:
            raise ValueError(
                f"causal attention with n_q = {n_q} queries > n_k = {n_k} keys needs an explicit "
                f"query_offset >= 0, got the default query_offset = n_k - n_q = {query_offset}"
            )
    elif query_offset < 0:
        raise ValueError(f"query_offset must be >= 0, got {query_offset}")
    pos = torch.arange(n_q, device=device).unsqueeze(-1) + query_offset
    return torch.arange(n_k, device=device).unsqueeze(0) <= pos


def window_visible(n_q: int, n_k: int, window: int, query_offset: int | None = None, device=None) -> torch.Tensor:
    """Boolean ``[N, S]`` of causal attention within a sliding window of ``window`` keys (Mistral, Gemma2/3, ...):
    query ``i`` (at position ``p = query_offset + i``) sees key ``j`` iff ``p − window < j ≤ p`` (transformers'
    ``sliding_window_overlay``: the last ``window`` positions, its own included)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    visible = causal_visible(n_q, n_k, query_offset, device)
    offset = n_k - n_q if query_offset is None else query_offset
    pos = torch.arange(n_q, device=device).unsqueeze(-1) + offset
    return visible & (torch.arange(n_k, device=device).unsqueeze(0) > pos - window)


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma 2's logit soft capping ``cap · tanh(logits / cap)`` (applied to the scaled logits, before the mask);
    ``cap`` None: the logits unchanged."""
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def softmax_with_sinks(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """``softmax`` over the keys with one *sink* logit per query head joining the normalisation and then dropped
    (gpt-oss's ``s_aux``): ``w_j = e^{l_j} / (e^{s_h} + Σ_k e^{l_k})``; logits ``[B, Hq, N, S]``, sinks ``[Hq]``.
    The weights then sum to less than 1. ``sinks`` None: the plain softmax."""
    if sinks is None:
        return torch.softmax(logits, dim=-1)
    b, hq, n, _ = logits.shape
    sink = sinks.to(logits.dtype).reshape(1, hq, 1, 1).expand(b, hq, n, 1)
    return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]


def mask_logits(logits: torch.Tensor, visible: torch.Tensor | None, fill: float = float("-inf")) -> torch.Tensor:
    """``logits`` with the keys not ``visible`` set to ``fill`` (``-inf``: probability exactly 0)."""
    if visible is None:
        return logits
    return logits.masked_fill(~visible, fill)


def attention_weights(logits: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(logits)`` over the keys, masked keys excluded: ``[..., N, S]``."""
    return torch.softmax(mask_logits(logits, visible), dim=-1)


def apply_weights(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``o = w · v`` with grouped-query heads: weights ``[B, Hq, N, S]``, v ``[B, Hkv, S, dv]`` -> ``[B, Hq, N, dv]``.

    Query head ``h`` reads the values of KV head ``h // G``.
    """
    b, hq, n, s = weights.shape
    hkv = v.shape[1]
    return ungroup(weights.reshape(b, hkv, gqa_group(hq, hkv) * n, s) @ v, hq, n)


def attend(logits: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output ``softmax(logits [masked]) · v``: logits ``[B, Hq, N, S]``, v ``[B, Hkv, S, dv]``."""
    return apply_weights(attention_weights(logits, visible), v)
