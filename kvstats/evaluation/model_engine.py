"""Output-level evaluation of a quantizer on a language model: what the field decides on, with intervals.

    ev = kvstats.evaluate("kqv", bits=4, model="smollm2")      # teacher-forced segments of the shipped documents
    print(ev.table())                                          # KL tail as llama.cpp reports it, top-1, perplexity

**The engine.** Every evaluation on a model runs these pieces: ``kvstats.evaluate(model=...)`` and ``kvstats
sensitivity`` (through :func:`model_source` and :func:`model_unit`), the studies end_to_end, retrieval and
model_damage. The model (:func:`model_source` loads it for one evaluation, :func:`shared_model` once per
process); the units, disjoint segments of documents taken first-per-document (:func:`document_segments`) or
round-robin over the documents (:func:`round_robin_segments`); the reference forward, the model's own attention
with no cache (:func:`plain_logits`; :func:`shared_reference` computes a batch of segments once per process); the
quantized forward through a :class:`~kvstats.cache.KVStatsCache` with a scheme per layer, each with its own K and V
quantizers, on the estimator path (:func:`quantized_logits`); the per-layer schemes and the calibration cache in
:mod:`kvstats.evaluation.layer_schemes`.

**Units.** Segment ``j`` of document ``i``: the first ``segment`` tokens of each shipped document
(:func:`kvstats.data.texts.documents`, 25 public-domain texts of varied genre), or its first
``segments_per_document`` disjoint segments. Each segment is fed from position 0, teacher-forced, twice: through
the model's own attention with no cache (the reference) and through a :class:`~kvstats.cache.KVStatsCache` of the
scheme on the estimator path (``attn_implementation="kvstats"``: the logits the scheme's estimator gives), which
for a prefill equals token-by-token decoding (docs/cache.md). Documents are the independent units: with several
segments per document, per-document means are what the t intervals average, and the pooled statistics resample
documents, then segments (:func:`kvstats.stats.cluster_bootstrap_ci`).

**Metrics** (fp64, :func:`kvstats.hf.baselines.output_metrics`):

* per unit: ``out_kl`` — mean next-token KL(p_exact ‖ p_quantized) over the segment's tokens (nats);
  ``top1`` — fraction of tokens whose top-1 next token agrees (llama.cpp's "same top p"); ``delta_nll`` — mean
  change of the next-token negative log-likelihood of the text; ``bits_total`` — bits per element the cache held
  (``KVStatsCache.memory()``, measured: the codes and the exact window together), ``bits_codes`` — those of the
  quantized tokens alone (``code_bits_per_element``; nan when the window holds every token); per layer the
  attention KL and top-5 recall of the estimator's logits;
* pooled over every token: the KL tail as llama.cpp's ``--kl-divergence`` reports it (mean, median, p90, p95,
  p99, p99.9, max), top-1 agreement, and the perplexity ratio ``exp(mean NLL_quantized − mean NLL_exact)``, each
  with a cluster bootstrap CI over documents from :data:`POOLED_MIN_DOCUMENTS` documents on (below, without one:
  the bootstrap over so few clusters covers far less than its level).
"""


from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstats.measure.stats._options import InferenceOptions, inference_options

__all__ = ["DEFAULT_SEGMENT", "MODEL_METRICS", "NO_INTERVAL_OF_A_MAXIMUM", "POOLED_COVERAGE", "POOLED_MIN_DOCUMENTS",
           "TAIL", "ModelSource", "coverage_at", "document_segments", "model_source", "model_unit", "plain_logits",
           "pooled_summary", "quantized_logits", "reference_logits", "round_robin_segments", "set_attention",
           "shared_model", "shared_reference", "unit_summary", "withheld_reason"]

#: Tokens per segment by default: 24 of the 25 shipped documents hold at least this many (with SmolLM2's tokenizer).
DEFAULT_SEGMENT = 128
#: The per-unit metrics (means over a segment's tokens), tested in a comparison.
MODEL_METRICS = ("out_kl", "top1", "delta_nll")
#: The KL statistics llama.cpp's perplexity tool prints, over every token: name -> quantile (None: mean).
TAIL = {"mean": None, "median": 0.5, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p99.9": 0.999, "max": 1.0}
#: Simulated coverage (%) of the nominal 95% cluster BCa interval by number of documents: the lowest and highest over
#: the pooled mean, median, p90 and p99 of one segment per document, 128 lognormal token values each with a document
#: effect (log-values N(0, 0.5²) + N(0, 1.2²)), 400 data sets of 499 resamples per count
#: (scripts/cluster_bootstrap_coverage.py).
POOLED_COVERAGE = {3: (60.0, 72.2), 4: (71.8, 80.7), 6: (76.2, 85.0), 8: (84.8, 90.2), 10: (84.3, 91.5),
                   12: (87.7, 92.5), 16: (89.0, 94.0), 24: (91.0, 94.5)}
#: The fewest documents whose pooled token statistics get a cluster bootstrap interval; below, each is an estimate
#: without one. From 8 documents the simulated coverage (POOLED_COVERAGE: 85-90%) is within a few points of that at
#: 24 (91-94.5%); below it falls fast (76-85% at 6, 72-81% at 4, 60-72% at 3): intervals far narrower than their
#: level claims.
POOLED_MIN_DOCUMENTS = 8


@dataclass
class ModelSource:
    """A loaded model and the segments that are the evaluation's units.

    Attributes:
        model, tokenizer, name: from :func:`kvstats.hf.capture.load_model`.
        dims: :func:`kvstats.cache.model_dims` of its config (head_dim, kv_heads, q_heads, layers).
        segments: ``(document index, title, ids [1, T])`` per unit.
        skipped: titles of the documents shorter than one segment.
        identity: what identifies the model and the text (for the unit store).
    """

    model: Any
    tokenizer: Any
    name: str
    dims: dict
    segments: list[tuple[int, str, torch.Tensor]]
    skipped: list[str]
    identity: dict = field(default_factory=dict)


def shared_model(model: str = "smollm2", dtype: torch.dtype = torch.float32):
    """``(model, tokenizer, name)`` of :func:`kvstats.hf.models.load_model`, loaded once per process: what the cells
    of a study share (each worker process loads it once). Callers that change its attention implementation set it
    again before they rely on it (:func:`set_attention`)."""
    return _shared_model(str(model), dtype)


@functools.lru_cache(maxsize=2)
def _shared_model(model: str, dtype: torch.dtype):  # one key per model, however the arguments are passed
    from kvstats.hf.models import load_model

    return load_model(model, dtype=dtype)


def set_attention(model, name: str) -> None:
    """Switch ``model`` to the attention implementation ``name`` (``"sdpa"``; ``"kvstats"``, registered first: the
    estimator path) unless it already runs it."""
    from kvstats.hf.cache import register_attention

    register_attention()
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)


def _check_size(size: int) -> None:
    if size < 2:
        raise ValueError(f"size must be at least 2 tokens, got {size}")


def document_segments(lengths: dict[str, int], size: int, per_document: int | None = None) -> list[tuple[str, int]]:
    """Disjoint segments of ``size`` tokens, each inside one document, document by document: segment ``j`` of
    document ``t`` is ``(t, j * size)`` for ``j < min(lengths[t] // size, per_document)`` (None: every one); a
    document shorter than ``size`` gives none."""
    _check_size(size)
    return [(t, j * size) for t, n in lengths.items()
            for j in range(n // size if per_document is None else min(n // size, per_document))]


def round_robin_segments(lengths: dict[str, int], size: int, count: int | None = None) -> list[tuple[str, int]]:
    """Disjoint segments of ``size`` tokens, each inside one document: (title, first token), taken round-robin
    over the documents (first segment of each, then the second, ...) and cut to ``count`` (None: all)."""
    _check_size(size)
    per_doc = {t: [(t, i * size) for i in range(n // size)] for t, n in lengths.items()}
    order = [seg for k in range(max((len(v) for v in per_doc.values()), default=0))
             for v in per_doc.values() if k < len(v) for seg in [v[k]]]
    if count is not None:
        if len(order) < count:
            raise ValueError(f"the documents hold {len(order)} disjoint segments of {size} tokens, fewer than {count}")
        order = order[:count]
    return order


def _model_identity(model: str | os.PathLike, loaded) -> dict:
    from kvstats.hf.models import SHIPPED_MODELS, shipped_gguf_path

    path = shipped_gguf_path(str(model)) if str(model) in SHIPPED_MODELS else Path(model)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    config = hashlib.sha256(loaded.config.to_json_string().encode()).hexdigest()[:16]
    return {"model": str(model), "files": stats, "config": config, "dtype": str(next(loaded.parameters()).dtype)}


def model_source(model: str | os.PathLike = "smollm2", *, segment: int = DEFAULT_SEGMENT,
                 segments_per_document: int | None = 1, documents: dict[str, str] | None = None,
                 dtype: torch.dtype = torch.float32) -> ModelSource:
    """Load ``model`` and cut ``documents`` (default: the 25 shipped ones) into disjoint segments of ``segment``
    tokens: the first ``segments_per_document`` of each (None: all), documents shorter than one segment skipped."""
    from kvstats._validation import check_int_range
    from kvstats.data.texts import documents as shipped
    from kvstats.hf.cache import model_dims
    from kvstats.hf.capture import load_model

    segment = check_int_range(segment, "segment", 2, 1 << 20)
    if segments_per_document is not None:
        segments_per_document = check_int_range(segments_per_document, "segments_per_document", 1, 1 << 20)
    texts = shipped() if documents is None else dict(documents)
    if not texts:
        raise ValueError("documents is empty: nothing to evaluate on")
    lm, tokenizer, name = load_model(model, dtype=dtype)
    limit = getattr(lm.config, "max_position_embeddings", None)
    if limit is not None and segment > limit:
        raise ValueError(f"segment must be at most the model's max_position_embeddings={limit}, got {segment}")
    ids = {title: tokenizer(text, return_tensors="pt").input_ids for title, text in texts.items()}
    index = {title: i for i, title in enumerate(texts)}
    segments = [(index[t], t, ids[t][:, a:a + segment])
                for t, a in document_segments({t: v.shape[1] for t, v in ids.items()}, segment, segments_per_document)]
    skipped = [t for t, v in ids.items() if v.shape[1] < segment]
    if len({doc for doc, _, _ in segments}) < 2:
        raise ValueError(f"segments of {segment} tokens come from fewer than 2 documents ({len(texts)} given, "
                         f"{len(skipped)} shorter than a segment): use a smaller segment")
    digest = hashlib.sha256(json.dumps(list(texts.items())).encode()).hexdigest()[:16]
    identity = _model_identity(model, lm) | {"documents": digest, "segment": segment,
                                             "segments_per_document": segments_per_document}
    return ModelSource(lm, tokenizer, name, model_dims(lm.config), segments, skipped, identity)


def plain_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The model's own forward of ``ids`` [B, T] with no cache (its attention implementation as set): fp32 logits
    [B, T, V] on the CPU."""
    with torch.inference_mode():
        return model(ids.to(next(model.parameters()).device)).logits.float().cpu()


def shared_reference(segments, model: str = "smollm2") -> torch.Tensor:
    """The reference logits [B, T, V] of equally long segments (B sequences of T token ids) through
    :func:`shared_model`'s sdpa attention with no cache, in one batched forward, computed once per process (a
    batched fp32 forward rounds apart from one segment at a time: every cell compared with it shares it)."""
    return _shared_reference(tuple(map(tuple, segments)), str(model))


@functools.lru_cache(maxsize=2)
def _shared_reference(segments: tuple[tuple[int, ...], ...], model: str) -> torch.Tensor:
    lm = shared_model(model)[0]
    set_attention(lm, "sdpa")
    return plain_logits(lm, torch.tensor(segments))


def quantized_logits(model, scheme, ids: torch.Tensor, *, full_precision_window: int = 0, record: bool = True):
    """``ids`` [B, T] teacher-forced through a :class:`~kvstats.cache.KVStatsCache` of ``scheme`` (one Scheme for
    every layer, or a callable ``layer -> Scheme``: each layer its own K and V quantizers) keeping the last
    ``full_precision_window`` tokens exact, on the estimator path (verified after the forward; the model's
    attention implementation is given back): ``(fp32 logits [B, T, V] on the CPU, the cache)``; ``record``: the
    cache records each layer's attention KL and top-5 recall."""
    from kvstats.hf.cache import KVStatsCache, cache_kwargs, use_estimator_attention

    previous = model.config._attn_implementation
    cache = KVStatsCache(scheme, full_precision_window, record_attention=record)
    try:
        use_estimator_attention(model)
        with torch.inference_mode():
            logits = model(ids.to(next(model.parameters()).device), **cache_kwargs(model, cache),
                           use_cache=True).logits.float().cpu()
        cache.require_estimator_path(model)  # the header says "on the estimator path": verified, not assumed
    finally:
        model.set_attn_implementation(previous)
    return logits, cache


def reference_logits(source: ModelSource, ids: torch.Tensor) -> tuple[torch.Tensor, float | None]:
    """The reference logits of a segment and the lossless floor: for an fp32 model, the model's own attention with
    no cache (the kvstats path with a lossless scheme reproduces it to a next-token KL of ~1e-11, tested), floor
    None; for an fp16/bf16 model, the kvstats path with a lossless scheme (it accumulates in fp32 where the model's
    sdpa rounds in its dtype, a difference that is not the quantizer's), and the floor = the mean next-token KL
    between the two, reported beside the results."""
    from kvstats.hf.baselines import output_metrics
    from kvstats.hf.cache import IdentityScheme

    plain = plain_logits(source.model, ids)
    if next(source.model.parameters()).dtype in (torch.float32, torch.float64):
        return plain, None
    lossless, _ = quantized_logits(source.model, IdentityScheme(source.dims["head_dim"]), ids, record=False)
    return lossless, float(output_metrics(plain, lossless, ids)["out_kl"].mean())


def model_unit(source: ModelSource, scheme, ids: torch.Tensor, *, full_precision_window: int = 0,
               reference: torch.Tensor | None = None, record: bool = True) -> dict[str, Any]:
    """The metrics of one segment ``ids`` [1, T] (module doc): the reference pass (:func:`reference_logits`, or
    ``reference`` logits computed before) and the quantized pass through a KVStatsCache of ``scheme``
    (one Scheme for every layer, or a callable ``layer -> Scheme``) on the estimator path. ``record=False``
    skips the per-layer attention metrics (a third of the quantized pass's time; their lists are then empty)."""
    from kvstats.hf.baselines import output_metrics

    ref = reference_logits(source, ids)[0] if reference is None else reference
    logits, cache = quantized_logits(source.model, scheme, ids, full_precision_window=full_precision_window,
                                     record=record)
    m = output_metrics(ref, logits, ids)
    memory = cache.memory()
    kl, top1 = m["out_kl"][0], m["top1"][0]
    nll, nll_ref = m["nll"][0], m["nll_ref"][0]
    layers = sorted({r.layer for r in cache.attention_records})
    per_layer = {i: [r for r in cache.attention_records if r.layer == i] for i in layers}
    return {"out_kl": float(kl.mean()), "top1": float(top1.mean()), "delta_nll": float((nll - nll_ref).mean()),
            "bits_total": float(memory.bits_per_element), "bits_codes": float(memory.code_bits_per_element),
            "layer_attention_kl": [float(torch.cat([r.kl.flatten() for r in per_layer[i]]).mean()) for i in layers],
            "layer_topk_recall": [float(torch.cat([r.recall.flatten() for r in per_layer[i]]).mean())
                                  for i in layers],
            "tokens_out_kl": kl.tolist(), "tokens_top1": top1.tolist(), "tokens_nll": nll.tolist(),
            "tokens_nll_ref": nll_ref.tolist()}


def _by_document(rows: list[dict], key: str, prefix: str = "") -> np.ndarray:
    """Per-document means of a per-unit metric (documents are the independent units)."""
    docs: dict[int, list[float]] = {}
    for r in rows:
        docs.setdefault(r["document"], []).append(r[prefix + key])
    return np.array([np.mean(v) for v in docs.values()])


def unit_summary(rows: list[dict], *, prefix: str = "", inference: InferenceOptions | None = None,
                 seed: int = 0) -> dict:
    """Each per-unit metric's mean over documents with its CI (:func:`kvstats.stats.mean_ci` at ``inference``'s
    level, its bootstrap seeded by ``inference.seed`` or else ``seed``; always mean_ci's 9999 resamples, cheap at a
    few dozen documents: ``inference.n_resamples`` is the pooled statistics' cluster bootstrap's), and each layer's
    attention KL and top-5 recall likewise."""
    from kvstats.measure import stats

    inference = inference_options(inference)
    level, opts = inference.confidence_level, dict(seed=inference.bootstrap_seed(seed))
    out = {m: stats.mean_ci(_by_document(rows, m, prefix), level, **opts) for m in (*MODEL_METRICS, "bits_total")}
    layers = len(rows[0][prefix + "layer_attention_kl"])
    for name in ("layer_attention_kl", "layer_topk_recall"):
        docs: dict[int, list] = {}
        for r in rows:
            docs.setdefault(r["document"], []).append(r[prefix + name])
        table = np.array([np.mean(v, axis=0) for v in docs.values()])  # [documents, layers]
        out[name] = [stats.mean_ci(table[:, i], level, **opts) for i in range(layers)]
    return out


def _quantile(q: float | None):
    def statistic(x):
        return float(np.mean(x)) if q is None else float(np.quantile(x, q))

    statistic.__name__ = "mean" if q is None else ("max" if q == 1.0 else f"quantile {q:g}")
    return statistic


def _without_interval(values: np.ndarray, statistic, level: float, clusters: int, units: int, reason: str):
    """``statistic`` of the pooled ``values`` as an estimate without an interval (``ci_method`` "none"), ``reason``
    (why none is given) under ``extra["no_interval"]``: in the results file the interval is null beside it."""
    from kvstats.measure.stats import BootstrapResult

    name = f"{statistic.__name__} of the pooled values"
    return BootstrapResult(statistic=float(statistic(values)), pvalue=math.nan, method=name,
                           null_hypothesis="none (estimate)", n=(clusters, units), ci_of=name,
                           confidence_level=level, ci_method="none", extra={"no_interval": reason})


#: Why the maximum has no interval.
NO_INTERVAL_OF_A_MAXIMUM = ("a bootstrap interval of a maximum never exceeds the sample maximum, so it cannot cover: "
                            "the maximum is reported without one")


def coverage_at(documents: int) -> tuple[int, tuple[float, float]]:
    """The simulated coverage of :data:`POOLED_COVERAGE` at the largest simulated count of documents not above
    ``documents`` (coverage grows with the documents: what it is at least), as ``(that count, (low, high))``."""
    if documents < min(POOLED_COVERAGE):
        raise ValueError(f"documents must be at least {min(POOLED_COVERAGE)}, got {documents}")
    at = max(k for k in POOLED_COVERAGE if k <= documents)
    return at, POOLED_COVERAGE[at]


def withheld_reason(documents: int) -> str:
    """Why the pooled statistics of ``documents`` documents (below :data:`POOLED_MIN_DOCUMENTS`) get no interval."""
    return (f"{documents} documents, fewer than {POOLED_MIN_DOCUMENTS} clusters for the cluster bootstrap to hold "
            "its level")


def pooled_summary(rows: list[dict], *, prefix: str = "", inference: InferenceOptions | None = None,
                   seed: int = 0) -> dict:
    """Statistics over every token pooled, each with a cluster BCa bootstrap CI (documents, then segments): the KL
    tail (:data:`TAIL`; the maximum without an interval: none covers), top-1 agreement and the perplexity ratio
    exp(mean NLL − mean NLL_exact). The intervals' coverage is that of a bootstrap over few clusters
    (:data:`POOLED_COVERAGE`); from fewer than :data:`POOLED_MIN_DOCUMENTS` documents every statistic is an estimate
    without an interval (``ci_method`` "none", the reason under ``no_interval``: :func:`withheld_reason`). 1999
    resamples unless ``inference`` says otherwise, seeded by ``inference.seed`` or else ``seed``."""
    from kvstats.measure import stats

    inference = inference_options(inference)
    confidence_level = inference.confidence_level
    docs = [r["document"] for r in rows]
    n_docs = len(set(docs))
    opts = dict(clusters=docs, confidence_level=confidence_level, n_resamples=inference.resamples(1999),
                seed=inference.bootstrap_seed(seed))

    def pooled(units: list[np.ndarray], statistic, reason: str | None = None):
        if reason is None and n_docs >= POOLED_MIN_DOCUMENTS:
            return stats.cluster_bootstrap_ci(units, statistic, **opts)
        return _without_interval(np.concatenate(units), statistic, confidence_level, n_docs, len(rows),
                                 withheld_reason(n_docs) if reason is None else reason)

    kl = [np.array(r[prefix + "tokens_out_kl"]) for r in rows]
    out = {f"kl_{name}": pooled(kl, _quantile(q), NO_INTERVAL_OF_A_MAXIMUM if q == 1.0 else None)
           for name, q in TAIL.items()}
    out["same_top1"] = pooled([np.array(r[prefix + "tokens_top1"]) for r in rows], np.mean)
    delta = [np.array(r[prefix + "tokens_nll"]) - np.array(r[prefix + "tokens_nll_ref"]) for r in rows]

    def ppl_ratio(x):
        return float(math.exp(np.mean(x)))

    out["ppl_ratio"] = pooled(delta, ppl_ratio)
    return out
