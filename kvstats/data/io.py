"""Q/K/V tensors per layer in one safetensors file, with metadata; lazy loading by layer.

File layout (format ``kvstats-qkv/2``): tensors ``layer.{i}.q`` ``[batch, q_heads, tokens, d]`` (optional),
``layer.{i}.k`` and ``layer.{i}.v`` ``[batch, kv_heads, tokens, d]``; the safetensors header metadata holds
one JSON-encoded value per key: ``format``, ``model``, ``layers`` (the stored layer indices), ``n_layers``,
``q_heads``, ``kv_heads``, ``head_dim``, ``n_tokens``, ``rope`` (dict: how positions were encoded —
queries and keys are stored *after* RoPE, as the attention kernel sees them), ``text_sha256``,
``attn_scaling`` (the softmax scale the model uses), ``attention`` (per layer: ``scaling``, ``softcap``,
``sliding_window``), ``documents`` (per text: ``source``, ``text_sha256``, tokens ``start``..``stop``),
``tensor_sha256`` (``{tensor name: sha256 of its bytes}``, checked on every read: a flipped data byte or two
tensors' offsets swapped are refused naming the tensor) and anything else the caller passes. The digests cover
the tensors, not the header: it is validated on every open and before every write, in one place
(:func:`check_header`), and a field out of range is refused naming the file and the field. Files of the first
format (``kvstats-qkv/1``, no digests) are refused: their contents cannot be checked; capture them again.

    save_qkv("cap.safetensors", [(q0, k0, v0), (q1, k1, v1)], {"model": "mine", "rope": {...}})
    cap = load_qkv("cap.safetensors")        # reads only the header
    cap.metadata["n_tokens"]; cap.keys(5)    # reads layer 5's keys only (memory-mapped)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvstats._files import check_output_path, write_output
from kvstats._validation import check_float_tensor

__all__ = ["FORMAT", "LayerQKV", "QKVFile", "check_header", "check_output_path", "save_qkv", "load_qkv",
           "tensor_sha256"]

FORMAT = "kvstats-qkv/2"
#: formats refused with a reason (not a foreign file: an older kvstats wrote it)
_OLD_FORMATS = {"kvstats-qkv/1": "it has no per-tensor digests, so its contents cannot be checked"}
#: safetensors dtype names a capture may hold
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_SAFETENSORS_DTYPE = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64"}


@dataclass(frozen=True)
class LayerQKV:
    """One layer's tensors: q ``[B, Hq, T, d]`` (None when not stored), k and v ``[B, H, T, d]``."""

    q: torch.Tensor | None
    k: torch.Tensor
    v: torch.Tensor


def _name(layer: int, part: str) -> str:
    return f"layer.{layer}.{part}"


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a CPU tensor's bytes in memory order (contiguous), as stored in a capture file."""
    data = t.detach().contiguous().view(torch.uint8).reshape(-1).numpy()
    return hashlib.sha256(memoryview(data)).hexdigest()


def _as_layer(item, index: int) -> LayerQKV:
    if isinstance(item, LayerQKV):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 3:
        return LayerQKV(*item)
    raise TypeError(f"layers[{index}] must be a LayerQKV or a (q, k, v) tuple, got {type(item).__name__}")


def save_qkv(path: str | os.PathLike, layers: Sequence | Mapping[int, Any], metadata: Mapping[str, Any]) -> Path:
    """Write per-layer Q/K/V and metadata to ``path`` (atomically: a temporary file, then a rename; a symlink's
    target is written, a device or FIFO written through, never replaced: :func:`kvstats._files.write_output`).

    Args:
        path: destination file (``.safetensors``); parent folders are created.
        layers: a sequence (layer i at position i) or a mapping {layer index: item}; each item a
            :class:`LayerQKV` or a ``(q, k, v)`` tuple, q may be None. Shapes as in the module doc; all
            layers alike.
        metadata: JSON-serialisable values; must contain ``model``. Shape fields (``n_layers``, ``q_heads``,
            ``kv_heads``, ``head_dim``, ``n_tokens``, ``layers``) are filled in from the tensors. Metadata that
            :func:`load_qkv` would refuse (:func:`check_header`: documents, attention rules, ...) is refused
            before anything is written.

    Returns:
        the path written.
    """
    items = dict(layers) if isinstance(layers, Mapping) else dict(enumerate(layers))
    if not items:
        raise ValueError("layers is empty: nothing to save")
    if "model" not in metadata:
        raise ValueError(f"metadata must contain 'model', got keys {sorted(metadata)}")
    tensors: dict[str, torch.Tensor] = {}
    ref = None
    for i, item in sorted(items.items()):
        lay = _as_layer(item, i)
        for part, t in (("q", lay.q), ("k", lay.k), ("v", lay.v)):
            if t is None and part == "q":
                continue
            check_float_tensor(t, f"layers[{i}].{part}", min_dim=4)
            if t.dim() != 4:
                raise ValueError(f"layers[{i}].{part} must be 4-D [batch, heads, tokens, d], got {tuple(t.shape)}")
            t = t.detach().to("cpu").contiguous()
            if any(t.untyped_storage().data_ptr() == o.untyped_storage().data_ptr() for o in tensors.values()):
                t = t.clone()  # safetensors refuses tensors sharing memory (the same tensor in two layers)
            tensors[_name(i, part)] = t
        if lay.k.shape != lay.v.shape:
            raise ValueError(f"layers[{i}]: k shape {tuple(lay.k.shape)} != v shape {tuple(lay.v.shape)}")
        shape = (tuple(lay.k.shape), None if lay.q is None else tuple(lay.q.shape))
        if ref is None:
            ref = shape
        elif shape != ref:
            raise ValueError(f"layers[{i}] shapes {shape} differ from the first layer's {ref}")
    (b, h, t, d), qshape = ref
    if qshape is not None and (qshape[0] != b or qshape[3] != d or qshape[1] % h):
        raise ValueError(f"q shape {qshape} does not fit k shape {(b, h, t, d)} (batch, d, q_heads % kv_heads)")
    meta = dict(metadata)
    meta.update(
        format=FORMAT, layers=sorted(items), n_layers=meta.get("n_layers", max(items) + 1),
        kv_heads=h, q_heads=None if qshape is None else qshape[1], head_dim=d, n_tokens=t, batch=b,
        tensor_sha256={name: tensor_sha256(t) for name, t in sorted(tensors.items())},
    )
    try:
        header = {k: json.dumps(v) for k, v in meta.items()}
    except TypeError as exc:
        raise TypeError(f"metadata values must be JSON-serialisable: {exc}") from None
    # what load_qkv would refuse is not written: the metadata as a reader will see it, against the tensors
    shapes = {name: (_SAFETENSORS_DTYPE[t.dtype], list(t.shape)) for name, t in tensors.items()}
    check_header({k: json.loads(v) for k, v in header.items()}, shapes, f"{path} (not written)")
    from safetensors.torch import save_file

    path = check_output_path(path, "path")
    # a temporary file renamed over a regular file (never half written); a device or FIFO written through
    return write_output(path, lambda tmp: save_file(tensors, str(tmp), metadata=header))


#: the safetensors dtype name of each ``dtype`` a header may state
_DTYPE_NAMES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
#: the keys of one ``attention`` entry (any other would be a rule kvstats ignores: refused)
_ATTENTION_KEYS = frozenset({"layer", "scaling", "softcap", "sliding_window"})
_HEX = frozenset("0123456789abcdef")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_positive(x) -> bool:
    """A finite real number > 0 (a bool is not a number here)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _is_sha256(x) -> bool:
    return isinstance(x, str) and len(x) == 64 and set(x) <= _HEX


def check_header(meta: Mapping[str, Any], headers: Mapping[str, tuple[str, list[int]]], where: str) -> list[int]:
    """Validate a capture's metadata against its tensors' headers ``{name: (safetensors dtype, shape)}``; return
    the stored layer indices. Every refusal is a ValueError naming ``where`` (the file) and the field.

    What is checked, field by field (a bool is never an int or a number):

    * ``layers``: distinct ints ≥ 0, at least one; ``n_layers`` (when given) an int > max(layers);
    * ``batch``, ``kv_heads``, ``n_tokens``, ``head_dim``: ints ≥ 1; ``q_heads``: None (no queries stored) or
      a multiple of ``kv_heads``; every stored layer has k and v (and q iff ``q_heads``), each a float tensor
      of shape ``[batch, heads, n_tokens, head_dim]``; ``dtype`` (when given) the tensors' dtype;
    * ``model``: a non-empty str; ``text_sha256`` (when given): None or a sha256;
    * ``attn_scaling`` (when given) and each ``attention`` entry's ``scaling``: finite and > 0; ``softcap``:
      None or finite and > 0; ``sliding_window``: None or an int ≥ 1; ``layer``: an int < n_layers, once;
      no other key (a rule kvstats does not implement, such as sinks, would be ignored);
    * ``documents`` (when given): a non-empty list of token ranges ``0 ≤ start < stop ≤ n_tokens``, disjoint;
      with several, each names its text by a ``text_sha256``, all distinct (documents are the independent
      units of an evaluation: one text twice is not two documents).
    """
    layers = _check_layers(meta, where)
    _check_tensors(meta, headers, layers, where)
    if not isinstance(meta.get("model"), str) or not meta["model"]:
        raise ValueError(f"{where}: metadata 'model' must be a non-empty str, got {meta.get('model')!r}")
    if meta.get("text_sha256") is not None and not _is_sha256(meta["text_sha256"]):
        raise ValueError(f"{where}: metadata 'text_sha256' must be None or a sha256 (64 hex digits), "
                         f"got {meta['text_sha256']!r}")
    _check_attention(meta, where)
    _check_documents(meta, where)
    return layers


def _check_layers(meta: Mapping[str, Any], where: str) -> list[int]:
    layers = meta.get("layers")
    if not isinstance(layers, list) or not all(_is_int(i) and i >= 0 for i in layers):
        raise ValueError(f"{where}: metadata 'layers' must be a list of layer indices (ints >= 0), got {layers!r}")
    if not layers:
        raise ValueError(f"{where}: metadata 'layers' is empty: the capture holds no layer")
    if len(set(layers)) != len(layers):
        repeated = sorted({i for i in layers if layers.count(i) > 1})
        raise ValueError(f"{where}: metadata 'layers' names layers {repeated} more than once (they would be "
                         "weighted twice): a damaged or hand-edited file")
    n_layers = meta.get("n_layers", max(layers) + 1)
    if not _is_int(n_layers) or n_layers <= max(layers):
        raise ValueError(f"{where}: metadata 'n_layers' must be an int above every stored layer index "
                         f"(max {max(layers)}), got {n_layers!r}")
    return list(layers)


def _check_tensors(meta: Mapping[str, Any], headers: Mapping[str, tuple[str, list[int]]], layers: list[int],
                   where: str) -> None:
    """The shape fields, and every stored tensor a float tensor of the shape they state: a damaged header can
    otherwise still parse (a dtype flipped from F32 to I32, a shape permuted, ``batch: true``)."""
    fields = ("batch", "kv_heads", "n_tokens", "head_dim")
    if not all(_is_int(meta.get(f)) and meta[f] > 0 for f in fields):
        got = {f: meta.get(f) for f in fields}
        raise ValueError(f"{where}: metadata must give positive ints {fields}, got {got}")
    q_heads = meta.get("q_heads")
    if q_heads is not None and not (_is_int(q_heads) and q_heads > 0 and q_heads % meta["kv_heads"] == 0):
        raise ValueError(f"{where}: metadata 'q_heads' must be None (no queries stored) or a positive multiple of "
                         f"kv_heads = {meta['kv_heads']}, got {q_heads!r}")
    parts = ("q", "k", "v") if q_heads is not None else ("k", "v")
    missing = [_name(i, part) for i in layers for part in parts if _name(i, part) not in headers]
    if missing:
        raise ValueError(f"{where}: incomplete capture, tensors {missing[:4]} are missing"
                         + (" (metadata 'q_heads' says queries are stored)" if missing[0].endswith(".q") else ""))
    if q_heads is None and (queries := [_name(i, "q") for i in layers if _name(i, "q") in headers]):
        raise ValueError(f"{where}: metadata 'q_heads' is None (no queries) but tensors {queries[:4]} are stored")
    dtype = meta.get("dtype")
    if dtype is not None and (not isinstance(dtype, str) or dtype not in _DTYPE_NAMES):
        raise ValueError(f"{where}: metadata 'dtype' must be None or one of {sorted(_DTYPE_NAMES)}, got {dtype!r}")
    expected = {"k": [meta["batch"], meta["kv_heads"], meta["n_tokens"], meta["head_dim"]]}
    expected["v"] = expected["k"]
    if q_heads is not None:
        expected["q"] = [meta["batch"], q_heads, meta["n_tokens"], meta["head_dim"]]
    for name, (kind, shape) in sorted(headers.items()):
        part = name.rsplit(".", 1)[-1]
        if kind not in _FLOAT_DTYPES:
            raise ValueError(f"{where}: tensor {name!r} has dtype {kind}, not a float type "
                             f"({', '.join(_FLOAT_DTYPES)}): a damaged or foreign file")
        if dtype is not None and kind != _DTYPE_NAMES[dtype]:
            raise ValueError(f"{where}: tensor {name!r} has dtype {kind}, the metadata 'dtype' states {dtype!r}")
        if part in expected and list(shape) != expected[part]:
            raise ValueError(f"{where}: tensor {name!r} has shape {list(shape)}, the metadata states "
                             f"{expected[part]}: a damaged file")


def _check_attention(meta: Mapping[str, Any], where: str) -> None:
    if "attn_scaling" in meta and not _is_positive(meta["attn_scaling"]):
        raise ValueError(f"{where}: metadata 'attn_scaling' must be a finite number > 0 (or absent: 1/sqrt(d)), "
                         f"got {meta['attn_scaling']!r}")
    entries = meta.get("attention")
    if entries is None:
        return
    if not isinstance(entries, list):
        raise ValueError(f"{where}: metadata 'attention' must be a list of per-layer rules, got {entries!r}")
    n_layers, seen = meta.get("n_layers", max(meta["layers"]) + 1), set()
    for j, a in enumerate(entries):
        field = f"metadata 'attention'[{j}]"
        if not isinstance(a, dict):
            raise ValueError(f"{where}: {field} must be an object, got {a!r}")
        if set(a) - _ATTENTION_KEYS:
            raise ValueError(f"{where}: {field} holds {sorted(set(a) - _ATTENTION_KEYS)}, rules kvstats does not "
                             f"implement (known: {sorted(_ATTENTION_KEYS)}): they would be ignored")
        layer = a.get("layer")
        if not (_is_int(layer) and 0 <= layer < n_layers) or layer in seen:
            raise ValueError(f"{where}: {field}['layer'] must be a layer index in [0, {n_layers}) named once, "
                             f"got {layer!r}")
        seen.add(layer)
        if not _is_positive(a.get("scaling")):
            raise ValueError(f"{where}: {field}['scaling'] must be a finite number > 0, got {a.get('scaling')!r}")
        if a.get("softcap") is not None and not _is_positive(a["softcap"]):
            raise ValueError(f"{where}: {field}['softcap'] must be None (no soft cap) or a finite number > 0, "
                             f"got {a['softcap']!r}")
        slide = a.get("sliding_window")
        if slide is not None and not (_is_int(slide) and slide > 0):
            raise ValueError(f"{where}: {field}['sliding_window'] must be None (full attention) or an int >= 1, "
                             f"got {slide!r}")


def _check_documents(meta: Mapping[str, Any], where: str) -> None:
    docs = meta.get("documents")
    if docs is None:
        return
    if not isinstance(docs, list) or not docs:
        raise ValueError(f"{where}: metadata 'documents' must be a non-empty list of token ranges (or absent: one "
                         f"text), got {docs!r}")
    n = meta["n_tokens"]
    for j, doc in enumerate(docs):
        field = f"metadata 'documents'[{j}]"
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: {field} must be an object with 'start' and 'stop', got {doc!r}")
        start, stop = doc.get("start"), doc.get("stop")
        if not (_is_int(start) and _is_int(stop) and 0 <= start < stop <= n):
            raise ValueError(f"{where}: {field} must have ints 0 <= 'start' < 'stop' <= n_tokens = {n}, got "
                             f"start={start!r}, stop={stop!r}")
        digest = doc.get("text_sha256")
        if digest is None and len(docs) > 1 or digest is not None and not _is_sha256(digest):
            raise ValueError(f"{where}: {field}['text_sha256'] must be the sha256 of its text (64 hex digits)"
                             + (": several documents must each name their text" if len(docs) > 1 else "")
                             + f", got {digest!r}")
        if doc.get("source") is not None and not isinstance(doc["source"], str):
            raise ValueError(f"{where}: {field}['source'] must be None or a str, got {doc['source']!r}")
    order = sorted(range(len(docs)), key=lambda j: docs[j]["start"])
    for a, b in zip(order, order[1:]):
        if docs[b]["start"] < docs[a]["stop"]:
            raise ValueError(f"{where}: metadata 'documents'[{a}] and [{b}] overlap (tokens {docs[a]['start']}.."
                             f"{docs[a]['stop']} and {docs[b]['start']}..{docs[b]['stop']}): documents must be "
                             "disjoint")
    first: dict[str, int] = {}
    for j, doc in enumerate(docs):
        if doc.get("text_sha256") is not None and first.setdefault(doc["text_sha256"], j) != j:
            raise ValueError(f"{where}: metadata 'documents'[{first[doc['text_sha256']]}] and [{j}] have one "
                             "text_sha256: one text listed twice is not two independent documents")


class QKVFile:
    """A lazily read capture file: the header at open, one tensor per access (memory-mapped).

    Attributes:
        path: the file.
        metadata: dict of the stored metadata (JSON-decoded).
        layers: the stored layer indices.
    """

    def __init__(self, path: str | os.PathLike):
        from safetensors import safe_open

        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"path {str(self.path)!r} is a folder, not a capture file")
        if not self.path.is_file():
            raise FileNotFoundError(f"path {str(self.path)!r} does not exist or is not a file")
        try:
            with safe_open(str(self.path), framework="pt") as f:  # checks the header covers the whole file
                raw = f.metadata() or {}
                self._names = set(f.keys())
                headers = {name: (f.get_slice(name).get_dtype(), list(f.get_slice(name).get_shape()))
                           for name in self._names}
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError
            raise ValueError(f"{self.path}: not a readable safetensors file, truncated or corrupt ({exc})") from None
        try:
            self.metadata = {k: json.loads(v) for k, v in raw.items()}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.path}: metadata is not kvstats JSON ({exc})") from None
        fmt = self.metadata.get("format")
        if isinstance(fmt, str) and fmt in _OLD_FORMATS:
            raise ValueError(f"{self.path}: format {fmt!r} is an older kvstats capture: {_OLD_FORMATS[fmt]}; "
                             f"capture it again (kvstats capture) to get a {FORMAT!r} file")
        if fmt != FORMAT:
            raise ValueError(f"{self.path}: format is {fmt!r}, expected {FORMAT!r}")
        self.layers: list[int] = check_header(self.metadata, headers, str(self.path))
        digests = self.metadata.get("tensor_sha256")
        if not isinstance(digests, dict) or set(digests) != self._names or not all(
                isinstance(v, str) and len(v) == 64 for v in digests.values()):
            raise ValueError(f"{self.path}: metadata 'tensor_sha256' must give one sha256 per stored tensor "
                             f"({len(self._names)}), got {type(digests).__name__}"
                             + (f" for {sorted(digests)[:4]}" if isinstance(digests, dict) else "")
                             + ": a damaged or hand-edited file")
        self._digests: dict[str, str] = digests
        self._verified: dict[str, tuple] = {}  # tensor name -> the file's (mtime, size, inode) when it was checked

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        m = self.metadata
        return (f"QKVFile({str(self.path)!r}, model={m.get('model')!r}, layers={len(self.layers)}, "
                f"q_heads={m.get('q_heads')}, kv_heads={m.get('kv_heads')}, tokens={m.get('n_tokens')}, "
                f"d={m.get('head_dim')})")

    def _get(self, layer: int, part: str) -> torch.Tensor:
        from safetensors import safe_open

        if layer not in self.layers:
            raise ValueError(f"layer must be one of the stored layers {self.layers}, got {layer!r}")
        name = _name(layer, part)
        if name not in self._names:
            raise ValueError(f"{self.path} stores no {part!r} tensors (layer {layer})")
        with safe_open(str(self.path), framework="pt") as f:
            t = f.get_tensor(name)
        stamp = self.path.stat()
        stamp = (stamp.st_mtime_ns, stamp.st_size, stamp.st_ino)
        if self._verified.get(name) == stamp:  # checked once per tensor while the file stays the same
            return t
        if tensor_sha256(t) != self._digests[name]:
            raise ValueError(f"{self.path}: tensor {name!r} (layer {layer}, {part}) does not match its stored sha256: "
                             "the file was damaged or edited after it was written; capture it again")
        self._verified[name] = stamp
        return t

    def keys(self, layer: int) -> torch.Tensor:
        """Keys of ``layer`` after RoPE: ``[batch, kv_heads, tokens, d]``."""
        return self._get(layer, "k")

    def values(self, layer: int) -> torch.Tensor:
        """Values of ``layer``: ``[batch, kv_heads, tokens, d]``."""
        return self._get(layer, "v")

    def queries(self, layer: int) -> torch.Tensor:
        """Queries of ``layer`` after RoPE, one per query head: ``[batch, q_heads, tokens, d]``."""
        return self._get(layer, "q")

    def layer(self, layer: int) -> LayerQKV:
        """All stored tensors of ``layer``."""
        has_q = _name(layer, "q") in self._names
        return LayerQKV(self.queries(layer) if has_q else None, self.keys(layer), self.values(layer))

    def __iter__(self) -> Iterator[LayerQKV]:
        for i in self.layers:
            yield self.layer(i)


def load_qkv(path: str | os.PathLike) -> QKVFile:
    """Open a file written by :func:`save_qkv` (or ``kvstats capture``) for lazy per-layer reads."""
    return QKVFile(path)
