"""Per-layer sensitivity: which layers of a model to keep in full precision, measured, with intervals.

    s = sensitivity("kqv", bits=2, model="smollm2", documents_used=8)
    print(s.table()); s.figure("sensitivity.png"); s.save("sensitivity.json")

    kvstats sensitivity --model smollm2 --quantizer kqv --bits 2 --out sensitivity.json

Every configuration runs the same teacher-forced segments (the first ``segment`` tokens of ``documents_used``
shipped documents, :mod:`kvstats.evaluation.model_engine`) through a :class:`~kvstats.cache.KVStatsCache` whose layers
are either quantized by the scheme or kept exact (a lossless scheme), and measures the output damage: the mean
next-token KL(p_exact ‖ p_quantized) of each document, averaged over documents with a CI
(:func:`kvstats.stats.mean_ci`). The configurations:

* ``all``: every layer quantized (the damage to reduce);
* ``only L``: layer L alone quantized — how much damage L causes by itself;
* ``all but L``: every layer but L quantized — how much keeping L exact saves: ``saved L`` = the mean over
  documents of ``all − all but L``, document by document (a paired CI);
* the recommendation: the layers in the order of their ``only L`` damage, most damaging first, and the fewest
  k of them that, kept exact, bring the damage to at most ``target`` (default half of ``all``'s), found by
  bisection over k with every probed set **measured** (it assumes that keeping more of them exact does not raise
  the damage; the chosen set's damage is measured, not predicted from the single-layer runs: damages do not add,
  the layers interact through the residual stream).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstats.evaluation.model_engine import DEFAULT_SEGMENT
from kvstats.measure.stats import interval_text
from kvstats.measure.stats._options import InferenceOptions, inference_options

__all__ = ["SENSITIVITY_SCHEMA", "Sensitivity", "sensitivity", "sensitivity_figure"]

#: Version of the results file's layout.
SENSITIVITY_SCHEMA = "kvstats-sensitivity/1"


@dataclass(frozen=True)
class Sensitivity:
    """What :func:`sensitivity` measured.

    Attributes:
        config: how it ran (quantizer, bits, model, documents, segment, target, seeds, checks).
        damage: ``{configuration: MeanResult}`` of the per-document mean next-token KL, for ``"all"``,
            ``"only <L>"``, ``"all but <L>"`` and each measured keep-exact set ``"exact <L1,L2,...>"``; and
            ``"saved <L>"``, the paired mean of ``all − all but L``.
        per_document: ``{configuration: [per-document mean KL, ...]}`` (in document order).
        recommendation: ``{"keep_exact": [layers], "damage": MeanResult, "target": float, "reached": bool,
            "order": [layers by their own damage]}``; None for a part (``configurations=``).
        provenance: versions, commit, device, threads, date, wall time, command line, seeds.
    """

    config: dict[str, Any]
    damage: dict[str, Any]
    per_document: dict[str, list[float]]
    recommendation: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> int:
        return int(self.config["layers"])

    def to_dict(self) -> dict[str, Any]:
        from kvstats.study.strict_json import strict_json

        rec = None if self.recommendation is None else \
            dict(self.recommendation) | {"damage": self.recommendation["damage"].to_dict()}
        table = [{"layer": i, **{key: self.damage[f"{name} {i}"].to_dict() for key, name in
                                 (("only", "only"), ("all_but", "all but"), ("saved", "saved"))
                                 if f"{name} {i}" in self.damage}} for i in range(self.layers)]
        return strict_json({"schema": SENSITIVITY_SCHEMA, "config": self.config, "layers": table,
                            "damage": {k: v.to_dict() for k, v in self.damage.items()},
                            "per_document": self.per_document, "recommendation": rec, "provenance": self.provenance})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """Write :meth:`to_json` without destroying anything (:mod:`kvstats._files`)."""
        from kvstats._files import check_output_path, write_output

        return write_output(check_output_path(path, "path", force=force), self.to_json().encode("utf-8"))

    def _complete(self) -> None:
        if self.recommendation is None:
            raise ValueError("a partial sensitivity (configurations=...) has no table or figure: pass its "
                             "per_document as known= to a full run")

    def table(self) -> str:
        self._complete()
        cfg, full = self.config, self.damage["all"]
        level = full.confidence_level
        lines = [f"{cfg['quantizer']} at {cfg['bits']} bits on {cfg['model']}: per-layer sensitivity over "
                 f"{cfg['documents']} documents ({cfg['segment']} tokens each); damage = mean next-token KL (nats), "
                 f"{level:.0%} CI over documents",
                 f"  every layer quantized: {full.statistic:.4g} {interval_text(full)}",
                 f"{'layer':>6} {'only this layer':>28} {'all but this layer':>28} {'saved (paired)':>30}"]
        for i in range(self.layers):
            only, but, saved = (self.damage[f"{what} {i}"] for what in ("only", "all but", "saved"))
            lines.append(f"{i:>6} {_ci(only):>28} {_ci(but):>28} {_ci(saved):>30}")
        rec = self.recommendation
        kept = ", ".join(map(str, rec["keep_exact"])) or "none"
        lines.append(f"keep exact: {kept} -> damage {_ci(rec['damage'])} (measured; target {rec['target']:.4g}"
                     + ("" if rec["reached"] else ", not reached") + ")")
        return "\n".join(lines)

    def figure(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """A PNG (:func:`sensitivity_figure`) of the per-layer damages, the full damage, the target and the
        recommended layers, written without destroying anything (an existing file needs ``force``)."""
        self._complete()
        rows = [{"layer": i, **{f"{k}_{f}": v for k in ("only", "saved")
                               for f, v in _triple(self.damage[f"{k} {i}"]).items()}} for i in range(self.layers)]
        cfg = self.config
        title = f"{cfg['quantizer']} at {cfg['bits']} bits on {cfg['model']}: which layers matter"
        from kvstats._files import check_output_path, write_output

        path = check_output_path(path, "path", force=force)
        suffix = Path(path).suffix or ".png"
        return write_output(path, lambda tmp: sensitivity_figure(
            rows, self.damage["all"].statistic, self.recommendation["target"], self.recommendation["keep_exact"],
            title, tmp.with_suffix(suffix)).replace(tmp))


def _triple(r) -> dict[str, float]:
    return {"mean": r.statistic, "low": r.confidence_interval.low, "high": r.confidence_interval.high}


def sensitivity_figure(rows: list[dict], full: float, target: float, keep_exact, title: str,
                       path: str | os.PathLike) -> Path:
    """Per layer (``rows``: ``layer``, ``only_mean``, ``only_low``, ``only_high``, ``saved_mean``, ``saved_low``,
    ``saved_high``) the damage of quantizing it alone and the damage saved by keeping it exact, with CIs; the
    damage of quantizing every layer (``full``) and the ``target`` as lines; the layers of ``keep_exact`` marked.
    Written to ``path`` (PNG); returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    x = np.array([r["layer"] for r in rows])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * len(rows) + 2), 3.6), constrained_layout=True)
    for key, shift, label, color in (("only", -0.2, "only this layer quantized", "#1f77b4"),
                                     ("saved", 0.2, "saved by keeping it exact (paired)", "#ff7f0e")):
        mid = np.array([r[f"{key}_mean"] for r in rows])
        err = [mid - np.array([r[f"{key}_low"] for r in rows]), np.array([r[f"{key}_high"] for r in rows]) - mid]
        ax.bar(x + shift, mid, width=0.4, yerr=err, capsize=1.5, label=label, color=color)
    ax.axhline(full, color="k", lw=0.8, ls="--", label=f"every layer quantized ({full:.3g})")
    ax.axhline(target, color="#2ca02c", lw=0.8, ls=":", label=f"target ({target:.3g})")
    for i in keep_exact:
        ax.annotate("exact", (i, 0), xytext=(0, -14), textcoords="offset points", ha="center", fontsize=6,
                    color="#2ca02c")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # layers are whole numbers
    ax.set_ylabel("mean next-token KL (nats)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="center right")
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _ci(r) -> str:
    return f"{r.statistic:.4g} {interval_text(r, '.3g')}"


def sensitivity(quantizer, *, bits: int, model="smollm2", documents_used: int | None = 8,
                segment: int = DEFAULT_SEGMENT, target: float | None = None, seed: int | None = 0,
                inference: InferenceOptions | None = None, check: bool = True, linear: bool = True, out=None,
                force: bool = False, progress: bool = False, documents: dict[str, str] | None = None,
                dtype: torch.dtype = torch.float32, configurations=None, known=None, **options) -> Sensitivity:
    """Per-layer sensitivity of ``model`` to ``quantizer`` at ``bits`` (module doc).

    Args:
        quantizer, bits, seed, inference, check, linear, out, force, progress, **options: as
            :func:`kvstats.evaluate`.
        model: ``"smollm2"``, a Hugging Face model folder or a .gguf file.
        documents_used: how many of the shipped documents (the first ones holding a full segment; None: all).
        segment: tokens per document segment.
        target: the damage (mean next-token KL) to reach by keeping layers exact, a finite number >= 0; default
            half of ``all``'s.
        documents: ``{title: text}`` instead of the shipped documents.
        configurations: the configurations to measure, by name (``"all"``, ``"only L"``, ``"all but L"``;
            default every one); a subset gives a partial result without a recommendation (``recommendation``
            None), e.g. one part of a study split over parallel workers.
        known: ``{configuration: per-document damages}`` measured before with the same arguments (the parts'
            ``per_document``): used instead of measuring them again.
    """
    if target is not None and not (isinstance(target, (int, float)) and not isinstance(target, bool)
                                   and math.isfinite(target) and target >= 0):
        raise ValueError(f"target must be a finite number >= 0 (a mean next-token KL in nats), got {target!r}")
    from kvstats._files import check_output_path
    from kvstats._random import check_seed
    from kvstats._validation import check_int_range
    from kvstats.evaluation import quantizer_sides as sides
    from kvstats.evaluation.model_engine import model_unit
    from kvstats.hf.capture import model_files
    from kvstats.study.provenance import provenance

    started = time.time()
    inference = inference_options(inference)
    bits = check_int_range(bits, "bits", 1, 8)
    seed = check_seed(seed)
    if out is not None:  # before the model loads; never one of the model's own files
        out = check_output_path(out, "out", force=force, inputs=model_files(model))
    source = _documents_source(model, segment, documents, dtype, documents_used)
    d, heads, n_layers = source.dims["head_dim"], source.dims["kv_heads"], source.dims["layers"]
    side = sides.Side("quantizer", quantizer, bits, dict(options))
    quantized = side.scheme(d, seed)
    checks = sides.check_side(side, quantized, d, seed, heads, linear=linear) if check else "skipped (check=False)"
    damage, references = _damage_function(source, quantized, progress)
    per_doc = _measured(n_layers, len(source.segments), configurations, known, damage)
    interval = _interval(inference, seed)
    results = {k: interval(v) for k, v in per_doc.items()}
    for i in range(n_layers):  # paired over documents: what keeping layer i exact saves
        if "all" in per_doc and f"all but {i}" in per_doc:
            results[f"saved {i}"] = interval(np.array(per_doc["all"]) - np.array(per_doc[f"all but {i}"]),
                                             support=None)
    config = {"quantizer": side.label, "bits": bits, "model": source.name, "model_dims": source.dims,
              "layers": n_layers, "documents": len(source.segments),
              "titles": [t for _, t, _ in source.segments], "segment": segment, "seed": seed,
              "confidence_level": inference.confidence_level, "checks": checks,
              "bits_per_element": model_unit(source, quantized, source.segments[0][2], reference=references[0],
                                             record=False)["bits_total"],
              "options": {k: str(v) for k, v in options.items()}}
    seeds = {"seed": seed, "schemes": "one seed for every unit"}
    if configurations is not None:  # a part: no recommendation
        return Sensitivity(config, results, per_doc, None, provenance(started=started, seeds=seeds))
    recommendation = _recommend(results, per_doc, damage, interval, n_layers, target)
    result = Sensitivity(config, results, per_doc, recommendation, provenance(started=started, seeds=seeds))
    if out is not None:
        result.save(out, force=force)
    return result


def _documents_source(model, segment: int, documents, dtype, documents_used):
    """The model and one segment of each of the first ``documents_used`` documents."""
    from kvstats._validation import check_int_range
    from kvstats.evaluation.model_engine import model_source

    source = model_source(model, segment=segment, segments_per_document=1, documents=documents, dtype=dtype)
    if documents_used is not None:
        documents_used = check_int_range(documents_used, "documents_used", 2, 1 << 20)
        source.segments = source.segments[:documents_used]
    return source


def _damage_function(source, quantized, progress: bool):
    """(``damage(keep_exact, name)``: each document's next-token KL with every layer quantized but those kept exact,
    the reference logits of each document)."""
    from kvstats.evaluation.model_engine import model_unit, reference_logits
    from kvstats.hf.cache import IdentityScheme

    exact = IdentityScheme(source.dims["head_dim"])
    references = [reference_logits(source, ids)[0] for _, _, ids in source.segments]

    def damage(keep_exact: set[int], name: str) -> list[float]:
        def per_layer(i: int):
            return exact if i in keep_exact else quantized

        values = [model_unit(source, per_layer, ids, reference=ref, record=False)["out_kl"]
                  for (_, _, ids), ref in zip(source.segments, references)]
        if progress:
            print(f"  {name}: {np.mean(values):.4g}", file=sys.stderr, flush=True)
        return values

    return damage, references


def _measured(n_layers: int, n_documents: int, configurations, known, damage) -> dict[str, list[float]]:
    """Each wanted configuration's per-document damage: ``known`` ones as given, the others measured."""
    everything = set(range(n_layers))
    standard = {"all": set()} | {f"only {i}": everything - {i} for i in range(n_layers)} | \
        {f"all but {i}": {i} for i in range(n_layers)}
    wanted = list(standard) if configurations is None else list(configurations)
    unknown = [c for c in wanted if c not in standard]
    if unknown:
        raise ValueError(f"configurations must name 'all', 'only L' or 'all but L' for L in 0..{n_layers - 1}, "
                         f"got {unknown}")
    per_doc = {k: [float(x) for x in v] for k, v in dict(known or {}).items()}
    for name, values in per_doc.items():
        if len(values) != n_documents:
            raise ValueError(f"known[{name!r}] holds {len(values)} damages, one per document ({n_documents}) "
                             "needed: measured with other arguments?")
    for name in wanted:
        if name not in per_doc:
            per_doc[name] = damage(standard[name], name)
    return per_doc


def _interval(inference: InferenceOptions, seed: int):
    """``values -> mean_ci(values)`` at the options' level (documents are the units); a damage is a KL divergence,
    so its interval is kept in [0, ∞) (``support``); a saved damage (a paired difference) passes ``support=None``."""
    from kvstats.measure import stats

    opts = dict(n_resamples=inference.resamples(9999), seed=inference.bootstrap_seed(seed))
    return lambda values, support=(0.0, math.inf): stats.mean_ci(values, inference.confidence_level,
                                                                 support=support, **opts)


def _recommend(results: dict, per_doc: dict, damage, interval, n_layers: int, target: float | None) -> dict:
    """The fewest layers kept exact, the most damaging first, whose damage reaches ``target`` (default half of
    every layer quantized): a bisection over k, each step measured (or reused) with its interval."""
    full = results["all"].statistic
    target = full / 2 if target is None else float(target)
    order = sorted(range(n_layers), key=lambda i: -results[f"only {i}"].statistic)  # most damaging first

    def measured(k: int):
        kept = sorted(order[:k])
        name = "all" if k == 0 else "exact " + ",".join(map(str, kept))
        if name not in results:
            per_doc[name] = per_doc[f"all but {kept[0]}"] if k == 1 else damage(set(kept), name)
            results[name] = interval(per_doc[name])
        return results[name]

    low, high = 0, n_layers  # bisection for the fewest k with damage <= target (k = n_layers: every layer exact)
    if measured(0).statistic <= target:
        high = 0
    while low + 1 < high:
        mid = (low + high) // 2
        if measured(mid).statistic <= target:
            high = mid
        else:
            low = mid
    chosen = measured(high)
    return {"keep_exact": sorted(order[:high]), "damage": chosen, "target": target,
            "reached": bool(chosen.statistic <= target), "order": order}
