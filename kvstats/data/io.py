"""Q/K/V tensors per layer in one safetensors file, with metadata; lazy loading by layer.

File layout (format ``kvstats-qkv/1``): tensors ``layer.{i}.q`` ``[batch, q_heads, tokens, d]`` (optional),
``layer.{i}.k`` and ``layer.{i}.v`` ``[batch, kv_heads, tokens, d]``; the safetensors header metadata holds
one JSON-encoded value per key: ``format``, ``model``, ``layers`` (the stored layer indices), ``n_layers``,
``q_heads``, ``kv_heads``, ``head_dim``, ``n_tokens``, ``rope`` (dict: how positions were encoded —
queries and keys are stored *after* RoPE, as the attention kernel sees them), ``text_sha256``,
``attn_scaling`` (the softmax scale the model uses), ``tensor_sha256`` (``{tensor name: sha256 of its bytes}``,
checked on every read: a flipped data byte or two tensors' offsets swapped are refused naming the tensor) and
anything else the caller passes. Files of the first format (``kvstats-qkv/1``, no digests) are refused: their
contents cannot be checked; capture them again.

    save_qkv("cap.safetensors", [(q0, k0, v0), (q1, k1, v1)], {"model": "mine", "rope": {...}})
    cap = load_qkv("cap.safetensors")        # reads only the header
    cap.metadata["n_tokens"]; cap.keys(5)    # reads layer 5's keys only (memory-mapped)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvstats._files import check_output_path, write_output
from kvstats._validation import check_float_tensor

__all__ = ["FORMAT", "LayerQKV", "QKVFile", "check_output_path", "save_qkv", "load_qkv", "tensor_sha256"]

FORMAT = "kvstats-qkv/2"
#: formats refused with a reason (not a foreign file: an older kvstats wrote it)
_OLD_FORMATS = {"kvstats-qkv/1": "it has no per-tensor digests, so its contents cannot be checked"}
#: safetensors dtype names a capture may hold
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


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
            ``kv_heads``, ``head_dim``, ``n_tokens``, ``layers``) are filled in from the tensors.

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
    from safetensors.torch import save_file

    path = check_output_path(path, "path")
    # a temporary file renamed over a regular file (never half written); a device or FIFO written through
    return write_output(path, lambda tmp: save_file(tensors, str(tmp), metadata=header))


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
        if fmt in _OLD_FORMATS:
            raise ValueError(f"{self.path}: format {fmt!r} is an older kvstats capture: {_OLD_FORMATS[fmt]}; "
                             f"capture it again (kvstats capture) to get a {FORMAT!r} file")
        if fmt != FORMAT:
            raise ValueError(f"{self.path}: format is {fmt!r}, expected {FORMAT!r}")
        layers = self.metadata.get("layers")
        if not isinstance(layers, list) or not all(isinstance(i, int) for i in layers):
            raise ValueError(f"{self.path}: metadata 'layers' must be a list of layer indices, got {layers!r}")
        if not layers:
            raise ValueError(f"{self.path}: metadata 'layers' is empty: the capture holds no layer")
        if len(set(layers)) != len(layers):
            repeated = sorted({i for i in layers if layers.count(i) > 1})
            raise ValueError(f"{self.path}: metadata 'layers' names layers {repeated} more than once (they would "
                             "be weighted twice): a damaged or hand-edited file")
        missing = [_name(i, part) for i in layers for part in ("k", "v") if _name(i, part) not in self._names]
        if missing:
            raise ValueError(f"{self.path}: incomplete capture, tensors {missing[:4]} are missing")
        self.layers: list[int] = list(layers)
        self._check_tensor_headers(headers)
        digests = self.metadata.get("tensor_sha256")
        if not isinstance(digests, dict) or set(digests) != self._names or not all(
                isinstance(v, str) and len(v) == 64 for v in digests.values()):
            raise ValueError(f"{self.path}: metadata 'tensor_sha256' must give one sha256 per stored tensor "
                             f"({len(self._names)}), got {type(digests).__name__}"
                             + (f" for {sorted(digests)[:4]}" if isinstance(digests, dict) else "")
                             + ": a damaged or hand-edited file")
        self._digests: dict[str, str] = digests
        self._verified: dict[str, tuple] = {}  # tensor name -> the file's (mtime, size, inode) when it was checked

    def _check_tensor_headers(self, headers: dict[str, tuple[str, list[int]]]) -> None:
        """Every stored tensor ({name: (dtype, shape)} from the file's header) is a float tensor of the shape the
        metadata states ([batch, heads, tokens, d]): a damaged header can otherwise still parse (e.g. a dtype
        flipped from F32 to I32 or a shape permuted)."""
        m = self.metadata
        fields = ("batch", "kv_heads", "n_tokens", "head_dim")
        if not all(isinstance(m.get(f), int) and m.get(f) > 0 for f in fields):
            raise ValueError(f"{self.path}: metadata must give positive ints {fields}, got "
                             f"{ {f: m.get(f) for f in fields} }")
        expected = {"k": [m["batch"], m["kv_heads"], m["n_tokens"], m["head_dim"]]}
        expected["v"] = expected["k"]
        if m.get("q_heads") is not None:
            expected["q"] = [m["batch"], m["q_heads"], m["n_tokens"], m["head_dim"]]
        for name, (dtype, shape) in sorted(headers.items()):
            part = name.rsplit(".", 1)[-1]
            if dtype not in _FLOAT_DTYPES:
                raise ValueError(f"{self.path}: tensor {name!r} has dtype {dtype}, not a float type "
                                 f"({', '.join(_FLOAT_DTYPES)}): a damaged or foreign file")
            if part in expected and shape != expected[part]:
                raise ValueError(f"{self.path}: tensor {name!r} has shape {shape}, the metadata states "
                                 f"{expected[part]}: a damaged file")

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
