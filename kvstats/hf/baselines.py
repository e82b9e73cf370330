"""transformers' own quantized KV caches (optimum-quanto, HQQ) through the output metrics of kvstats' end_to_end.

These are the caches users deploy today (``generate(cache_implementation="quantized", cache_config={"backend":
"quanto" | "hqq", "nbits": ...})``): KIVI-style round-to-nearest integer codes with a scale and a zero point per
group of ``q_group_size`` elements, the last ``residual_length`` − 1 tokens or fewer kept exact
(transformers' ``QuantizedCache``; docs/end_to_end.md, "Baselines"). Optional: ``pip install 'kvstats[baselines]'``.

    from kvstats.hf.baselines import available_backends, output_metrics, teacher_forced_logits
    logits = teacher_forced_logits(model, ids, "quanto", nbits=4, residual_length=16)   # [B, T, V]
    m = output_metrics(reference_logits, logits, ids)     # per-token KL, NLL, top-1 vs the exact model

Teacher forcing is token by token: a ``QuantizedCache`` quantizes what a forward adds only after that forward
(its first forward attends exactly), so the logits of token t are those of a generation that had produced
tokens 0..t-1 — what kvstats' estimator path gives for a whole segment in one forward.
"""

from __future__ import annotations

import importlib.util
import inspect
import time

import torch

__all__ = ["BACKENDS", "available_backends", "baseline_rows", "output_metrics", "quantized_cache",
           "quantized_cache_memory", "quantized_prefill", "teacher_forced_logits"]

#: transformers backend name -> the package it needs (the ``[baselines]`` extra installs both).
BACKENDS = {"quanto": "optimum.quanto", "hqq": "hqq"}


def available_backends() -> list[str]:
    """The backends of :data:`BACKENDS` whose package imports here (none without the ``[baselines]`` extra)."""
    found = []
    for backend, module in BACKENDS.items():
        try:
            ok = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # "optimum" itself missing
            ok = False
        if ok:
            found.append(backend)
    return found


def quantized_cache(model_or_config, backend: str, nbits: int = 4, *, residual_length: int = 128,
                    q_group_size: int = 64, axis_key: int = 0, axis_value: int = 0):
    """transformers' ``QuantizedCache`` for a model (or its config) with the quanto or hqq backend.

    Args:
        backend: ``"quanto"`` (nbits 2 or 4) or ``"hqq"`` (nbits 1, 2, 3, 4 or 8).
        residual_length: R ≥ 1: exact tokens are buffered until R are held, then the whole cache (codes
            dequantized, buffer, new tokens) is quantized again (transformers' ``QuantizedLayer.update``).
        q_group_size, axis_key, axis_value: transformers' group-wise options (defaults: transformers' own).
    """
    from transformers.cache_utils import QuantizedCache

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    if backend not in available_backends():
        raise ImportError(f"backend {backend!r} needs the package {BACKENDS[backend]!r}: "
                          "pip install 'kvstats[baselines]'")
    for name, value in (("nbits", nbits), ("residual_length", residual_length), ("q_group_size", q_group_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    config = getattr(model_or_config, "config", model_or_config)
    if "config" not in inspect.signature(QuantizedCache.__init__).parameters:  # pragma: no cover - transformers < 5
        raise ImportError("kvstats.hf.baselines needs transformers >= 5 (QuantizedCache(backend, config, ...))")
    return QuantizedCache(backend=backend, config=config, nbits=nbits, axis_key=axis_key, axis_value=axis_value,
                          q_group_size=q_group_size, residual_length=residual_length)


def quantized_prefill(model, past, backend: str, nbits: int = 4, **cache_options):
    """A fresh :func:`quantized_cache` holding an exact prefill's states: ``past`` (a transformers cache, e.g. the
    ``past_key_values`` of a full-precision forward) handed over layer by layer through ``update``, as the prefill
    forward would have written them (the serving protocol of a full-precision prefill and a quantized cache)."""
    cache = quantized_cache(model, backend, nbits, **cache_options)
    for i, layer in enumerate(past.layers):
        cache.update(layer.keys, layer.values, i)
    return cache


def teacher_forced_logits(model, ids: torch.Tensor, backend: str, nbits: int = 4, *, residual_length: int = 128,
                          return_cache: bool = False, **cache_options):
    """Logits [B, T, V] (fp32, or fp64 for an fp64 model) of ``ids`` [B, T] fed one token per forward through a fresh
    :func:`quantized_cache` (with ``return_cache``: (logits, the cache), e.g. for :func:`quantized_cache_memory`);
    ``cache_options``: ``q_group_size``, ``axis_key``, ``axis_value``."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 1 or ids.dtype != torch.long:
        raise ValueError(f"ids must be a [B, T] int64 tensor with T >= 1, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")
    from kvstats.hf.cache import cache_kwargs  # transformers, like quantized_cache; output_metrics needs neither

    cache = quantized_cache(model, backend, nbits, residual_length=residual_length, **cache_options)
    kw = cache_kwargs(model, cache)
    steps = []
    with torch.inference_mode():
        for t in range(ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], use_cache=True, **kw).logits[:, -1])
    logits = torch.stack(steps, dim=1)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return (logits, cache) if return_cache else logits


def _tensor_bytes(t) -> int:
    """Bytes of the elements of ``t``: a plain tensor's numel × element size, or, for a tensor subclass holding
    others (quanto's QBitsTensor: packed codes, scale, shift), the sum over the tensors it is made of."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def quantized_cache_memory(cache) -> dict:
    """Bytes a transformers QuantizedCache holds: every tensor inside each layer's quantized K and V
    (:func:`_tensor_bytes`: quanto's packed codes, scale and shift) plus its exact residual K and V; the elements are
    those of the K/V the layer stands for (quantized + residual tokens), checked against the tokens the layer has
    seen. Where a state is not made of tensors (a backend that keeps other objects), the bytes are None with the
    reason. Returns ``cache_bytes``, ``elements``, ``bits_per_element`` and the breakdown ``quantized_memory``."""
    codes = residual = elements = 0
    for i, layer in enumerate(cache.layers):
        states = (layer._quantized_keys, layer._quantized_values)
        if not all(isinstance(s, torch.Tensor) for s in states):
            return {"cache_bytes": None, "bits_per_element": None,
                    "not_counted": f"layer {i} holds quantized states of types "
                                   f"{[type(s).__name__ for s in states]}, not tensors"}
        exact = [t for t in (layer.keys, layer.values) if t is not None and t.dim() == 4]
        codes += sum(_tensor_bytes(s) for s in states)
        residual += sum(t.numel() * t.element_size() for t in exact)
        elements += sum(s.numel() for s in states) + sum(t.numel() for t in exact)
        held_tokens = states[0].shape[-2] + (exact[0].shape[-2] if exact else 0)
        if held_tokens != layer.cumulative_length:
            raise RuntimeError(f"QuantizedCache layer {i} holds {held_tokens} tokens but has seen "
                               f"{layer.cumulative_length}: its bytes would not be those of the whole cache")
    held = codes + residual
    return {"cache_bytes": held, "elements": elements, "bits_per_element": 8 * held / elements if elements else None,
            "quantized_memory": {"code_bytes": codes, "residual_bytes": residual, "total_bytes": held,
                                 "elements": elements}}


def output_metrics(reference_logits: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token output damage of ``logits`` against the exact model's ``reference_logits`` (both [B, T, V]) on the
    tokens ``ids`` [B, T], as the end_to_end study (studies/end_to_end/) measures every kvstats scheme (fp64):

    * ``out_kl`` [B, T]: KL(p_exact ‖ p_quantized) of the next-token distributions (nats, clamped at 0);
    * ``nll_ref``, ``nll`` [B, T−1]: −log p(ids[:, t+1]) under the exact and the quantized model;
    * ``top1`` [B, T]: 1.0 where both models put the same token first.
    """
    if reference_logits.shape != logits.shape or reference_logits.dim() != 3:
        raise ValueError(f"reference_logits and logits must be [B, T, V] of one shape, got "
                         f"{tuple(reference_logits.shape)} and {tuple(logits.shape)}")
    if tuple(ids.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"ids must be [B, T] = {tuple(logits.shape[:2])}, got {tuple(ids.shape)}")
    parts = {"out_kl": [], "nll_ref": [], "nll": [], "top1": []}
    for b in range(ids.shape[0]):  # one sequence at a time: fp64 [T, V] copies stay small at a 262k vocabulary
        ref = torch.log_softmax(reference_logits[b].double(), dim=-1)
        logq = torch.log_softmax(logits[b].double(), dim=-1)
        target = ids[b, 1:, None]
        parts["out_kl"].append((ref.exp() * (ref - logq)).sum(-1).clamp_min(0))
        parts["nll_ref"].append(-ref[:-1].gather(-1, target)[..., 0])
        parts["nll"].append(-logq[:-1].gather(-1, target)[..., 0])
        parts["top1"].append((ref.argmax(-1) == logq.argmax(-1)).double())
    return {name: torch.stack(rows) for name, rows in parts.items()}


def baseline_rows(model, ids: torch.Tensor, reference_logits: torch.Tensor, backend: str, nbits: int, *,
                  residual_length: int = 1, **cache_options) -> list[dict]:
    """The rows the end_to_end study keeps per cell, for transformers' quantized cache over the segments ``ids``
    [B, T]: one ``"token"`` row per (segment, t) with out_kl, top1, nll_ref, nll (None at the last token), and
    one ``"cell"`` row (seconds, max_abs_dlogit, the cache's options). No attention metrics: the cache never
    sees the exact keys of what it quantized."""
    t0 = time.perf_counter()
    logits = teacher_forced_logits(model, ids, backend, nbits, residual_length=residual_length, **cache_options)
    seconds = time.perf_counter() - t0
    m = output_metrics(reference_logits, logits, ids)
    b, t_len = ids.shape
    rows = [{"kind": "token", "segment": u, "t": t, "out_kl": float(m["out_kl"][u, t]), "top1": float(m["top1"][u, t]),
             "nll_ref": None if t == t_len - 1 else float(m["nll_ref"][u, t]),
             "nll": None if t == t_len - 1 else float(m["nll"][u, t])}
            for u in range(b) for t in range(t_len)]
    rows.append({"kind": "cell", "seconds": seconds, "segments": b, "segment_tokens": t_len,
                 "max_abs_dlogit": float((logits.double() - reference_logits.double()).abs().max()),
                 "residual_length": residual_length, "q_group_size": cache_options.get("q_group_size", 64)})
    return rows
