"""A scheme per layer for a model evaluation, by name, and the calibration cache of the calibrated ones.

    schemes = layer_schemes("kqv", 4, seed, 30, dim=64, rows="srht")    # layer i -> its own Scheme
    logits, cache = quantized_logits(model, schemes, ids)               # kvstats.evaluation.model_engine

The names (:data:`LAYER_SCHEMES`): ``kv``, ``kqv``, ``qkqv``, ``minmax`` (:func:`kvstats.scheme`, their QJL
stages on the sketch ``rows``); ``mse``: TurboQuant_mse on K and on V, independent seeds; ``identity``: lossless
(the control); ``nova``: NOVA-KV calibrated per layer; ``qjl``: QJL's own cache (``kvstats.scheme("qjl_cache")``,
keys m = n·d sign bits with ``outliers`` outlier channels per layer in their own sketch of ``rows_per_outlier``
rows each; values min-max per token). Layer ``i`` gets the seed ``spawn_seeds(seed, layers)[i]``
(:func:`kvstats._random.spawn_seeds`; NOVA-KV: one per calibrated layer).

**Calibration.** ``nova`` and ``qjl`` are fitted on the Q/K/V of the model they run in (``model``: a shipped model,
by default SmolLM2, :data:`CALIBRATION_MODEL`, through :func:`~kvstats.evaluation.model_engine.shared_model`) over
the calibration document
(:data:`CALIBRATION_TITLE` of :func:`kvstats.data.texts.documents`, its first ``calibration_tokens`` tokens; None:
all of it), captured once per process (:func:`calibration_capture`). QJL's outlier channels of a layer are the
``outliers`` channels of largest mean |k| over it (heads and tokens pooled), as QJL's §4 finds them. NOVA-KV's
k-means fits are an evaluation's largest cost and every worker process that builds NOVA-KV needs them:
:func:`nova_layers` stores them once in kvstats' cache folder (:func:`kvstats.hf.models.cache_dir`), keyed by
:data:`CALIBRATION_VERSION`, the model, the bits, the seed, the token count and the document's text, and reloads
them (a damaged file is fitted again).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable

import torch

__all__ = ["CALIBRATION_MODEL", "CALIBRATION_TITLE", "CALIBRATION_VERSION", "LAYER_SCHEMES", "build_scheme",
           "calibration_capture", "layer_schemes", "nova_layers", "qjl_outlier_channels"]

#: The names :func:`layer_schemes` builds.
LAYER_SCHEMES = ("kv", "kqv", "qkqv", "minmax", "mse", "nova", "qjl", "identity")
#: The calibration document: the first shipped document (never a measured segment of the studies that use it).
CALIBRATION_TITLE = "The Declaration of Independence"
#: The model the calibrated schemes are fitted on (:func:`~kvstats.evaluation.model_engine.shared_model`)
CALIBRATION_MODEL = "smollm2"
#: The version of the stored NOVA-KV calibrations (a change of the fit changes it, so old files are not reused).
CALIBRATION_VERSION = "4"


def build_scheme(name: str, bits: int, seed: int, *, dim: int, rows: str | None = None):
    """One layer's scheme: ``mse``, TurboQuant_mse on K and on V (independent seeds spawned from ``seed``), as a
    :class:`kvstats.schemes.Scheme`; any other name :func:`kvstats.scheme` builds (``rows``: its QJL stages'
    sketch)."""
    from kvstats._random import spawn_seeds
    from kvstats.quant.quantizers import quantizer
    from kvstats.quant.schemes import Scheme, scheme

    if name == "mse":
        ks, vs = spawn_seeds(seed, 2)
        return Scheme("mse", bits, quantizer("turbo_mse", bits=bits, dim=dim, seed=ks),
                      quantizer("turbo_mse", bits=bits, dim=dim, seed=vs), seed)
    return scheme(name, bits=bits, dim=dim, seed=seed, **({} if rows is None else {"rows": rows}))


def layer_schemes(name: str, bits: int, seed: int, layers: int, *, dim: int, rows: str | None = None,
                  calibration_tokens: int | None = None, outliers: int = 4, rows_per_outlier: int = 8,
                  model: str = CALIBRATION_MODEL) -> Callable[[int], object]:
    """``layer -> Scheme`` for a :class:`~kvstats.cache.KVStatsCache` of ``layers`` layers: ``name`` at ``bits``
    (module doc), layer ``i`` seeded by ``spawn_seeds(seed, layers)[i]``; ``nova`` and ``qjl`` calibrated on
    ``model``'s Q/K/V over the first ``calibration_tokens`` tokens of the calibration document."""
    from kvstats._random import spawn_seeds
    from kvstats.hf.cache import IdentityScheme

    if name == "identity":
        lossless = IdentityScheme(dim)
        return lambda i: lossless
    if name == "nova":
        built = nova_layers(bits, seed, calibration_tokens, model)
    elif name == "qjl":
        from kvstats.quant.schemes import scheme

        channels = qjl_outlier_channels(calibration_tokens, outliers, model)
        built = [scheme("qjl_cache", bits=bits, dim=dim, seed=s, outliers=list(channels[i]),
                        outlier_m=rows_per_outlier * len(channels[i]))
                 for i, s in enumerate(spawn_seeds(seed, layers))]
    else:
        built = [build_scheme(name, bits, s, dim=dim, rows=rows) for s in spawn_seeds(seed, layers)]
    return lambda i: built[i]


@functools.lru_cache(maxsize=2)
def calibration_capture(tokens: int | None, model: str = CALIBRATION_MODEL):
    """The Q/K/V (:func:`kvstats.hf.capture.capture_qkv`, sdpa) of the shared ``model`` over the calibration
    document's first ``tokens`` tokens (None: all of it), once per process. The model's attention implementation
    is given back after the capture: a cell that builds its schemes (and so calibrates) after setting "kvstats"
    must still run on the estimator path, not silently on sdpa."""
    from kvstats.data.texts import documents
    from kvstats.evaluation.model_engine import set_attention, shared_model
    from kvstats.hf.capture import capture_qkv

    lm, tokenizer, _ = shared_model(model)
    before = lm.config._attn_implementation
    set_attention(lm, "sdpa")
    ids = tokenizer(documents()[CALIBRATION_TITLE], return_tensors="pt").input_ids
    try:
        return capture_qkv(lm, input_ids=ids[:, :tokens] if tokens else ids)
    finally:
        set_attention(lm, before)


@functools.lru_cache(maxsize=4)
def qjl_outlier_channels(tokens: int | None, count: int, model: str = CALIBRATION_MODEL) -> tuple[tuple[int, ...], ...]:
    """Per layer, the ``count`` channels of largest mean |k| over the calibration capture (heads and tokens
    pooled; QJL's figure 2 sorts channels by mean magnitude over tokens), in increasing order."""
    cap = calibration_capture(tokens, model)
    return tuple(tuple(sorted(torch.argsort(cap.keys(i).double().abs().mean(dim=(0, 1, 2)), descending=True)
                              [:count].tolist())) for i in range(len(cap)))


def _calibration_folder():
    from kvstats.hf.models import cache_dir

    return cache_dir()


@functools.lru_cache(maxsize=4)
def nova_layers(bits: int, seed: int, tokens: int | None, model: str = CALIBRATION_MODEL) -> tuple:
    """NOVA-KV (:meth:`kvstats.schemes.NovaScheme.calibrate`) fitted per layer on the calibration capture, layer
    ``i`` with the seed ``spawn_seeds(seed, layers)[i]``; stored in kvstats' cache folder and reloaded (module
    doc), and kept per process."""
    from kvstats._random import spawn_seeds
    from kvstats.data.texts import documents
    from kvstats.quant.schemes import NovaScheme

    text = documents()[CALIBRATION_TITLE]
    key = hashlib.sha256(repr((CALIBRATION_VERSION, model, bits, seed, tokens, text)).encode())
    path = _calibration_folder() / f"nova_calibration_{key.hexdigest()[:16]}.pt"
    if path.is_file():
        try:
            return tuple(torch.load(path, weights_only=False))
        except Exception:  # noqa: BLE001 - a damaged cache file is refitted below
            pass
    cap = calibration_capture(tokens, model)
    seeds = spawn_seeds(seed, len(cap))
    built = tuple(NovaScheme.calibrate(cap.queries(i), cap.keys(i), cap.values(i), bits=bits, seed=seeds[i])
                  for i in range(len(cap)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(list(built), tmp)
    tmp.replace(path)
    return built
