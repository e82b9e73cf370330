"""A quantized KV cache for real generation with Hugging Face transformers.

    from kvstats.hf.cache import KVStatsCache, use_estimator_attention
    from kvstats.quant.schemes import scheme

    use_estimator_attention(model)                      # optional: attention through the scheme's estimator
    cache = KVStatsCache(scheme=scheme("kqv", bits=4, dim=64), full_precision_window=32)
    out = model.generate(input_ids, cache=cache, max_new_tokens=40)   # transformers >= 5.24; before it:
    # past_key_values=cache (cache_kwargs(model, cache) picks the keyword the installed version takes)
    cache.memory()                                      # bytes held vs an fp16 cache

What is stored. Each layer holds the K and V of every token *as codes of the scheme* (``scheme.encode``:
packed payloads + per-vector scalars, counted by ``Code.nbytes``), except the most recent
``full_precision_window`` = W tokens, kept exactly in the model's dtype (as KIVI and QJL do). A token is
encoded once, when it leaves the window (W = 0: as soon as it arrives), and never re-encoded; with
``flush_size`` = G > 1 tokens leave in blocks of G (KIVI's residual groups).

How attention reads it — two paths, chosen by the model's attention implementation:

* ``attn_implementation="kvstats"`` (:func:`use_estimator_attention`, or ``load_model(...,
  attn_implementation="kvstats")``): :func:`kvstats_attention` asks the cache layer for the logits.
  Logits against quantized keys come from the scheme's *estimator*, ``scheme.scores(q, code)`` (for
  ``turbo_prod``/QJL the asymmetric estimator ⟨Πq, ŷ⟩ + c·γ·⟨SΠq, sign(S r)⟩, for the MSE quantizers
  ⟨q, k̂⟩); logits against window tokens are exact. Values enter linearly, so the output is
  ``Σ_j w_j v̂_j`` with v̂ = ``scheme.v.decode`` (exact v for window tokens). The window is per *query*: key j
  is exact for the query at cache position i iff it was still in the window when token i was decoded
  (i − j < W for G = 1), exactly what token-by-token decoding gives, so a teacher-forced prefill of T
  tokens equals T incremental steps (tested). This path can also record,
  per layer, the attention KL and top-5 recall of the quantized against the exact logits of the same
  queries (``record_attention=True``; needs the exact keys, i.e. a forward that starts from an empty cache).
* any other implementation (``sdpa``, ``eager``, ...): ``update`` returns dense tensors, decoded K̂, V̂ for the
  quantized tokens followed by the exact window, and the model's own attention computes q·k̂ᵀ
  ("decode-then-dot"). The window is then counted from the end of the cache, so for a prefill chunk of
  N > 1 tokens with W > 0 early queries see some keys quantized that the estimator path keeps exact; for
  one-token decode steps and for W = 0 both paths treat every pair alike.

Why both. A standard ``Cache`` can only hand K/V tensors to the attention function, which then forms
q·kᵀ itself; an estimator that is not an inner product with a reconstructed vector (a sketch estimator
with a non-linear correction, a learned scorer) can only be honoured by an attention function that asks
the cache for *scores*. Every built-in kvstats K estimator is linear in the code — ⟨q, k̂⟩ with k̂ =
``decode(code)`` equals ``inner(q, code)`` exactly (turbo_prod: x̂ = Πᵀ(ŷ + (c/d)·γ·Sᵀ sign(S r))) — so
decode-then-dot gives the same logits up to float rounding (tested), which is why the dense fallback
is offered and correct for them; the estimator path stays the reference. Once the estimator path has
run on a layer, later ``update`` calls stop decoding the dense tensors (they are not used).

Memory. :meth:`KVStatsCache.memory` reports what the cache holds between forwards: Σ ``Code.nbytes``
of the quantized tokens + the bytes of the fp window, against an fp16 cache of the same tokens
(2 bytes × 2 tensors × B × H_kv × S × d per layer). Transient buffers of a forward are not counted: the
exact states of the tokens just added (and of the window), which the estimator path reads and releases in
its attention call, and the dense path stops keeping from its second forward on.

Grouped-query attention: query head h reads KV head h // (H_q / H_kv), as transformers' ``repeat_kv``.
Any model whose attention calls ``cache.update`` and then an ``AttentionInterface`` function works (Llama,
SmolLM, Mistral, Qwen2/3, Gemma, Gemma2/3, Phi3, gpt-oss, ...): the estimator path applies the model's soft
capping, sliding window and attention sinks as its eager attention does (:class:`LogitRules`) and refuses any
other attention keyword by name (:func:`logit_rules`); docs/cache.md, "Architectures".
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvstats.measure.metrics import attention_kl_from_scores, topk_recall_from_scores
from kvstats.quant import attention as _attention
from kvstats.quant.quantizers.base import acc_dtype, held_bytes
from kvstats.quant.quantizers.identity import IdentityQuantizer
from kvstats.quant.schemes import CacheCode, Scheme

try:
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("kvstats.cache needs transformers (the [models] extra): pip install 'kvstats[models]'") from exc

__all__ = [
    "ATTN_IMPLEMENTATION",
    "AttentionRecord",
    "CacheMemory",
    "IdentityQuantizer",
    "IdentityScheme",
    "KVStatsCache",
    "KVStatsLayer",
    "LogitRules",
    "cache_kwargs",
    "kvstats_attention",
    "kvstats_cache",
    "logit_rules",
    "model_dims",
    "register_attention",
    "use_estimator_attention",
]

#: Name under which :func:`kvstats_attention` is registered in transformers' AttentionInterface.
ATTN_IMPLEMENTATION = "kvstats"
#: k of the top-k recall recorded by ``record_attention`` (docs/references.md §5).
RECORD_TOP_K = 5


# ----------------------------------------------------------------------------------------- lossless scheme


def IdentityScheme(dim: int, *, dtype: torch.dtype | None = None) -> Scheme:  # noqa: N802 - a factory read as a type
    """A lossless :class:`~kvstats.schemes.Scheme` ("identity"): K and V stored as given (or cast to ``dtype``)."""
    return Scheme("identity", torch.finfo(dtype or torch.float32).bits,
                  IdentityQuantizer(dim, dtype=dtype), IdentityQuantizer(dim, dtype=dtype))


# ------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CacheMemory:
    """Bytes a :class:`KVStatsCache` holds between forwards, against an fp16 cache of the same tokens.

    code_bytes: Σ ``Code.nbytes`` over the quantized tokens of all layers (K and V);
    window_bytes: the full-precision window (K and V) at its stored dtype;
    fp16_bytes: 2 bytes × 2 tensors × B × H_kv × tokens × d summed over layers;
    elements: number of cached K and V elements (2 × B × H_kv × tokens × d summed over layers).
    """

    code_bytes: int
    window_bytes: int
    fp16_bytes: int
    elements: int
    tokens: int
    layers: int

    @property
    def total_bytes(self) -> int:
        return self.code_bytes + self.window_bytes

    @property
    def ratio(self) -> float:
        """total_bytes / fp16_bytes (0.25 means a 4× smaller cache)."""
        return self.total_bytes / self.fp16_bytes if self.fp16_bytes else math.nan

    @property
    def compression(self) -> float:
        """fp16_bytes / total_bytes: how many times smaller than an fp16 cache of the same tokens (4.0 = 4×)."""
        return self.fp16_bytes / self.total_bytes if self.total_bytes else math.nan

    @property
    def bits_per_element(self) -> float:
        """8 · total_bytes / elements: everything counted (payload, norms, side data, window)."""
        return 8 * self.total_bytes / self.elements if self.elements else math.nan

    def to_dict(self) -> dict:
        return {"code_bytes": self.code_bytes, "window_bytes": self.window_bytes, "total_bytes": self.total_bytes,
                "fp16_bytes": self.fp16_bytes, "ratio": self.ratio, "compression": self.compression,
                "bits_per_element": self.bits_per_element,
                "elements": self.elements, "tokens": self.tokens, "layers": self.layers}


@dataclass(frozen=True)
class AttentionRecord:
    """Attention-level damage of one layer in one forward (``record_attention=True``).

    kl: ``[B, H_q, N]`` KL(p_exact ‖ p_used) per query (nats), p = softmax of the logits with the causal mask;
    recall: ``[B, H_q, N]`` top-k recall of the used logits against the exact ones (k = ``top_k``);
    both float64 on the CPU. ``query_offset``: cache position of the first query.
    """

    layer: int
    query_offset: int
    kl: torch.Tensor
    recall: torch.Tensor
    top_k: int


#: Queries per block of :meth:`KVStatsLayer.attend`: bounds its temporaries to O(QUERY_BLOCK × S) per head.
QUERY_BLOCK = 64


def _reveals(mask: torch.Tensor) -> bool:
    """Whether an attention mask (bool: True = attend; float: added to the logits) lets any query see a key."""
    if mask.dtype == torch.bool:
        return bool(mask.any())
    return bool((mask > torch.finfo(mask.dtype).min / 2).any())


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


@dataclass(frozen=True)
class LogitRules:
    """What a model's attention does to the scaled logits ``scaling · q·kᵀ`` besides its mask, as transformers
    passes it to an attention function: ``softcap`` (Gemma 2: ``softcap · tanh(l / softcap)``, before the mask),
    ``sliding_window`` (Mistral, Gemma 2/3, ...: a query sees its last W positions; transformers' masks
    already hold it, and it is applied here where no mask is given) and ``sinks`` (gpt-oss's ``s_aux``: one
    logit per query head that joins the softmax and is dropped)."""

    softcap: float | None = None
    sliding_window: int | None = None
    sinks: torch.Tensor | None = None


#: Keyword arguments transformers passes to attention functions that do not change what attention computes.
_NEUTRAL_KWARGS = frozenset({"position_ids", "use_cache", "cache_position", "output_attentions", "position_embeddings",
                             "layer_idx", "return_dict", "output_hidden_states"})


def logit_rules(module, kwargs: dict) -> LogitRules:
    """The :class:`LogitRules` of one attention call from the keyword arguments transformers gives the attention
    function; a keyword that would change the attention and that kvstats does not implement (``position_bias``,
    packed-sequence ``cu_seq_lens_*``, ``is_causal=False`` without a mask, ...) is refused with a ValueError
    naming it and the module: never a silently different attention."""
    rules = LogitRules(softcap=kwargs.get("softcap"), sliding_window=kwargs.get("sliding_window"),
                       sinks=kwargs.get("s_aux"))
    for key, value in kwargs.items():
        if key in ("softcap", "sliding_window", "s_aux") or key in _NEUTRAL_KWARGS or value is None:
            continue
        if key.startswith("output_"):  # what a forward records (router logits, hidden states), not what it computes
            continue
        if key == "is_causal" and value:
            continue
        what = type(value).__name__ if isinstance(value, torch.Tensor) else repr(value)
        raise ValueError(f"the kvstats attention path does not implement {key}={what} (passed by "
                         f"{type(module).__name__}): it refuses rather than compute another attention than the "
                         "model's; use the model's own attention implementation (the dense path) instead")
    if rules.softcap is not None and not (isinstance(rules.softcap, (int, float)) and rules.softcap > 0):
        raise ValueError(f"softcap must be a positive number, got {rules.softcap!r} ({type(module).__name__})")
    return rules


def _mask_block(logits: torch.Tensor, mask: torch.Tensor | None, first: int, n: int, width: int,
                window: int | None) -> None:
    """Mask, in place, the logits [B, H_q, N, width] of the queries at positions [first, first + N): with the
    model's mask (its rows, cut to ``width`` columns; bool True = attend, or additive), or without one causally
    (and within the sliding ``window``). Masked logits get the dtype's most negative finite value, so padded
    rows stay defined."""
    fill = torch.finfo(logits.dtype).min
    if mask is None and window is not None:
        logits.masked_fill_(~_attention.window_visible(n, width, window, query_offset=first, device=logits.device),
                            fill)
    elif mask is None:  # causal: only the block's own last N columns hide anything
        logits[..., first:width].masked_fill_(~_attention.causal_visible(n, n, query_offset=0, device=logits.device),
                                              fill)
    elif mask.dtype == torch.bool:  # no padding before the block: mask only its own last columns
        tail = first if first and bool(mask[..., :first].all()) else 0
        logits[..., tail:].masked_fill_(~mask[..., tail:width], fill)
    else:
        logits += mask[..., :width].to(logits.dtype)


# --------------------------------------------------------------------------------------------- layer


class KVStatsLayer(CacheLayerMixin):
    """One layer of a :class:`KVStatsCache`: codes of the quantized tokens + the exact window.

    State: ``chunks`` (a list of :class:`~kvstats.schemes.CacheCode` covering cache positions
    ``[0, n_quantized)``; per-vector codes are merged into one chunk, codes with groups across tokens stay
    separate), ``keys``/``values`` (the exact window, positions ``[n_quantized, seq)``, ``[B, H_kv, w, d]``).
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
        self.cumulative_length = 0
        self.estimator_attention = False
        self.dense_attention = False  # set when an update's exact states went unread: standard attention in use
        self._span: tuple[int, torch.Tensor, torch.Tensor] | None = None

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
        if key_states.shape[-1] != self.scheme.dim or value_states.shape[-1] != self.scheme.dim:
            raise ValueError(f"key/value head dim must equal the scheme's dim {self.scheme.dim}, got "
                             f"{key_states.shape[-1]} and {value_states.shape[-1]}")
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
            self._append(self.scheme.encode(span_k[..., a:b, :], span_v[..., a:b, :]))
            self._remember(self.n_quantized, span_k[..., a:b, :], span_v[..., a:b, :], self.rollback)
            self.n_quantized = target
        cut = self.n_quantized - span_start
        self.keys = span_k[..., cut:, :].clone()  # own storage: the window alone is what stays held
        self.values = span_v[..., cut:, :].clone()
        self._span = None if self.dense_attention else (span_start, span_k, span_v)
        if self.estimator_attention:
            keys, values = span_k, span_v
        else:
            k_hat, v_hat = self.decoded()
            keys, values = torch.cat([k_hat, self.keys], dim=-2), torch.cat([v_hat, self.values], dim=-2)
        keys._kvstats_layer = self  # how kvstats_attention finds the codes behind the tensors it is given
        return keys, values

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
        self.chunks, self.n_quantized, self.cumulative_length, self._span = [], 0, 0, None
        self._undo = None
        self.estimator_attention = self.dense_attention = False
        self.keys = self.values = None
        self.is_initialized = False

    # ----------------------------------------------------------------------------------------- crop
    def _remember(self, start: int, k: torch.Tensor, v: torch.Tensor, keep: int) -> None:
        """Keep the exact states of the last ``keep`` quantized tokens (k, v: those just quantized, from
        position ``start``) for :meth:`crop`, in tensors of their own (never views of a forward's states)."""
        n_new = k.shape[-2]
        if keep <= 0:
            self._undo = None
            return
        if n_new >= keep:  # a copy: a view would keep this forward's whole exact states alive
            start, k, v = start + n_new - keep, k[..., n_new - keep:, :].clone(), v[..., n_new - keep:, :].clone()
        elif self._undo is not None and self._undo[0] + self._undo[1].shape[-2] == start:  # cat copies
            old_k, old_v = self._undo[1], self._undo[2]
            take = min(keep - n_new, old_k.shape[-2])
            k = torch.cat([old_k[..., old_k.shape[-2] - take:, :], k], dim=-2)
            v = torch.cat([old_v[..., old_v.shape[-2] - take:, :], v], dim=-2)
            start -= take
        else:
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
        if new_nq < self.n_quantized:
            undo_start = self._undo[0] if self._undo is not None else self.n_quantized
            if new_nq < undo_start:
                raise ValueError(
                    f"crop to {keep} of {seq} tokens must put back tokens {new_nq}..{self.n_quantized - 1} exact, but "
                    f"only the exact states of tokens from {undo_start} on are kept; build the cache with a larger "
                    f"rollback_tokens (now {self.rollback})")
            self._truncate_codes(new_nq)
            lo, hi = new_nq - undo_start, min(keep, self.n_quantized) - undo_start
            back_k, back_v = self._undo[1][..., lo:hi, :], self._undo[2][..., lo:hi, :]
            self._undo = None if lo == 0 else (undo_start, self._undo[1][..., :lo, :], self._undo[2][..., :lo, :])
        else:
            back_k, back_v = self.keys[..., :0, :], self.values[..., :0, :]
        in_window = max(0, keep - self.n_quantized)
        self.keys = torch.cat([back_k, self.keys[..., :in_window, :]], dim=-2).clone()
        self.values = torch.cat([back_v, self.values[..., :in_window, :]], dim=-2).clone()
        self.n_quantized, self.cumulative_length, self._span = new_nq, keep, None

    def _truncate_codes(self, stop: int) -> None:
        """Keep the codes of tokens [0, stop): whole chunks, then the first tokens of a per-vector chunk; a chunk
        with groups across tokens is encoded again from the exact states of its kept tokens."""
        kept, start = [], 0
        for chunk in self.chunks:
            n = chunk.k.shape[chunk.k.token_axis]
            if start + n <= stop:
                kept.append(chunk)
            elif start < stop:
                if chunk.k.is_per_vector() and chunk.v.is_per_vector():
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
        self.chunks = kept

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if not self.is_initialized:
            return
        self.chunks = [CacheCode(c.k.map_batch(fn), c.v.map_batch(fn)) for c in self.chunks]
        self.keys, self.values, self._span = fn(self.keys), fn(self.values), None
        if self._undo is not None:
            self._undo = (self._undo[0], fn(self._undo[1]), fn(self._undo[2]))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch_op(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch_op(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch_op(lambda t: t[indices.to(t.device) if isinstance(indices, torch.Tensor) else indices, ...])

    # ------------------------------------------------------------------------------------- storage
    def _append(self, code: CacheCode) -> None:
        last = self.chunks[-1] if self.chunks else None
        if last is not None and all(c.is_per_vector() for c in (last.k, last.v, code.k, code.v)):
            self.chunks[-1] = CacheCode(last.k.cat(code.k), last.v.cat(code.v))
        else:
            self.chunks.append(code)

    def decoded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K̂, V̂) of the quantized tokens, ``[B, H_kv, n_quantized, d]``, in the model's dtype."""
        if not self.chunks:
            return self.keys[..., :0, :], self.values[..., :0, :]
        parts = [self.scheme.decode(c) for c in self.chunks]
        return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-2)

    def nbytes(self) -> tuple[int, int]:
        """(bytes of the codes, bytes of the exact window), K and V together."""
        codes = sum(held_bytes(c.k) + held_bytes(c.v) for c in self.chunks)
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
        self.estimator_attention = True
        span = self._span
        self._span = None
        n, seq = query.shape[2], self.cumulative_length
        if query.shape[1] % span[1].shape[1]:
            raise ValueError(f"query heads {query.shape[1]} must be a multiple of the KV heads {span[1].shape[1]}")
        if n > seq - span[0]:
            raise ValueError(f"{n} queries but only {seq - span[0]} tokens were added or kept exact by update()")
        acc = acc_dtype(query.dtype)
        v_hat = torch.cat([self.scheme.v.decode(c.v) for c in self.chunks], dim=-2).to(acc) if self.chunks else None
        keep_weights = _weights_requested() or n <= QUERY_BLOCK
        first_record = len(self.records)
        outs, weights = [], []
        for r0 in range(0, n, QUERY_BLOCK):
            r1 = min(n, r0 + QUERY_BLOCK)
            mask = attention_mask
            if mask is not None and mask.shape[-2] == n:
                mask = mask[..., r0:r1, :]
            out, w = self._attend_rows(query[:, :, r0:r1], mask, scaling, dropout, training, span, seq - n + r0,
                                       v_hat, rules)
            outs.append(out)
            if keep_weights:
                weights.append(F.pad(w, (0, seq - w.shape[-1])))
        if len(self.records) - first_record > 1:  # one record per layer and forward, as for one block
            parts = self.records[first_record:]
            del self.records[first_record:]
            self.records.append(AttentionRecord(parts[0].layer, parts[0].query_offset,
                                                torch.cat([r.kl for r in parts], dim=-1),
                                                torch.cat([r.recall for r in parts], dim=-1), parts[0].top_k))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return out, (None if not keep_weights else weights[0] if len(weights) == 1 else torch.cat(weights, dim=2))

    def _attend_rows(self, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float, dropout: float,
                     training: bool, span: tuple[int, torch.Tensor, torch.Tensor], first: int,
                     v_hat: torch.Tensor | None, rules: LogitRules) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`attend` for the queries at cache positions [first, first + N) (``attention_mask``: their rows).

        Only the first ``width`` = first + N key columns are formed when the mask hides every later key (the
        causal case): a prefill block then costs O(N × (first + N)) rather than O(N × S). The weights returned
        have ``width`` columns (:meth:`attend` pads them to S when they are asked for).
        """
        span_start, span_k, span_v = span
        n = query.shape[2]
        seq, nq = self.cumulative_length, self.n_quantized
        acc = acc_dtype(query.dtype)
        q = query.to(acc)
        mask = None if attention_mask is None else attention_mask[..., -seq:]
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
            logits[..., lo:] = torch.where(use_exact[:, lo:], exact, logits[..., lo:])
        else:
            logits = F.pad(exact, (lo, 0))
        logits = _attention.soft_cap(logits, rules.softcap)  # elementwise: the same before or after the merge
        _mask_block(logits, mask, first, n, width, rules.sliding_window)
        weights = _attention.softmax_with_sinks(logits, rules.sinks)
        if self.record:  # the reference: exact logits of every column (lo = span_start = 0), capped and masked alike
            exact = _attention.soft_cap(exact, rules.softcap)
            _mask_block(exact, mask, first, n, width, rules.sliding_window)
            self._record(exact, logits, span_start, seq, n, first)
        used = F.dropout(weights, p=dropout, training=training)
        # the two weighted sums of values cover only the columns some query reads exactly, resp. through the
        # codes (the other weights of each product are zero); before `read` every query reads the codes
        out = _attention.apply_weights(used[..., read:] * use_exact[:, read:],
                                       span_v[..., read - span_start:width - span_start, :].to(acc))
        cut = min(read, hi)
        if cut:
            out += _attention.apply_weights(used[..., :cut], v_hat[..., :cut, :])
        if hi > cut:
            out += _attention.apply_weights(used[..., cut:hi] * ~use_exact[:, cut:hi], v_hat[..., cut:hi, :])
        return out.to(query.dtype).transpose(1, 2).contiguous(), weights.to(query.dtype)

    def _code_scores(self, q: torch.Tensor, stop: int) -> torch.Tensor:
        """``scheme.scores`` of q against the codes of keys [0, ≥ stop): whole chunks, the last per-vector chunk
        cut at ``stop`` (a view); at least one key so the result is never empty."""
        parts, start = [], 0
        for chunk in self.chunks:
            if start >= max(stop, 1):
                break
            n = chunk.k.shape[chunk.k.token_axis]
            code = chunk
            if start + n > stop > start and chunk.k.is_per_vector() and chunk.v.is_per_vector():
                code = CacheCode(chunk.k.narrow(stop - start, copy=False), chunk.v.narrow(stop - start, copy=False))
            parts.append(self.scheme.scores(q, code))
            start += n
        return torch.cat(parts, dim=-1)

    def _record(self, exact: torch.Tensor, logits: torch.Tensor, span_start: int, seq: int, n: int,
                offset: int) -> None:
        if span_start != 0:  # the exact keys of older tokens are gone: no reference to compare with
            return
        kl = attention_kl_from_scores(exact, logits, causal=True, query_offset=offset, reduction="none")
        recall = topk_recall_from_scores(exact, logits, top_k=min(RECORD_TOP_K, seq), causal=True,
                                         query_offset=offset, reduction="none")
        self.records.append(AttentionRecord(self.layer_idx, offset, kl.to(torch.float64).cpu(),
                                            recall.to(torch.float64).cpu(), min(RECORD_TOP_K, seq)))


# --------------------------------------------------------------------------------------------- cache


class KVStatsCache(Cache):
    """A transformers ``Cache`` that stores every layer's K and V through a kvstats scheme.

    Args:
        scheme: a :class:`~kvstats.schemes.Scheme` (``kvstats.schemes.scheme("kqv", bits=4, dim=64)``, your
            own ``Scheme(name, bits, k=..., v=...)``, or :func:`IdentityScheme`), shared by all layers; or a
            callable ``layer_idx -> Scheme`` (per-layer seeds or calibrations).
        full_precision_window: W ≥ 0, the most recent tokens kept exact (KIVI/QJL style); tokens are encoded
            as they leave the window.
        flush_size: G ≥ 1, tokens leave the window in blocks of G (KIVI's residual groups: a quantizer with
            groups across tokens, e.g. min-max per channel, then sees G tokens at a time). The cache holds
            the first G·⌊max(0, S − W)/G⌋ of S tokens as codes, the rest (W to W + G − 1 tokens) exactly.
        record_attention: with the estimator path, keep per layer the attention KL and top-5 recall of the
            logits used against the exact ones (:attr:`attention_records`, :class:`AttentionRecord`).
        rollback_tokens: R ≥ 0, how many of the most recently quantized tokens keep their exact states (besides
            the codes) so that :meth:`crop` can put them back in the window: a crop of at most R tokens is exact
            (assisted decoding crops the rejected drafts of the last forward, ~5–20 tokens), a deeper one raises.
            Costs R exact tokens per layer (transient: not counted by :meth:`memory`); 0 allows crops inside
            the window only.

    Construction from a model's config (no head dimension by hand): :meth:`from_config` or :func:`kvstats_cache`.

    Use with any Llama-style model: ``model.generate(ids, cache=KVStatsCache(scheme=s))`` or ``model(ids,
    cache=cache, use_cache=True)`` (``past_key_values=`` before transformers 5.24; :func:`cache_kwargs` picks
    the keyword). See the module docstring for the two attention
    paths; :func:`use_estimator_attention` selects the estimator path.
    """

    def __init__(self, scheme: Scheme | Callable[[int], Scheme], full_precision_window: int = 0, *,
                 flush_size: int = 1, record_attention: bool = False, rollback_tokens: int = 128):
        for name, value, low in (("full_precision_window", full_precision_window, 0), ("flush_size", flush_size, 1),
                                 ("rollback_tokens", rollback_tokens, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.flush_size, self.rollback_tokens = flush_size, rollback_tokens
        if not isinstance(scheme, Scheme) and not callable(scheme):
            raise TypeError(f"scheme must be a kvstats Scheme or a callable layer_idx -> Scheme, got "
                            f"{type(scheme).__name__}")
        self.scheme, self.window, self.record_attention = scheme, full_precision_window, record_attention
        self.attention_records: list[AttentionRecord] = []
        self.model_dims: dict | None = None  # set by from_config: checked against what the model feeds
        super().__init__(layers=[])

    def _scheme_for(self, layer_idx: int) -> Scheme:
        s = self.scheme if isinstance(self.scheme, Scheme) else self.scheme(layer_idx)
        if not isinstance(s, Scheme):
            raise TypeError(f"scheme({layer_idx}) must return a kvstats Scheme, got {type(s).__name__}")
        return s

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self.model_dims is not None and len(self.layers) <= layer_idx:
            dims = self.model_dims
            if dims["layers"] is not None and layer_idx >= dims["layers"]:
                raise ValueError(f"layer_idx {layer_idx} is beyond the config's num_hidden_layers {dims['layers']}")
            if key_states.dim() != 4 or key_states.shape[1] != dims["kv_heads"]:
                raise ValueError(f"key_states {tuple(key_states.shape)} do not have the config's "
                                 f"num_key_value_heads={dims['kv_heads']} heads (dim 1)")
        while len(self.layers) <= layer_idx:
            i = len(self.layers)
            self.layers.append(KVStatsLayer(self._scheme_for(i), self.window, self.flush_size, layer_idx=i,
                                            record=self.record_attention, records=self.attention_records,
                                            rollback=self.rollback_tokens))
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def crop(self, max_length: int) -> None:
        """Drop the last tokens of every layer, as if they had never been added (see :meth:`KVStatsLayer.crop`):
        ``max_length`` < 0 removes that many (what transformers ≥ 4.56 passes; 0 removes none), > 0 keeps the
        first ``max_length`` tokens (transformers' older convention)."""
        if isinstance(max_length, bool) or not isinstance(max_length, int):
            raise TypeError(f"max_length must be an int, got {type(max_length).__name__} ({max_length!r})")
        for layer in self.layers:
            layer.crop(max_length)

    @classmethod
    def from_config(cls, config, scheme: str | Scheme | Callable[[int], Scheme] = "kqv", bits: int = 4, *,
                    seed: int = 0, per_layer_seeds: bool = False, full_precision_window: int = 0,
                    **kwargs) -> KVStatsCache:
        """A cache for the model of ``config`` (a transformers ``PretrainedConfig``), built without a head
        dimension by hand.

        The head dimension d is ``config.head_dim`` when set, else ``hidden_size // num_attention_heads``
        (read from the text config of a multimodal model); ``num_key_value_heads`` and
        ``num_hidden_layers`` are checked against what the model then feeds the cache.

        Args:
            config: the model's config (``model.config``).
            scheme: a scheme name (``"kv"``, ``"kqv"``, ``"qkqv"``, or any registered name; built by
                :func:`kvstats.schemes.scheme` at dimension d), or a ready Scheme / ``layer_idx -> Scheme``.
            bits: the budget n, when ``scheme`` is a name.
            seed: the scheme's seed; ``per_layer_seeds=True`` gives layer i the seed ``seed + i``.
            full_precision_window, **kwargs: as :class:`KVStatsCache` (``flush_size``, ``record_attention``,
                ``rollback_tokens``).
        """
        from kvstats.quant.schemes import scheme as build_scheme

        dims = model_dims(config)
        if isinstance(scheme, str):
            name = scheme
            if per_layer_seeds:
                def by_layer(i: int, _cache: dict = {}) -> Scheme:  # noqa: B006 - one scheme per layer, built once
                    if i not in _cache:
                        _cache[i] = build_scheme(name, bits=bits, dim=dims["head_dim"], seed=seed + i)
                    return _cache[i]

                by_layer.__name__ = f"{name}(bits={bits}, dim={dims['head_dim']}, seed={seed}+layer)"
                scheme = by_layer
            else:
                scheme = build_scheme(name, bits=bits, dim=dims["head_dim"], seed=seed)
        elif isinstance(scheme, Scheme) and scheme.dim != dims["head_dim"]:
            raise ValueError(f"scheme dim {scheme.dim} does not match the model's head dimension {dims['head_dim']}")
        cache = cls(scheme, full_precision_window, **kwargs)
        cache.model_dims = dims
        return cache

    def memory(self) -> CacheMemory:
        """Bytes held now: codes (Σ Code.nbytes) + fp window, vs an fp16 cache of the same tokens."""
        codes = window = fp16 = elements = 0
        for layer in self.layers:
            c, w = layer.nbytes()
            codes, window = codes + c, window + w
            if layer.is_initialized:
                b, h, _, d = layer.keys.shape
                count = 2 * b * h * layer.cumulative_length * d
                elements, fp16 = elements + count, fp16 + 2 * count
        return CacheMemory(codes, window, fp16, elements, self.get_seq_length(), len(self.layers))

    def nbytes(self) -> int:
        """Total bytes held (codes + window)."""
        return self.memory().total_bytes

    def __repr__(self) -> str:
        name = repr(self.scheme) if isinstance(self.scheme, Scheme) else getattr(self.scheme, "__name__", "per-layer")
        return (f"KVStatsCache(scheme={name}, full_precision_window={self.window}, flush_size={self.flush_size}, "
                f"tokens={self.get_seq_length()})")


def cache_kwargs(model, cache) -> dict:
    """The keyword that hands a cache to ``model.generate(...)`` or ``model(...)``: ``{"cache": cache}`` on
    transformers whose models renamed the argument (5.24 and later: ``past_key_values=`` is deprecated there,
    due to go in 5.40 for ``forward``), ``{"past_key_values": cache}`` before.

        out = model.generate(ids, **cache_kwargs(model, cache), max_new_tokens=40)
    """
    forward = getattr(model, "forward", None)
    if forward is None:
        raise TypeError(f"model must be a transformers model (with a forward), got {type(model).__name__}")
    key = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    return {key: cache}


def model_dims(config) -> dict:
    """Head dimension, KV heads, query heads and layers of a transformers config (its text config if nested).

    ``head_dim`` is ``config.head_dim`` when set, else ``hidden_size // num_attention_heads``; KV heads default
    to the query heads (no grouped-query attention).
    """
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        hidden = getattr(config, "hidden_size", None)
        if not heads or not hidden:
            raise ValueError(f"config {type(config).__name__} has neither head_dim nor hidden_size and "
                             "num_attention_heads: cannot tell the head dimension")
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}; set head_dim")
        head_dim = hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    layers = getattr(config, "num_hidden_layers", None)
    return {"head_dim": int(head_dim), "kv_heads": kv_heads, "q_heads": heads, "layers": layers}


def kvstats_cache(model_or_config, scheme: str | Scheme | Callable[[int], Scheme] = "kqv", nbits: int = 4, *,
                  residual_length: int = 0, **cache_config) -> KVStatsCache:
    """A :class:`KVStatsCache` for a model, in the style of transformers' ``QuantizedCache(backend, config,
    nbits=..., residual_length=...)``: ``scheme`` plays the backend, ``nbits`` the budget n and
    ``residual_length`` the full-precision window W.

        cache = kvstats_cache(model, "kqv", nbits=4, residual_length=32)
        model.generate(ids, **cache_kwargs(model, cache), max_new_tokens=40)

    (transformers' ``generate(cache_implementation="quantized", cache_config=...)`` knows only its own
    backends, so pass the cache itself.) ``cache_config`` goes to :meth:`KVStatsCache.from_config` (``seed``,
    ``per_layer_seeds``, ``flush_size``, ``record_attention``, ``rollback_tokens``).
    """
    config = getattr(model_or_config, "config", model_or_config)
    return KVStatsCache.from_config(config, scheme, nbits, full_precision_window=residual_length, **cache_config)


# ------------------------------------------------------------------------------- attention function


def kvstats_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers attention function (registered as ``"kvstats"``): logits from the cache's codes.

    With a :class:`KVStatsCache`, the key tensor it receives carries its cache layer, which computes the
    attention (:meth:`KVStatsLayer.attend`). With any other cache (or none) it computes exact eager
    attention, so a model set to ``"kvstats"`` behaves as the unquantized model there. Either way the model's
    soft capping, sliding window and attention sinks are applied as its own eager attention applies them
    (:class:`LogitRules`), and any other keyword that would change the attention is refused (:func:`logit_rules`).
    """
    scaling = module.scaling if scaling is None else scaling
    rules = logit_rules(module, kwargs)
    training = bool(getattr(module, "training", False))
    layer = getattr(key, "_kvstats_layer", None)
    if layer is not None:
        return layer.attend(query, attention_mask, scaling, dropout, training, rules)
    acc = acc_dtype(query.dtype)
    logits = _attention.soft_cap(_attention.scores(query.to(acc), key.to(acc), scale=scaling), rules.softcap)
    n, seq = logits.shape[-2:]
    if attention_mask is None:
        visible = (_attention.causal_visible(n, seq, device=query.device) if rules.sliding_window is None else
                   _attention.window_visible(n, seq, rules.sliding_window, device=query.device))
        attention_mask = visible
    if attention_mask.dtype == torch.bool:
        logits = _attention.mask_logits(logits, attention_mask[..., -seq:], torch.finfo(acc).min)
    else:
        logits = logits + attention_mask[..., -seq:].to(acc)
    weights = _attention.softmax_with_sinks(logits, rules.sinks)
    out = _attention.apply_weights(F.dropout(weights, p=dropout, training=training), value.to(acc))
    return out.to(query.dtype).transpose(1, 2).contiguous(), weights.to(query.dtype)


def _kvstats_mask(*args, **kwargs):
    """Boolean causal/padding mask (True = attend), never skipped: sdpa's mask without the is_causal shortcut."""
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_attention() -> str:
    """Register :func:`kvstats_attention` (and its mask) with transformers as ``"kvstats"``; idempotent."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvstats_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _kvstats_mask)
    return ATTN_IMPLEMENTATION


def use_estimator_attention(model):
    """Switch ``model`` to the estimator path (``attn_implementation="kvstats"``); returns the model."""
    register_attention()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


register_attention()
