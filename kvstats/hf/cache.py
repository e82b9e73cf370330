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
``flush_size`` = G > 1 tokens leave in blocks of G (KIVI's residual groups). With ``sink_tokens`` = S > 0 the
first S tokens are kept exact too and never encoded (attention sinks), on both paths; :func:`kivi_cache` is KIVI
as published (the ``kivi`` scheme, R = 128 recent tokens exact, flushed in blocks of G = 32).

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
other attention keyword by name (:func:`logit_rules`); KV-sharing layers (Gemma 3n) read the shared layer's codes.
A model whose attention does not go through the AttentionInterface (Bloom, MPT, ...) is refused by
:func:`use_estimator_attention`, and :meth:`KVStatsCache.require_estimator_path` verifies after a forward that
every layer ran on the estimator path; multi-head latent attention (DeepSeek-V2/V3) is refused by name;
docs/cache.md, "Architectures".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from kvstats.hf._transformers import Cache
from kvstats.hf.attention_function import (
    ATTN_IMPLEMENTATION,
    kvstats_attention,
    register_attention,
    use_estimator_attention,
)
from kvstats.hf.cache_layer import KVStatsLayer
from kvstats.hf.logit_rules import LogitRules, logit_rules
from kvstats.hf.models import refuse_latent_attention
from kvstats.hf.records import AttentionRecord, CacheMemory
from kvstats.quant.quantizers.identity import IdentityQuantizer
from kvstats.quant.schemes import KIVI_GROUP_SIZE, KIVI_RESIDUAL_LENGTH, IdentityScheme, Scheme

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
    "kivi_cache",
    "kvstats_attention",
    "kvstats_cache",
    "logit_rules",
    "model_dims",
    "register_attention",
    "use_estimator_attention",
]


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
        sink_tokens: S ≥ 0, the first S tokens of every layer kept exact and never encoded (attention sinks, as
            StreamingLLM's and OSCAR's full-precision sinks), besides the window: the codes hold the tokens
            between them, S + G·⌊max(0, seq − S − W)/G⌋ tokens are held outside the window. Both attention paths
            read the sinks exactly; :meth:`memory` counts them with the window (``window_bytes``). 0: none.

    Construction from a model's config (no head dimension by hand): :meth:`from_config` or :func:`kvstats_cache`.

    Use with any Llama-style model: ``model.generate(ids, cache=KVStatsCache(scheme=s))`` or ``model(ids,
    cache=cache, use_cache=True)`` (``past_key_values=`` before transformers 5.24; :func:`cache_kwargs` picks
    the keyword). See the module docstring for the two attention
    paths; :func:`use_estimator_attention` selects the estimator path.
    """

    def __init__(self, scheme: Scheme | Callable[[int], Scheme], full_precision_window: int = 0, *,
                 flush_size: int = 1, record_attention: bool = False, rollback_tokens: int = 128,
                 sink_tokens: int = 0):
        for name, value, low in (("full_precision_window", full_precision_window, 0), ("flush_size", flush_size, 1),
                                 ("rollback_tokens", rollback_tokens, 0), ("sink_tokens", sink_tokens, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.flush_size, self.rollback_tokens, self.sink_tokens = flush_size, rollback_tokens, sink_tokens
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

    def _check_dims(self, layer_idx: int, key_states: torch.Tensor, name: str) -> None:
        """A new layer's index and its keys' KV heads against the config (when built by :meth:`from_config`)."""
        dims = self.model_dims
        if dims is None:
            return
        if dims["layers"] is not None and layer_idx >= dims["layers"]:
            raise ValueError(f"layer_idx {layer_idx} is beyond the config's num_hidden_layers {dims['layers']}")
        if key_states.dim() != 4 or key_states.shape[1] != dims["kv_heads"]:
            raise ValueError(f"{name} {tuple(key_states.shape)} do not have the config's "
                             f"num_key_value_heads={dims['kv_heads']} heads (dim 1)")

    def _add_layer(self) -> KVStatsLayer:
        """Append the next layer (its scheme from :meth:`_scheme_for`) and return it."""
        i = len(self.layers)
        self.layers.append(KVStatsLayer(self._scheme_for(i), self.window, self.flush_size, layer_idx=i,
                                        record=self.record_attention, records=self.attention_records,
                                        rollback=self.rollback_tokens, sinks=self.sink_tokens))
        return self.layers[i]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
            raise ValueError(f"layer_idx must be an int >= 0 (the model's layer), got {layer_idx!r}")
        if len(self.layers) <= layer_idx:
            self._check_dims(layer_idx, key_states, "key_states")
        while len(self.layers) <= layer_idx:
            self._add_layer()
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def prefill(self, past) -> KVStatsCache:
        """Hold the K/V of a context whose forward ran in full precision elsewhere: ``past`` is a transformers
        cache of that forward (a ``DynamicCache``: ``model(ids, use_cache=True).past_key_values``) or a sequence of
        ``(keys, values)`` per layer, ``[B, H_kv, S, d]`` each. Every layer stores them as its forward would have
        (codes outside the full-precision window), so the next forward — a question, a decode step — reads the
        context through the codes: the protocol of servers that prefill in full precision and keep the cache
        quantized (transformers' ``QuantizedCache`` attends its first forward exactly, too). Only on an empty
        cache; returns the cache. With ``record_attention`` the exact states are kept as the records' reference.

            past = model(context_ids, use_cache=True).past_key_values      # exact prefill
            cache = kvstats_cache(model, "kqv", nbits=4).prefill(past)
            logits = model(question_ids, **cache_kwargs(model, cache)).logits
        """
        if self.layers:
            raise ValueError(f"prefill needs a new cache; this one has {len(self.layers)} layers and holds "
                             f"{self.get_seq_length()} tokens")
        pairs = _past_pairs(past)
        for i, (keys, _) in enumerate(pairs):
            self._check_dims(i, keys, f"past[{i}] keys")
        for keys, values in pairs:
            self._add_layer().prefill(keys, values)
        return self

    def attention_paths(self) -> list[str | None]:
        """How the last forward's attention read each layer: ``"kvstats"`` (the estimator path,
        :func:`kvstats_attention`), ``"model"`` (the model's own attention read decoded K̂/V̂: the dense path), None
        for a layer no forward has read yet (a new or prefilled one)."""
        return [layer.last_attention for layer in self.layers]

    def require_estimator_path(self, model=None) -> None:
        """Raise ValueError, naming the layers (and ``model``'s class), unless the last forward read every layer
        on the estimator path: what a measurement "through the scheme's estimator" must check after its forward,
        for a model whose attention may not reach :func:`kvstats_attention` (transformers ignores
        ``attn_implementation`` for a model without AttentionInterface support) — for a quantizer whose
        ``inner`` is not decode-then-dot, the dense path would silently measure another estimator."""
        paths = self.attention_paths()
        missed = [i for i, p in enumerate(paths) if p != "kvstats"]
        if not paths or missed:
            who = f"{type(model).__name__}: " if model is not None else ""
            shown = ", ".join(f"{i} ({paths[i] or 'not read'})" for i in missed[:8]) + (" ..." if len(missed) > 8
                                                                                       else "")
            raise ValueError(f"{who}the estimator path did not run on "
                             + (f"layers {shown} of {len(paths)}" if paths else "any layer (no forward stored K/V)")
                             + ": their attention was the model's own over decoded K̂/V̂ (its attention does not go "
                               "through transformers' AttentionInterface, or its implementation is not 'kvstats')")

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
                ``rollback_tokens``, ``sink_tokens``).
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

    def memory(self, layer: int | None = None) -> CacheMemory:
        """Bytes held now: codes (Σ Code.nbytes) + the exact tokens (window and sinks), vs an fp16 cache of the same
        tokens; of every layer, or of layer ``layer`` alone (a cache with a scheme per layer: its bits per layer)."""
        layers = self.layers
        if layer is not None:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(self.layers):
                raise ValueError(f"layer must be a layer index in [0, {len(self.layers)}), got {layer!r}")
            layers = [self.layers[layer]]
        codes = window = fp16 = elements = exact = 0
        for layer in layers:
            c, w = layer.nbytes()
            codes, window = codes + c, window + w
            if layer.is_initialized:
                b, h, _, d = layer.keys.shape
                count = 2 * b * h * layer.cumulative_length * d
                elements, fp16 = elements + count, fp16 + 2 * count
                exact += sum(t.numel() for t in (layer.keys, layer.values, layer.sink_keys, layer.sink_values)
                             if t is not None)
        tokens = self.get_seq_length() if len(layers) != 1 else layers[0].cumulative_length
        return CacheMemory(codes, window, fp16, elements, tokens, len(layers), exact)

    def nbytes(self) -> int:
        """Total bytes held (codes + window)."""
        return self.memory().total_bytes

    def __repr__(self) -> str:
        name = repr(self.scheme) if isinstance(self.scheme, Scheme) else getattr(self.scheme, "__name__", "per-layer")
        sinks = f"sink_tokens={self.sink_tokens}, " if self.sink_tokens else ""
        return (f"KVStatsCache(scheme={name}, full_precision_window={self.window}, flush_size={self.flush_size}, "
                f"{sinks}tokens={self.get_seq_length()})")


def _past_pairs(past) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(keys, values)`` of each layer of ``past`` (a transformers cache or a sequence of pairs), refused by
    name unless every layer holds every token it has seen, all layers alike in length and batch."""
    layers = getattr(past, "layers", None)
    try:
        pairs = [(layer.keys, layer.values) for layer in layers] if layers is not None else list(past)
    except TypeError:
        raise TypeError(f"past must be a transformers cache or a sequence of (keys, values) pairs, got "
                        f"{type(past).__name__}") from None
    if not pairs:
        raise ValueError("past must hold the keys and values of at least one layer, got none")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(isinstance(t, torch.Tensor)
                                                                            for t in pair):
            raise TypeError(f"past[{i}] must be a (keys, values) pair of tensors, got {type(pair).__name__}")
        if pair[0].dim() != 4 or pair[0].shape != pair[1].shape:
            raise ValueError(f"past[{i}] keys {tuple(pair[0].shape)} and values {tuple(pair[1].shape)} must have one "
                             "shape [B, H_kv, S, d]")
        seen = layers[i].get_seq_length() if layers is not None and hasattr(layers[i], "get_seq_length") else None
        if seen is not None and seen != pair[0].shape[-2]:
            raise ValueError(
                f"past layer {i} ({type(layers[i]).__name__}) holds {pair[0].shape[-2]} token states but has seen "
                f"{seen} tokens (a sliding-window layer keeps only the last ones; a static layer holds padding): "
                f"KVStatsCache.prefill needs every token of every layer, or the next forward would read a shorter "
                f"context at the wrong positions; run the context with cache=DynamicCache() (no config: every "
                f"layer keeps every token) and prefill from that")
    first = pairs[0][0].shape
    for i, (keys, _) in enumerate(pairs):
        if keys.shape[0] != first[0] or keys.shape[-2] != first[-2]:
            raise ValueError(f"past layer {i} holds batch {keys.shape[0]} and {keys.shape[-2]} tokens, layer 0 batch "
                             f"{first[0]} and {first[-2]} tokens: every layer of a context must hold the same batch "
                             "and tokens")
    return pairs


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
    refuse_latent_attention(config)
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


def kivi_cache(model_or_config, bits: int = 2, *, group_size: int = KIVI_GROUP_SIZE,
               residual_length: int = KIVI_RESIDUAL_LENGTH, sink_tokens: int = 0, seed: int = 0,
               **cache_config) -> KVStatsCache:
    """KIVI as published (arXiv 2402.02750 §3): the ``kivi`` scheme at ``bits`` = 2 or 4 (keys per channel in groups
    of ``group_size`` = G tokens, values per token in groups of G channels, fp16 lo and step) in a cache that keeps
    the recent ``residual_length`` = R tokens in full precision and encodes the older ones in blocks of G:
    ``KVStatsCache(scheme("kivi", bits, d, group_size=G), full_precision_window=R, flush_size=G)`` (G = 32,
    R = 128 as published). The residual is counted in :meth:`KVStatsCache.memory` (``window_bytes``).

    One departure from KIVI's Algorithm 1: there the key residual holds l mod R tokens (quantized R at a time)
    and the value residual exactly R; here K and V share one window of R to R + G − 1 tokens, so every token
    KIVI keeps exact is exact here too, and at most G − 1 more values and R + G − 1 more keys (docs/cache.md).

        cache = kivi_cache(model, 2)
        model.generate(ids, **cache_kwargs(model, cache), max_new_tokens=40)
    """
    from kvstats._validation import check_int_range
    from kvstats.quant.schemes import scheme as build_scheme

    check_int_range(group_size, "group_size", 1, 1 << 20)
    check_int_range(residual_length, "residual_length", 0, 1 << 40)
    if residual_length % group_size:
        raise ValueError(f"residual_length must be a multiple of group_size = {group_size} (KIVI flushes its "
                         f"residual in whole groups), got {residual_length}")
    config = getattr(model_or_config, "config", model_or_config)
    dim = model_dims(config)["head_dim"]
    s = build_scheme("kivi", bits=bits, dim=dim, seed=seed, group_size=group_size)
    return KVStatsCache.from_config(config, s, full_precision_window=residual_length, flush_size=group_size,
                                    sink_tokens=sink_tokens, **cache_config)
