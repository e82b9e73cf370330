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

**Units** (:mod:`kvstats.run.units`): synthetic unit ``i`` is a fresh draw with the unit seed
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
distinct, non-constant metrics (:mod:`kvstats.run.comparison`) — is compared with the paired Wilcoxon
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

import json
import os
import sys
import textwrap
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstats._random import check_seed, unit_seed
from kvstats._validation import check_int_range
from kvstats.run import sides
from kvstats.run.sides import QuantizerCheckError, Side, check_side, measured_bits, resolve_scheme
from kvstats.run.strict import strict_json
from kvstats.run.units import METRICS

__all__ = ["DEFAULT_SYNTHETIC_UNITS", "DEFAULT_WINDOW", "Evaluation", "InconclusiveWarning", "METRICS",
           "QuantizerCheckError", "SCHEMA", "evaluate", "resolve_scheme"]

#: Version of the results file's layout.
SCHEMA = "kvstats-evaluation/2"
#: Synthetic units by default: enough for a family of 8 Wilcoxon tests to reach p < 0.05 after Holm
#: (8 · 2/2¹⁶ = 2.4e-4), i.e. the documented comparisons can conclude.
DEFAULT_SYNTHETIC_UNITS = 16
#: Tokens of a capture unit by default: a default capture (1,024 tokens) gives 16 disjoint windows.
DEFAULT_WINDOW = 64


class InconclusiveWarning(UserWarning):
    """A comparison that cannot reach its level whatever the data (too few units for the family)."""


# ------------------------------------------------------------------------------------------------ the result

@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` measured.

    Attributes:
        config: how it ran (quantizer, compare, bits of both sides, data, units, seeds, options, whether the
            conformance checks ran).
        units: one dict per unit: ``unit``, every metric of :data:`METRICS`, ``bits_claimed``, and
            ``other:<metric>`` for the compared scheme.
        summary: ``{metric: MeanResult}``, the mean over units with its CI (:func:`kvstats.stats.mean_ci`).
        comparison: ``{metric: {"test": WilcoxonResult, "pvalue_holm": float, "significant": bool,
            "detectable_shift": PowerResult or None}}`` for the family's metrics, when ``compare`` was given.
        excluded: ``{metric: reason}`` for the metrics left out of the family.
        plan: the :class:`~kvstats.run.comparison.ComparisonPlan` made before running, for the family the
            comparison could have at most (None without compare).
        family_plan: the same for the family actually tested (constant and repeated metrics left out).
        bits: measured and claimed bits per element of each side, and whether the sides match.
        provenance: versions, commit, device, threads, date, wall time, command line, seeds.
    """

    config: dict[str, Any]
    units: list[dict[str, float]]
    summary: dict[str, Any]
    comparison: dict[str, Any] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    plan: Any = None
    family_plan: Any = None
    bits: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    #: the results file's ``schema``
    schema = SCHEMA

    def _summary_dict(self) -> dict[str, Any]:
        return {m: r.to_dict() for m, r in self.summary.items()}

    def to_dict(self) -> dict[str, Any]:
        """The results file's content: strict-JSON-ready (no NaN or inf: null, with ``null_reasons``)."""
        comparison = {m: {"test": c["test"].to_dict(), "pvalue_holm": c["pvalue_holm"],
                          "significant": c["significant"],
                          "detectable_shift": None if c["detectable_shift"] is None else
                          c["detectable_shift"].to_dict()} for m, c in self.comparison.items()}
        return strict_json({"schema": self.schema, "config": self.config, "bits": self.bits,
                            "plan": None if self.plan is None else {"before_running": self.plan.to_dict(),
                                                                    "family_tested": self.family_plan.to_dict()},
                            "units": self.units, "summary": self._summary_dict(), "comparison": comparison,
                            "excluded": self.excluded, "provenance": self.provenance})

    def to_json(self) -> str:
        """:meth:`to_dict` as strict JSON (``allow_nan=False``: every standard parser reads it)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """Write :meth:`to_json` to ``path`` without destroying anything (:mod:`kvstats._files`): an existing file
        needs ``force``, the input capture is refused, a device or FIFO is written through; returns the path."""
        from kvstats._files import check_output_path, write_output

        path = check_output_path(path, "path", force=force, inputs=self.config.get("inputs", ()))
        return write_output(path, self.to_json().encode("utf-8"))

    def table(self) -> str:
        """A plain-text table: each metric's mean and CI over units, and the paired comparison when present. The
        two sides are A (the evaluated quantizer) and B (the compared one), named in full above the table."""
        from kvstats.measure.stats import interval_text
        from kvstats.run.comparison import per_document, shift_text

        cfg = self.config
        first = next(iter(self.summary.values()))
        me, other = cfg["quantizer"], cfg["compare"]
        by_document = str(cfg.get("inference_units", "")).startswith("documents")
        units = per_document(self.units, METRICS) if by_document else self.units
        width = max(18, *(len(m) for m in self.summary))
        head = f"{'metric':<{width}} {'A mean':>11} {f'{first.confidence_level:.0%} CI of A':>25}"
        if other is not None:
            head += f" {'B mean':>11} {'r':>7} {'p (Holm)':>9} {'detectable':>10}"
        bits = self.bits
        count = (f"{len(units)} documents, {len(self.units)} windows" if by_document else f"{len(self.units)} units")
        lines = [f"A = {me} at {cfg['bits']} bits on {cfg['data']} ({count}: {cfg['unit']})",
                 _bits_line("A", me, bits["evaluated"])]
        if other is not None:
            lines.append(_bits_line("B", other, bits["compared"]))
            if not bits["matched"]:
                lines += textwrap.wrap(
                    f"! the sides hold different bits per element ({bits['evaluated']['measured']:.4g} vs "
                    f"{bits['compared']['measured']:.4g}): the comparison is not bit-matched (match_bits=True, "
                    "--match-bits, runs the comparator at its largest budget that holds no more bits)", 110,
                    initial_indent="  ", subsequent_indent="    ")
        lines += [head, "-" * len(head)]
        for m, r in self.summary.items():
            row = f"{m:<{width}} {r.statistic:>11.4g} {interval_text(r):>25}"
            if other is not None:
                row += f" {float(np.mean([u[f'other:{m}'] for u in units])):>11.4g}"
                if m in self.comparison:
                    c = self.comparison[m]
                    mark = "*" if c["significant"] else " "
                    row += (f" {c['test'].effect_size:>7.3f} {c['pvalue_holm']:>8.2g}{mark}"
                            f" {shift_text(c['detectable_shift']):>10}")
            lines.append(row)
        if other is not None:
            lines += comparison_footnotes(self, "A", "B")
        return "\n".join(lines)


def _bits_line(letter: str, name: str, b: dict) -> str:
    claimed = b.get("claimed")
    claim = "" if claimed is None or abs(claimed - b["measured"]) <= 1e-9 * max(1.0, b["measured"]) else \
        f"; it claims {claimed:.4g} (bits_per_coordinate)"
    return f"  {letter} = {name}: budget n = {b['budget']}, {b['measured']:.4g} bits per element held (measured){claim}"


def comparison_footnotes(ev, me: str, other: str) -> list[str]:
    """What the comparison columns mean (r's sign, p's correction, the detectable shift, what blank means)."""
    family = len(ev.comparison)
    notes = [f"r: matched-pairs rank-biserial of {me} − {other} over the units (−1: {me} lower in every unit, +1: "
             f"higher); p: paired Wilcoxon signed-rank, Holm-corrected over the {family} metric(s) tested, * below "
             f"alpha = {ev.config['alpha']:g}; detectable: the mean difference the test would find with 80% power "
             "at this many units (non-significant rows; 'none': no difference can be significant here)."]
    by_reason: dict[str, list[str]] = {}
    for m, why in ev.excluded.items():
        by_reason.setdefault(why, []).append(m)
    if by_reason:
        notes.append("blank r/p: " + "; ".join(f"{', '.join(ms)} — {why}" for why, ms in by_reason.items()) + ".")
    if ev.family_plan is not None and not ev.family_plan.can_conclude:
        notes.append("! " + ev.family_plan.message() + ".")
    return [line for note in notes for line in textwrap.wrap(note, 110, subsequent_indent="  ")]


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
    from kvstats.run.units import capture_units, synthetic_units

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
    from kvstats.run.comparison import candidate_family, plan_comparison

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
    confidence_level: float = 0.95,
    n_resamples: int | None = None,
    alpha: float = 0.05,
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
        confidence_level, n_resamples: the CIs (bootstrap resamples: default 9999, 1999 for the cluster bootstrap
            of a model evaluation).
        alpha: level of the comparison (Holm-corrected over its family).
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
            :class:`~kvstats.run.model_evaluation.ModelEvaluation`
            (:func:`~kvstats.run.model_evaluation.evaluate_model`).
        segment, segments_per_document, full_precision_window, documents: the model evaluation's segments
            (default 128 tokens, one per document), the cache's exact window, ``{title: text}`` to use instead of
            the shipped documents, and the model's dtype (default float32).
        **options: passed to the scheme / quantizer constructor (e.g. ``rows="srht"``).
    """
    _refuse_without_effect(quantizer, bits, data=data, model=model, compare=compare, match_bits=match_bits,
                           window=window, layers=layers, store=store)
    if model is not None:
        if data != "gaussian" or units is not None:
            raise ValueError("give data= (and units=) or model=, not both: a model evaluation's units are the "
                             "segments of its documents")
        from kvstats.run.model_evaluation import DEFAULT_SEGMENT, evaluate_model

        return evaluate_model(quantizer, bits=bits, model=model, compare=compare, match_bits=match_bits,
                              segment=DEFAULT_SEGMENT if segment is None else segment,
                              segments_per_document=segments_per_document,
                              full_precision_window=full_precision_window, seed=seed, alpha=alpha,
                              confidence_level=confidence_level, n_resamples=n_resamples or 1999, check=check,
                              linear=linear, out=out, force=force, store=store, progress=progress,
                              documents=documents, dtype=torch.float32 if dtype is None else dtype, **options)
    if documents is not None or dtype is not None:
        raise ValueError("documents= and dtype= are for a model evaluation (model=); synthetic data and captures have "
                         "their own")
    n_resamples = 9999 if n_resamples is None else n_resamples
    from kvstats._files import check_output_path, is_stream
    from kvstats.measure import stats
    from kvstats.run import unit_store
    from kvstats.run.comparison import compare_units, per_document
    from kvstats.run.provenance import provenance
    from kvstats.run.units import unit_metrics

    started = time.time()
    bits = check_int_range(bits, "bits", 1, 8)
    if units is not None:
        units = check_int_range(units, "units", 2, 100_000)
    top_k = check_int_range(top_k, "top_k", 1, 1 << 30)
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    fresh_seed = seed is None
    seed = check_seed(seed)
    kv_heads = check_int_range(kv_heads, "kv_heads", 1, 1 << 16)
    q_heads = check_int_range(q_heads, "q_heads", 1, 1 << 16)
    if q_heads % kv_heads:
        raise ValueError(f"q_heads must be a multiple of kv_heads={kv_heads} (grouped-query attention), got {q_heads}")
    shape = dict(kv_heads=kv_heads, q_heads=q_heads, seq=seq, dim=dim, n_q=n_q)
    source, n_units = _source(data, units, seed=seed, window=window, layers=layers, shape=shape,
                              data_params=data_params)
    if out is not None:
        out = check_output_path(out, "out", force=force, inputs=source.inputs)
    if store is None and out is not None and not is_stream(out):  # a device or FIFO has no folder beside it
        store = Path(str(out) + ".units")
        if store.exists() and not store.is_dir():
            raise ValueError(f"the unit store beside out= ({str(store)!r}, where an interrupted run resumes from) is "
                             "a file: move it, or pass store= a folder")
    d = source.dim
    main = Side("quantizer", quantizer, bits, dict(options))
    other = None if compare is None else Side("compare", compare, bits, dict(options))
    parts0 = source.unit(0)
    seed0 = unit_seed(seed, 0)  # unit 0's schemes: checked, recorded, and the budget the comparator is matched to
    scheme0 = main.scheme(d, seed0)
    heads = source.kv_heads
    opts = dict(linear=linear, parts=_copied(parts0))  # copies: no encode can change the data unit 0 is measured on
    checks = {"quantizer": check_side(main, scheme0, d, seed0, heads, **opts) if check else "skipped (check=False)"}
    records = {"evaluated": sides.scheme_record(scheme0)}
    if other is not None:
        if match_bits:
            other.bits = sides.match_bits(other, measured_bits(scheme0, _copied(parts0)), d, seed0,
                                          _copied(parts0))[0]
        other_scheme0 = other.scheme(d, seed0)
        records["compared"] = sides.scheme_record(other_scheme0)
        checks["compare"] = (check_side(other, other_scheme0, d, seed0, heads, **opts) if check else
                             "skipped (check=False)")
    # documents, not their windows, are the independent units when a capture holds several
    doc_ids = None if source.documents is None else source.documents[:n_units]
    by_document = doc_ids is not None and len(set(doc_ids)) >= 2
    n_inference = len(set(doc_ids)) if by_document else n_units
    plan = None if other is None else _plan(check and linear, n_inference, alpha, source)

    identities = [main.identity()] + ([] if other is None else [other.identity()])
    key = None if None in identities else unit_store.store_key(
        {"sides": identities, "data": source.identity, "units_seed": seed, "top_k": top_k, "kvstats":
         unit_store.kvstats_digest()})
    if store is not None and key is None:
        warnings.warn(f"units are not stored in {str(store)!r}: the source of {main.label!r} or of the comparator "
                      "cannot be read to identify it, so an interrupted run cannot resume", stacklevel=2)
        store = None
    if progress and store is not None and key is not None:
        have = unit_store.stored_units(n_units, key, store)
        if have:
            print(f"resuming: {have} of {n_units} units are stored in {store}", file=sys.stderr)

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

    try:
        rows, reused = unit_store.run_units(compute, n_units, key=key, store=store, progress=progress,
                                            desc=f"evaluate {main.label}")
    except KeyboardInterrupt:
        if store is not None:
            have = unit_store.stored_units(n_units, key, store)
            again = (f"rerun with seed={seed} (--seed {seed}): the seed was drawn fresh" if fresh_seed else
                     "run the same command again")
            print(f"interrupted: {have} of {n_units} units are stored in {store}; {again} to resume", file=sys.stderr)
        raise
    inference = per_document(rows, (*METRICS, "bits_claimed")) if by_document else rows
    summary = {m: stats.mean_ci([r[m] for r in inference], confidence_level, n_resamples=n_resamples, seed=seed)
               for m in METRICS}
    comparison = {} if other is None else compare_units(inference, alpha=alpha, confidence_level=confidence_level,
                                                        n_resamples=n_resamples, seed=seed)
    by_side = {"evaluated": ("", main)} | ({} if other is None else {"compared": ("other:", other)})
    bits_info = {name: {"budget": side.bits, "measured": float(np.mean([r[p + "bits_total"] for r in rows])),
                        "claimed": float(np.mean([r[p + "bits_claimed"] for r in rows]))}
                 for name, (p, side) in by_side.items()}
    if other is not None:
        a, b = bits_info["evaluated"]["measured"], bits_info["compared"]["measured"]
        bits_info["matched"] = abs(a - b) <= 1e-9 * max(a, b)
    config = {"quantizer": main.label, "compare": None if other is None else other.label, "bits": bits,
              "compare_bits": None if other is None else other.bits, "match_bits": bool(match_bits),
              "data": str(data), "units": len(rows), "unit": source.description, "seed": seed, "top_k": top_k,
              "softmax_scale": source.scale, "softcap": [r.softcap for r in source.rules],
              "documents": None if doc_ids is None else len(set(doc_ids)),
              "inference_units": "documents (per-document means of their windows)" if by_document else
              ("windows of one text" if source.kind == "capture" else "independent draws"),
              "alpha": float(alpha), "confidence_level": confidence_level,
              "window": window if source.kind == "capture" else None, "layers": source.identity.get("layers"),
              "options": {k: str(v) for k, v in options.items()}, "data_params": dict(data_params or {}),
              "checks": checks, "inputs": list(source.inputs), "units_reused": reused,
              "schemes": records | {"seeds": "unit 0's; unit i's schemes are built from unit_seed(seed, i)"}}
    ev = Evaluation(config, rows, summary, comparison.get("tests", {}), comparison.get("excluded", {}), plan,
                    comparison.get("plan"), bits_info,
                    provenance(started=started, seeds={"seed": seed,
                                                       "unit i": "unit_seed(seed, i) = child i of SeedSequence(seed) "
                                                                 "(data and schemes)",
                                                       "bootstrap": seed}))
    return unit_store.save_results(ev, out, force=force, store=store, n=n_units, key=key)
