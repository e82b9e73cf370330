"""``kvstats.evaluate(..., model=...)``: a quantizer on a language model, checked, planned, resumable, with provenance.

The units, the metrics and their statistics are those of :mod:`kvstats.evaluation.model_engine`; the sides, the checks,
the plan, the unit store, the strict results file and the provenance block are the synthetic evaluation's
(docs/evaluate.md, "On a model").
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstats.evaluation.model_engine import (
    DEFAULT_SEGMENT,
    MODEL_METRICS,
    NO_INTERVAL_OF_A_MAXIMUM,
    POOLED_MIN_DOCUMENTS,
    TAIL,
    coverage_at,
    withheld_reason,
)
from kvstats.evaluation.results import Evaluation
from kvstats.measure.stats._options import InferenceOptions, inference_options
from kvstats.study.provenance import provenance

__all__ = ["MODEL_SCHEMA", "ModelEvaluation", "evaluate_model"]

#: Version of the results file's layout.
MODEL_SCHEMA = "kvstats-model-evaluation/1"
_WORDS = {"out_kl": "next-token KL (nats)", "top1": "top-1 agreement", "delta_nll": "change of NLL (nats)",
          "bits_total": "bits per element held"}


@dataclass(frozen=True)
class ModelEvaluation(Evaluation):
    """What :func:`evaluate_model` measured: the fields of :class:`kvstats.evaluation.results.Evaluation`, with

    * ``units``: one dict per segment: ``unit``, ``document``, ``title``, the metrics of
      :func:`kvstats.evaluation.model_engine.model_unit` (``other:``-prefixed for the compared scheme);
    * ``summary``: per side (``"evaluated"``, ``"compared"``): :func:`~kvstats.evaluation.model_engine.unit_summary`
      (means over documents with CIs, per layer too) under ``"documents"``, and
      :func:`~kvstats.evaluation.model_engine.pooled_summary` (the KL tail, top-1, perplexity ratio over every token,
      cluster bootstrap CIs; from fewer than :data:`~kvstats.evaluation.model_engine.POOLED_MIN_DOCUMENTS` documents
      none, the reason under ``no_interval`` and in ``config["pooled_intervals"]``) under ``"tokens"``;
    * ``comparison``, ``excluded``, ``plan``, ``family_plan``: over documents;
    * ``bits``: the measured bits per element of each side (``measured``: the codes and the exact window;
      ``measured_codes``: the codes alone, per element of the quantized tokens), and whether they match.
    """

    schema = MODEL_SCHEMA

    def _summary_dict(self) -> dict[str, Any]:
        def side(s: dict) -> dict:
            docs = {m: (r.to_dict() if not isinstance(r, list) else [x.to_dict() for x in r])
                    for m, r in s["documents"].items()}
            return {"documents": docs, "tokens": {m: r.to_dict() for m, r in s["tokens"].items()}}

        return {k: side(v) for k, v in self.summary.items()}

    def table(self) -> str:
        """Plain text: per-document means, the KL tail over every token, top-1 and perplexity, the worst layers,
        and the comparison when present (A: the evaluated quantizer, B: the compared one)."""
        import textwrap

        from kvstats.evaluation.comparison import shift_text
        from kvstats.evaluation.results import comparison_footnotes, unmatched_note
        from kvstats.measure.stats import interval_text

        cfg, ev = self.config, self.summary["evaluated"]
        level = ev["documents"]["out_kl"].confidence_level
        lines = [f"A = {cfg['quantizer']} at {cfg['bits']} bits on {cfg['model']} ({cfg['documents']} documents, "
                 f"{len(self.units)} segments of {cfg['segment']} tokens, teacher-forced through KVStatsCache on the "
                 f"estimator path; exact window {cfg['full_precision_window']} tokens; reference: "
                 f"{cfg['reference']})",
                 _held_line("A", cfg["quantizer"], self.bits["evaluated"], cfg["full_precision_window"])]
        if cfg.get("lossless_floor") is not None:
            lines.append(f"  the kvstats path with a lossless scheme differs from the model's own attention by a mean "
                         f"next-token KL of {cfg['lossless_floor']:.3g} nats (the {cfg['dtype']} model): not counted "
                         "against A")
        if cfg["compare"] is not None:
            lines.append(_held_line("B", cfg["compare"], self.bits["compared"], cfg["full_precision_window"]))
            if not self.bits["matched"]:
                lines += textwrap.wrap(unmatched_note(self.bits), 110, initial_indent="  ", subsequent_indent="    ")
        how = ", ".join(dict.fromkeys(ev["documents"][m].ci_method for m in MODEL_METRICS))  # each one used
        lines.append(f"per document: mean over the {cfg['documents']} documents, {level:.0%} CI ({how})")
        for m in MODEL_METRICS:
            r = ev["documents"][m]
            row = f"  {_WORDS[m]:<22} {r.statistic:>10.4g} {interval_text(r)}"
            if m in self.comparison:
                c, o = self.comparison[m], self.summary["compared"]["documents"][m]
                shift = shift_text(c["detectable_shift"])
                row += (f"   B {o.statistic:.4g}; r = {c['test'].effect_size:+.3f}, "
                        f"p (Holm) = {c['pvalue_holm']:.2g}{'*' if c['significant'] else ''}"
                        + (f", detectable {shift}" if shift else ""))
            lines.append(row)
        tok = ev["tokens"]
        n_tokens = sum(len(u["tokens_out_kl"]) for u in self.units)
        docs, segments = cfg["documents"], len(self.units)
        if tok["kl_mean"].ci_method == "none":  # withheld: too few documents
            how = f"no intervals: {tok['kl_mean'].extra['no_interval']}; pass more documents for them"
        else:
            at, (low, high) = coverage_at(docs)
            how = (f"{level:.0%} cluster BCa bootstrap over the {docs} documents, then their segments; simulated "
                   f"coverage of a nominal 95% at {at} documents: {low}-{high}%")
        lines += textwrap.wrap(f"over all {n_tokens} tokens of {docs} documents ({segments} segments; as llama.cpp's "
                               f"--kl-divergence; {how}):", 110, subsequent_indent="  ")
        for name in TAIL:
            lines.append(f"  KL {name:<8} {tok[f'kl_{name}'].statistic:>10.4g} {_pooled_interval(tok[f'kl_{name}'])}")
        same, ppl = tok["same_top1"], tok["ppl_ratio"]
        lines.append(f"  same top p {100 * same.statistic:9.2f}% {_pooled_interval(same, 100, '.2f')}")
        lines.append(f"  PPL ratio  {ppl.statistic:>10.5g} {_pooled_interval(ppl, spec='.5g')}  (exp of the mean "
                     "change of NLL)")
        layers = ev["documents"]["layer_attention_kl"]
        worst = sorted(range(len(layers)), key=lambda i: -layers[i].statistic)[:5]
        lines.append("attention KL of the estimator's logits, the 5 worst layers: " + ", ".join(
            f"{i}: {layers[i].statistic:.3g}" for i in worst))
        if cfg["compare"] is not None:
            lines += comparison_footnotes(self, "A", "B")
        return "\n".join(lines)


def _held_line(letter: str, name: str, bits: dict, window: int) -> str:
    """A side's measured bits per element held; with an exact window, also the codes' alone (the quantized tokens:
    what the quantizer's budget is about)."""
    line = f"  {letter} = {name}: {bits['measured']:.4g} bits per element held (measured"
    if not window:
        return line + ")"
    codes = bits.get("measured_codes")
    alone = ("no token was quantized: the exact window holds them all" if codes is None or not math.isfinite(codes)
             else f"the codes alone {codes:.4g} bits per element of the quantized tokens")
    return line + f": the codes and the exact window of {window} tokens); {alone}"


def _pooled_interval(r, scale: float = 1.0, spec: str = ".4g") -> str:
    """A pooled statistic's interval as printed: ``[low, high]`` (times ``scale``), or why it has none."""
    if r.ci_method == "none":
        return ("(no interval: none covers a maximum)" if r.extra["no_interval"] == NO_INTERVAL_OF_A_MAXIMUM else
                f"(no interval: {r.n[0]} documents)")
    return f"[{scale * r.confidence_interval.low:{spec}}, {scale * r.confidence_interval.high:{spec}}]"


def evaluate_model(quantizer, *, bits: int, model="smollm2", compare=None, match_bits: bool = False,
                   segment: int = DEFAULT_SEGMENT, segments_per_document: int | None = 1,
                   full_precision_window: int = 0, seed: int | None = 0, inference: InferenceOptions | None = None,
                   check: bool = True, linear: bool = True, out=None, force: bool = False, store=None,
                   progress: bool = False, dtype: torch.dtype = torch.float32, documents: dict[str, str] | None = None,
                   **options) -> ModelEvaluation:
    """Evaluate ``quantizer`` at ``bits`` on ``model`` (module doc of :mod:`kvstats.evaluation.model_engine`).
    ``quantizer``, ``bits``, ``compare``, ``match_bits``, ``seed``, ``inference``, ``check``, ``linear``, ``out``,
    ``force``, ``store``, ``progress`` and ``**options`` are as in :func:`kvstats.evaluate`; ``inference.n_resamples``
    sets the pooled statistics' cluster bootstrap (default 1999), the per-document means and the comparison keep
    9999 (cheap at a few dozen documents).

    Args:
        model: ``"smollm2"``, a local Hugging Face model folder or a .gguf file.
        segment: tokens per segment; segments_per_document: how many disjoint segments of each document (None:
            all).
        full_precision_window: W, the most recent tokens the cache keeps exact (KIVI/QJL style).
        dtype: the model's dtype.
        documents: ``{title: text}`` instead of the shipped documents.
    """
    from kvstats._files import check_output_path, is_stream
    from kvstats._random import check_seed, unit_seed
    from kvstats._validation import check_int_range
    from kvstats.evaluation import unit_store
    from kvstats.evaluation.model_engine import model_source
    from kvstats.evaluation.quantizer_sides import prepare_sides
    from kvstats.hf.capture import model_files

    started = time.time()
    inference = inference_options(inference)
    bits = check_int_range(bits, "bits", 1, 8)
    full_precision_window = check_int_range(full_precision_window, "full_precision_window", 0, 1 << 30)
    fresh_seed = seed is None
    seed = check_seed(seed)
    if out is not None:  # before the model loads; never one of the model's own files
        out = check_output_path(out, "out", force=force, inputs=model_files(model))
    source = model_source(model, segment=segment, segments_per_document=segments_per_document, documents=documents,
                          dtype=dtype)
    d, heads = source.dims["head_dim"], source.dims["kv_heads"]
    probe_gen = torch.Generator().manual_seed(0)
    probe = [(None, *(torch.randn(1, heads, segment, d, generator=probe_gen) for _ in range(2)))]
    sides = prepare_sides(quantizer, compare, bits, options, dim=d, heads=heads, seed0=unit_seed(seed, 0),
                          parts=lambda: probe, check=check, linear=linear, match=match_bits)
    n_docs = len({doc for doc, _, _ in source.segments})
    plan = None if sides.other is None else _plan(n_docs, inference.alpha)
    identities = sides.identities()
    key = None if None in identities else unit_store.store_key(
        {"mode": "model", "sides": identities, "source": source.identity, "seed": seed,
         "window": full_precision_window, "kvstats": unit_store.kvstats_digest()})
    if store is None and out is not None and not is_stream(out):
        store = Path(str(out) + ".units")
    if key is None:
        store = None
    rows, reused = unit_store.run_resumable(
        _segment_function(sides, source, seed, full_precision_window), len(source.segments), key=key, store=store,
        progress=progress, desc=f"evaluate {sides.main.label} on {source.name}", seed=seed, fresh_seed=fresh_seed)
    summaries, comparison = _statistics(rows, sides.other is not None, inference, seed)
    config = {"quantizer": sides.main.label, "compare": None if sides.other is None else sides.other.label,
              "bits": bits, "compare_bits": None if sides.other is None else sides.other.bits,
              "match_bits": bool(match_bits), "model": source.name, "model_dims": source.dims, "documents": n_docs,
              "segment": segment, "segments_per_document": segments_per_document, "skipped_documents": source.skipped,
              "full_precision_window": full_precision_window,
              "pooled_intervals": ("cluster BCa bootstrap over the documents, then their segments"
                                   if n_docs >= POOLED_MIN_DOCUMENTS else f"withheld: {withheld_reason(n_docs)}"),
              "seed": seed, "alpha": inference.alpha,
              "confidence_level": inference.confidence_level, "options": {k: str(v) for k, v in options.items()},
              "checks": sides.checks,
              "schemes": sides.records | {"seeds": "unit 0's; unit i's schemes are built from unit_seed(seed, i)"},
              "units_reused": reused, "dtype": str(dtype).removeprefix("torch."),
              "reference": ("the model's own attention, no cache" if rows[0]["lossless_floor"] is None else
                            "the kvstats path with a lossless scheme (the model is not fp32)"),
              "lossless_floor": None if rows[0]["lossless_floor"] is None else
              float(np.mean([r["lossless_floor"] for r in rows]))}
    ev = ModelEvaluation(config, rows, summaries, comparison.get("tests", {}), comparison.get("excluded", {}), plan,
                         comparison.get("plan"), sides.budgets(rows, claimed=False),
                         provenance(started=started, seeds={"seed": seed, "unit i": "unit_seed(seed, i) (the schemes)",
                                                            "bootstrap": inference.bootstrap_seed(seed)}))
    return unit_store.save_results(ev, out, force=force, store=store, n=len(source.segments), key=key)


def _plan(n_docs: int, alpha: float):
    """Whether a comparison over ``n_docs`` documents can conclude at ``alpha`` (warned when it cannot)."""
    from kvstats.evaluation.comparison import plan_comparison
    from kvstats.evaluation.results import InconclusiveWarning

    plan = plan_comparison(n_docs, len(MODEL_METRICS), alpha)
    if not plan.can_conclude:
        warnings.warn(InconclusiveWarning(f"{plan.message()}: pass more documents"), stacklevel=4)
    return plan


def _segment_function(sides, source, seed: int, window: int):
    """``compute(i)``: segment i's row — the reference pass once, then each side's quantized pass."""
    from kvstats._random import unit_seed
    from kvstats.evaluation.model_engine import model_unit, reference_logits

    d = source.dims["head_dim"]

    def compute(i: int) -> dict:
        doc, title, ids = source.segments[i]
        ref, floor = reference_logits(source, ids)
        row = {"unit": i, "document": doc, "title": title, "lossless_floor": floor,
               **model_unit(source, sides.main.scheme(d, unit_seed(seed, i)), ids, full_precision_window=window,
                            reference=ref)}
        if sides.other is not None:
            row |= {f"other:{k}": v for k, v in model_unit(source, sides.other.scheme(d, unit_seed(seed, i)), ids,
                                                              full_precision_window=window, reference=ref).items()}
        return row

    return compute


def _statistics(rows: list[dict], compared: bool, inference: InferenceOptions, seed: int):
    """Each side's per-document means and pooled token statistics, and the paired comparison when ``compared``."""
    from kvstats.evaluation.comparison import compare_units, per_document
    from kvstats.evaluation.model_engine import pooled_summary, unit_summary

    def side(prefix: str) -> dict:
        return {"documents": unit_summary(rows, prefix=prefix, inference=inference, seed=seed),
                "tokens": pooled_summary(rows, prefix=prefix, inference=inference, seed=seed)}

    summaries = {"evaluated": side("")} | ({"compared": side("other:")} if compared else {})
    comparison = {} if not compared else compare_units(
        per_document(rows, MODEL_METRICS), alpha=inference.alpha, confidence_level=inference.confidence_level,
        seed=inference.bootstrap_seed(seed), metrics=MODEL_METRICS)  # 9999 resamples: cheap at document counts
    return summaries, comparison
