"""Retrieval through a quantized KV cache on any model kvstats loads, for any quantizer ``evaluate`` accepts: every
trial a pass or a fail, the fp model as control on the same trials (docs/retrieval.md).

    ev = kvstats.evaluate_retrieval("mymod:MyQuant", bits=3, model="smollm2", compare="kqv")
    print(ev.table())          # accuracy (Wilson), exact McNemar vs fp and between the sides (Holm), TOST at ±margin
    ev.figure("retrieval.png")  # accuracy over context length × needle depth

**Protocol** (the retrieval study's, :mod:`kvstats.studies.retrieval`): per prompt (:mod:`kvstats.evaluation.
retrieval_tasks`), the context goes through the model once with its own attention into a ``DynamicCache`` (every
layer keeps every token); its K/V are handed to a :class:`~kvstats.cache.KVStatsCache` of each side
(:meth:`~kvstats.cache.KVStatsCache.prefill`: every token stored as codes), and the questions with their answers go
through the cache in one teacher-forced forward on the estimator path (verified); then through the fp cache (the
control). A needle passes when every answer token is the argmax. On the first prompt a lossless scheme must
reproduce the control's logits (the model's own attention is the oracle): a model kvstats cannot hold exactly is
refused, not measured.

**Statistics** (:mod:`kvstats.evaluation.retrieval_stats`): accuracy per (task, length) and per task with Wilson
intervals; exact McNemar of each side against fp and between the sides per task over its lengths (the primary
family, Holm) and per (task, length) (Holm within each); per task the paired difference's Newcombe interval at
1 − 2α, inside ±margin = equivalent (TOST at α). The needles of one prompt share its text: the tests treat them as
trials, so their p-values describe these prompts (the passkey task has one needle per prompt).
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from kvstats.evaluation.results import JsonResults
from kvstats.evaluation.retrieval_tasks import DEPTHS, TASKS, Prompt, RetrievalTasks, passed
from kvstats.study.strict_json import strict_json

__all__ = ["RETRIEVAL_SCHEMA", "FP", "PromptRun", "RetrievalEvaluation", "evaluate_retrieval"]

RETRIEVAL_SCHEMA = "kvstats-retrieval/1"
FP = "fp"
#: the n recorded for the fp control's rows (its cache holds the model's own states)
FP_BITS = 16
NEEDLES = {"passkey": 1, "induction": len(DEPTHS), "lookup": len(DEPTHS)}


class PromptRun:
    """One prompt's exact prefill (once) and what reads it: the questions through a KVStatsCache of a scheme
    (:meth:`quantized`) or through the exact cache (:meth:`exact`, last: it extends the prefill itself)."""

    def __init__(self, model, prompt: Prompt, *, attention: str | None = None):
        from transformers import DynamicCache

        from kvstats.evaluation.model_engine import set_attention
        from kvstats.hf.cache import cache_kwargs

        self.model, self.p = model, prompt
        self.attention = attention or model.config._attn_implementation
        self.device = next(model.parameters()).device
        self.chunk = torch.tensor([prompt.chunk], device=self.device)
        set_attention(model, self.attention)
        self.past = model(torch.tensor([prompt.context], device=self.device), use_cache=True, logits_to_keep=1,
                          **cache_kwargs(model, DynamicCache())).past_key_values  # no [T, vocab] logits

    def _logits(self, cache) -> torch.Tensor:
        from kvstats.hf.cache import cache_kwargs

        return self.model(self.chunk, use_cache=True, **cache_kwargs(self.model, cache)).logits[0].float().cpu()

    def quantized(self, scheme, *, record: bool = True) -> dict[str, Any]:
        """The questions through a KVStatsCache of ``scheme`` (one Scheme for every layer, or ``layer -> Scheme``)
        holding the prefill as codes, on the estimator path (verified): ``logits`` [chunk, V], ``success`` per
        needle, the mean attention KL of every question query and layer (with ``record``), the bits per element
        the cache held at the end (``bits_per_element``: the context and the questions) and those it held for the
        context alone, before the questions (``context_bits_per_element``)."""
        from kvstats.evaluation.model_engine import set_attention
        from kvstats.hf.cache import KVStatsCache

        cache = KVStatsCache(scheme, record_attention=record)
        set_attention(self.model, "kvstats")
        try:
            cache.prefill(self.past)
            context_bits = float(cache.memory().bits_per_element)
            logits = self._logits(cache)
            cache.require_estimator_path(self.model)
        finally:
            set_attention(self.model, self.attention)
        records = cache.attention_records
        kl = float(np.mean([r.kl.mean().item() for r in records])) if records else float("nan")
        return {"logits": logits, "success": passed(logits, self.p), "attn_kl": kl,
                "bits_per_element": float(cache.memory().bits_per_element), "context_bits_per_element": context_bits}

    def through(self, cache) -> dict[str, Any]:
        """The questions through another ``cache`` holding the prefill (e.g. transformers' quantized cache made from
        :attr:`past`), with the prefill's attention: ``logits`` and ``success``."""
        from kvstats.evaluation.model_engine import set_attention

        set_attention(self.model, self.attention)
        logits = self._logits(cache)
        return {"logits": logits, "success": passed(logits, self.p)}

    def exact(self) -> dict[str, Any]:
        """The questions through the fp cache, with the model's own attention: ``logits`` and ``success`` (last: the
        forward extends the prefill itself)."""
        return self.through(self.past)


@dataclass(frozen=True)
class RetrievalEvaluation(JsonResults):
    """What :func:`evaluate_retrieval` measured.

    Attributes:
        config: how it ran (sides, bits, model, tasks, lengths, prompts, margin, alpha, seed, checks).
        units: one dict per prompt: ``unit``, ``task``, ``length``, ``prompt``, ``context_tokens``, ``trials``
            (per needle: ``needle``, ``depth``, and the outcome of each cache: ``fp``, ``A``, ``B``), and per
            quantized side its ``attn_kl`` and ``bits_per_element``.
        accuracy: per (task, length, cache) with Wilson intervals; pooled: per (task, cache).
        tests: exact McNemar rows (:func:`kvstats.evaluation.retrieval_stats.tests_table`), each pooled row with its
            TOST interval (``eq_low``, ``eq_high`` at 1 − 2α) and ``verdict``.
        plan: what the trials can conclude, worked out before running.
        provenance: versions, commit, device, date, wall time, command line, seeds.
    """

    config: dict[str, Any]
    units: list[dict]
    accuracy: list[dict]
    pooled: list[dict]
    tests: list[dict]
    plan: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)

    schema = RETRIEVAL_SCHEMA

    def trials(self) -> pd.DataFrame:
        """One row per (cache, needle): the trials table of :mod:`kvstats.evaluation.retrieval_stats`."""
        return trials_frame(self.units, self.config["sides"])

    def to_dict(self) -> dict[str, Any]:
        """The results file's content: strict-JSON-ready (no NaN or inf: null, with ``null_reasons``)."""
        return strict_json({"schema": self.schema, "config": self.config, "plan": self.plan, "units": self.units,
                            "accuracy": self.accuracy, "pooled": self.pooled, "tests": self.tests,
                            "provenance": self.provenance})

    def table(self) -> str:
        """Plain text: per task the accuracy of fp and each side (Wilson), the McNemar tests with Holm, the TOST
        interval and the verdict; then the accuracies per length."""
        from kvstats.evaluation.retrieval_report import table

        return table(self)

    def figure(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """The heat map of accuracy over context length × needle depth, one row of panels per task, one column per
        cache (fp first), written to ``path`` (.png, .pdf or .svg)."""
        from kvstats.evaluation.retrieval_report import figure

        return figure(self, path, force=force)


def trials_frame(units: list[dict], sides: dict[str, dict]) -> pd.DataFrame:
    """The units' needles as the trials table: one row per (cache, needle), the cache's ``scheme`` its label and
    ``n`` its budget (:data:`FP_BITS` for fp)."""
    rows = []
    for u in units:
        for t in u["trials"]:
            for key, side in sides.items():
                m = u.get(key, {})
                rows.append({"task": u["task"], "length": u["length"], "prompt": u["prompt"], "needle": t["needle"],
                             "depth": t["depth"], "side": key, "scheme": side["label"], "n": side["bits"],
                             "success": bool(t[key]), "attn_kl": m.get("attn_kl", float("nan")),
                             "bits_per_element": m.get("bits_per_element", float("nan")),
                             "context_tokens": u["context_tokens"]})
    return pd.DataFrame(rows)


def _check_plan_arguments(tasks, lengths, prompts: int) -> tuple[tuple[str, ...], tuple[int, ...], int]:
    from kvstats._validation import check_int_range

    tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    bad = [t for t in tasks if t not in TASKS]
    if not tasks or bad or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must name each of {TASKS} at most once, got {list(tasks)}")
    lengths = (lengths,) if isinstance(lengths, int) else tuple(lengths)
    if not lengths or len(set(lengths)) != len(lengths):
        raise ValueError(f"lengths must be distinct context lengths in tokens, got {list(lengths)}")
    lengths = tuple(check_int_range(n, "lengths", 64, 1 << 22) for n in lengths)
    return tasks, tuple(sorted(lengths)), check_int_range(prompts, "prompts", 1, 1 << 20)


def plan(tasks, lengths, prompts: int, comparisons: int, *, alpha: float, margin: float,
         discordance: float) -> dict[str, Any]:
    """What the planned trials can conclude, per task: its trials (prompts × lengths × needles), the fewest
    discordant trials with which McNemar rejects at Holm's first threshold over the primary family (tasks ×
    ``comparisons``), and the trials a TOST at ±``margin`` needs at 80% power when the caches disagree on
    ``discordance`` of the trials (:func:`~kvstats.evaluation.retrieval_stats.equivalence_trials`)."""
    from kvstats.evaluation.retrieval_stats import equivalence_trials, min_discordant

    family = len(tasks) * comparisons
    need_b = min_discordant(alpha, family)
    need_eq = equivalence_trials(margin, alpha=alpha, discordance=discordance)
    per_task = {t: prompts * len(lengths) * NEEDLES[t] for t in tasks}
    return {"trials": per_task, "family": family, "min_discordant_to_reject": need_b,
            "can_reject": {t: n >= need_b for t, n in per_task.items()},
            "equivalence": {"margin": margin, "power": 0.8, "assumed_discordance": discordance,
                            "trials_needed": need_eq, "enough": {t: n >= need_eq for t, n in per_task.items()}}}


def evaluate_retrieval(quantizer, *, bits: int, model="smollm2", compare=None, match_bits: bool = False,
                       tasks=TASKS, lengths=(256, 1024), prompts: int = 10, margin: float = 0.05,
                       alpha: float = 0.05, discordance: float = 0.1, seed: int | None = 0,
                       documents: dict[str, str] | None = None, dtype: torch.dtype = torch.float32,
                       check: bool = True, linear: bool = True, out=None, force: bool = False, store=None,
                       progress: bool = False, **options) -> RetrievalEvaluation:
    """Retrieval of ``quantizer`` at ``bits`` (and ``compare``) on ``model`` against the fp control (module doc).

    Args:
        quantizer, bits, compare, match_bits, check, linear, seed, options: as in :func:`kvstats.evaluate`; unit i
            (one prompt) builds each side's scheme from ``unit_seed(seed, i)``, its prompt from
            ``cell_seed("retrieval", task, length, seed)``'s child ``prompt``.
        model: ``"smollm2"``, a local Hugging Face model folder or a .gguf file.
        tasks: some of ``passkey``, ``induction``, ``lookup``; lengths: context lengths in tokens (each at most the
            model's context less the questions); prompts: per (task, length).
        margin: δ of the equivalence test (TOST at ``alpha`` on the (1 − 2α) Newcombe interval); discordance: the
            fraction of trials on which the sides are assumed to disagree when planning it.
        documents: ``{title: text}``, the haystack (default: the shipped documents but the Declaration of
            Independence).
        out: the results JSON (checked before any work; finished prompts are kept in OUT.units until the end, so an
            interrupted run resumes); store: that folder, explicitly.
    """
    from kvstats._files import check_output_path, is_stream
    from kvstats._random import check_seed, unit_seed
    from kvstats._validation import check_int_range
    from kvstats.evaluation import unit_store
    from kvstats.evaluation.model_engine import _model_identity
    from kvstats.evaluation.quantizer_sides import prepare_sides
    from kvstats.evaluation.results import InconclusiveWarning
    from kvstats.evaluation.retrieval_stats import tests_table
    from kvstats.hf.cache import model_dims
    from kvstats.hf.capture import load_model, model_files
    from kvstats.study.provenance import provenance
    from kvstats.study.sweep import cell_seed

    started = time.time()
    bits = check_int_range(bits, "bits", 1, 8)
    tasks, lengths, prompts = _check_plan_arguments(tasks, lengths, prompts)
    for name, value, high in (("alpha", alpha, 0.5), ("margin", margin, 1.0), ("discordance", discordance, 1.0)):
        if not (isinstance(value, (int, float)) and 0 < value < high):
            raise ValueError(f"{name} must be in (0, {high:g}), got {value!r}")
    fresh_seed = seed is None
    seed = check_seed(seed)
    if out is not None:
        out = check_output_path(out, "out", force=force, inputs=model_files(model))
    lm, tokenizer, name = load_model(model, dtype=dtype)
    dims = model_dims(lm.config)
    d, heads = dims["head_dim"], dims["kv_heads"]
    builder = RetrievalTasks(tokenizer, documents)
    units = [(task, length, i) for task in tasks for length in lengths for i in range(prompts)]

    def prompt_of(task: str, length: int, i: int) -> Prompt:
        rng = np.random.default_rng(unit_seed(cell_seed("retrieval", task, length, seed), i))
        return builder.build(task, length, rng, depth=DEPTHS[i % len(DEPTHS)])

    limit = getattr(lm.config.get_text_config(decoder=True), "max_position_embeddings", None)
    for task in tasks:
        longest = prompt_of(task, lengths[-1], 0)
        if limit is not None and len(longest.context) + len(longest.chunk) > limit:
            raise ValueError(f"lengths: {task} at {lengths[-1]} tokens needs {len(longest.context)} + "
                             f"{len(longest.chunk)} positions, more than the model's max_position_embeddings={limit}")
    probe_gen = torch.Generator().manual_seed(0)
    probe = [(None, *(torch.randn(1, heads, min(lengths), d, generator=probe_gen) for _ in range(2)))]
    sides = prepare_sides(quantizer, compare, bits, options, dim=d, heads=heads, seed0=unit_seed(seed, 0),
                          parts=lambda: probe, check=check, linear=linear, match=match_bits)
    labels = {"A": sides.main} | ({} if sides.other is None else {"B": sides.other})
    side_info = {FP: {"label": FP, "bits": FP_BITS}} | {k: {"label": s.label, "bits": s.bits}
                                                        for k, s in labels.items()}
    pairs = [("A", FP)] + ([("B", FP), ("A", "B")] if sides.other is not None else [])
    the_plan = plan(tasks, lengths, prompts, len(pairs), alpha=alpha, margin=margin, discordance=discordance)
    short = [t for t, ok in the_plan["can_reject"].items() if not ok]
    if short:
        warnings.warn(InconclusiveWarning(
            f"{', '.join(short)}: fewer trials than the {the_plan['min_discordant_to_reject']} discordant ones an "
            f"exact McNemar needs to reject at alpha = {alpha} over the family of {the_plan['family']}: no "
            "difference can be found; pass more prompts or lengths"), stacklevel=2)

    identities = sides.identities()
    key = None if None in identities else unit_store.store_key(
        {"mode": "retrieval", "sides": identities, "model": _model_identity(model, lm), "seed": seed,
         "units": units, "documents": None if documents is None else sorted(documents.items()),
         "kvstats": unit_store.kvstats_digest()})
    if store is None and out is not None and not is_stream(out):
        store = Path(str(out) + ".units")
    if key is None:
        store = None

    def compute(i: int) -> dict:
        task, length, k = units[i]
        p = prompt_of(task, length, k)
        with torch.inference_mode():
            run = PromptRun(lm, p)
            measured = {key: run.quantized(s.scheme(d, unit_seed(seed, i))) for key, s in labels.items()}
            lossless = _lossless_logits(run, d) if i == 0 else None
            exact = run.exact()
        checked = {} if lossless is None else {
            "lossless_max_logit_gap": _require_lossless(lossless, exact["logits"], p, name, dtype)}
        outcomes = {FP: exact["success"]} | {k: m["success"] for k, m in measured.items()}
        return {"unit": i, "task": task, "length": length, "prompt": k, "context_tokens": len(p.context),
                "trials": [{"needle": j, "depth": p.depths[j], **{c: bool(o[j]) for c, o in outcomes.items()}}
                           for j in range(len(p.answers))],
                **{c: {"attn_kl": m["attn_kl"], "bits_per_element": m["bits_per_element"]}
                   for c, m in measured.items()}, **checked}

    rows, reused = unit_store.run_resumable(compute, len(units), key=key, store=store, progress=progress,
                                            desc=f"retrieval {sides.main.label} on {name}", seed=seed,
                                            fresh_seed=fresh_seed)
    trials = trials_frame(rows, side_info)
    by_side = trials.assign(scheme=trials["side"])  # the tests name the caches A, B, fp (labels may coincide)
    pair_keys = [((a, side_info[a]["bits"]), (b, side_info[b]["bits"])) for a, b in pairs]
    tests = _with_equivalence(tests_table(by_side, pair_keys, alpha=alpha), by_side, alpha, margin)
    from kvstats.evaluation.retrieval_stats import accuracy_table

    accuracy = accuracy_table(trials, ["task", "length", "side", "scheme", "n"])
    pooled = accuracy_table(trials, ["task", "side", "scheme", "n"])
    grid = accuracy_table(trials, ["task", "length", "depth", "side", "scheme", "n"])
    config = {"quantizer": sides.main.label, "compare": None if sides.other is None else sides.other.label,
              "bits": bits, "compare_bits": None if sides.other is None else sides.other.bits,
              "match_bits": bool(match_bits), "sides": side_info, "model": name, "model_dims": dims,
              "dtype": str(dtype).removeprefix("torch."), "tasks": list(tasks), "lengths": list(lengths),
              "prompts": prompts, "margin": margin, "alpha": alpha, "seed": seed,
              "haystack": "shipped documents" if documents is None else f"{len(documents)} documents given",
              "options": {k: str(v) for k, v in options.items()}, "checks": sides.checks,
              "schemes": sides.records | {"seeds": "unit 0's; unit i's schemes are built from unit_seed(seed, i)"},
              "units_reused": reused, "grid": grid.to_dict("records"),
              "lossless_check": {"what": "a lossless scheme on the kvstats path reproduced the model's own "
                                         "attention on unit 0: every answer prediction the same" +
                                         (", the logits within 1e-3 of their scale" if dtype in _FULL else ""),
                                 "max_logit_gap": rows[0]["lossless_max_logit_gap"]}}
    ev = RetrievalEvaluation(config, rows, accuracy.to_dict("records"), pooled.to_dict("records"),
                             tests.to_dict("records"), the_plan,
                             provenance(started=started, seeds={"seed": seed, "unit i": "unit_seed(seed, i)"}))
    return unit_store.save_results(ev, out, force=force, store=store, n=len(units), key=key)


def _lossless_logits(run: PromptRun, head_dim: int) -> torch.Tensor:
    """The chunk's logits through a KVStatsCache of a lossless scheme (the oracle's other half)."""
    from kvstats.hf.cache import IdentityScheme

    return run.quantized(IdentityScheme(head_dim), record=False)["logits"]


_FULL = (torch.float32, torch.float64)


def _require_lossless(lossless: torch.Tensor, exact: torch.Tensor, p: Prompt, model: str,
                      dtype: torch.dtype) -> float:
    """Refuse a model whose prefill kvstats cannot hold exactly: with a lossless scheme every answer prediction must
    be the model's own and, for an fp32 model, the logits agree to 1e-3 of their scale (fp32 reorders sums; a wrong
    position or a lost layer moves them by their whole scale; a bf16/fp16 model's own attention rounds in its dtype
    where the kvstats path accumulates in fp32, so there only the predictions are compared). Returns the largest
    |logit difference|."""
    gap = float((lossless - exact).abs().max())
    scale = float(exact.abs().max())
    same = all(int(lossless[o - 1 + j].argmax()) == int(exact[o - 1 + j].argmax())
               for o, answer in p.answers for j in range(len(answer)))
    if not same or (dtype in _FULL and not gap <= 1e-3 * max(scale, 1.0)):
        raise ValueError(f"model {model}: a lossless cache on the kvstats path does not reproduce the model's own "
                         f"attention on the first prompt (max |logit difference| {gap:.3g} of scale {scale:.3g}"
                         f"{'' if same else '; an answer prediction differs'}): kvstats cannot hold this model's "
                         "prefill exactly, so it measures nothing on it")
    return gap


def _with_equivalence(tests: pd.DataFrame, trials: pd.DataFrame, alpha: float, margin: float) -> pd.DataFrame:
    """The pooled rows with their (1 − 2α) Newcombe interval (``eq_low``, ``eq_high``) and verdict."""
    from kvstats.evaluation.retrieval_stats import mcnemar_row, verdict

    if tests.empty:
        return tests
    tests = tests.assign(eq_low=np.nan, eq_high=np.nan, verdict="")
    for idx, r in tests[tests["length"] == "all"].iterrows():
        g = trials[trials["task"] == r["task"]]
        eq = mcnemar_row(g, (r["a"], r["n_a"]), (r["b"], r["n_b"]), confidence_level=1 - 2 * alpha)
        tests.loc[idx, ["eq_low", "eq_high"]] = eq["diff_low"], eq["diff_high"]
        tests.loc[idx, "verdict"] = verdict(tests.loc[idx].to_dict(), margin)
    return tests
