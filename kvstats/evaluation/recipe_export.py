"""A layer map in the forms serving engines read: one KV-cache dtype per layer.

    from kvstats.evaluation.recipe_export import engine_export, from_layer_spec
    e = engine_export(m)   # {"layer_dtypes": [...], "layer_spec": "0-3:fp8_e4m3,4-29:nvfp4", "vllm_args": ...}
    from_layer_spec(e["layer_spec"], layers=30, exact_bits=e["exact_bits"]) == m

Engines store one dtype per layer for K and V together, and only a few dtypes: the OCP FP8 formats with a
per-tensor scale (1.0 unless the checkpoint calibrates one; kvstats' ``fp8_e4m3``/``fp8_e5m2`` use exactly that
unity scale), NVFP4 (E2M1 values, an E4M3 scale per 16, an fp32 global scale: kvstats' ``nvfp4``), and the model's
own dtype (``auto``: kvstats' ``exact``, whose width the map counts as ``exact_bits``: a map measured at fp32 prices
its exact layers at 32 bits where a bf16 engine holds 16, so measure at the checkpoint's dtype to export). kvstats'
NVFP4 takes its fp32 global scale from the amax of the tensor it encodes (per head and call); an engine's may be a
static per-tensor scale from the checkpoint. A map is exported only when every layer's K and V share a format and
that format has an engine dtype (:data:`ENGINE_DTYPES`); anything else is refused naming the layer and format — a
kvstats format such as ``int_token`` is not claimed equal to an engine's own int4/int8 cache, whose grouping and
rounding kvstats has not checked.

The forms written:

* ``layer_spec``: ``"first-last:dtype,..."`` ranges over every layer, the per-layer syntax proposed for SGLang's
  ``--kv-cache-per-layer-dtype`` and TensorRT-LLM's ``KvCacheConfig.dtype``;
* ``vllm_args``: ``--kv-cache-dtype D --kv-cache-dtype-skip-layers i j ...`` (vLLM: one quantized dtype; the
  skipped layers, a list of layer indices, at the model's dtype) where the map has that shape, else None with
  ``vllm_reason``.

Per-layer dtype maps are still proposals in these engines (docs/recipe.md names them): the names follow them, and
what an engine computes with them is the engine's; kvstats measured its own implementation of each format.
"""

from __future__ import annotations

import re
from typing import Any

from kvstats.evaluation.layer_recipe import EXACT, LayerMap

__all__ = ["ENGINE_DTYPES", "engine_dtypes", "engine_export", "from_layer_spec", "layer_spec"]

#: kvstats format -> the engines' KV-cache dtype name
ENGINE_DTYPES = {EXACT: "auto", "fp8_e4m3@8": "fp8_e4m3", "fp8_e5m2@8": "fp8_e5m2", "nvfp4@4": "nvfp4"}
_FORMATS = {v: k for k, v in ENGINE_DTYPES.items()}
_RANGE = re.compile(r"^\s*(?P<first>[0-9]+)(?:\s*-\s*(?P<last>[0-9]+))?\s*:\s*(?P<dtype>[A-Za-z0-9_]+)\s*$")


def engine_dtypes(m: LayerMap) -> list[str]:
    """Each layer's engine dtype; ValueError naming the first layer whose K and V differ or whose format has no
    engine dtype."""
    out = []
    for i, (k, v) in enumerate(m.layers):
        if k != v:
            raise ValueError(f"layer {i} has K {k} and V {v}: engines take one KV-cache dtype per layer, so this map "
                             "has no engine form (its JSON layer map is kvstats' own)")
        if k not in ENGINE_DTYPES:
            raise ValueError(f"layer {i}'s format {k} has no engine KV-cache dtype (those with one: "
                             f"{', '.join(f'{f} -> {d}' for f, d in ENGINE_DTYPES.items())})")
        out.append(ENGINE_DTYPES[k])
    return out


def layer_spec(m: LayerMap) -> str:
    """``"first-last:dtype,..."``: runs of equal dtypes over every layer, in order."""
    dtypes, runs, start = engine_dtypes(m), [], 0
    for i in range(1, len(dtypes) + 1):
        if i == len(dtypes) or dtypes[i] != dtypes[start]:
            runs.append(f"{start}:{dtypes[start]}" if i - 1 == start else f"{start}-{i - 1}:{dtypes[start]}")
            start = i
    return ",".join(runs)


def from_layer_spec(spec: str, *, layers: int, exact_bits: int, default: str | None = None) -> LayerMap:
    """The layer map of an engine's per-layer spec: every layer named once, or the omitted ones at ``default`` (an
    engine dtype, as ``--kv-cache-dtype`` gives them); ``exact_bits``: the width of the model's dtype (``auto``),
    as :func:`engine_export` records it. A malformed range, an unknown dtype, a layer out of range, named twice or
    missing, an empty spec is refused by name."""
    from kvstats._validation import check_int_range

    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"spec must be a non-empty string 'first-last:dtype,...', got {spec!r}")
    layers = check_int_range(layers, "layers", 1, 1 << 20)
    if default is not None and (not isinstance(default, str) or default not in _FORMATS):
        raise ValueError(f"default must be an engine dtype {sorted(_FORMATS)} or None, got {default!r}")
    dtypes: list[str | None] = [default] * layers
    named: set[int] = set()
    for part in spec.split(","):
        r = _RANGE.match(part)
        if r is None:
            raise ValueError(f"spec: {part!r} is not 'layer:dtype' or 'first-last:dtype'")
        first, last = int(r["first"]), int(r["last"] if r["last"] is not None else r["first"])
        if r["dtype"] not in _FORMATS:
            raise ValueError(f"spec: dtype {r['dtype']!r} of {part!r} is not one kvstats measures "
                             f"({sorted(_FORMATS)})")
        if not 0 <= first <= last < layers:
            raise ValueError(f"spec: {part!r} is outside layers 0-{layers - 1}")
        again = named & set(range(first, last + 1))
        if again:
            raise ValueError(f"spec: layers {sorted(again)} are named twice")
        named |= set(range(first, last + 1))
        dtypes[first:last + 1] = [r["dtype"]] * (last - first + 1)
    missing = [i for i, d in enumerate(dtypes) if d is None]
    if missing:
        raise ValueError(f"spec leaves layers {missing} without a dtype and no default was given")
    return LayerMap(tuple((_FORMATS[d], _FORMATS[d]) for d in dtypes), exact_bits)


def engine_export(m: LayerMap) -> dict[str, Any]:
    """The map's engine forms: ``layer_dtypes``, ``layer_spec``, and ``vllm_args`` (None, with ``vllm_reason``,
    unless the quantized layers share one dtype). ValueError when the map has no engine form
    (:func:`engine_dtypes`)."""
    dtypes = engine_dtypes(m)
    quantized = sorted({d for d in dtypes if d != "auto"})
    vllm, reason = None, None
    if len(quantized) == 1:
        skip = [i for i, d in enumerate(dtypes) if d == "auto"]
        vllm = ["--kv-cache-dtype", quantized[0]] + (["--kv-cache-dtype-skip-layers", *map(str, skip)] if skip else [])
    else:
        reason = ("every layer is at the model's dtype: no KV-cache quantization to configure" if not quantized else
                  f"vLLM's flags take one quantized dtype, the map has {', '.join(quantized)}")
    return {"layer_dtypes": dtypes, "layer_spec": layer_spec(m), "exact_bits": m.exact_bits, "vllm_args": vllm,
            "vllm_reason": reason}
