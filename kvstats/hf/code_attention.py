"""Attention from the codes: the estimator path of a :class:`~kvstats.hf.cache_layer.KVStatsLayer`
(:class:`CodeAttention`, a mixin of the layer). Logits against quantized keys come from the scheme's estimator
(``scheme.scores`` through per-chunk plans), against the window's exact keys from q·kᵀ; the output takes the codes'
part from the value codes (``scheme.weighted_values``) or from V̂ decoded once. The module docstring of
:mod:`kvstats.hf.cache` describes both attention paths."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvstats._validation import all_finite, check_float_tensor, first_non_finite
from kvstats.hf.decoded_attention import attend_decoded_block, attend_decoded_window, scores_are_decoded
from kvstats.hf.decoded_plan import DecodedPlan, decodable_sides
from kvstats.hf.logit_rules import LogitRules, mask_block, mask_shows_any, mask_shows_later_keys
from kvstats.hf.records import AttentionRecord
from kvstats.measure.metrics import causal_kl_and_recall_
from kvstats.quant import attention as _attention
from kvstats.quant import ops
from kvstats.quant.quantizers.numerics import acc_dtype
from kvstats.quant.schemes import CacheCode

#: k of the top-k recall recorded by ``record_attention`` (docs/references.md §5).
RECORD_TOP_K = 5
#: Queries per block of :meth:`CodeAttention.attend`: bounds its temporaries to O(QUERY_BLOCK × S) per head.
QUERY_BLOCK = 64
#: Up to this many queries per forward (decode steps, short chunks) attend() takes the output from the value codes
#: (``scheme.weighted_values``: no V̂ formed); a longer forward (a prefill) decodes V̂ once and multiplies, which
#: costs less when many query rows share the keys (one decode, then a GEMM; docs/cache.md).
CODE_VALUES_MAX_QUERIES = 8
#: Queries per block of a long forward from decoded keys (:meth:`CodeAttention._attend_decoded`): its band — the keys
#: where the block's queries differ, read explicitly — is DECODED_QUERY_BLOCK × (DECODED_QUERY_BLOCK + W) per head.
DECODED_QUERY_BLOCK = 128


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without a dispatch when it already is (a decode step converts four tensors per layer)."""
    return t if t.dtype == dtype else t.to(dtype)


def _weights_requested() -> bool:
    """Whether transformers is recording attention weights in this forward (``output_attentions=True``); True
    when that cannot be told (an older or newer transformers), so weights are then always returned."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - depends on the transformers version
        return True
    try:
        collected = _active_collector.get()
    except Exception:  # noqa: BLE001 - a private API: any change means "cannot tell"
        return True
    return not isinstance(collected, dict) or "attentions" in collected


class CodeAttention:
    """The attention of a :class:`~kvstats.hf.cache_layer.KVStatsLayer` computed from its codes (:meth:`attend`).

    A mixin of the layer, whose storage it reads: ``scheme``, ``chunks`` (the codes of positions [n_sinks, n_coded),
    cut by ``_chunks_before``), the exact sinks ``sink_keys`` / ``sink_values`` (positions [0, n_sinks), read with
    the codes: every query reads them exactly), ``n_quantized``, ``n_coded``, ``cumulative_length``,
    ``quantized_count``, the exact span ``_span`` = (first position, K, V) that ``update`` left for this forward,
    ``record`` / ``records`` and ``layer_idx``. It owns ``_chunk_plans``, the scheme's plans of each chunk
    (:meth:`_plans`), which the storage drops when it replaces chunks.
    """

    def attend(self, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float = 0.0, training: bool = False,
               rules: LogitRules | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of ``query`` [B, H_q, N, d] (the N tokens of the last ``update``) through the codes.

        ``rules``: what the model's attention does to the scaled logits besides the mask (soft capping, a
        sliding window, attention sinks: :class:`LogitRules`), applied exactly as its eager attention does.
        Returns (output [B, N, H_q, d], weights [B, H_q, N, S]), as transformers' attention functions do. The
        queries are processed in blocks of :data:`QUERY_BLOCK` rows, so the [rows, S] logits, masks and weights
        of a long prefill never exist at full size; the weights are assembled only when transformers records
        them (``output_attentions=True``), else None is returned for them, as the sdpa implementation does.
        """
        if self._span is None:
            raise RuntimeError("attend() must follow update() in the same forward (no exact states available"
                               + ("; this cache was filled through another attention implementation: start a new "
                                  "KVStatsCache after switching to 'kvstats')" if self.dense_attention else ")"))
        rules = rules or LogitRules()
        span = self._span
        self._check_query(query, attention_mask, rules, span)
        self.estimator_attention, self.last_attention = True, "kvstats"
        self._span = None
        if query.shape[2] == 1 and not self.record:  # a decode step: _attend_rows' one block, its last position
            seq = self.cumulative_length
            mask = None if attention_mask is None else attention_mask[..., -seq:]
            out, weights = self._attend_last(query, mask, scaling, dropout, training, span, rules)
        else:
            out, weights = self._attend_blocks(query, attention_mask, scaling, dropout, training, span, rules)
        self._check_output(out)
        return out, weights

    def _check_query(self, query: torch.Tensor, attention_mask: torch.Tensor | None, rules: LogitRules,
                     span: tuple[int, torch.Tensor, torch.Tensor]) -> None:
        """Refuse what :meth:`attend` cannot compute: the estimators run on the queries unchecked
        (Scheme.own_scores), so their shape and finiteness are checked here, before any state changes (a refused
        call leaves the update's states to a corrected one); and records that would compare other distributions
        than the model's (attention sinks, a mask that shows later keys)."""
        if self.record and rules.sinks is not None:
            raise ValueError("record_attention with attention sinks (s_aux) is not supported: the recorded KL compares "
                             "distributions without the sink; build the cache with record_attention=False")
        if query.dim() != 4 or query.shape[0] != span[1].shape[0] or query.shape[-1] != self.scheme.dim:
            raise ValueError(f"query of layer {self.layer_idx} must be [{span[1].shape[0]}, H_q, N, {self.scheme.dim}] "
                             f"(the layer's batch and head dim), got {tuple(query.shape)}")
        n, seq = query.shape[2], self.cumulative_length
        if query.shape[1] % span[1].shape[1]:
            raise ValueError(f"query heads {query.shape[1]} must be a multiple of the KV heads {span[1].shape[1]}")
        if n > seq - span[0]:
            raise ValueError(f"{n} queries but only {seq - span[0]} tokens were added or kept exact by update()")
        check_float_tensor(query, f"query of layer {self.layer_idx}", allow_empty=True)
        if (self.record and span[0] == 0 and n > 1 and attention_mask is not None  # a forward _record will record
                and mask_shows_later_keys(attention_mask, n)):
            raise ValueError(f"record_attention on layer {self.layer_idx}: the attention mask lets a query see keys "
                             f"after its own position (a bidirectional or prefix-LM mask), and the records compare "
                             f"causal attention distributions, not the ones this model uses; build the cache with "
                             f"record_attention=False")

    def _attend_blocks(self, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
                       dropout: float, training: bool, span: tuple[int, torch.Tensor, torch.Tensor],
                       rules: LogitRules) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`attend` in blocks of :data:`QUERY_BLOCK` query rows (:meth:`_attend_rows`): output [B, N, H_q, d],
        and the weights [B, H_q, N, S] when transformers records them (else None); the records of the blocks
        joined into one per layer and forward."""
        n, seq = query.shape[2], self.cumulative_length
        keep_weights = _weights_requested() or n <= QUERY_BLOCK
        if (not keep_weights and self._decoded_keys_apply(attention_mask, dropout, training, rules)
                and (self.chunks or self.n_sinks)):
            return self._attend_decoded(query, scaling, span), None
        v_hat = None
        if n > CODE_VALUES_MAX_QUERIES and (self.chunks or self.n_sinks):
            v_hat = self._decoded("v", acc_dtype(query.dtype))
        first_record = len(self.records)
        out, weights = None, []
        for r0 in range(0, n, QUERY_BLOCK):
            r1 = min(n, r0 + QUERY_BLOCK)
            mask = attention_mask
            if mask is not None and mask.shape[-2] == n:
                mask = mask[..., r0:r1, :]
            rows, w = self._attend_rows(query[:, :, r0:r1], mask, scaling, dropout, training, span, seq - n + r0,
                                        v_hat, rules, keep_weights)
            if r1 - r0 == n:
                out = rows
            else:
                if out is None:  # one output for every block: no block's rows are left between the next temporaries
                    out = rows.new_empty((rows.shape[0], n, *rows.shape[2:]))
                out[:, r0:r1] = rows
            if keep_weights:
                weights.append(w if w.shape[-1] == seq else F.pad(w, (0, seq - w.shape[-1])))
        if len(self.records) - first_record > 1:  # one record per layer and forward, as for one block
            parts = self.records[first_record:]
            del self.records[first_record:]
            self.records.append(AttentionRecord(parts[0].layer, parts[0].query_offset,
                                                torch.cat([r.kl for r in parts], dim=-1),
                                                torch.cat([r.recall for r in parts], dim=-1), parts[0].top_k))
        return out, (None if not keep_weights else weights[0] if len(weights) == 1 else torch.cat(weights, dim=2))

    def _decoded(self, side: str, dtype: torch.dtype) -> torch.Tensor:
        """K̂ (``side`` "k") or V̂ ("v") of every key held outside the window [B, H_kv, n_coded, d] in ``dtype``: the
        sinks' exact states, then the codes decoded."""
        parts = [getattr(self, f"sink_{'keys' if side == 'k' else 'values'}")] if self.n_sinks else []
        quantizer = getattr(self.scheme, side)
        parts += [quantizer.decode(getattr(c, side)) for c in self.chunks]
        return _as_dtype(parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2), dtype)

    def _decoded_keys_apply(self, attention_mask: torch.Tensor | None, dropout: float, training: bool,
                            rules: LogitRules) -> bool:
        """Whether a long forward whose weights nobody reads may take :meth:`_attend_decoded`: no records (they need
        every logit), a causal forward without a mask, a sliding window, soft capping, sinks or dropout, on the CPU
        (torch's fused flash kernel), and scores that are ⟨q, decode(code)⟩ by construction
        (:func:`~kvstats.hf.decoded_attention.scores_are_decoded`)."""
        if (self.record or attention_mask is not None or rules.softcap is not None or rules.sinks is not None
                or rules.sliding_window is not None or (training and dropout) or self.device.type != "cpu"):
            return False  # off the CPU the flash part would form whole [N, S] logits: the blocks bound them
        linear = self.__dict__.get("_scores_are_decoded")
        if linear is None:
            linear = self._scores_are_decoded = scores_are_decoded(self.scheme)
        return linear

    def _attend_decoded(self, query: torch.Tensor, scaling: float,
                        span: tuple[int, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """:meth:`attend` of a long causal forward from K̂ and V̂ decoded once
        (:func:`~kvstats.hf.decoded_attention.attend_decoded_block` per block of :data:`DECODED_QUERY_BLOCK`
        queries): output [B, N, H_q, d]."""
        n, seq, nq = query.shape[2], self.cumulative_length, self.n_quantized
        acc = acc_dtype(query.dtype)
        k_hat, v_hat = self._decoded("k", acc), self._decoded("v", acc)
        span_start, span_k, span_v = span[0], _as_dtype(span[1], acc), _as_dtype(span[2], acc)
        if self.flush_size == 1 and not self.sinks and span_start <= max(0, seq - n - self.window + 1):
            out = attend_decoded_window(_as_dtype(query, acc), k_hat, v_hat, span_k, span_v, span_start, seq - n,
                                        self.window, scaling)
            return out.to(query.dtype).transpose(1, 2).contiguous()
        out = None
        for r0 in range(0, n, DECODED_QUERY_BLOCK):
            r1 = min(n, r0 + DECODED_QUERY_BLOCK)
            first = seq - n + r0
            width = first + r1 - r0
            # keys [0, far) are read through the codes by every query of the block; the band [far, width) is not
            far = max(span_start, int(self.quantized_count(first + 1)))
            hi = min(nq, int(self.quantized_count(width)))
            pos_q = torch.arange(first, width, device=query.device).unsqueeze(-1)
            use_exact = torch.arange(far, width, device=query.device) >= self.quantized_count(pos_q + 1)
            rows = attend_decoded_block(_as_dtype(query[:, :, r0:r1], acc), k_hat, v_hat, span_k, span_v,
                                        span_start, first, far, hi, use_exact, scaling)
            rows = rows.to(query.dtype).transpose(1, 2)
            if r1 - r0 == n:
                return rows.contiguous()
            if out is None:
                out = rows.new_empty((rows.shape[0], n, *rows.shape[2:]))
            out[:, r0:r1] = rows
        return out

    def attend_shared(self, reader: int, key: torch.Tensor, value: torch.Tensor, query: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                      training: bool = False, rules: LogitRules | None = None):
        """:meth:`attend` for layer ``reader``, which reads this layer's K/V (KV sharing: Gemma 3n's last layers
        reuse the K/V of the last layer of their type that stores them), from this layer's codes — as a server
        that shares the quantized cache between layers computes it. ``key``/``value`` are the tensors
        :meth:`update` returned in this forward (they carry its exact span); the records and messages name the
        reader."""
        carried = getattr(key, "_kvstats_span", None)
        if carried is None:
            raise ValueError(f"layer {reader} reads the K/V of layer {self.layer_idx} (KV sharing), but the tensors it "
                             "was given carry no exact states of this forward: a cache filled through another "
                             "attention implementation cannot serve a sharing layer; start a new KVStatsCache")
        start, k, v = carried
        span = (start, key if k is None else k, value if v is None else v)
        saved, own = self._span, self.layer_idx
        self._span, self.layer_idx = span, reader
        try:
            return self.attend(query, attention_mask, scaling, dropout, training, rules)
        finally:
            self._span, self.layer_idx, self.last_attention = saved, own, "kvstats"

    def _check_output(self, out: torch.Tensor) -> None:
        if out.numel() and not all_finite(out):  # finite queries and states, yet a logit or a sum overflowed fp32
            at, value = first_non_finite(out)
            raise ValueError(f"attention of layer {self.layer_idx} through the codes is {value} at output {list(at)} "
                             f"(output [B, N, H_q, d]) from finite queries and states: a logit or a weighted sum "
                             f"overflowed {out.dtype}; rescale the model's states or run it in a wider dtype")

    def _attend_rows(self, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float, dropout: float,
                     training: bool, span: tuple[int, torch.Tensor, torch.Tensor], first: int,
                     v_hat: torch.Tensor | None, rules: LogitRules,
                     weights_kept: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`attend` for the queries at cache positions [first, first + N) (``attention_mask``: their rows);
        ``weights_kept`` False: the caller discards the returned weights (they may then hold the codes' part only).

        Only the first ``width`` = first + N key columns are formed when the mask hides every later key (the
        causal case): a prefill block then costs O(N × (first + N)) rather than O(N × S). The weights returned
        have ``width`` columns (:meth:`attend` pads them to S when they are asked for).
        """
        span_start, span_k, span_v = span
        n = query.shape[2]
        seq, nq = self.cumulative_length, self.n_quantized
        mask = None if attention_mask is None else attention_mask[..., -seq:]
        acc = acc_dtype(query.dtype)
        q = query.to(acc)
        width = first + n  # keys after the block's last query: hidden by the causal mask
        if mask is not None and width < seq and mask_shows_any(mask[..., width:]):
            width = seq  # a mask that shows later keys (not a causal LM): form every column
        pos_q = torch.arange(first, first + n, device=q.device).unsqueeze(-1)
        pos_k = torch.arange(width, device=q.device).unsqueeze(0)
        # key j is read exactly by the query at position i iff it was not yet quantized when token i was
        # decoded: j >= quantized_count(i + 1) (i − j < W when G = 1); those keys all lie in the span
        use_exact = pos_k >= self.quantized_count(pos_q + 1)  # [N, width]
        # exact logits only for the columns some query of the block reads exactly, j >= quantized_count(first + 1)
        # (all of the span when recording: the reference logits), codes only for j < quantized_count(first + N)
        read = max(span_start, int(self.quantized_count(first + 1)))
        lo = span_start if self.record else read
        hi = min(nq, int(self.quantized_count(first + n)))
        exact = _attention.scores(q, span_k[..., lo - span_start:width - span_start, :].to(acc), scale=scaling)
        if hi:  # codes' logits, then the columns [lo, width) where some query reads exactly
            quant = self._code_scores(q, hi)[..., :width].to(acc)
            logits = F.pad(quant, (0, width - quant.shape[-1])).mul_(scaling)
            del quant  # a long prefill's [B, H_q, N, width] temporaries set its peak memory: hold as few as needed
            logits[..., lo:] = torch.where(use_exact[:, lo:], exact, logits[..., lo:])
        else:
            logits = F.pad(exact, (lo, 0))
        logits = _attention.soft_cap(logits, rules.softcap)  # elementwise: the same before or after the merge
        mask_block(logits, mask, first, n, width, rules.sliding_window)
        weights = _attention.softmax_with_sinks(logits, rules.sinks)
        # the reference: exact logits of every column (lo = span_start = 0), capped and masked alike; none once the
        # exact states of older tokens are gone (span_start > 0: its exact logits miss columns [0, span_start))
        if self.record and span_start == 0:
            exact = _attention.soft_cap(exact, rules.softcap)
            mask_block(exact, mask, first, n, width, rules.sliding_window)
            self._record(exact, logits, span_start, seq, n, first)
        del logits
        used = F.dropout(weights, p=dropout, training=training)
        out = self._weighted_values(used, use_exact, span, read, width, hi, v_hat, weights_kept)
        return out.to(query.dtype).transpose(1, 2).contiguous(), weights.to(query.dtype)

    def _weighted_values(self, used: torch.Tensor, use_exact: torch.Tensor,
                         span: tuple[int, torch.Tensor, torch.Tensor], read: int, width: int, hi: int,
                         v_hat: torch.Tensor | None, weights_kept: bool) -> torch.Tensor:
        """The output [B, H_q, N, d] of :meth:`_attend_rows` from its weights ``used`` [B, H_q, N, width] (in the
        accumulation dtype): Σⱼ wᵢⱼ vⱼ over the keys query i reads exactly (``use_exact`` [N, width]) plus
        Σⱼ wᵢⱼ v̂ⱼ over the keys [0, hi) it reads through the codes. ``weights_kept`` False: ``used`` may be
        changed in place (the caller discards it)."""
        span_start, _, span_v = span
        # the two weighted sums of values cover only the columns some query reads exactly, resp. through the
        # codes (the other weights of each product are zero); before `read` every query reads the codes. The
        # codes' sum comes from the value codes, or from V̂ when attend() decoded it (a long forward).
        out = _attention.apply_weights(used[..., read:] * use_exact[:, read:],
                                       span_v[..., read - span_start:width - span_start, :].to(used.dtype))
        if hi:
            cut = min(read, hi)
            code_weights = used[..., :hi]
            if hi > cut and not weights_kept and v_hat is not None:  # in place: a prefill block's weights go unread
                code_weights[..., cut:].mul_(~use_exact[:, cut:hi])
            elif hi > cut:
                code_weights = torch.cat([code_weights[..., :cut], code_weights[..., cut:] * ~use_exact[:, cut:hi]], -1)
            out += self._code_values(code_weights) if v_hat is None else _attention.apply_weights(
                code_weights, v_hat[..., :hi, :])
        return out


    def _attend_last(self, query: torch.Tensor, mask: torch.Tensor | None, scaling: float, dropout: float,
                     training: bool, span: tuple[int, torch.Tensor, torch.Tensor],
                     rules: LogitRules) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_attend_rows` for one query at the last position (a decode step), without recording: it reads
        keys [0, n_quantized) through their codes and the window [n_quantized, seq) exactly, so the general path's
        per-column choice (``use_exact``) and its causal mask of the block's own column are identities here, and
        the same logits and sums are formed without them (the same values, bit for bit), in the grouped layout
        [B, H_kv, G, ·] of the queries of each KV head, which for one query is a view of [B, H_q, 1, ·]."""
        span_start, span_k, span_v = span
        seq, hi, coded = self.cumulative_length, self.n_quantized, self.n_coded
        acc = acc_dtype(query.dtype)
        q = _as_dtype(query, acc)
        if hi and mask is None and rules.sliding_window is None and not (training and dropout):
            parts = self._decode_parts(acc)
            if parts is not None:
                return self._attend_fused(q, query.dtype, span, scaling, rules, parts)
        b, hq, _, d = q.shape
        hkv = span_k.shape[1]
        g = hq // hkv
        exact = q.view(b, hkv, g, d) @ _as_dtype(span_k[..., hi - span_start:, :], acc).transpose(-1, -2)
        if hi:  # whole chunks: their window columns cut from the logits, zero-weighted in the sums
            code_scores = _as_dtype(self._code_scores(q, coded), acc)
            logits = torch.cat([code_scores.view(b, hkv, g, -1)[..., :hi], exact], dim=-1)
        else:
            logits = exact
        logits = _attention.soft_cap(logits.mul_(scaling).view(b, hq, 1, seq), rules.softcap)
        if mask is not None or rules.sliding_window is not None:
            mask_block(logits, mask, seq - 1, 1, seq, rules.sliding_window)
        weights = _attention.softmax_with_sinks(logits, rules.sinks)
        used = F.dropout(weights, p=dropout, training=training) if training and dropout else weights
        out = used.view(b, hkv, g, seq)[..., hi:] @ _as_dtype(span_v[..., hi - span_start:, :], acc)
        if hi:
            out = out.view(b, hq, 1, d)
            out += self._code_values(used[..., :hi] if coded == hi else F.pad(used[..., :hi], (0, coded - hi)))
        out = out.view(b, 1, hq, d)  # = [B, H_q, 1, d].transpose(1, 2): one query row
        if query.dtype != acc:
            out, weights = out.to(query.dtype), weights.to(query.dtype)
        return out, weights

    def _decode_parts(self, acc: torch.dtype):
        """(K, V) parts of the codes for the fused decode step (:meth:`Scheme.decode_parts`, made once per chunk and
        dtype), or None: more than one chunk, a chunk the op cannot read, or sinks (exact keys before the codes, which
        the op does not read: the plans then run, with the sinks' exact columns joined to the codes')."""
        if self.n_sinks:
            return None
        plans = self._plans()
        if len(plans) != 1:
            return None
        chunk, _, _, parts = plans[0]
        if chunk.k.shape[chunk.k.token_axis] != self.n_coded:  # (one chunk holds every code: a guard, not a case)
            return None
        if acc not in parts:
            parts[acc] = self.scheme.decode_parts(chunk, acc)
        return parts[acc]

    def _attend_fused(self, q: torch.Tensor, dtype: torch.dtype, span: tuple[int, torch.Tensor, torch.Tensor],
                      scaling: float, rules: LogitRules, parts) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_attend_last` in one call of :func:`kvstats.ops.decode_attention` (no mask, no sliding window, no
        dropout, one chunk of codes the op reads): the same ops in the same order, so the same values, bit for bit
        (tests/quant/test_decode_attention.py). q [B, H_q, 1, d] in the accumulation dtype."""
        span_start, span_k, span_v = span
        seq, hi = self.cumulative_length, self.n_quantized
        b, hq, _, d = q.shape
        hkv = span_k.shape[1]
        g, groups, n_win = hq // hkv, b * hkv, seq - hi
        sinks = None if rules.sinks is None else \
            rules.sinks.to(q.dtype).reshape(1, hkv, g).expand(b, hkv, g).reshape(groups, g)
        out, weights = ops.decode_attention(
            q.reshape(groups, g, d), _as_dtype(span_k[..., hi - span_start:, :], q.dtype).reshape(groups, n_win, d),
            _as_dtype(span_v[..., hi - span_start:, :], q.dtype).reshape(groups, n_win, d), hi, scaling, rules.softcap,
            sinks, *parts[0], *parts[1])
        out, weights = out.view(b, 1, hq, d), weights.view(b, hq, 1, seq)  # out: [B, H_q, 1, d].transpose(1, 2)
        if dtype != q.dtype:
            out, weights = out.to(dtype), weights.to(dtype)
        return out, weights

    def __getstate__(self) -> dict:
        # the plans' functions read the tensors of this layer's chunks: a copy (copy.deepcopy, pickle) makes its own
        return {**self.__dict__, "_chunk_plans": []}

    def _plans(self) -> list[tuple[CacheCode, Callable, Callable]]:
        """``(chunk, scores, values, parts)`` of each chunk: the scheme's plans for it (:meth:`_plan_of`), made when a
        chunk is new — a decode step scores every chunk, and a chunk changes only when codes are appended (every
        W + 1 steps with codes encoded ahead) or cut. A plan holds its chunk, so identity tells a new one; the
        methods that replace chunks also drop their plans, so no replaced chunk stays held by one."""
        plans = self._chunk_plans
        if len(plans) != len(self.chunks) or any(c is not p[0] for c, p in zip(self.chunks, plans)):
            old = {id(p[0]): p for p in plans}
            self._chunk_plans = plans = [old[id(c)] if id(c) in old and old[id(c)][0] is c
                                         else self._plan_of(c) for c in self.chunks]
        return plans

    def _plan_of(self, chunk: CacheCode) -> tuple[CacheCode, Callable, Callable, dict]:
        """A new chunk's plan entry: the scheme's (:meth:`Scheme.own_plan`), or for a quantizer with no plans of its
        own the chunk decoded once and kept (:class:`~kvstats.hf.decoded_plan.DecodedPlan`, under ``"decoded"``)."""
        sides = self.__dict__.get("_decodable")
        if sides is None:
            sides = self._decodable = decodable_sides(self.scheme)
        if any(sides):
            plan = DecodedPlan(self.scheme, chunk, sides)
            return chunk, plan.scores, plan.values, {"decoded": plan}
        return (chunk, *self.scheme.own_plan(chunk), {})

    def _code_scores(self, q: torch.Tensor, stop: int) -> torch.Tensor:
        """``scheme.scores`` of q against the codes of keys [0, ≥ stop) (:meth:`_chunks_before`); at least one key
        so the result is never empty. q in the accumulation dtype. The sinks (keys [0, n_sinks)) are scored
        exactly, q·kᵀ, before the codes."""
        plans = self._plans()
        parts = [plans[i][1](q) if code is plans[i][0] else self.scheme.own_scores(q, code)
                 for i, (_, code) in enumerate(self._chunks_before(max(stop, 1)))]
        if self.n_sinks:
            parts.insert(0, _attention.scores(q, _as_dtype(self.sink_keys, q.dtype), scale=1.0))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _code_values(self, weights: torch.Tensor) -> torch.Tensor:
        """Σⱼ wᵢⱼ v̂ⱼ over the quantized tokens [0, stop), stop = weights.shape[-1] (weights [B, H_q, N, stop] in the
        accumulation dtype), from the value codes (``scheme.weighted_values``) of :meth:`_chunks_before`; a chunk
        reaching past ``stop`` gets zero weights there. The sinks' part (keys [0, n_sinks)) from their exact values."""
        plans, out = self._plans(), None
        if self.n_sinks:
            s = min(self.n_sinks, weights.shape[-1])
            out = _attention.apply_weights(weights[..., :s], _as_dtype(self.sink_values[..., :s, :], weights.dtype))
        for i, (start, code) in enumerate(self._chunks_before(weights.shape[-1])):
            n = code.v.shape[code.v.token_axis]
            w = weights[..., start:start + n]
            if w.shape[-1] < n:
                w = F.pad(w, (0, n - w.shape[-1]))
            part = plans[i][2](w) if code is plans[i][0] else self.scheme.own_weighted_values(w, code)
            out = part if out is None else out.add_(part)
        return out

    def _record(self, exact: torch.Tensor, logits: torch.Tensor, span_start: int, seq: int, n: int,
                offset: int) -> None:
        if span_start != 0:  # the exact keys of older tokens are gone: no reference to compare with
            return
        # both logits are this block's temporaries (the weights are already formed): masked in place, not copied
        kl, recall = causal_kl_and_recall_(exact, logits, top_k=min(RECORD_TOP_K, seq), query_offset=offset)
        self.records.append(AttentionRecord(self.layer_idx, offset, kl.cpu(), recall.cpu(), min(RECORD_TOP_K, seq)))
