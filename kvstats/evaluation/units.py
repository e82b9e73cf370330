"""The independent units of an evaluation and the metrics of one unit.

    source = synthetic_units("gaussian", seed=0, dim=128, kv_heads=2, q_heads=4, seq=512, n_q=32)
    source = capture_units("capture.safetensors", window=64)
    parts = source.unit(3)                  # [(q, k, v)] of unit 3 (one triple per stored layer for a capture)
    row = unit_metrics(scheme, parts, top_k=5, causal=source.causal, query_offset=source.query_offset,
                       scale=source.scale)

A unit never shares randomness with another: synthetic unit ``i`` is a fresh draw with the unit seed
``kvstats._random.unit_seed(seed, i)`` (child i of ``SeedSequence(seed)``); a
capture's unit ``i`` is its ``i``-th disjoint window of tokens (disjoint, but from one text).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvstats._random import unit_seed
from kvstats._validation import all_finite, first_non_finite

__all__ = ["METRICS", "PartRules", "UnitSource", "capture_units", "synthetic_units", "unit_metrics"]

#: The metrics of one unit, in table order. ``6d_*`` are the components of :func:`kvstats.measure.error6d.error6d`;
#: ``bits_total`` is measured from the bytes the unit's codes hold.
METRICS = ("attention_kl", "topk_recall", "6d_k_direction", "6d_k_norm", "6d_v_direction", "6d_v_norm",
           "6d_attention_kl", "6d_output_error", "bits_total")


@dataclass(frozen=True)
class PartRules:
    """How the attention of one part of a unit (a captured layer) forms its logits: ``scale · q·kᵀ``, then
    ``softcap · tanh(l / softcap)`` when the model soft-caps (Gemma 2)."""

    scale: float
    softcap: float | None = None
    #: the part in words for messages ("layer 5" of a capture; "" for a synthetic draw)
    name: str = ""


@dataclass(frozen=True)
class UnitSource:
    """Where an evaluation's units come from.

    Attributes:
        kind: "synthetic" or "capture".
        description: what one unit is, in words (for the table and the results file).
        dim: the head dimension d.
        kv_heads: KV heads of a unit's cache ``[B, kv_heads, S, d]``.
        available: how many units exist (a capture's disjoint windows), None when unbounded (synthetic draws).
        causal, query_offset: the attention mask of a unit (see :mod:`kvstats.quant.attention`).
        rules: one :class:`PartRules` per part of a unit (the softmax scale, the soft cap).
        identity: what identifies the data (kind and parameters, or the capture file's sha256), for the unit store.
        unit: ``unit(i) -> [(q, k, v), ...]``, the tensors of unit ``i`` (fp32).
        inputs: files the evaluation reads (never its output).
        documents: the document of each unit (a capture's; None for synthetic draws, all independent).
    """

    kind: str
    description: str
    dim: int
    kv_heads: int
    available: int | None
    causal: bool
    query_offset: int | None
    rules: tuple[PartRules, ...]
    identity: dict
    unit: Callable[[int], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(repr=False)
    inputs: tuple[str, ...] = ()
    documents: tuple[int, ...] | None = None

    @property
    def scale(self) -> float:
        """The softmax scale of the first part (every part's is in :attr:`rules`)."""
        return self.rules[0].scale


def synthetic_units(kind: str, *, seed: int, dim: int, kv_heads: int, q_heads: int, seq: int, n_q: int,
                    params: dict | None = None) -> UnitSource:
    """Unit ``i``: a fresh draw of :func:`kvstats.data.synthetic.generate` with seed ``unit_seed(seed, i)``, cache
    ``[1, kv_heads, seq, dim]``, ``n_q`` queries per query head from the generator's query model, non-causal."""
    from kvstats.data.synthetic import generate

    params = dict(params or {})

    def unit(i: int):
        q, k, v = generate(kind, 1, kv_heads, seq, dim, unit_seed(seed, i), q_heads=q_heads, n_q=n_q, **params)
        return [(q, k, v)]

    shape = {"kv_heads": kv_heads, "q_heads": q_heads, "seq": seq, "dim": dim, "n_q": n_q}
    return UnitSource("synthetic", f"independent draws (unit seeds spawned from the seed), cache [1, {kv_heads}, "
                      f"{seq}, {dim}], {n_q} queries per head", dim, kv_heads, None, False, None,
                      (PartRules(1 / math.sqrt(dim)),),
                      {"kind": kind, "params": {k: repr(v) for k, v in sorted(params.items())}, "shape": shape}, unit)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:  # noqa: PTH123
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _check_capture_finite(path: Path, chosen: list[int], tensors, starts: list[int], window: int) -> None:
    """Refuse a capture holding NaN or ±inf before any unit is computed, naming the file, the layer, the tensor, the
    token, head and channel of the first bad value and the unit (window) holding it: not when a unit reaches it."""
    for i, t in zip(chosen, tensors):
        for part, x in (("q", t.q), ("k", t.k), ("v", t.v)):
            if all_finite(x):
                continue
            (b, h, tok, ch), value = first_non_finite(x)
            units = [u for u, a in enumerate(starts) if a <= tok < a + window]
            where = f"unit {units[0]} (a window of {window} tokens)" if units else "outside every unit's window"
            raise ValueError(f"data {str(path)!r}: layer {i}'s {part} holds {value} at token {tok} "
                             f"(batch {b}, head {h}, channel {ch}; {where}): a capture must be finite — capture it "
                             "again (a model run in fp16 can overflow; run it in fp32)")


def _attention_rules(meta: dict, chosen: list[int], d: int, window: int, path: Path) -> tuple[PartRules, ...]:
    """Each chosen layer's :class:`PartRules` from a capture's metadata; a sliding window shorter than the unit
    (which would hide keys inside it) is refused, naming the layer."""
    by_layer = {a["layer"]: a for a in meta.get("attention") or []}
    default = meta.get("attn_scaling", 1 / math.sqrt(d))
    rules = []
    for i in chosen:
        a = by_layer.get(i, {"scaling": default, "softcap": None, "sliding_window": None})
        scale, cap, slide = a.get("scaling"), a.get("softcap"), a.get("sliding_window")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"{str(path)!r}: layer {i}'s softmax scaling must be a positive number, got {scale!r}")
        if slide is not None and slide < window:
            raise ValueError(f"layer {i} of {str(path)!r} attends within a sliding window of {slide} tokens, shorter "
                             f"than the evaluation window of {window}: keys of a unit would be hidden from its queries "
                             f"that plain causal attention shows; pass window <= {slide} (--window {slide}) or leave "
                             "the sliding layers out (--layers)")
        rules.append(PartRules(float(scale), None if cap is None else float(cap), f"layer {i}"))
    return tuple(rules)


def capture_units(path: str | os.PathLike, *, window: int, layers: Sequence[int] | None = None) -> UnitSource:
    """Unit ``i``: the ``i``-th disjoint window of ``window`` tokens of a capture, inside one of its documents (a
    window never spans two), its queries attending causally to the window's keys, one (q, k, v) per chosen layer
    (default all stored layers). Each layer's logits follow the model: its softmax scaling and soft cap from the
    capture's metadata (``attention``; ``attn_scaling``, else 1/√d, for older files)."""
    from kvstats.data.io import load_qkv

    path = Path(path)
    f = load_qkv(path)
    chosen = list(f.layers if layers is None else layers)
    if not chosen:
        raise ValueError(f"layers must name at least one stored layer of {str(path)!r} (stored: {f.layers}), got []")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"layers must name each layer once (a repeated layer would count twice in every unit's "
                         f"mean), got {chosen}")
    missing = [i for i in chosen if i not in f.layers]
    if missing:
        raise ValueError(f"layers must be stored layers of {str(path)!r} ({f.layers}), got {missing}")
    tensors = [f.layer(i) for i in chosen]
    if any(t.q is None for t in tensors):
        raise ValueError(f"data {str(path)!r} stores no queries: capture with queries to evaluate attention")
    n_tokens = tensors[0].k.shape[2]
    d = int(tensors[0].k.shape[-1])
    # checked on open (kvstats.data.io.check_header): int ranges inside the stored tokens, disjoint, distinct texts
    docs = f.metadata.get("documents") or [{"start": 0, "stop": n_tokens}]
    starts = [(j, a) for j, doc in enumerate(docs)
              for a in range(int(doc["start"]), int(doc["stop"]) - window + 1, window)]
    if len(starts) < 2:
        raise ValueError(f"window must leave at least 2 disjoint windows in the {n_tokens} tokens of {str(path)!r} "
                         f"({len(docs)} document(s)), got window = {window}")
    rules = _attention_rules(f.metadata, chosen, d, window, path)
    _check_capture_finite(path, chosen, tensors, [a for _, a in starts], window)

    def unit(i: int):
        sl = slice(starts[i][1], starts[i][1] + window)
        return [(t.q[:, :, sl].float(), t.k[:, :, sl].float(), t.v[:, :, sl].float()) for t in tensors]

    where = f"{len(docs)} documents" if len(docs) > 1 else "one text"
    return UnitSource("capture", f"disjoint windows of {window} tokens within {where}, causal within the window, "
                      f"mean over {len(chosen)} layer(s)", d, int(tensors[0].k.shape[1]), len(starts), True, 0,
                      rules, {"kind": "capture", "sha256": _file_sha256(path), "window": window, "layers": chosen},
                      unit, (str(path),), tuple(j for j, _ in starts))


def unit_metrics(scheme, parts, *, top_k: int, causal: bool, query_offset: int | None,
                 rules: Sequence[PartRules], where: str = "") -> dict[str, float]:
    """Every metric of :data:`METRICS` for one unit: means over its queries and vectors, then over its parts
    (a capture's layers); ``bits_total`` = 8 · bytes the codes hold / elements encoded (K and V, every part), and
    ``bits_claimed`` the scheme's ``bits_per_coordinate(n_tokens=S)["mean"].total``.

    Logits of part ``p`` are ``softcap(scale · q·kᵀ)`` (its :class:`PartRules`): the estimator's
    ``softcap(scale · scheme.scores(q, code))`` against ``softcap(scale · q·kᵀ)`` in float64, and for the 6D
    components (:func:`~kvstats.measure.error6d.error6d`) the decoded keys' ``softcap(scale · q·k̂ᵀ)`` against the same
    reference. ``where`` names the unit in messages ("unit 3"): estimated logits that are not finite on finite data
    (an estimator whose fp32 arithmetic overflows) are refused naming the scheme, the unit and the part. The scheme
    is given copies of q, k and v: whatever it does to its inputs, the references come from the data as drawn.
    """
    from kvstats.measure import error6d, metrics
    from kvstats.quant.attention import soft_cap
    from kvstats.quant.quantizers.base import held_bytes
    from kvstats.quant.quantizers.numerics import InnerOverflowError

    per_part, held, elements = [], 0, 0
    for (q, k, v), rule in zip(parts, rules):
        code = scheme.encode(k.clone(), v.clone())
        held += held_bytes(code.k) + held_bytes(code.v)
        elements += k.numel() + v.numel()
        k_hat, v_hat = scheme.decode(code)
        q_scaled = q.double() * (rule.scale * math.sqrt(q.shape[-1]))  # q_s·k/√d = scale · q·k
        ref = soft_cap(metrics.attention_scores(q_scaled, k, double=True), rule.softcap)
        try:
            est = soft_cap(scheme.scores(q.clone(), code).to(torch.float64) * rule.scale, rule.softcap)
            why = ""
        except InnerOverflowError as exc:  # a kvstats quantizer refuses scores beyond fp32; others return inf
            est, why = None, f" ({exc})"
        if est is None or not all_finite(est):
            part = ", ".join(x for x in (where, rule.name) if x) or "a unit"
            raise ValueError(f"{scheme!r} estimates logits that are not finite in {part} from finite queries (max |q| "
                             f"= {float(q.abs().max()):.4g}) and keys (max |k| = {float(k.abs().max()):.4g}): its "
                             f"estimator overflows there; rescale the data or leave this scheme out{why}")
        opts = dict(causal=causal, query_offset=query_offset)
        if rule.softcap is None:
            six = error6d.error6d(q_scaled, k, v, k_hat, v_hat, **opts)[0]
        else:
            decoded = soft_cap(metrics.attention_scores(q_scaled, k_hat, double=True), rule.softcap)
            six = error6d.error6d(q_scaled, k, v, k_hat, v_hat, scores=ref, scores_hat=decoded, **opts)[0]
        row = {"attention_kl": float(metrics.attention_kl_from_scores(ref, est, **opts)),
               "topk_recall": float(metrics.topk_recall_from_scores(ref, est, top_k=top_k, **opts))}
        row |= {f"6d_{name}": float(x) for name, x in zip(error6d.ERROR6D_COMPONENTS, six.tolist())}
        per_part.append(row)
    out = {m: float(sum(p[m] for p in per_part) / len(per_part)) for m in per_part[0]}
    out["bits_total"] = 8.0 * held / elements
    out["bits_claimed"] = float(scheme.bits_per_coordinate(n_tokens=parts[0][1].shape[-2])["mean"].total)
    return out
