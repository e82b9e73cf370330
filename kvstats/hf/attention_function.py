"""The ``"kvstats"`` attention function for transformers: with a :class:`~kvstats.hf.cache.KVStatsCache` its
layer computes the attention from the codes (:meth:`~kvstats.hf.cache_layer.KVStatsLayer.attend`); with any
other cache, exact eager attention under the same logit rules. Registered on import."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from kvstats.hf._transformers import AttentionInterface, AttentionMaskInterface, sdpa_mask
from kvstats.hf.logit_rules import logit_rules
from kvstats.quant import attention as _attention
from kvstats.quant.quantizers.numerics import acc_dtype

#: Name under which :func:`kvstats_attention` is registered in transformers' AttentionInterface.
ATTN_IMPLEMENTATION = "kvstats"


def kvstats_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers attention function (registered as ``"kvstats"``): logits from the cache's codes.

    With a :class:`KVStatsCache`, the key tensor it receives carries its cache layer, which computes the
    attention (:meth:`KVStatsLayer.attend`). With any other cache (or none) it computes exact eager
    attention, so a model set to ``"kvstats"`` behaves as the unquantized model there. Either way the model's
    soft capping, sliding window and attention sinks are applied as its own eager attention applies them
    (:class:`LogitRules`), and any other keyword that would change the attention is refused (:func:`logit_rules`).
    No mask means causal, except for a module with ``is_causal = False`` (every key, as sdpa; refused on a
    KVStatsCache for more than one query).
    """
    scaling = module.scaling if scaling is None else scaling
    rules = logit_rules(module, kwargs)
    training = bool(getattr(module, "training", False))
    # a module that is not causal (an encoder's, a vision tower's: is_causal = False) with no mask attends to every
    # key, as sdpa reads it; kvstats' None means causal, so such a call is refused on the cache (which models causal
    # decoding) and computed over every key without one
    causal = kwargs.get("is_causal")  # the call's keyword first, then the module's attribute, as sdpa decides
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    bidirectional = attention_mask is None and not causal and query.shape[2] > 1
    layer = getattr(key, "_kvstats_layer", None)
    if layer is not None:
        if bidirectional:
            raise ValueError(f"{type(module).__name__} is not causal (is_causal=False) and passed no mask: a "
                             f"KVStatsCache reads a None mask as causal decoding; pass the model's mask, or use "
                             f"the model's own attention implementation for this module")
        reader = getattr(module, "layer_idx", None)
        if isinstance(reader, int) and reader != layer.layer_idx:  # KV sharing: this layer reads an earlier one's K/V
            return layer.attend_shared(reader, key, value, query, attention_mask, scaling, dropout, training, rules)
        return layer.attend(query, attention_mask, scaling, dropout, training, rules)
    acc = acc_dtype(query.dtype)
    logits = _attention.soft_cap(_attention.scores(query.to(acc), key.to(acc), scale=scaling), rules.softcap)
    n, seq = logits.shape[-2:]
    if attention_mask is None:
        if bidirectional and rules.sliding_window is not None:
            raise ValueError(f"{type(module).__name__} is not causal (is_causal=False) and passed no mask with "
                             f"sliding_window={rules.sliding_window}: which keys a bidirectional window shows is "
                             f"not defined without a mask; pass the model's mask")
        visible = (None if bidirectional else  # None: every key
                   _attention.causal_visible(n, seq, device=query.device) if rules.sliding_window is None else
                   _attention.window_visible(n, seq, rules.sliding_window, device=query.device))
        logits = _attention.mask_logits(logits, visible, torch.finfo(acc).min)
    elif attention_mask.dtype == torch.bool:
        logits = _attention.mask_logits(logits, attention_mask[..., -seq:], torch.finfo(acc).min)
    else:
        logits = logits + attention_mask[..., -seq:].to(acc)
    weights = _attention.softmax_with_sinks(logits, rules.sinks)
    out = _attention.apply_weights(F.dropout(weights, p=dropout, training=training), value.to(acc))
    return out.to(query.dtype).transpose(1, 2).contiguous(), weights.to(query.dtype)


#: whether the installed transformers' sdpa_mask can skip a bidirectional mask (returning None for it)
_BIDIRECTIONAL_SKIP = "allow_is_bidirectional_skip" in inspect.signature(sdpa_mask).parameters


def _kvstats_mask(*args, **kwargs):
    """sdpa's boolean mask (True = attend), or None where transformers finds it purely causal and the keys are
    exactly the queries (a prefill of the whole sequence) or the query is one (a decode step): kvstats' attention
    reads None as causal with the queries the last N keys (within the model's sliding window), every key for one
    query. Not skipped otherwise: sdpa also skips a prefill into a longer, partly empty static cache, where None
    means its upper-left alignment; never for a bidirectional mask (None would read as causal). Skipping saves a
    [B, 1, N, S] mask per forward (64 MiB of an 8,192-token prefill) and a mask pass per layer and decode step."""
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    if not (isinstance(q_length, int) and isinstance(kv_length, int) and (q_length == 1 or q_length == kv_length)):
        kwargs["allow_is_causal_skip"] = False
    if _BIDIRECTIONAL_SKIP:
        kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_attention() -> str:
    """Register :func:`kvstats_attention` (and its mask) with transformers as ``"kvstats"``; idempotent."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvstats_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _kvstats_mask)
    return ATTN_IMPLEMENTATION


def use_estimator_attention(model):
    """Switch ``model`` to the estimator path (``attn_implementation="kvstats"``); returns the model.

    Refused (ValueError naming the class) for a model whose attention does not go through transformers'
    AttentionInterface (``_supports_attention_backend`` False: Bloom, MPT, GPT-Neo, XGLM, Falcon, Jamba, ...):
    transformers ignores the setting there, and its own attention would read decoded K̂/V̂ instead of the estimator.
    Whether every layer then ran on the kvstats path is verified after a forward by
    :meth:`~kvstats.hf.cache.KVStatsCache.require_estimator_path`."""
    name = type(model).__name__
    if not callable(getattr(model, "set_attn_implementation", None)) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {name}")
    if not getattr(model, "_supports_attention_backend", True):
        raise ValueError(f"{name} does not compute its attention through transformers' AttentionInterface "
                         f"(_supports_attention_backend is False), so attn_implementation='{ATTN_IMPLEMENTATION}' "
                         f"would be ignored and its own attention would read decoded K̂/V̂: kvstats' estimator path "
                         f"cannot run on this model (its dense path, KVStatsCache with the model's own attention, can)")
    register_attention()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise ValueError(f"{name} kept attn_implementation={model.config._attn_implementation!r} after "
                         f"set_attn_implementation('{ATTN_IMPLEMENTATION}'): kvstats' estimator path cannot run on it")
    return model


register_attention()
