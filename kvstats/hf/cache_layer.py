"""One layer of the :class:`~kvstats.hf.cache.KVStatsCache`: codes for the tokens that left the full-precision
window, exact states for the window, and attention computed from the codes (the estimator path).
The module docstring of :mod:`kvstats.hf.cache` describes both attention paths."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvstats._validation import all_finite, check_float_tensor, first_non_finite
from kvstats.hf._transformers import CacheLayerMixin
from kvstats.hf.logit_rules import LogitRules, _mask_block, _reveals, _shown
from kvstats.hf.records import AttentionRecord
from kvstats.measure.metrics import causal_kl_and_recall_
from kvstats.quant import attention as _attention
from kvstats.quant import ops
from kvstats.quant.quantizers.base import acc_dtype, held_bytes
from kvstats.quant.schemes import CacheCode, Scheme

#: k of the top-k recall recorded by ``record_attention`` (docs/references.md §5).
RECORD_TOP_K = 5
#: Queries per block of :meth:`KVStatsLayer.attend`: bounds its temporaries to O(QUERY_BLOCK × S) per head.
QUERY_BLOCK = 64
#: Up to this many queries per forward (decode steps, short chunks) attend() takes the output from the value codes
#: (``scheme.weighted_values``: no V̂ formed); a longer forward (a prefill) decodes V̂ once and multiplies, which
#: costs less when many query rows share the keys (one decode, then a GEMM; docs/cache.md).
CODE_VALUES_MAX_QUERIES = 8


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without a dispatch when it already is (a decode step converts four tensors per layer)."""
    return t if t.dtype == dtype else t.to(dtype)


def _shows_later_keys(mask: torch.Tensor, n: int) -> bool:
    """Whether the mask rows of the last ``n`` positions (bool: True = attend; float: added to the logits; keys aligned
    to the end) let a query see a key after its own position."""
    rows = mask[..., -n:]  # a later key of one of the last n queries is one of the last n keys
    rows = rows if rows.shape[-2] in (1, n) else rows[..., -n:, :]  # one row broadcast to every query, or theirs
    return bool((_shown(rows) & ~_attention.causal_visible(n, n, 0, device=rows.device)).any())


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


class KVStatsLayer(CacheLayerMixin):
    """One layer of a :class:`KVStatsCache`: codes of the quantized tokens + the exact window.

    State: ``chunks`` (a list of :class:`~kvstats.schemes.CacheCode` covering cache positions
    ``[0, n_coded)``; per-vector codes are merged into one chunk, codes with groups across tokens stay
    separate; n_coded ≥ n_quantized: when a per-vector code is due, the whole window is encoded with it, so the
    next W steps append nothing — a token's code is a function of its own K/V, the same whenever it is formed),
    ``keys``/``values`` (the exact window, positions ``[n_quantized, seq)``, ``[B, H_kv, w, d]``).
    """

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, scheme: Scheme, window: int = 0, flush_size: int = 1, *, layer_idx: int = -1,
                 record: bool = False, records: list | None = None, rollback: int = 128):
        super().__init__()
        self.scheme, self.window, self.flush_size, self.layer_idx = scheme, window, flush_size, layer_idx
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
        self._chunk_plans: list[tuple[CacheCode, Callable, Callable, dict]] = []  # see _plans()

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
        """How many of the first ``seq`` tokens are stored as codes: G·⌊max(0, seq − W)/G⌋ (int or tensor)."""
        g = self.flush_size
        if isinstance(seq, torch.Tensor):
            return torch.div((seq - self.window).clamp_min(0), g, rounding_mode="floor") * g
        return max(0, seq - self.window) // g * g

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.chunks, self.n_quantized, self.n_coded, self.cumulative_length, self._span = [], 0, 0, 0, None
        self._undo = self._reference = None
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
        if self._reference is not None:
            self._reference = (self._reference[0][..., :new_nq, :], self._reference[1][..., :new_nq, :])

    def _truncate_codes(self, stop: int) -> None:
        """Keep the codes of tokens [0, stop): whole chunks, then the first tokens of a per-vector chunk; a chunk
        with groups across tokens is encoded again from the exact states of its kept tokens."""
        kept, start = [], 0
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
            self.chunks[-1] = CacheCode(last.k.cat(code.k), last.v.cat(code.v))
            self._chunk_plans = self._chunk_plans[:-1]  # (its plan holds the replaced chunk)
        else:
            self.chunks.append(code)

    def decoded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K̂, V̂) of the quantized tokens, ``[B, H_kv, n_quantized, d]``, in the model's dtype."""
        if not self.n_quantized:
            return self.keys[..., :0, :], self.values[..., :0, :]
        parts = [self.scheme.decode(c) for _, c in self._chunks_before(self.n_quantized)]
        return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-2)

    def nbytes(self) -> tuple[int, int]:
        """(bytes of the quantized tokens' codes, bytes of the exact window), K and V together: the cache's format.
        Window tokens encoded ahead (``n_coded`` > ``n_quantized``) are not counted, like the rollback record: both
        are buffers of this implementation, at most W + G tokens' codes and ``rollback`` tokens' states."""
        codes = sum(held_bytes(c.k) + held_bytes(c.v) for _, c in self._chunks_before(self.n_quantized))
        window = 0 if self.keys is None else sum(t.numel() * t.element_size() for t in (self.keys, self.values))
        return codes, window

    # ----------------------------------------------------------------------------------- attention
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
        if self.record and rules.sinks is not None:
            raise ValueError("record_attention with attention sinks (s_aux) is not supported: the recorded KL compares "
                             "distributions without the sink; build the cache with record_attention=False")
        span = self._span
        # the estimators below run on these queries unchecked (Scheme.own_scores): their shape and finiteness here,
        # before any state changes (a refused call leaves the update's states to a corrected one)
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
                and _shows_later_keys(attention_mask, n)):
            raise ValueError(f"record_attention on layer {self.layer_idx}: the attention mask lets a query see keys "
                             f"after its own position (a bidirectional or prefix-LM mask), and the records compare "
                             f"causal attention distributions, not the ones this model uses; build the cache with "
                             f"record_attention=False")
        self.estimator_attention, self.last_attention = True, "kvstats"
        self._span = None
        if n == 1 and not self.record:  # a decode step: _attend_rows' one block, straight to its last-position path
            mask = None if attention_mask is None else attention_mask[..., -seq:]
            out, weights = self._attend_last(query, mask, scaling, dropout, training, span, rules)
            self._check_output(out)
            return out, weights
        v_hat = None
        if n > CODE_VALUES_MAX_QUERIES and self.chunks:
            v_hat = torch.cat([self.scheme.v.decode(c.v) for c in self.chunks], dim=-2).to(acc_dtype(query.dtype))
        keep_weights = _weights_requested() or n <= QUERY_BLOCK
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
        self._check_output(out)
        return out, (None if not keep_weights else weights[0] if len(weights) == 1 else torch.cat(weights, dim=2))

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
        if mask is not None and width < seq and _reveals(mask[..., width:]):
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
        _mask_block(logits, mask, first, n, width, rules.sliding_window)
        weights = _attention.softmax_with_sinks(logits, rules.sinks)
        # the reference: exact logits of every column (lo = span_start = 0), capped and masked alike; none once the
        # exact states of older tokens are gone (span_start > 0: its exact logits miss columns [0, span_start))
        if self.record and span_start == 0:
            exact = _attention.soft_cap(exact, rules.softcap)
            _mask_block(exact, mask, first, n, width, rules.sliding_window)
            self._record(exact, logits, span_start, seq, n, first)
        del logits
        used = F.dropout(weights, p=dropout, training=training)
        # the two weighted sums of values cover only the columns some query reads exactly, resp. through the
        # codes (the other weights of each product are zero); before `read` every query reads the codes. The
        # codes' sum comes from the value codes, or from V̂ when attend() decoded it (a long forward).
        out = _attention.apply_weights(used[..., read:] * use_exact[:, read:],
                                       span_v[..., read - span_start:width - span_start, :].to(acc))
        if hi:
            cut = min(read, hi)
            code_weights = used[..., :hi]
            if hi > cut and not weights_kept and v_hat is not None:  # in place: a prefill block's weights go unread
                code_weights[..., cut:].mul_(~use_exact[:, cut:hi])
            elif hi > cut:
                code_weights = torch.cat([code_weights[..., :cut], code_weights[..., cut:] * ~use_exact[:, cut:hi]], -1)
            out += self._code_values(code_weights) if v_hat is None else _attention.apply_weights(
                code_weights, v_hat[..., :hi, :])
        return out.to(query.dtype).transpose(1, 2).contiguous(), weights.to(query.dtype)

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
            _mask_block(logits, mask, seq - 1, 1, seq, rules.sliding_window)
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
        dtype), or None: more than one chunk, or a chunk the op cannot read."""
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
        (tests/test_decode_attention.py). q [B, H_q, 1, d] in the accumulation dtype."""
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

    def _chunks_before(self, stop: int):
        """``(first token, code)`` of the chunks that hold keys [0, stop): whole chunks, the last per-vector chunk cut
        at ``stop`` (a view); a chunk that cannot be cut (groups across tokens) whole, reaching past ``stop``."""
        start = 0
        for chunk in self.chunks:
            if start >= stop:
                break
            n = chunk.k.shape[chunk.k.token_axis]
            if start + n > stop and self._per_vector(chunk):
                chunk = CacheCode(chunk.k.narrow(stop - start, copy=False), chunk.v.narrow(stop - start, copy=False))
            yield start, chunk
            start += n

    def __getstate__(self) -> dict:
        # the plans' functions read the tensors of this layer's chunks: a copy (copy.deepcopy, pickle) makes its own
        return {**self.__dict__, "_chunk_plans": []}

    def _plans(self) -> list[tuple[CacheCode, Callable, Callable]]:
        """``(chunk, scores, values)`` of each chunk: the scheme's plans for it (:meth:`Scheme.own_plan`), made when a
        chunk is new — a decode step scores every chunk, and a chunk changes only when codes are appended (every
        W + 1 steps with codes encoded ahead) or cut. A plan holds its chunk, so identity tells a new one; the
        methods that replace chunks also drop their plans, so no replaced chunk stays held by one."""
        plans = self._chunk_plans
        if len(plans) != len(self.chunks) or any(c is not p[0] for c, p in zip(self.chunks, plans)):
            old = {id(p[0]): p for p in plans}
            self._chunk_plans = plans = [old[id(c)] if id(c) in old and old[id(c)][0] is c
                                         else (c, *self.scheme.own_plan(c), {}) for c in self.chunks]
        return plans

    def _code_scores(self, q: torch.Tensor, stop: int) -> torch.Tensor:
        """``scheme.scores`` of q against the codes of keys [0, ≥ stop) (:meth:`_chunks_before`); at least one key
        so the result is never empty. q in the accumulation dtype."""
        plans = self._plans()
        parts = [plans[i][1](q) if code is plans[i][0] else self.scheme.own_scores(q, code)
                 for i, (_, code) in enumerate(self._chunks_before(max(stop, 1)))]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _code_values(self, weights: torch.Tensor) -> torch.Tensor:
        """Σⱼ wᵢⱼ v̂ⱼ over the quantized tokens [0, stop), stop = weights.shape[-1] (weights [B, H_q, N, stop] in the
        accumulation dtype), from the value codes (``scheme.weighted_values``) of :meth:`_chunks_before`; a chunk
        reaching past ``stop`` gets zero weights there."""
        plans, out = self._plans(), None
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
