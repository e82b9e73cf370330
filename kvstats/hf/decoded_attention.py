"""A long forward's attention from decoded keys and values: the keys every query of a block reads through the codes
in one flash-attention call, the rest (the band where a block's queries differ) explicitly, the two joined by their
log-sum-exps.

A many-query forward through a :class:`~kvstats.hf.cache.KVStatsCache` (a prefill, a teacher-forced segment, a
retrieval question) is decoded as if token by token: the query at position i reads key j through its code when j
was quantized before token i was decoded, ``j < quantized_count(i + 1)``, exactly otherwise (j ≤ i). For a block of
queries at positions [first, first + N) the keys [0, r), r = quantized_count(first + 1), are read through the codes
by *every* query of the block, and lie before all of them (no mask). When K's estimator is linear —
inner(q, code) = ⟨q, decode(code)⟩, what :func:`scores_are_decoded` establishes for the scheme — that part is
ordinary attention over K̂ = decode(codes) and V̂:

    far:  o_f = softmax(s · q K̂[:r]ᵀ) V̂[:r],        ℓ_f = log Σ_{j<r} exp(s · q·k̂ⱼ)   (one fused CPU kernel)
    band: o_b, ℓ_b over the keys [r, first + N): the code's or the exact logit per (query, key), causally masked
    out  = σ(ℓ_f − ℓ_b) · o_f + σ(ℓ_b − ℓ_f) · o_b                                    (σ the logistic function)

which is softmax over all the block's keys applied to their values (the weights of a split softmax are the parts'
weights scaled by exp(ℓ_part − ℓ_all)). The far part never forms its [N, r] logits or weights, so the long forward
costs what the model's own sdpa costs plus the band. The numbers are the estimator's up to float32 rounding (another
order of the same sums; tests/hf/test_decoded_attention.py bounds the difference against the code path and a
float64 oracle).
"""

from __future__ import annotations

import torch

from kvstats.quant import attention as _attention

__all__ = ["attend_decoded_block", "attend_decoded_window", "flash_part", "merge_parts", "scores_are_decoded",
           "window_part"]

#: Most logits :func:`window_part` forms at once (fp32: 32 MiB): its blocks are taken in groups under this.
WINDOW_PART_ELEMENTS = 1 << 23
#: Most queries of one block of :func:`window_part` (a long window's band is then Q × (Q + W − 1), not W × (2W − 1)).
WINDOW_QUERY_BLOCK = 64


def scores_are_decoded(scheme) -> bool:
    """Whether ``scheme``'s scores are ⟨q, decode(code)⟩ by construction, so a long forward may score K̂ =
    decode(codes) instead: kvstats' own quantizers as their scheme uses them (every one is a linear estimator,
    checked by :func:`kvstats.quant.conformance.check_quantizer` on each registered name,
    tests/quant/test_conformance.py), or a user's subclass of kvstats' Quantizer that keeps its decode-then-dot
    ``inner``. False for a scheme or a quantizer with an estimator of its own (it may not be linear), and for a
    quantizer written on the protocol alone, whose ``inner`` nothing guarantees: the cache checks that one against
    q·K̂ᵀ on every new chunk (:class:`~kvstats.hf.decoded_plan.DecodedPlan`) on the code-logit path, which it keeps."""
    from kvstats.hf.decoded_plan import _default_estimator
    from kvstats.quant.schemes import Scheme

    if not isinstance(scheme, Scheme) or type(scheme).own_scores is not Scheme.own_scores or not scheme._own_inner():
        return False
    module = type(scheme.k).__module__ or ""
    return (module == "kvstats" or module.startswith("kvstats.")
            or _default_estimator(scheme.k, "inner", "_inner", "inner_plan"))


def flash_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries q [B, H_q, N, d] over every key of k, v [B, H_kv, S, d] (S ≥ 1), or with ``causal`` (S = N)
    query r over keys [0, r], grouped-query heads (query head h reads KV head h // G): (output [B, H_q, N, d],
    log-sum-exp of the scaled logits [B, H_q, N]). One call of torch's fused CPU flash-attention kernel, whose [N, S]
    logits never exist; CPU tensors only (the cache takes this path on the CPU alone: elsewhere the fused kernels'
    log-sum-exp layouts differ by device and dtype, and forming the logits would cost what the path saves)."""
    if q.device.type != "cpu":
        raise ValueError(f"flash_part runs torch's CPU flash-attention kernel: q must be on the CPU, got {q.device}")
    b, hq, n, d = q.shape
    hkv = k.shape[1]
    if causal:  # the G query heads of a KV head as a batch axis, each causal over the keys
        grouped = q.reshape(b, hkv, hq // hkv, n, d).transpose(1, 2).reshape(b * (hq // hkv), hkv, n, d)
        k, v = (t.repeat_interleave(hq // hkv, dim=0) if hq != hkv else t for t in (k, v))  # batch b·G + g
    else:  # no mask: the G query heads of a KV head are rows of one head
        grouped = _attention.group_queries(q, hkv)
    # torch's CPU kernel reads each row of d as contiguous: a transposed K̂ (a per-channel code's decode) gave
    # wrong outputs there, so every operand's last axis is made unit-stride first
    grouped, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (grouped, k, v))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(grouped, k, v, 0.0, causal, scale=scale)[:2]
    if causal:
        back = lambda t: t.reshape(b, hq // hkv, hkv, *t.shape[2:]).transpose(1, 2)  # noqa: E731
        return back(out).reshape(b, hq, n, d), back(lse).reshape(b, hq, n)
    return _attention.ungroup(out, hq, n), lse.reshape(b, hq, n)


def merge_parts(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """The attention over the union of two disjoint key sets from each one's output [..., N, d] and log-sum-exp
    [..., N]: σ(ℓ_a − ℓ_b)·o_a + σ(ℓ_b − ℓ_a)·o_b (σ the logistic function; the same as the softmax over both sets),
    written into ``out_b`` (returned)."""
    share = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)
    return out_b.add_(share * (out_a - out_b))


def attend_decoded_block(q: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor, span_k: torch.Tensor,
                         span_v: torch.Tensor, span_start: int, first: int, far: int, hi: int,
                         use_exact: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of the queries q [B, H_q, N, d] at positions [first, first + N) (fp32), from decoded keys:
    keys [0, far) through K̂/V̂ (``k_hat``, ``v_hat`` [B, H_kv, ≥ max(far, hi), d]: every query reads them through the
    codes, :func:`flash_part`); keys [far, first + N) the band, where query i reads key j through K̂/V̂ for
    j < hi unless ``use_exact`` [N, first + N − far] says it reads it exactly (from ``span_k`` / ``span_v``, the exact
    states of positions [span_start, ...)). Returns the output [B, H_q, N, d]."""
    n = q.shape[2]
    width = first + n
    if width == far:  # every key of the block is read through the codes (sink tokens or flushes, no window)
        return flash_part(q, k_hat[..., :far, :], v_hat[..., :far, :], scale)[0]
    exact = slice(far - span_start, width - span_start)
    logits = _attention.scores(q, span_k[..., exact, :], scale=scale)  # [B, H_q, N, width − far]
    if hi > far:  # the band's columns a query reads through the codes
        codes = _attention.scores(q, k_hat[..., far:hi, :], scale=scale)
        logits[..., :hi - far] = torch.where(use_exact[:, :hi - far], logits[..., :hi - far], codes)
        del codes
    # causal: query first + r sees key far + c iff c ≤ first + r − far. Only the block's own columns hide any; with
    # exact sink tokens far may be first + 1 (the first query's own key is a sink), and that query then sees no key
    # of the band: its band part is empty (weight sum 0, log-sum-exp −inf) and the join takes the far part alone.
    offset = first - far
    skip = max(0, offset)
    hidden = torch.ones(n, width - far - skip, dtype=torch.bool, device=q.device).triu_(offset - skip + 1)
    logits[..., skip:].masked_fill_(hidden, float("-inf"))
    top = logits.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)  # a row with no visible key: 0, not −inf
    weights = logits.sub_(top).exp_()  # unnormalised: the sums are divided once, on the output
    total = weights.sum(dim=-1, keepdim=True)
    out = _attention.apply_weights(weights * use_exact, span_v[..., exact, :])
    if hi > far:
        out += _attention.apply_weights(weights[..., :hi - far].mul_(~use_exact[:, :hi - far]), v_hat[..., far:hi, :])
    out.div_(total.clamp_min(torch.finfo(total.dtype).tiny))
    lse = top.squeeze(-1).add_(total.squeeze(-1).log_())
    if far == 0:
        return out
    out_far, lse_far = flash_part(q, k_hat[..., :far, :], v_hat[..., :far, :], scale)
    return merge_parts(out_far, lse_far, out, lse)


def window_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, window: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query of q [B, H_q, N, d] (positions [first, first + N)) over its ``window`` = W exact keys, positions
    [i − W + 1, i] ∩ [0, i]: k, v [B, H_kv, first + N − p0, d] hold positions [p0, first + N),
    p0 = max(0, first − W + 1). Returns (output [B, H_q, N, d], log-sum-exp [B, H_q, N]). The queries go in blocks
    of Q = min(W, :data:`WINDOW_QUERY_BLOCK`), each block against the Q + W − 1 keys its queries can see (the band,
    at most twice its own size), all blocks in batched products of at most :data:`WINDOW_PART_ELEMENTS` logits."""
    b, hq, n, d = q.shape
    hkv, g = k.shape[1], hq // k.shape[1]
    block = min(window, WINDOW_QUERY_BLOCK)
    span = block + window - 1  # the keys one block's queries see
    blocks = -(-n // block)
    lead = window - 1 - min(first, window - 1)  # positions before 0 the first block's keys would start at
    tail = blocks * block - n
    kp, vp = (torch.nn.functional.pad(t, (0, 0, lead, tail)) for t in (k, v))  # positions [first − W + 1, ...)
    qb = torch.nn.functional.pad(q, (0, 0, 0, tail)).reshape(b, hkv, g, blocks, block, d)
    qb = qb.permute(0, 1, 3, 2, 4, 5).reshape(b, hkv, blocks, g * block, d)
    kb = kp.unfold(2, span, block)  # [B, H_kv, blocks, d, Q + W − 1]: block j's keys, a view
    vb = vp.unfold(2, span, block).transpose(-1, -2)
    # query t of block j (position first + jQ + t) sees its keys c ∈ [t, t + W − 1] (position first + jQ + c − W + 1)
    t, c = torch.arange(block, device=q.device).unsqueeze(-1), torch.arange(span, device=q.device)
    hidden = ((c < t) | (c > t + window - 1)).repeat(g, 1)  # [G·Q, Q + W − 1]
    out = qb.new_empty(b, hkv, blocks, g * block, d)
    lse = qb.new_empty(b, hkv, blocks, g * block)
    step = max(1, WINDOW_PART_ELEMENTS // max(1, b * hkv * g * block * span))
    for j0 in range(0, blocks, step):
        j1 = min(blocks, j0 + step)
        logits = (qb[:, :, j0:j1] @ kb[:, :, j0:j1]).mul_(scale).masked_fill_(hidden, float("-inf"))
        for j in range(j0, min(j1, -(-lead // block))):  # keys before position 0 (the zero padding): hidden
            logits[:, :, j - j0, :, :lead - j * block] = float("-inf")
        top = logits.amax(dim=-1, keepdim=True)  # finite: every query sees its own key
        weights = logits.sub_(top).exp_()  # unnormalised: the sums are divided once, on the output
        total = weights.sum(dim=-1, keepdim=True)
        out[:, :, j0:j1] = torch.matmul(weights, vb[:, :, j0:j1]).div_(total)
        lse[:, :, j0:j1] = top.squeeze(-1).add_(total.squeeze(-1).log_())
    out = out.reshape(b, hkv, blocks, g, block, d).permute(0, 1, 3, 2, 4, 5).reshape(b, hq, blocks * block, d)
    lse = lse.reshape(b, hkv, blocks, g, block).permute(0, 1, 3, 2, 4).reshape(b, hq, blocks * block)
    return out[:, :, :n], lse[:, :, :n]


def attend_decoded_window(q: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor, span_k: torch.Tensor,
                          span_v: torch.Tensor, span_start: int, first: int, window: int,
                          scale: float) -> torch.Tensor:
    """:func:`attend_decoded_block` for every query at once when the cache flushes one token at a time and holds no
    sink tokens: the query at position i reads keys [0, i + 1 − W) through K̂/V̂ and [i + 1 − W, i] exactly (W =
    ``window``). The codes' part is two flash calls — keys [0, a − W) seen whole by every query from a = max(first,
    W) on, then keys [a − W, i + 1 − W) causally — and the exact part :func:`window_part`; joined by log-sum-exp.
    ``span_k``/``span_v`` hold positions [span_start, first + N), span_start ≤ max(0, first − W + 1)."""
    n = q.shape[2]
    if window:
        p0 = max(0, first - window + 1)
        out, lse = window_part(q, span_k[..., p0 - span_start:, :], span_v[..., p0 - span_start:, :], first, window,
                               scale)
    a = max(first, window)  # the first query that reads a key through its code
    if a >= first + n:
        return out
    rows, off = slice(a - first, n), a - window
    q_codes = q[:, :, rows]
    m = q_codes.shape[2]
    codes, codes_lse = flash_part(q_codes, k_hat[..., off:off + m, :], v_hat[..., off:off + m, :], scale, causal=True)
    if off:
        far, far_lse = flash_part(q_codes, k_hat[..., :off, :], v_hat[..., :off, :], scale)
        codes_lse, codes = torch.logaddexp(far_lse, codes_lse), merge_parts(far, far_lse, codes, codes_lse)
    if not window:
        return codes
    merge_parts(codes, codes_lse, out[:, :, rows], lse[:, :, rows])  # in place: into the view of out's rows
    return out
