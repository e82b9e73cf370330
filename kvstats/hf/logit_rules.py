"""What a model's attention does to its logits besides ``scaling · q·kᵀ``, read from the keywords transformers
passes an attention function (soft capping, sliding window, sinks; anything else refused), and the model's mask:
the masking of a block of logits (:func:`mask_block`) and what a mask shows (:func:`mask_shows`,
:func:`mask_shows_any`, :func:`mask_shows_later_keys`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstats.quant import attention as _attention


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


def mask_block(logits: torch.Tensor, mask: torch.Tensor | None, first: int, n: int, width: int,
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


def mask_shows(mask: torch.Tensor) -> torch.Tensor:
    """Where an attention mask (bool: True = attend; float: added to the logits) lets a query see a key."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def mask_shows_any(mask: torch.Tensor) -> bool:
    """Whether an attention mask lets any query see a key (:func:`mask_shows` anywhere)."""
    return bool(mask_shows(mask).any())


def mask_shows_later_keys(mask: torch.Tensor, n: int) -> bool:
    """Whether the mask rows of the last ``n`` positions (bool: True = attend; float: added to the logits; keys aligned
    to the end) let a query see a key after its own position."""
    rows = mask[..., -n:]  # a later key of one of the last n queries is one of the last n keys
    rows = rows if rows.shape[-2] in (1, n) else rows[..., -n:, :]  # one row broadcast to every query, or theirs
    return bool((mask_shows(rows) & ~_attention.causal_visible(n, n, 0, device=rows.device)).any())
