"""One layer of the :class:`~kvstats.hf.cache.KVStatsCache`: its storage — codes for the tokens that left the
full-precision window, exact states for the window (update, prefill, crop, reorder, the rollback record) — with the
attention computed from the codes (the estimator path) mixed in from :mod:`kvstats.hf.code_attention`.
The module docstring of :mod:`kvstats.hf.cache` describes both attention paths."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kvstats._validation import all_finite, first_non_finite
from kvstats.hf._transformers import CacheLayerMixin
from kvstats.hf.code_attention import CodeAttention
from kvstats.quant.quantizers.base import held_bytes
from kvstats.quant.schemes import CacheCode, Scheme


class KVStatsLayer(CodeAttention, CacheLayerMixin):
    """One layer of a :class:`KVStatsCache`: codes of the quantized tokens + the exact window.

    State: ``sink_keys``/``sink_values`` (the first ``sinks`` = S tokens, exact and never encoded: positions
    ``[0, n_sinks)``, n_sinks = min(seq, S); None while S = 0), ``chunks`` (a list of
    :class:`~kvstats.schemes.CacheCode` covering cache positions ``[n_sinks, n_coded)``; per-vector codes are merged
    into one chunk, codes with groups across tokens stay separate; n_coded ≥ n_quantized: when a per-vector code is
    due, the whole window is encoded with it, so the next W steps append nothing — a token's code is a function of
    its own K/V, the same whenever it is formed), ``keys``/``values`` (the exact window, positions
    ``[n_quantized, seq)``, ``[B, H_kv, w, d]``).
    Attention from the codes (:meth:`attend`, :meth:`attend_shared`): :class:`~kvstats.hf.code_attention.CodeAttention`.
    """

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, scheme: Scheme, window: int = 0, flush_size: int = 1, *, layer_idx: int = -1,
                 record: bool = False, records: list | None = None, rollback: int = 128, sinks: int = 0):
        super().__init__()
        self.scheme, self.window, self.flush_size, self.layer_idx = scheme, window, flush_size, layer_idx
        #: S: the first S tokens are kept exact (attention sinks), besides the window; never encoded
        self.sinks = sinks
        self.sink_keys: torch.Tensor | None = None  # [B, H_kv, n_sinks, d] in the model's dtype (S > 0)
        self.sink_values: torch.Tensor | None = None
        self.rollback = rollback
        # exact K/V of the most recently quantized tokens, positions [start, n_quantized): what crop() puts back
        self._undo: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.record, self.records = record, records if records is not None else []
        self.chunks: list[CacheCode] = []
        self.n_quantized = 0
        self.n_coded = 0  # tokens [0, n_coded) have codes: the quantized ones, then window tokens encoded ahead
        self.cumulative_length = 0
        self.estimator_attention = False
        self.dense_attention = False  # set when an update's exact states went unread: standard attention in use
        #: how the last forward's attention read this layer: "kvstats" (attend(): the estimator path), "model" (the
        #: model's own attention read the tensors update() returned), None before any forward (or after prefill)
        self.last_attention: str | None = None
        self._span: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self._reference: tuple[torch.Tensor, torch.Tensor] | None = None  # see prefill()
        self._chunk_plans: list[tuple[CacheCode, Callable, Callable, dict]] = []  # see CodeAttention._plans()

    # ------------------------------------------------------------------------------- Cache protocol
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.keys = key_states[..., :0, :].clone()
        self.values = value_states[..., :0, :].clone()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append N new tokens (``[B, H_kv, N, d]``); encode those leaving the window; return K/V for attention.

        Returns dense (K̃, Ṽ) of all S tokens (decoded codes, then the exact window) for standard attention
        functions; once :func:`kvstats_attention` has run on this layer, the exact states of this forward
        instead (the estimator path reads the codes itself).
        """
        if self.estimator_attention and self._span is not None:
            raise ValueError(
                f"layer {self.layer_idx}: the last forward's attention did not go through kvstats_attention although "
                f"this cache's estimator path ran on the layer before, so the model's own attention read only that "
                f"forward's exact states, not the cache: was the model's attention implementation changed? Start a "
                f"new KVStatsCache after switching")
        span_start, span_k, span_v = self._store(key_states, value_states)
        self._span = None if self.dense_attention else (span_start, span_k, span_v)
        self.last_attention = "model"
        if self.estimator_attention:
            keys, values = span_k, span_v
        else:
            k_hat, v_hat = self.decoded()
            keys, values = torch.cat([k_hat, self.keys], dim=-2), torch.cat([v_hat, self.values], dim=-2)
        keys._kvstats_layer = self  # how kvstats_attention finds the codes behind the tensors it is given
        if self._span is not None:  # the exact span travels with the tensors: a layer sharing these K/V reads it
            keys._kvstats_span = (span_start, None, None) if keys is span_k else self._span
        return keys, values

    def _store(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """Append N new tokens: encode those leaving the window, keep the window exact. Returns the span of exact
        states this forward can read, ``(first position, K, V)``: the window before the update and the new tokens
        (from position 0 when the layer keeps a reference of every exact state, see :meth:`prefill`)."""
        self._check_states(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif self._span is not None and not self.estimator_attention:
            self.dense_attention = True  # the last forward did not call attend(): stop keeping its exact states
        old = self.cumulative_length
        span_start = old - self.keys.shape[-2]
        span_k = torch.cat([self.keys, key_states], dim=-2)
        span_v = torch.cat([self.values, value_states], dim=-2)
        seq = old + key_states.shape[-2]
        self.cumulative_length = seq
        target = self.quantized_count(seq)
        if old < self.sinks:  # tokens among the first S: kept exact (the window is empty: span_start = old)
            stop = min(seq, self.sinks)
            self._add_sinks(span_k[..., :stop - old, :], span_v[..., :stop - old, :])
            self.n_quantized, self.n_coded = stop, max(self.n_coded, stop)
        if target > self.n_quantized:
            a, b = self.n_quantized - span_start, target - span_start
            if target > self.n_coded:  # per-vector codes: the whole window too, so the next steps need no encode
                stop = seq if self._codes_per_vector() else target
                c = self.n_coded - span_start
                self._append(self.scheme.encode_checked(span_k[..., c:stop - span_start, :],
                                                        span_v[..., c:stop - span_start, :]))
                self.n_coded = stop
            self._remember(self.n_quantized, span_k[..., a:b, :], span_v[..., a:b, :], self.rollback)
            self.n_quantized = target
        cut = self.n_quantized - span_start
        if cut > self.flush_size:  # own storage: the window alone is what stays held, not this forward's states
            self.keys, self.values = span_k[..., cut:, :].clone(), span_v[..., cut:, :].clone()
        else:  # a decode step's view of its window + new tokens holds at most G tokens more
            self.keys, self.values = span_k[..., cut:, :], span_v[..., cut:, :]
        if self._reference is not None:  # every exact state from position 0: the records' reference
            span_k = torch.cat([self._reference[0], span_k], dim=-2)
            span_v = torch.cat([self._reference[1], span_v], dim=-2)
            span_start = 0
            self._reference = (span_k[..., :self.n_quantized, :], span_v[..., :self.n_quantized, :])
        return span_start, span_k, span_v

    def _check_states(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """New K/V must be float [B, H_kv, N, d] of one shape, d the scheme's, B and H_kv those the layer holds, and
        finite — refused at once, naming the layer (not when the window flushes them into codes W steps later)."""
        where = f"layer {self.layer_idx}"
        for name, t in (("key_states", key_states), ("value_states", value_states)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 4:
                raise ValueError(f"{name} of {where} must be a float tensor [B, H_kv, N, d], got "
                                 f"{type(t).__name__ if not isinstance(t, torch.Tensor) else tuple(t.shape)}")
        if key_states.shape != value_states.shape:
            mla = (" (different last dims: a model whose cache holds other than per-head K and V of one head dim, "
                   "such as multi-head latent attention (DeepSeek-V2/V3, Kimi: a compressed latent and a shared RoPE "
                   "key), which kvstats does not support)" if key_states.shape[:-1] == value_states.shape[:-1] else "")
            raise ValueError(f"key_states {tuple(key_states.shape)} and value_states {tuple(value_states.shape)} of "
                             f"{where} must have one shape [B, H_kv, N, d]{mla}")
        if key_states.shape[-1] != self.scheme.dim:
            raise ValueError(f"key/value head dim must equal the scheme's dim {self.scheme.dim}, got "
                             f"{key_states.shape[-1]} ({where})")
        if self.is_initialized and key_states.shape[:2] != self.keys.shape[:2]:
            raise ValueError(f"key_states {tuple(key_states.shape)} of {where} change the batch or KV-head count: "
                             f"the layer holds [B, H_kv] = {list(self.keys.shape[:2])}")
        # one reduction each and one host sync for both: a finite sum means every value is finite (NaN and ±inf
        # propagate); only a non-finite one (or fp32 overflow of the sum) looks closer
        if math.isfinite((key_states.sum(dtype=torch.float32) + value_states.sum(dtype=torch.float32)).item()):
            return
        for name, t in (("key_states", key_states), ("value_states", value_states)):
            if t.numel() and not all_finite(t):
                (b, h, n, c), value = first_non_finite(t)
                raise ValueError(f"{name} of {where} hold {value} at cache position "
                                 f"{self.cumulative_length + n} (batch {b}, head {h}, channel {c}): the model's "
                                 "attention produced a non-finite state; kvstats stores finite K/V only")

    def prefill(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Hold the K/V ``[B, H_kv, S, d]`` of a context whose forward ran elsewhere (a full-precision prefill):
        store them as :meth:`update` does (codes outside the window, the window exact) with no attention in this
        layer, so the next forward's queries read them through the codes — what a server that prefills in full
        precision and keeps the cache as codes does. Only on an empty layer. With recording on, the layer keeps
        every exact state from here on (not counted by :meth:`nbytes`): the reference the records compare with."""
        if self.cumulative_length:
            raise ValueError(f"prefill needs an empty layer; layer {self.layer_idx} holds {self.cumulative_length} "
                             "tokens")
        if key_states.dim() != 4 or key_states.shape != value_states.shape:
            raise ValueError(f"prefill needs key and value states of one shape [B, H_kv, S, d], got "
                             f"{tuple(key_states.shape)} and {tuple(value_states.shape)}")
        if self.record:
            self._reference = (key_states[..., :0, :], value_states[..., :0, :])
        self._store(key_states, value_states)
        self._span, self.last_attention = None, None

    def _declared(self) -> bool | None:
        """The scheme's quantizers' ``codes_per_vector`` (True only when both K's and V's declare it; False when
        either declares groups across tokens; None when not declared, or when the scheme encodes by its own method)."""
        if type(self.scheme).encode is not Scheme.encode:
            return None
        flags = [getattr(q, "codes_per_vector", None) for q in (self.scheme.k, self.scheme.v)]
        return False if False in flags else True if flags == [True, True] else None

    def _per_vector(self, chunk: CacheCode) -> bool:
        """Whether a chunk's codes can be cut and joined along the tokens: every tensor indexed by token, and not
        declared to have groups across tokens (a min-max code per channel of exactly d tokens has the shapes of
        per-token tensors)."""
        return self._declared() is not False and chunk.k.is_per_vector() and chunk.v.is_per_vector()

    def _codes_per_vector(self) -> bool:
        """Whether a window token can be encoded before it leaves the window (its code the same whenever formed):
        the quantizers declare codes per vector, and the layer holds a chunk of them."""
        last = self.chunks[-1] if self.chunks else None
        return self._declared() is True and last is not None and last.k.is_per_vector() and last.v.is_per_vector()

    def quantized_count(self, seq):
        """How many of the first ``seq`` tokens are held outside the window — as codes, and the sinks exact:
        G·⌊max(0, seq − W)/G⌋, or with S sinks min(seq, S) + G·⌊max(0, seq − S − W)/G⌋ (int or tensor)."""
        g, s = self.flush_size, self.sinks
        if isinstance(seq, torch.Tensor):
            if s:
                return seq.clamp_max(s) + torch.div((seq - s - self.window).clamp_min(0), g,
                                                    rounding_mode="floor") * g
            return torch.div((seq - self.window).clamp_min(0), g, rounding_mode="floor") * g
        return min(seq, s) + max(0, seq - s - self.window) // g * g

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.chunks, self.n_quantized, self.n_coded, self.cumulative_length, self._span = [], 0, 0, 0, None
        self._undo = self._reference = None
        self.sink_keys = self.sink_values = None
        self._chunk_plans = []
        self.estimator_attention = self.dense_attention = False
        self.last_attention = None
        self.keys = self.values = None
        self.is_initialized = False

    # ----------------------------------------------------------------------------------------- crop
    @property
    def _undo(self) -> tuple[int, torch.Tensor, torch.Tensor] | None:
        """The rollback record ``(first position, K, V)`` of the last ``rollback`` quantized tokens: what
        :meth:`crop` puts back. A decode step's tokens are held apart (:meth:`_remember`) and joined here, on read."""
        if self._undo_pending:
            start, k, v = self._undo_held
            k = torch.cat([k, *(p[0] for p in self._undo_pending)], dim=-2)
            v = torch.cat([v, *(p[1] for p in self._undo_pending)], dim=-2)
            drop = max(0, k.shape[-2] - self.rollback)
            if drop:  # own tensors of the kept tokens, not views holding the dropped ones
                start, k, v = start + drop, k[..., drop:, :].clone(), v[..., drop:, :].clone()
            self._undo = (start, k, v)
        return self._undo_held

    @_undo.setter
    def _undo(self, record: tuple[int, torch.Tensor, torch.Tensor] | None) -> None:
        self._undo_held, self._undo_pending, self._undo_pending_tokens = record, [], 0

    def _remember(self, start: int, k: torch.Tensor, v: torch.Tensor, keep: int) -> None:
        """Keep the exact states of the last ``keep`` quantized tokens (k, v: those just quantized, from
        position ``start``) for :meth:`crop`, in tensors of their own (never views of a forward's states).

        A few tokens that follow the record are held apart, copied alone, and joined when the record is read or
        they reach ``keep`` tokens: a decode step then copies its one token instead of the record's ``keep``."""
        n_new = k.shape[-2]
        if keep <= 0:
            self._undo = None
            return
        held = self._undo_held
        if n_new < keep and held is not None and held[0] + held[1].shape[-2] + self._undo_pending_tokens == start:
            self._undo_pending.append((k.clone(), v.clone()))
            self._undo_pending_tokens += n_new
            if self._undo_pending_tokens >= keep:
                self._undo  # noqa: B018 - join them: the pieces never hold more than a record's tokens
            return
        if n_new >= keep:  # a copy: a view would keep this forward's whole exact states alive
            start, k, v = start + n_new - keep, k[..., n_new - keep:, :].clone(), v[..., n_new - keep:, :].clone()
        else:  # the first record, or tokens not following it (after a crop past it)
            k, v = k.clone(), v.clone()
        self._undo = (start, k, v)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last tokens: ``tokens_to_remove`` ≤ 0 removes that many (transformers ≥ 4.56); a positive
        value is the length to keep (transformers' older ``crop(max_length)``).

        The result equals a cache that never saw the removed tokens: window tokens are cut, and tokens that
        were quantized only because the removed ones pushed them out of the window are put back exact from
        the layer's record of its last ``rollback`` quantized tokens (so any crop of at most ``rollback``
        tokens is exact). ValueError when the crop reaches further back than that record.
        """
        seq = self.cumulative_length
        keep = max(0, seq + tokens_to_remove) if tokens_to_remove <= 0 else min(tokens_to_remove, seq)
        if keep >= seq or not self.is_initialized:
            return
        new_nq = self.quantized_count(keep)
        # codes of tokens [0, coded): the quantized ones, and per vector those of kept tokens encoded ahead (so the
        # crops of assisted decoding, which remove only new tokens, mostly leave the codes as they are)
        coded = min(self.n_coded, keep) if self._codes_per_vector() else new_nq
        back_stop = min(keep, self.n_quantized)  # tokens [new_nq, back_stop) go back to the window, exact
        if new_nq < back_stop:
            undo_start = self._undo[0] if self._undo is not None else self.n_quantized
            if new_nq < undo_start:
                raise ValueError(
                    f"crop to {keep} of {seq} tokens must put back tokens {new_nq}..{back_stop - 1} exact, but "
                    f"only the exact states of tokens from {undo_start} on are kept; build the cache with a larger "
                    f"rollback_tokens (now {self.rollback})")
            if self.n_coded > coded:
                self._truncate_codes(coded)
            lo, hi = new_nq - undo_start, back_stop - undo_start
            back_k, back_v = self._undo[1][..., lo:hi, :], self._undo[2][..., lo:hi, :]
            self._undo = None if lo == 0 else (undo_start, self._undo[1][..., :lo, :], self._undo[2][..., :lo, :])
        else:  # nothing goes back (W = 0, or the kept tokens were all quantized before the removed ones came)
            back_k, back_v = self.keys[..., :0, :], self.values[..., :0, :]
            if self.n_coded > coded:  # codes of removed tokens (W = 0), or encoded ahead of them
                self._truncate_codes(coded)
            if self._undo is not None and new_nq < self.n_quantized:  # the record's removed tokens go with them
                start, k, v = self._undo
                cut = max(0, new_nq - start)
                self._undo = None if cut == 0 else (start, k[..., :cut, :], v[..., :cut, :])
        in_window = max(0, keep - self.n_quantized)
        self.keys = torch.cat([back_k, self.keys[..., :in_window, :]], dim=-2).clone()
        self.values = torch.cat([back_v, self.values[..., :in_window, :]], dim=-2).clone()
        self.n_quantized, self.n_coded = new_nq, coded
        self.cumulative_length, self._span = keep, None
        if self.n_sinks > keep:  # sinks after the kept tokens go too
            self.sink_keys, self.sink_values = (t[..., :keep, :].clone() for t in (self.sink_keys, self.sink_values))
        if self._reference is not None:
            self._reference = (self._reference[0][..., :new_nq, :], self._reference[1][..., :new_nq, :])

    def _truncate_codes(self, stop: int) -> None:
        """Keep the codes of tokens [0, stop): whole chunks, then the first tokens of a per-vector chunk; a chunk
        with groups across tokens is encoded again from the exact states of its kept tokens."""
        kept, start = [], self.n_sinks
        for chunk in self.chunks:
            n = chunk.k.shape[chunk.k.token_axis]
            if start + n <= stop:
                kept.append(chunk)
            elif start < stop:
                if self._per_vector(chunk):
                    kept.append(CacheCode(chunk.k.narrow(stop - start), chunk.v.narrow(stop - start)))
                else:
                    undo_start, k, v = self._undo if self._undo is not None else (self.n_quantized, None, None)
                    if start < undo_start:
                        raise ValueError(f"crop inside a code with groups across tokens (tokens {start}.."
                                         f"{start + n - 1}) needs their exact states; build the cache with a larger "
                                         "rollback_tokens")
                    a, b = start - undo_start, stop - undo_start
                    kept.append(self.scheme.encode(k[..., a:b, :], v[..., a:b, :]))
            start += n
        self.chunks, self._chunk_plans = kept, []

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if not self.is_initialized:
            return
        self.chunks, self._chunk_plans = [CacheCode(c.k.map_batch(fn), c.v.map_batch(fn)) for c in self.chunks], []
        self.keys, self.values, self._span = fn(self.keys), fn(self.values), None
        if self.sink_keys is not None:
            self.sink_keys, self.sink_values = fn(self.sink_keys), fn(self.sink_values)
        if self._undo is not None:
            self._undo = (self._undo[0], fn(self._undo[1]), fn(self._undo[2]))
        if self._reference is not None:
            self._reference = (fn(self._reference[0]), fn(self._reference[1]))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch_op(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch_op(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch_op(lambda t: t[indices.to(t.device) if isinstance(indices, torch.Tensor) else indices, ...])

    # ------------------------------------------------------------------------------------- storage
    def _append(self, code: CacheCode) -> None:
        last = self.chunks[-1] if self.chunks else None
        if last is not None and self._per_vector(last) and self._per_vector(code):
            merged = self.chunks[-1] = CacheCode(last.k.cat(code.k), last.v.cat(code.v))
            plans = self._chunk_plans
            decoded = plans[-1][3].get("decoded") if plans and plans[-1][0] is last else None
            if decoded is not None:  # the decoded chunk grows by the new tokens' decode alone
                plan = decoded.extended(merged, code)
                plans[-1] = (merged, plan.scores, plan.values, {"decoded": plan})
            else:
                self._chunk_plans = plans[:-1]  # (its plan holds the replaced chunk)
        else:
            self.chunks.append(code)

    def decoded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K̂, V̂) of the tokens before the window, ``[B, H_kv, n_quantized, d]``, in the model's dtype: the sinks
        exact, then the decoded codes."""
        if not self.n_quantized:
            return self.keys[..., :0, :], self.values[..., :0, :]
        parts = [self.scheme.decode(c) for _, c in self._chunks_before(self.n_quantized)]
        if self.n_sinks:
            parts.insert(0, (self.sink_keys, self.sink_values))
        return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-2)

    def nbytes(self) -> tuple[int, int]:
        """(bytes of the quantized tokens' codes, bytes of the exact tokens: window and sinks), K and V together: the
        cache's format. Window tokens encoded ahead (``n_coded`` > ``n_quantized``) are not counted, like the rollback
        record: both are buffers of this implementation, at most W + G tokens' codes and ``rollback`` tokens' states."""
        codes = sum(held_bytes(c.k) + held_bytes(c.v) for _, c in self._chunks_before(self.n_quantized))
        exact = (self.keys, self.values, self.sink_keys, self.sink_values)
        window = sum(t.numel() * t.element_size() for t in exact if t is not None)
        return codes, window

    @property
    def n_sinks(self) -> int:
        """How many sink tokens the layer holds exact: min(seq, S)."""
        return 0 if self.sink_keys is None else self.sink_keys.shape[-2]

    def _add_sinks(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append the exact K/V of tokens among the first S (own tensors: never views of a forward's states)."""
        if self.sink_keys is None:
            self.sink_keys, self.sink_values = k.clone(), v.clone()
        else:
            self.sink_keys = torch.cat([self.sink_keys, k], dim=-2)
            self.sink_values = torch.cat([self.sink_values, v], dim=-2)

    def _chunks_before(self, stop: int):
        """``(first token, code)`` of the chunks that hold keys [0, stop): whole chunks, the last per-vector chunk cut
        at ``stop`` (a view); a chunk that cannot be cut (groups across tokens) whole, reaching past ``stop``. The
        codes begin after the sinks: the first chunk at position n_sinks."""
        start = self.n_sinks
        for chunk in self.chunks:
            if start >= stop:
                break
            n = chunk.k.shape[chunk.k.token_axis]
            if start + n > stop and self._per_vector(chunk):
                chunk = CacheCode(chunk.k.narrow(stop - start, copy=False), chunk.v.narrow(stop - start, copy=False))
            yield start, chunk
            start += n

