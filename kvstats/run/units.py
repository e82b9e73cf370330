"""The independent units of an evaluation and the metrics of one unit.

    source = synthetic_units("gaussian", seed=0, dim=128, kv_heads=2, q_heads=4, seq=512, n_q=32)
    source = capture_units("capture.safetensors", window=64)
    parts = source.unit(3)                  # [(q, k, v)] of unit 3 (one triple per stored layer for a capture)
    row = unit_metrics(scheme, parts, top_k=5, causal=source.causal, query_offset=source.query_offset,
                       scale=source.scale)

A unit never shares randomness with another: synthetic unit ``i`` is a fresh draw with seed ``seed + i``; a
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

__all__ = ["METRICS", "UnitSource", "capture_units", "synthetic_units", "unit_metrics"]

#: The metrics of one unit, in table order. ``6d_*`` are the components of :func:`kvstats.metrics.error6d`;
#: ``bits_total`` is measured from the bytes the unit's codes hold.
METRICS = ("attention_kl", "topk_recall", "6d_k_direction", "6d_k_norm", "6d_v_direction", "6d_v_norm",
           "6d_attention_kl", "6d_output_error", "bits_total")


@dataclass(frozen=True)
class UnitSource:
    """Where an evaluation's units come from.

    Attributes:
        kind: "synthetic" or "capture".
        description: what one unit is, in words (for the table and the results file).
        dim: the head dimension d.
        kv_heads: KV heads of a unit's cache ``[B, kv_heads, S, d]``.
        available: how many units exist (a capture's disjoint windows), None when unbounded (synthetic draws).
        causal, query_offset: the attention mask of a unit (see :mod:`kvstats.attention`).
        scale: the softmax scale of the logits (1/√d, or the captured model's ``attn_scaling``).
        identity: what identifies the data (kind and parameters, or the capture file's sha256), for the unit store.
        inputs: files the evaluation reads (never its output).
        unit: ``unit(i) -> [(q, k, v), ...]``, the tensors of unit ``i`` (fp32).
    """

    kind: str
    description: str
    dim: int
    kv_heads: int
    available: int | None
    causal: bool
    query_offset: int | None
    scale: float
    identity: dict
    unit: Callable[[int], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(repr=False)
    inputs: tuple[str, ...] = ()


def synthetic_units(kind: str, *, seed: int, dim: int, kv_heads: int, q_heads: int, seq: int, n_q: int,
                    params: dict | None = None) -> UnitSource:
    """Unit ``i``: a fresh draw of :func:`kvstats.data.synthetic.generate` with seed ``seed + i``, cache
    ``[1, kv_heads, seq, dim]``, ``n_q`` queries per query head from the generator's query model, non-causal."""
    from kvstats.data.synthetic import generate

    params = dict(params or {})

    def unit(i: int):
        q, k, v = generate(kind, 1, kv_heads, seq, dim, seed + i, q_heads=q_heads, n_q=n_q, **params)
        return [(q, k, v)]

    shape = {"kv_heads": kv_heads, "q_heads": q_heads, "seq": seq, "dim": dim, "n_q": n_q}
    return UnitSource("synthetic", f"independent draws (seed + i), cache [1, {kv_heads}, {seq}, {dim}], {n_q} "
                      "queries per head", dim, kv_heads, None, False, None, 1 / math.sqrt(dim),
                      {"kind": kind, "params": {k: repr(v) for k, v in sorted(params.items())}, "shape": shape}, unit)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:  # noqa: PTH123
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def capture_units(path: str | os.PathLike, *, window: int, layers: Sequence[int] | None = None) -> UnitSource:
    """Unit ``i``: the ``i``-th disjoint window of ``window`` tokens of a capture, its queries attending causally to
    the window's keys, one (q, k, v) per chosen layer (default all stored layers); the softmax scale is the
    capture's ``attn_scaling`` (the model's own), 1/√d when the file does not record it."""
    from kvstats.data.io import load_qkv

    path = Path(path)
    f = load_qkv(path)
    chosen = list(f.layers if layers is None else layers)
    if not chosen:
        raise ValueError(f"layers must name at least one stored layer of {str(path)!r} (stored: {f.layers}), got []")
    tensors = [f.layer(i) for i in chosen]
    if any(t.q is None for t in tensors):
        raise ValueError(f"data {str(path)!r} stores no queries: capture with queries to evaluate attention")
    n_tokens = tensors[0].k.shape[2]
    available = n_tokens // window
    if available < 2:
        raise ValueError(f"window must leave at least 2 disjoint windows in the {n_tokens} tokens of {str(path)!r}, "
                         f"got window = {window}")
    d = int(tensors[0].k.shape[-1])
    scale = f.metadata.get("attn_scaling")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{str(path)!r}: metadata attn_scaling must be a positive number, got {scale!r}")
    scale = float(scale) if scale is not None else 1 / math.sqrt(d)

    def unit(i: int):
        sl = slice(i * window, (i + 1) * window)
        return [(t.q[:, :, sl].float(), t.k[:, :, sl].float(), t.v[:, :, sl].float()) for t in tensors]

    return UnitSource("capture", f"disjoint windows of {window} tokens, causal within the window, mean over "
                      f"{len(chosen)} layer(s)", d, int(tensors[0].k.shape[1]), available, True, 0, scale,
                      {"kind": "capture", "sha256": _file_sha256(path), "window": window, "layers": chosen}, unit,
                      (str(path),))


def unit_metrics(scheme, parts, *, top_k: int, causal: bool, query_offset: int | None,
                 scale: float) -> dict[str, float]:
    """Every metric of :data:`METRICS` for one unit: means over its queries and vectors, then over its parts
    (a capture's layers); ``bits_total`` = 8 · bytes the codes hold / elements encoded (K and V, every part), and
    ``bits_claimed`` the scheme's ``bits_per_coordinate(n_tokens=S)["mean"].total``.

    Logits are ``scale · q·kᵀ``: the estimator's ``scale · scheme.scores(q, code)`` against ``scale · q·kᵀ`` in
    float64; :func:`~kvstats.metrics.error6d` (which divides by √d) gets the queries times ``scale·√d``.
    """
    from kvstats import metrics

    per_part, held, elements = [], 0, 0
    for q, k, v in parts:
        code = scheme.encode(k, v)
        held += code.k.nbytes + code.v.nbytes
        elements += k.numel() + v.numel()
        k_hat, v_hat = scheme.decode(code)
        d = q.shape[-1]
        factor = scale * math.sqrt(d)
        q_scaled = q if abs(factor - 1.0) < 1e-12 else q.double() * factor
        ref = metrics.attention_scores(q_scaled, k, double=True)
        est = scheme.scores(q, code).to(torch.float64) * scale
        opts = dict(causal=causal, query_offset=query_offset)
        six = metrics.error6d(q_scaled, k, v, k_hat, v_hat, **opts)[0]
        row = {"attention_kl": float(metrics.attention_kl_from_scores(ref, est, **opts)),
               "topk_recall": float(metrics.topk_recall_from_scores(ref, est, top_k=top_k, **opts))}
        row |= {f"6d_{name}": float(x) for name, x in zip(metrics.ERROR6D_COMPONENTS, six.tolist())}
        per_part.append(row)
    out = {m: float(sum(p[m] for p in per_part) / len(per_part)) for m in per_part[0]}
    out["bits_total"] = 8.0 * held / elements
    out["bits_claimed"] = float(scheme.bits_per_coordinate(n_tokens=parts[0][1].shape[-2])["mean"].total)
    return out
