"""``kvstats.recipe``: a per-layer, per-K/V precision recipe for a model under bit budgets, measured and checked.

    r = recipe(["int_token@2", "int_token@4", "fp8_e4m3@8"], budgets=[3, 4], model="smollm2", documents_used=8)
    print(r.table()); r.map(3).save("map.json"); r.save("recipe.json")

Every configuration runs the same teacher-forced segments (one per document, the first ``documents_used``
documents holding a full segment; :mod:`kvstats.evaluation.model_engine`) through a KVStatsCache with one scheme per
layer (:class:`~kvstats.evaluation.layer_recipe.LayerMap`), and its damage is each document's mean next-token
KL(p_exact ‖ p_quantized). The steps:

0. **the noise floor**: every layer exact on the kvstats path (a lossless scheme) against the model's own attention,
   the damage no recipe can go below (about 1e-11 nats for an fp32 model);
1. **isolated damage**: for each layer ℓ, each tensor (K or V) and each candidate format f, ℓ's K (or V) alone in f,
   everything else exact: damage[doc, ℓ, s, f] (an ``"exact"`` candidate costs no damage and is not run);
2. **uniform maps**: every layer's K and V in one format, for each candidate format: their damage, the bits
   per element the cache held (measured), and their additivity (damage against the sum of their 2L isolated
   parts);
3. per budget: **the map** minimising the summed mean isolated damage under the budget in bits per element the
   codes hold — each format's measured bits (its uniform map's), not its nominal width, which leaves out scales
   and zero points (:func:`~kvstats.evaluation.layer_recipe.solve_recipe`); its **stability** under bootstrap
   resamples of the documents; its **measured damage** and bits; the **additivity** check, measured against the
   sum of its isolated parts, paired over documents (:func:`~kvstats.evaluation.layer_recipe.additivity`); and the
   **comparison against uniform precision within the same budget**: the uniform map holding the most measured bits
   not above the budget (at a budget equal to a uniform map's bits, that map: equal measured bits, the recipe
   holding at most as many), paired Wilcoxon tests over documents on next-token KL, top-1 agreement and the change
   of NLL, Holm-corrected (:func:`kvstats.evaluation.comparison.compare_units`); none when the recipe is that
   uniform map itself.

The units (one document each) are stored as they finish when ``out`` is given (OUT.units), so an interrupted run
resumes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstats.evaluation.layer_recipe import EXACT, LayerMap, additivity, format_width, recipe_stability
from kvstats.evaluation.model_engine import DEFAULT_SEGMENT, MODEL_METRICS
from kvstats.evaluation.results import JsonResults

__all__ = ["RECIPE_SCHEMA", "Recipe", "recipe", "recipe_unit"]

RECIPE_SCHEMA = "kvstats-recipe/2"  # 2: each budget's refinement; the comparator chosen within the budget
_METRICS = (*MODEL_METRICS, "bits_total")


@dataclass(frozen=True)
class Recipe(JsonResults):
    """What :func:`recipe` measured: ``config``; ``units`` (per document: its isolated damages, L × 2 × F nested
    lists, and each uniform map's metrics); ``budgets`` (per budget: the map, its stability, predicted and measured
    damage, bits, the additivity verdict and the comparison against uniform precision); ``provenance``."""

    config: dict[str, Any]
    units: list[dict]
    budgets: list[dict]
    provenance: dict[str, Any] = field(default_factory=dict)

    schema = RECIPE_SCHEMA

    def map(self, budget: float, *, refined: bool = False) -> LayerMap:
        """The solver's map at ``budget``; ``refined``: the map of least measured damage among the solver's and the
        other maps the bootstrap resamples chose (measured on the same documents it is chosen on, so its damage
        there is optimistic)."""
        for b in self.budgets:
            if b["budget"] == budget:
                return LayerMap.from_dict(b["refinement"][b["refined"]]["map"] if refined else b["map"])
        raise ValueError(f"budget must be one of {[b['budget'] for b in self.budgets]}, got {budget!r}")

    def to_dict(self) -> dict[str, Any]:
        from kvstats.study.strict_json import strict_json

        def plain(b: dict) -> dict:
            add = b["additivity"]
            cmp_ = b["versus_uniform"]
            return {**b, "additivity": {**add, "difference": add["difference"].to_dict()},
                    "versus_uniform": None if cmp_ is None else {
                        **cmp_, "plan": cmp_["plan"].to_dict(),
                        "tests": {m: {"test": t["test"].to_dict(), "pvalue_holm": t["pvalue_holm"],
                                      "significant": t["significant"]} for m, t in cmp_["tests"].items()}}}

        return strict_json({"schema": self.schema, "config": self.config, "budgets": [plain(b) for b in self.budgets],
                            "units": self.units, "provenance": self.provenance})

    def table(self) -> str:
        from kvstats.measure.stats import interval_text

        cfg = self.config
        lines = [f"recipe on {cfg['model']}: {cfg['documents']} documents, {cfg['segment']} tokens each; candidate "
                 f"formats {', '.join(cfg['formats'])}; damage = mean next-token KL (nats) per document"]
        lines.append(f"noise floor: every layer exact on the kvstats path against the model's own attention, damage "
                     f"{cfg['noise_floor']:.3g} (what no recipe can go below)")
        lines.append("uniform maps (every layer's K and V in one format): damage, bits per element held (measured)")
        for f, u in cfg["uniform"].items():
            a = cfg["uniform_additivity"][f]
            lines.append(f"  {f:<16} {u['damage']:>10.4g}   {u['bits']:.4g} bits   sum of its isolated parts "
                         f"{a['predicted']:.4g}: {a['verdict']}")
        for b in self.budgets:
            add, st = b["additivity"], b["stability"]
            m = LayerMap.from_dict(b["map"])
            lines.append(f"budget {b['budget']:g} bits per element held: measured {b['bits']:.4g} (nominal widths "
                         f"{m.mean_bits:.4g}); the map chosen on {st['same_map']:.0%} of {st['resamples']} "
                         "bootstrap resamples of the documents")
            lines.append("  layers: " + m.summary())
            lines.append(f"  bits per element held per layer: {min(b['layer_bits']):.4g} to {max(b['layer_bits']):.4g}")
            lines.append(f"  damage: predicted (sum of isolated) {add['predicted']:.4g}, measured "
                         f"{add['measured']:.4g}; measured − predicted {add['difference'].statistic:+.4g} "
                         f"{interval_text(add['difference'])}"
                         f": {add['verdict']} (margin ±{add['margin']:.0%} of the prediction)")
            ref = b["refinement"]
            if len(ref) > 1:
                best = ref[b["refined"]]
                lines.append(f"  refinement: {len(ref) - 1} other maps the resamples chose, measured end to end: "
                             + ("the solver's map has the least damage" if best["solver"] else
                                f"one chosen on {best['share']:.0%} of resamples has {best['measured']:.4g} "
                                "(optimistic: chosen on these documents); Recipe.map(budget, refined=True)"))
            u = b["versus_uniform"]
            if u is None:
                lines.append(f"  no comparison: {b['versus_reason']}")
                continue
            lines.append(f"  against uniform {u['format']} ({u['bits']:.4g} bits, "
                         + ("equal to the recipe's" if u["equal_bits"] else f"the recipe {b['bits']:.4g}")
                         + "): paired Wilcoxon over documents, "
                         "Holm")
            for metric, t in u["tests"].items():
                lines.append(f"    {metric:<10} recipe {u['recipe'][metric]:.4g}  uniform {u['uniform'][metric]:.4g}"
                             f"  p (Holm) = {t['pvalue_holm']:.2g}{'*' if t['significant'] else ''}")
            if not u["plan"].can_conclude:
                lines.append(f"    ! {u['plan'].message()}")
        return "\n".join(lines)


def _single(n_layers: int, layer: int, side: int, fmt: str, exact_bits: int) -> LayerMap:
    pairs = [[EXACT, EXACT] for _ in range(n_layers)]
    pairs[layer][side] = fmt
    return LayerMap(tuple(map(tuple, pairs)), exact_bits)


def _refuse_budgets_below_the_narrowest(formats, budgets, exact_bits: int, heads: int, tokens: int, dim: int,
                                        seed: int) -> None:
    """Before any model work: each budget must fit the narrowest format's bits per element held, measured on a
    segment-sized probe [1, H_kv, segment, d] (what the codes of a uniform map hold per segment; nominal widths
    leave out scales and zero points)."""
    from kvstats.evaluation.quantizer_sides import measured_bits

    probe = torch.randn(1, heads, tokens, dim, generator=torch.Generator().manual_seed(0))
    held = {f: exact_bits if f == EXACT else
            measured_bits(LayerMap(((f, f),), exact_bits).scheme(0, dim, seed), [(None, probe, probe)])
            for f in formats}
    narrowest = min(held, key=held.get)
    for b in budgets:
        if held[narrowest] > b:
            raise ValueError(f"budgets: {b:g} bits is below the narrowest format's {held[narrowest]:.4g} bits per "
                             f"element held ({narrowest}, measured at {tokens} tokens of head dim {dim})")


def _check_formats(formats, dtype: torch.dtype) -> tuple[list[str], int, np.ndarray]:
    """(the formats as a list, the exact side's width in bits, each format's nominal width); at least two distinct
    formats, each registered (:func:`~kvstats.evaluation.layer_recipe.format_width` names one that is not)."""
    formats = [formats] if isinstance(formats, str) else list(formats)
    exact_bits = torch.finfo(dtype).bits
    widths = np.array([format_width(f, exact_bits=exact_bits) for f in formats], dtype=float)
    if len(formats) < 2 or len(set(formats)) != len(formats):
        raise ValueError(f"formats must name at least two distinct formats, got {formats}")
    return formats, exact_bits, widths


def _source(model, segment: int, documents, dtype, documents_used):
    from kvstats.evaluation.sensitivity import _documents_source

    return _documents_source(model, segment, documents, dtype, documents_used)


def _units_key(formats: list[str], source, seed: int) -> str:
    """What a document's measurements depend on: the formats, the source (model, texts, segment, dtype), the seed
    and kvstats' code."""
    from kvstats.evaluation import unit_store

    return unit_store.store_key({"mode": "recipe", "formats": formats, "source": source.identity, "seed": seed,
                                 "kvstats": unit_store.kvstats_digest()})


def _measure_document(source, i: int, formats: list[str], exact_bits: int, seed: int, progress: bool) -> dict:
    """Document ``i``'s measurements: its isolated damages [L, 2, F] (0 for ``exact``), each uniform map's metrics
    and the noise floor (module doc, steps 0-2)."""
    from kvstats.evaluation.model_engine import model_unit, reference_logits

    d, n_layers = source.dims["head_dim"], source.dims["layers"]
    quantized = [f for f, name in enumerate(formats) if name != EXACT]
    _, title, ids = source.segments[i]
    ref = reference_logits(source, ids)[0]

    def run(m: LayerMap) -> dict:
        return model_unit(source, m.schemes(d, seed), ids, reference=ref, record=False)

    isolated = np.zeros((n_layers, 2, len(formats)))
    for layer in range(n_layers):
        for side in range(2):
            for f in quantized:
                isolated[layer, side, f] = run(_single(n_layers, layer, side, formats[f], exact_bits))["out_kl"]
    uniform = {}
    for f in quantized:
        r = run(LayerMap(((formats[f], formats[f]),) * n_layers, exact_bits))
        uniform[formats[f]] = {k: r[k] for k in _METRICS}
    floor = run(LayerMap(((EXACT, EXACT),) * n_layers, exact_bits))["out_kl"]
    if progress:
        print(f"  document {i + 1}/{len(source.segments)} ({title}) measured", file=sys.stderr, flush=True)
    return {"unit": i, "document": i, "title": title, "isolated": isolated.tolist(), "uniform": uniform,
            "noise_floor": floor}


def recipe_unit(formats, document: int, *, model="smollm2", documents_used: int | None = 8,
                segment: int = DEFAULT_SEGMENT, documents: dict[str, str] | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> dict:
    """One document's measurements for :func:`recipe` (its ``units``): document ``document`` of the same source
    (the arguments as :func:`recipe`'s) — its isolated damages, uniform maps and noise floor, with the key
    :func:`recipe` checks (``"key"``). Documents measured in parallel processes and passed back in order give the
    same recipe as one run."""
    from kvstats._validation import check_int_range

    formats, exact_bits, _ = _check_formats(formats, dtype)
    source = _source(model, segment, documents, dtype, documents_used)
    document = check_int_range(document, "document", 0, len(source.segments) - 1)
    return {**_measure_document(source, document, formats, exact_bits, seed, False),
            "key": _units_key(formats, source, seed)}


def _check_units(units, source, key: str) -> list[dict]:
    """The ``units`` given to :func:`recipe`: one per document, in order, each made by :func:`recipe_unit` for this
    run (its key), else refused by name."""
    units = list(units)
    if len(units) != len(source.segments):
        raise ValueError(f"units must hold one measurement per document ({len(source.segments)}), got {len(units)}")
    for i, u in enumerate(units):
        if not isinstance(u, dict) or u.get("unit") != i:
            raise ValueError(f"units[{i}] must be document {i}'s measurement (recipe_unit(..., document={i})), got "
                             f"{'unit ' + repr(u.get('unit')) if isinstance(u, dict) else type(u).__name__}")
        if u.get("key") != key:
            raise ValueError(f"units[{i}] was measured for other formats, documents, segment, dtype, seed or kvstats "
                             f"code (key {u.get('key')!r}, this run's {key!r})")
    return [{k: v for k, v in u.items() if k != "key"} for u in units]


def recipe(formats, *, budgets, model="smollm2", documents_used: int | None = 8, segment: int = DEFAULT_SEGMENT,
           documents: dict[str, str] | None = None, seed: int = 0, margin: float = 0.2, resamples: int = 200,
           alpha: float = 0.05, dtype: torch.dtype = torch.float32, out=None, force: bool = False, store=None,
           progress: bool = False, units=None, tie_kv: bool = False, refine: int = 3) -> Recipe:
    """The recipe of each budget for ``model`` from the candidate ``formats`` (module doc).

    Args:
        formats: ``"name@bits"`` of registered quantizers, or ``"exact"`` (at least two).
        budgets: mean bits per element, each at least the narrowest format's width.
        documents_used: how many documents (one segment each; None: all); documents: ``{title: text}`` instead of
            the shipped ones.
        margin: the additivity verdict's margin, a fraction of the predicted damage; resamples: bootstrap
            resamples of the documents for the stability of each map.
        out: the results JSON (finished documents kept in OUT.units until the end; ``store`` names that folder).
        tie_kv: K and V of a layer take one format (engines store one KV-cache dtype per layer; such a map can be
            exported to them, :mod:`kvstats.evaluation.recipe_export`).
        refine: how many other maps the bootstrap resamples chose (the most frequent first) are measured end to end
            beside the solver's; the one of least measured damage is the refined map (0: none).
        units: every document's measurements, made before by :func:`recipe_unit` with the same formats, model,
            documents, segment, dtype and seed (in parallel processes, say), in document order; each is checked
            against this run's key and refused when it does not match.
    """
    from kvstats._files import check_output_path, is_stream
    from kvstats._validation import check_int_range
    from kvstats.evaluation import unit_store
    from kvstats.evaluation.comparison import compare_units
    from kvstats.evaluation.model_engine import model_unit, quantized_logits, reference_logits
    from kvstats.hf.capture import model_files
    from kvstats.study.provenance import provenance

    started = time.time()
    formats, exact_bits, widths = _check_formats(formats, dtype)
    budgets = [budgets] if isinstance(budgets, (int, float)) else list(budgets)
    for b in budgets:
        if isinstance(b, bool) or not (isinstance(b, (int, float)) and widths.min() <= b):
            raise ValueError(f"budgets must be numbers of bits at least the narrowest format's {widths.min():g}, "
                             f"got {b!r}")
    if len({f"{float(b):g}" for b in budgets}) != len(budgets):
        raise ValueError(f"budgets must be distinct (as printed, %g), got {budgets}")
    if not isinstance(tie_kv, bool):
        raise ValueError(f"tie_kv must be True or False, got {tie_kv!r}")
    resamples = check_int_range(resamples, "resamples", 10, 1 << 20)
    refine = check_int_range(refine, "refine", 0, 1 << 10)
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1) (a fraction of the predicted damage), got {margin!r}")
    if out is not None:
        out = check_output_path(out, "out", force=force, inputs=model_files(model))
    source = _source(model, segment, documents, dtype, documents_used)
    d, n_layers = source.dims["head_dim"], source.dims["layers"]
    quantized = [i for i, f in enumerate(formats) if f != EXACT]
    _refuse_budgets_below_the_narrowest(formats, budgets, exact_bits, source.dims["kv_heads"], segment, d, seed)

    key = _units_key(formats, source, seed)
    if units is None:
        if store is None and out is not None and not is_stream(out):
            store = Path(str(out) + ".units")
        units, reused = unit_store.run_resumable(
            lambda i: _measure_document(source, i, formats, exact_bits, seed, progress), len(source.segments),
            key=key, store=store, progress=progress, desc=f"recipe on {source.name}", seed=seed, fresh_seed=False)
    else:
        units, reused = _check_units(units, source, key), len(source.segments)
    per_doc = np.array([u["isolated"] for u in units])  # [docs, L, 2, F]
    uniform = {f: {"damage": float(np.mean([u["uniform"][f]["out_kl"] for u in units])),
                   "bits": float(np.mean([u["uniform"][f]["bits_total"] for u in units]))}
               for f in units[0]["uniform"]}
    # the uniform maps are maps too: their measured damage against the sum of their 2L isolated parts, per format
    uniform_additivity = {formats[f]: additivity(per_doc[:, :, :, f].reshape(len(units), -1),
                                                 np.array([u["uniform"][formats[f]]["out_kl"] for u in units]),
                                                 margin=margin) for f in quantized}
    # the solver's widths are the bits each format's codes hold, measured (a uniform map of it: K and V hold as many
    # elements, and every (layer, tensor) as many, so a map's measured bits are the mean of its parts'); the
    # declared widths leave out the scales and zero points (int_token@2 holds 4 bits per element at d = 32)
    held = np.array([exact_bits if f == EXACT else uniform[f]["bits"] for f in formats])
    references = [reference_logits(source, ids)[0] for _, _, ids in source.segments]

    def measure(choice: np.ndarray, share: float, solver: bool) -> tuple[LayerMap, list[dict], np.ndarray, dict]:
        """The map of ``choice`` [L, 2], each document's metrics through it, its isolated parts [docs, 2L] and its
        refinement entry (the share of resamples choosing it, predicted and measured damage, bits held)."""
        m = LayerMap(tuple((formats[k], formats[v]) for k, v in choice), exact_bits)
        rows = [{"document": u["document"], **{k: r[k] for k in _METRICS}}
                for u, (_, _, ids), ref in zip(units, source.segments, references)
                for r in [model_unit(source, m.schemes(d, seed), ids, reference=ref, record=False)]]
        parts = np.take_along_axis(per_doc, np.broadcast_to(choice[None, ..., None], (len(units), n_layers, 2, 1)),
                                   -1)[..., 0].reshape(len(units), -1)
        entry = {"map": m.to_dict(), "share": share, "solver": solver, "predicted": float(parts.sum(1).mean()),
                 "measured": float(np.mean([r["out_kl"] for r in rows])),
                 "bits": float(np.mean([r["bits_total"] for r in rows]))}
        return m, rows, parts, entry

    results = []
    for b in budgets:
        stable = recipe_stability(per_doc, held, float(b), resamples=resamples, seed=seed, tie_kv=tie_kv)
        choice = stable["choice"]
        m, rows, parts, solved = measure(choice, stable["same_map"], True)
        add = additivity(parts, np.array([r["out_kl"] for r in rows]), margin=margin)
        refinement = [solved] + [measure(other, share, False)[3] for other, share in
                                 [(c, sh) for c, sh in stable["maps"] if not np.array_equal(c, choice)][:refine]]
        bits = solved["bits"]
        _, held_cache = quantized_logits(source.model, m.schemes(d, seed), source.segments[0][2], record=False)
        layer_bits = [held_cache.memory(layer=i).bits_per_element for i in range(len(held_cache.layers))]
        # the comparator: the uniform map holding the most measured bits within the same budget (at a budget equal
        # to a uniform map's bits, that map: equal measured bits, the recipe holding at most as many)
        fits = [f for f, u in uniform.items() if u["bits"] <= float(b) * (1 + 1e-9)]
        versus, versus_reason = None, "no uniform map holds at most the budget's bits"
        if fits:
            f = max(fits, key=lambda x: uniform[x]["bits"])
            if m == LayerMap(((f, f),) * n_layers, exact_bits):
                fits, versus_reason = [], f"the recipe is the uniform {f} map itself: nothing to compare"
        if fits:
            paired = [{**r, **{f"other:{k}": units[j]["uniform"][f][k] for k in MODEL_METRICS}}
                      for j, r in enumerate(rows)]
            c = compare_units(paired, alpha=alpha, seed=seed, metrics=MODEL_METRICS)
            versus = {"format": f, "bits": uniform[f]["bits"], "equal_bits": bool(abs(uniform[f]["bits"] - bits)
                                                                                   <= 1e-9 * bits),
                      "plan": c["plan"], "tests": c["tests"],
                      "excluded": c["excluded"],
                      "recipe": {k: float(np.mean([r[k] for r in rows])) for k in MODEL_METRICS},
                      "uniform": {k: float(np.mean([u["uniform"][f][k] for u in units])) for k in MODEL_METRICS}}
        results.append({"budget": float(b), "map": m.to_dict(), "bits": bits, "layer_bits": layer_bits,
                        "measured": rows, "additivity": add, "refinement": refinement,
                        "refined": int(np.argmin([x["measured"] for x in refinement])),
                        "stability": {"same_map": stable["same_map"], "resamples": stable["resamples"],
                                      "agreement": stable["agreement"].tolist()},
                        "versus_uniform": versus, "versus_reason": None if versus else versus_reason})
    config = {"formats": formats, "widths": widths.tolist(), "held_bits": held.tolist(),
              "budgets": [float(b) for b in budgets],
              "model": source.name, "model_dims": source.dims, "documents": len(source.segments),
              "titles": [t for _, t, _ in source.segments], "segment": segment, "seed": seed, "margin": margin,
              "alpha": alpha, "dtype": str(dtype).removeprefix("torch."), "exact_bits": exact_bits,
              "tie_kv": tie_kv, "refine": refine,
              "uniform": uniform, "units_reused": reused,
              "noise_floor": float(np.mean([u["noise_floor"] for u in units])),
              "uniform_additivity": {f: {**a, "difference": a["difference"].to_dict()}
                                     for f, a in uniform_additivity.items()}}
    result = Recipe(config, units, results, provenance(started=started, seeds={"seed": seed}))
    return unit_store.save_results(result, out, force=force, store=store, n=len(source.segments), key=key)
