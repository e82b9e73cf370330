"""Evaluate a KV-cache quantizer: every metric over independent units, checked, planned, resumable, with provenance.

    import kvstats
    ev = kvstats.evaluate("turbo_mse", bits=4, data="gaussian")     # 16 units
    print(ev.table())                 # mean and CI of each metric over the units
    ev.save("results.json")           # strict JSON with a provenance block

    kvstats evaluate --quantizer turbo_mse --bits 4 --data gaussian --out results.json
    kvstats evaluate --quantizer mypkg.quant:Int4 --bits 4 --data capture.safetensors --compare kqv

**What is evaluated.** A scheme: a K quantizer and a V quantizer. ``quantizer`` names a registered scheme
(``"kqv"``), a registered quantizer (``"turbo_mse"``: used for both K and V, with independent seeds), an
importable ``"module:Class"`` or a class / factory called as ``factory(bits=, dim=, seed=)`` (used for K and V
likewise), or a ready :class:`~kvstats.schemes.Scheme` (then only the data vary between units). Any class with
the protocol of docs/quantizers.md works — a :class:`~kvstats.quantizers.Quantizer` subclass or not — as long
as it passes :func:`kvstats.testing.check_quantizer`.

**Checks before measuring.** Both quantizers of each side are put through ``check_quantizer`` (shapes, dtypes,
determinism per seed, ``nbytes`` against the claimed bits, reconstruction, the cache contract, bad input) and a
failing one is refused with the check's message (:class:`QuantizerCheckError`); ``check=False`` measures it
anyway and the results record that the checks were skipped. A quantizer that needs calibration (``nova``) is
refused uncalibrated: pass a calibrated Scheme.

**Units** (:mod:`kvstats.evaluation.units`): synthetic unit ``i`` is a fresh draw with the unit seed
``unit_seed(seed, i)`` (child i of ``numpy.random.SeedSequence(seed)``) and a scheme built from that seed; a
capture's unit ``i`` is its ``i``-th disjoint window of ``window`` tokens, queries attending causally within it,
averaged over the stored layers, at each layer's own softmax scale and soft cap (the capture's ``attention``
metadata). Windows of one text are disjoint but not independent of the text:
capture several texts into one file (its documents; windows stay inside them) to generalise beyond it.

**Metrics per unit** (means over the unit's queries and vectors): ``attention_kl`` and ``topk_recall`` from the
logits the scheme's own inner-product estimator gives, the six components of :func:`kvstats.measure.error6d.error6d`
(prefixed ``6d_``; its KL uses the decoded keys), and ``bits_total``: the bits per cache element the codes
hold, measured from their bytes (the quantizer's claim, ``bits_per_coordinate``, is shown beside it where it
differs). Each metric's mean over units gets a CI from :func:`kvstats.stats.mean_ci` (Student's t below 5
units; from there on an interval for units with two values or values at 0/1 bounds, else the studentized
bootstrap; a metric constant over the units is printed with no interval).

**Comparison** (``compare=``): a second scheme runs on the same units; each metric of the family — the
distinct, non-constant metrics (:mod:`kvstats.evaluation.comparison`) — is compared with the paired Wilcoxon
signed-rank test, Holm-corrected over the family, with the detectable shift beside each non-significant row.
Before any work the smallest attainable corrected p is computed: a run that cannot conclude says so and how
many units it would need. Comparisons at unequal measured bits are flagged; ``match_bits=True`` runs the
comparator at the largest budget whose measured bits do not exceed the evaluated quantizer's.

**Progress, resume, output.** A progress bar counts units; each finished unit is stored (in ``<out>.units``
when ``out`` is given, or in ``store=``) and a rerun with the same arguments resumes from them. ``out`` is
checked before any work and written without destroying anything (:mod:`kvstats._files`): an existing file
needs ``force=True``, the input capture is never the output, a device or FIFO is written through. The JSON is
strict (no NaN: missing values are null with a reason) and carries a provenance block (versions, commit,
device, threads, date, wall time, command line, seeds) and its schema version (:data:`SCHEMA`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kvstats._random import check_seed, unit_seed
from kvstats._validation import check_int_range
from kvstats.evaluation import unit_store
from kvstats.evaluation.quantizer_sides import QuantizerCheckError, prepare_sides, resolve_scheme
from kvstats.evaluation.results import (
    DEFAULT_SYNTHETIC_UNITS,
    DEFAULT_WINDOW,
    ONE_TEXT,
    SCHEMA,
    Evaluation,
    InconclusiveWarning,
)
from kvstats.evaluation.units import METRICS
from kvstats.measure.stats._options import InferenceOptions, inference_options
from kvstats.study.provenance import provenance

__all__ = ["DEFAULT_SYNTHETIC_UNITS", "DEFAULT_WINDOW", "Evaluation", "InconclusiveWarning", "METRICS",
           "QuantizerCheckError", "SCHEMA", "evaluate", "resolve_scheme"]

# ------------------------------------------------------------------------------------------------- evaluate


def _refuse_without_effect(quantizer, bits, *, data, model, compare, match_bits, window, layers, store) -> None:
    """Refuse, by name, an argument that would be ignored or contradicted: a ready Scheme's budget is its own, layers
    and window select a capture's units, match_bits sets the comparator's budget, store is a folder."""
    from kvstats.data.synthetic import KINDS
    from kvstats.quant.schemes import Scheme

    if isinstance(quantizer, Scheme) and bits != quantizer.bits:
        raise ValueError(f"bits={bits!r}, but the Scheme {quantizer.name!r} given as quantizer was built at "
                         f"{quantizer.bits} bits: a ready Scheme's budget is its own (the results' label and the "
                         f"comparator's budget); pass bits={quantizer.bits}")
    if match_bits and compare is None:
        raise ValueError("match_bits=True has no effect without compare=: it sets the budget of the compared scheme")
    if match_bits and isinstance(compare, Scheme):
        raise ValueError(f"match_bits=True cannot set the budget of compare={compare.name!r}, a Scheme built at "
                         f"{compare.bits} bits: pass its name (or a factory) to have it matched")
    where = f"model={str(model)!r}" if model is not None else \
        f"synthetic data {data!r}" if isinstance(data, str) and data in KINDS else None
    for name, value, what in (("layers", layers, "the stored layers"), ("window", window, "the tokens of a unit")):
        if where is not None and value is not None:
            raise ValueError(f"{name}={value!r} has no effect on {where}: it sets {what} of a capture file "
                             "(data=<capture>)")
    if store is not None and Path(store).exists() and not Path(store).is_dir():
        raise ValueError(f"store= must be a folder (the unit store an interrupted run resumes from), got "
                         f"{str(store)!r}, which is a file")


def _source(data, units, *, seed, window, layers, shape, data_params):
    from kvstats.data.synthetic import KINDS
    from kvstats.evaluation.units import capture_units, synthetic_units

    if isinstance(data, str) and data in KINDS:
        source = synthetic_units(data, seed=seed, params=data_params, **shape)
        return source, DEFAULT_SYNTHETIC_UNITS if units is None else units
    if not isinstance(data, (str, os.PathLike)) or not Path(data).is_file():
        raise ValueError(f"data must be a synthetic kind {sorted(KINDS)} or an existing capture file, got "
                         f"{str(data)!r}")
    window = check_int_range(DEFAULT_WINDOW if window is None else window, "window", 2, 1 << 30)
    source = capture_units(data, window=window, layers=layers)
    n = source.available if units is None else units
    if n > source.available:
        raise ValueError(f"units must be at most {source.available} (disjoint windows of {window} tokens), got {n}")
    return source, n


def _copied(parts):
    """Copies of a unit's tensors ``[(q, k, v), ...]``, for calls that must not reach the tensors measured against."""
    return [tuple(t.clone() for t in part) for part in parts]


def _plan(main_checked: bool, n_units: int, alpha: float, source) -> Any:
    from kvstats.evaluation.comparison import candidate_family, plan_comparison

    plan = plan_comparison(n_units, len(candidate_family(linear=main_checked)), alpha)
    if not plan.can_conclude:
        if source.kind == "capture" and source.documents is not None and len(set(source.documents)) >= 2:
            more = f"capture more documents ({plan.units_needed} are needed: the documents are the units)"
        elif source.kind == "capture":
            more = (f"capture more tokens (kvstats capture --tokens) or use a smaller window ({plan.units_needed} "
                    "windows are needed)")
        else:
            more = f"pass units={plan.units_needed} (--units {plan.units_needed})"
        warnings.warn(InconclusiveWarning(f"{plan.message()}: {more}"), stacklevel=3)
    return plan


def evaluate(
    quantizer,
    *,
    bits: int,
    data: str | os.PathLike = "gaussian",
    units: int | None = None,
    seed: int | None = 0,
    compare=None,
    match_bits: bool = False,
    top_k: int = 5,
    dim: int = 128,
    kv_heads: int = 2,
    q_heads: int = 4,
    seq: int = 512,
    n_q: int = 32,
    window: int | None = None,
    layers: Sequence[int] | None = None,
    inference: InferenceOptions | None = None,
    check: bool = True,
    linear: bool = True,
    out: str | os.PathLike | None = None,
    force: bool = False,
    store: str | os.PathLike | None = None,
    progress: bool = False,
    data_params: dict | None = None,
    model=None,
    segment: int | None = None,
    segments_per_document: int | None = 1,
    full_precision_window: int = 0,
    documents: dict[str, str] | None = None,
    dtype=None,
    **options,
):
    """Evaluate ``quantizer`` at ``bits`` on ``data`` over independent units (see the module doc).

    Args:
        quantizer: scheme name, quantizer name, ``"module:Class"``, a class/factory, or a Scheme.
        bits: budget n (bits per cache element); a ready Scheme's own (a conflicting bits= is refused).
        data: a synthetic kind (``"gaussian"``, ``"heavy_tail"``, ``"low_rank"``) or a capture file path.
        units: independent units (synthetic draws, default :data:`DEFAULT_SYNTHETIC_UNITS`; a capture's
            disjoint windows, default all); at least 2.
        seed: unit ``i`` uses the unit seed ``unit_seed(seed, i)`` (spawned: child i of ``SeedSequence(seed)``) for
            its data (synthetic) and its schemes; None draws a fresh seed (recorded in the results).
        compare: a second ``quantizer`` spec, evaluated on the same units and compared pairwise (at ``bits``; a
            ready Scheme at its own budget).
        match_bits: run ``compare`` at the largest budget whose measured bits per element do not exceed the
            evaluated quantizer's (default: the same budget ``bits``); refused without ``compare``.
        top_k: k of the top-k recall.
        dim, kv_heads, q_heads, seq, n_q: synthetic shape (cache ``[1, kv_heads, seq, dim]``, ``n_q``
            queries per query head, non-causal: the queries follow the generator's query model).
        window: capture: tokens per unit (causal attention within the window; default :data:`DEFAULT_WINDOW`).
        layers: capture: the stored layers to use (default all). ``window`` and ``layers`` are refused for synthetic
            data and a model, where they would have no effect.
        inference: :class:`kvstats.stats.InferenceOptions`: the CIs' confidence level, the comparison's level alpha
            (Holm-corrected over its family), the bootstrap's resamples (default 9999; 1999 for the cluster
            bootstrap of a model evaluation) and seed (default ``seed``).
        check: run :func:`kvstats.testing.check_quantizer` on every quantizer first (refusing a failing one), check
            the bits at the units' own length, and decode in a fresh process (a user's picklable quantizer).
        linear: whether the K estimators must be linear in the code (``inner(q, code) = ⟨q, decode(code)⟩``, every
            kvstats quantizer); False (``--nonlinear``) checks a quantizer whose estimator is not, and keeps
            ``6d_attention_kl`` (the decoded keys' KL) in the comparison's family.
        out: write the results JSON here (checked before any work; an existing file needs ``force``).
        force: replace an existing ``out``.
        store: folder of the resumable unit store (default ``<out>.units`` when ``out`` is given, else none); an
            existing file there is refused.
        progress: a progress bar (tqdm on stderr) and notes (resumed units) on stderr.
        data_params: extra parameters of the synthetic generator (e.g. ``{"df": 3}``).
        model: evaluate on a language model instead (``"smollm2"``, a model folder or a .gguf file): its output
            damage over teacher-forced segments of the shipped documents, returning a
            :class:`~kvstats.evaluation.model_evaluator.ModelEvaluation`
            (:func:`~kvstats.evaluation.model_evaluator.evaluate_model`).
        segment, segments_per_document, full_precision_window, documents: the model evaluation's segments
            (default 128 tokens, one per document), the cache's exact window, ``{title: text}`` to use instead of
            the shipped documents, and the model's dtype (default float32).
        **options: passed to the scheme / quantizer constructor (e.g. ``rows="srht"``).
    """
    inference = inference_options(inference)
    _refuse_without_effect(quantizer, bits, data=data, model=model, compare=compare, match_bits=match_bits,
                           window=window, layers=layers, store=store)
    if model is None:
        from kvstats.evaluation.quantizer_sides import _is_layer_map

        for role, spec in (("quantizer", quantizer), ("compare", compare)):
            if _is_layer_map(spec):
                raise ValueError(f"{role} is a layer map ({spec.name}): its schemes differ by layer, so it is "
                                 "measured on a model (model=...), not on synthetic data or a capture's windows")
    if model is not None:
        if data != "gaussian" or units is not None:
            raise ValueError("give data= (and units=) or model=, not both: a model evaluation's units are the "
                             "segments of its documents")
        from kvstats.evaluation.model_evaluator import DEFAULT_SEGMENT, evaluate_model

        return evaluate_model(quantizer, bits=bits, model=model, compare=compare, match_bits=match_bits,
                              segment=DEFAULT_SEGMENT if segment is None else segment,
                              segments_per_document=segments_per_document,
                              full_precision_window=full_precision_window, seed=seed, inference=inference,
                              check=check, linear=linear, out=out, force=force, store=store, progress=progress,
                              documents=documents, dtype=torch.float32 if dtype is None else dtype, **options)
    if documents is not None or dtype is not None:
        raise ValueError("documents= and dtype= are for a model evaluation (model=); synthetic data and captures have "
                         "their own")
    started = time.time()
    bits = check_int_range(bits, "bits", 1, 8)
    if units is not None:
        units = check_int_range(units, "units", 2, 100_000)
    top_k = check_int_range(top_k, "top_k", 1, 1 << 30)
    fresh_seed = seed is None
    seed = check_seed(seed)
    source, n_units = _source(data, units, seed=seed, window=window, layers=layers,
                              shape=_synthetic_shape(kv_heads, q_heads, seq, dim, n_q), data_params=data_params)
    out, store = _output(out, store, force, source)
    parts0 = source.unit(0)
    sides = prepare_sides(quantizer, compare, bits, options, dim=source.dim, heads=source.kv_heads,
                          seed0=unit_seed(seed, 0), parts=lambda: _copied(parts0), check=check, linear=linear,
                          match=match_bits)  # copies: no encode can change the data unit 0 is measured on
    # documents, not their windows, are the independent units when a capture holds several
    doc_ids = None if source.documents is None else source.documents[:n_units]
    by_document = doc_ids is not None and len(set(doc_ids)) >= 2
    n_inference = len(set(doc_ids)) if by_document else n_units
    plan = None if sides.other is None else _plan(check and linear, n_inference, inference.alpha, source)
    key, store = _store_key(sides, source, seed, top_k, store)
    compute = _unit_function(sides, source, seed, top_k, parts0)
    rows, reused = unit_store.run_resumable(compute, n_units, key=key, store=store, progress=progress,
                                            desc=f"evaluate {sides.main.label}", seed=seed, fresh_seed=fresh_seed)
    summary, comparison = _statistics(rows, sides.other is not None, by_document, inference, seed)
    config = {"quantizer": sides.main.label, "compare": None if sides.other is None else sides.other.label,
              "bits": bits, "compare_bits": None if sides.other is None else sides.other.bits,
              "match_bits": bool(match_bits), "data": str(data), "units": len(rows), "unit": source.description,
              "seed": seed, "top_k": top_k, "softmax_scale": source.scale, "softcap": [r.softcap for r in source.rules],
              "documents": None if doc_ids is None else len(set(doc_ids)),
              "inference_units": "documents (per-document means of their windows)" if by_document else
              (ONE_TEXT if source.kind == "capture" else "independent draws"),
              "alpha": inference.alpha, "confidence_level": inference.confidence_level,
              "window": window if source.kind == "capture" else None, "layers": source.identity.get("layers"),
              "options": {k: str(v) for k, v in options.items()}, "data_params": dict(data_params or {}),
              "checks": sides.checks, "inputs": list(source.inputs), "units_reused": reused,
              "schemes": sides.records | {"seeds": "unit 0's; unit i's schemes are built from unit_seed(seed, i)"}}
    ev = Evaluation(config, rows, summary, comparison.get("tests", {}), comparison.get("excluded", {}), plan,
                    comparison.get("plan"), sides.budgets(rows, claimed=True),
                    provenance(started=started, seeds={"seed": seed,
                                                       "unit i": "unit_seed(seed, i) = child i of SeedSequence(seed) "
                                                                 "(data and schemes)",
                                                       "bootstrap": inference.bootstrap_seed(seed)}))
    return unit_store.save_results(ev, out, force=force, store=store, n=n_units, key=key)


def _synthetic_shape(kv_heads: int, q_heads: int, seq: int, dim: int, n_q: int) -> dict:
    kv_heads = check_int_range(kv_heads, "kv_heads", 1, 1 << 16)
    q_heads = check_int_range(q_heads, "q_heads", 1, 1 << 16)
    if q_heads % kv_heads:
        raise ValueError(f"q_heads must be a multiple of kv_heads={kv_heads} (grouped-query attention), got {q_heads}")
    return dict(kv_heads=kv_heads, q_heads=q_heads, seq=seq, dim=dim, n_q=n_q)


def _output(out, store, force: bool, source):
    """``out`` checked (never one of the inputs; an existing file needs ``force``) and the unit store: ``store``, or
    ``<out>.units`` beside a file ``out`` (a device or FIFO has no folder beside it)."""
    from kvstats._files import check_output_path, is_stream

    if out is not None:
        out = check_output_path(out, "out", force=force, inputs=source.inputs)
    if store is None and out is not None and not is_stream(out):
        store = Path(str(out) + ".units")
        if store.exists() and not store.is_dir():
            raise ValueError(f"the unit store beside out= ({str(store)!r}, where an interrupted run resumes from) is "
                             "a file: move it, or pass store= a folder")
    return out, store


def _store_key(sides, source, seed: int, top_k: int, store):
    """The evaluation's key in the unit store (None, and no store, when a side's source cannot be identified)."""
    identities = sides.identities()
    key = None if None in identities else unit_store.store_key(
        {"sides": identities, "data": source.identity, "units_seed": seed, "top_k": top_k, "kvstats":
         unit_store.kvstats_digest()})
    if store is not None and key is None:
        warnings.warn(f"units are not stored in {str(store)!r}: the source of {sides.main.label!r} or of the "
                      "comparator cannot be read to identify it, so an interrupted run cannot resume", stacklevel=3)
        store = None
    return key, store


def _unit_function(sides, source, seed: int, top_k: int, parts0):
    """``compute(i)``: unit i's row — its metrics under each side's scheme for unit i (``unit_seed(seed, i)``)."""
    from kvstats.evaluation.units import unit_metrics

    main, other, d = sides.main, sides.other, source.dim

    def compute(i: int) -> dict:
        parts = parts0 if i == 0 else source.unit(i)
        opts = dict(top_k=top_k, causal=source.causal, query_offset=source.query_offset, rules=source.rules,
                    where=f"unit {i}")
        row = {"unit": i, **({} if source.documents is None else {"document": source.documents[i]}),
               **unit_metrics(main.scheme(d, unit_seed(seed, i)), parts, **opts)}
        if other is not None:
            row |= {f"other:{m}": x for m, x in unit_metrics(other.scheme(d, unit_seed(seed, i)), parts,
                                                             **opts).items()}
        return row

    return compute


def _statistics(rows: list[dict], compared: bool, by_document: bool, inference: InferenceOptions, seed: int):
    """Each metric's mean over the inference units with its CI, and the paired comparison when ``compared``."""
    from kvstats.evaluation.comparison import compare_units, per_document
    from kvstats.measure import stats

    units = per_document(rows, (*METRICS, "bits_claimed")) if by_document else rows
    n_resamples, boot = inference.resamples(9999), inference.bootstrap_seed(seed)
    summary = {m: stats.mean_ci([r[m] for r in units], inference.confidence_level, n_resamples=n_resamples,
                                seed=boot) for m in METRICS}
    comparison = {} if not compared else compare_units(units, alpha=inference.alpha,
                                                      confidence_level=inference.confidence_level,
                                                      n_resamples=n_resamples, seed=boot)
    return summary, comparison
