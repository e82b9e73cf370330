"""Evaluate a KV-cache quantizer: every metric, with confidence intervals over independent units.

    import kvstats
    ev = kvstats.evaluate("turbo_mse", bits=4, data="gaussian", units=8)
    print(ev.table())                 # mean and CI of each metric over the units
    ev.save("results.json")

    kvstats evaluate --quantizer turbo_mse --bits 4 --data gaussian --units 8 --out results.json
    kvstats evaluate --quantizer mypkg.quant:Int4 --bits 4 --data capture.safetensors --compare kqv

**What is evaluated.** A scheme: a K quantizer and a V quantizer. ``quantizer`` names a registered scheme
(``"kqv"``), a registered quantizer (``"turbo_mse"``: used for both K and V, with independent seeds), an
importable ``"module:Class"`` or a class / factory called as ``factory(bits=, dim=, seed=)`` (used for K
and V likewise), or a ready :class:`~kvstats.schemes.Scheme` (then only the data vary between units).

**Units.** Every statistic is over *independent units*, never over the queries of one draw:

* synthetic data (``data`` a kind of :func:`kvstats.data.synthetic.generate`): unit ``i`` is a fresh
  draw of Q/K/V with seed ``seed + i`` and a scheme built with seed ``seed + i``;
* a capture file (``data`` a path written by ``kvstats capture``): unit ``i`` is the ``i``-th disjoint
  window of ``window`` tokens, its queries attending causally to the window's keys, averaged over the
  stored layers; the scheme is seeded ``seed + i``. Windows of one text are disjoint but not independent
  of the text: capture several texts to generalise beyond it.

**Metrics per unit** (means over the unit's queries and vectors): ``attention_kl`` and ``topk_recall``
from the logits the scheme's own inner-product estimator gives (what attention with the quantized cache
computes), the six components of :func:`kvstats.metrics.error6d` (prefixed ``6d_``; its KL uses the
decoded keys), and the cache's bits per element (``bits_total``: payload, norms and side information).
Each metric's mean over units gets a BCa bootstrap CI (:func:`kvstats.stats.bootstrap_ci`). With
``compare=`` a second scheme runs on the same units and each metric is compared with the paired Wilcoxon
signed-rank test, Holm-corrected over the metrics.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstats._validation import check_int_range

__all__ = ["Evaluation", "METRICS", "evaluate", "resolve_scheme"]

#: The metrics of one unit, in table order. ``6d_*`` are the components of :func:`kvstats.metrics.error6d`.
METRICS = ("attention_kl", "topk_recall", "6d_k_direction", "6d_k_norm", "6d_v_direction", "6d_v_norm",
           "6d_attention_kl", "6d_output_error", "bits_total")
#: Which way is better for each metric (for the comparison's wording): -1 lower is better, +1 higher.
_BETTER = {"topk_recall": 1}


def resolve_scheme(spec, *, bits: int, dim: int, seed: int = 0, **options):
    """Build the scheme that ``spec`` names (see the module doc) at budget ``bits`` and head dim ``dim``."""
    from kvstats.quantizers import QUANTIZERS, Quantizer, quantizer
    from kvstats.schemes import SCHEMES, Scheme, scheme

    if isinstance(spec, Scheme):
        return spec
    factory: Callable | None = None
    label = spec
    if isinstance(spec, str):
        if spec in SCHEMES:
            return scheme(spec, bits=bits, dim=dim, seed=seed, **options)
        if spec in QUANTIZERS:
            def factory(bits, dim, seed, _name=spec):
                return quantizer(_name, bits=bits, dim=dim, seed=seed, **options)
        elif ":" in spec:
            module, _, attr = spec.partition(":")
            try:
                factory = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"quantizer {spec!r}: cannot import {attr!r} from module {module!r} ({exc})") from None
        else:
            raise ValueError(f"quantizer must be a scheme ({sorted(SCHEMES)}), a quantizer ({sorted(QUANTIZERS)}) "
                             f"or 'module:Class', got {spec!r}")
    elif callable(spec):
        factory, label = spec, getattr(spec, "__name__", type(spec).__name__)
    if factory is None:
        raise TypeError(f"quantizer must be a name, 'module:Class', a class/factory or a Scheme, got "
                        f"{type(spec).__name__}")
    from kvstats._random import spawn_seeds

    seed_k, seed_v = spawn_seeds(seed, 2)
    k, v = factory(bits=bits, dim=dim, seed=seed_k), factory(bits=bits, dim=dim, seed=seed_v)
    for name, q in (("K", k), ("V", v)):
        if not isinstance(q, Quantizer):
            raise TypeError(f"quantizer {label!r} built a {type(q).__name__} for {name}, not a kvstats Quantizer")
    return Scheme(str(label), bits, k, v)


def _unit_metrics(scheme, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, top_k: int, causal: bool,
                  query_offset: int | None) -> dict[str, float]:
    from kvstats import metrics

    code = scheme.encode(k, v)
    k_hat, v_hat = scheme.decode(code)
    ref = metrics.attention_scores(q, k, double=True)
    est = scheme.scores(q, code).to(torch.float64) / math.sqrt(q.shape[-1])
    opts = dict(causal=causal, query_offset=query_offset)
    six = metrics.error6d(q, k, v, k_hat, v_hat, **opts)[0]
    out = {
        "attention_kl": float(metrics.attention_kl_from_scores(ref, est, **opts)),
        "topk_recall": float(metrics.topk_recall_from_scores(ref, est, top_k=top_k, **opts)),
    }
    out |= {f"6d_{name}": float(x) for name, x in zip(metrics.ERROR6D_COMPONENTS, six.tolist())}
    out["bits_total"] = float(scheme.bits_per_coordinate()["mean"].total)
    return out


def _synthetic_units(kind: str, units: int, seed: int, shape: dict[str, int], params: dict):
    from kvstats.data.synthetic import generate

    for i in range(units):
        q, k, v = generate(kind, shape["batch"], shape["kv_heads"], shape["seq"], shape["dim"], seed + i,
                           q_heads=shape["q_heads"], n_q=shape["n_q"], **params)
        yield i, [(q, k, v)]


def _capture_units(path: Path, units: int | None, window: int, layers: Sequence[int] | None):
    from kvstats.data.io import load_qkv

    f = load_qkv(path)
    chosen = list(layers) if layers is not None else f.layers
    tensors = [f.layer(i) for i in chosen]
    if any(t.q is None for t in tensors):
        raise ValueError(f"data {str(path)!r} stores no queries: capture with queries to evaluate attention")
    n_tokens = tensors[0].k.shape[2]
    available = n_tokens // window
    if available < 2:
        raise ValueError(f"window must leave at least 2 disjoint windows in the {n_tokens} tokens of {str(path)!r}, "
                         f"got window = {window}")
    n = available if units is None else units
    if n > available:
        raise ValueError(f"units must be at most {available} (disjoint windows of {window} tokens), got {n}")
    for i in range(n):
        sl = slice(i * window, (i + 1) * window)
        yield i, [(t.q[:, :, sl].float(), t.k[:, :, sl].float(), t.v[:, :, sl].float()) for t in tensors]


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` measured.

    Attributes:
        config: how it ran (quantizer, bits, data, units, seeds, query model).
        units: one dict per unit: ``unit`` and every metric of :data:`METRICS` (and ``other:<metric>``
            for the compared scheme).
        summary: ``{metric: BootstrapResult}``, the mean over units with its CI.
        comparison: ``{metric: {"test": paired test result, "pvalue_holm": float}}`` when ``compare`` was
            given (metrics equal in every unit are not tested), else empty.
    """

    config: dict[str, Any]
    units: list[dict[str, float]]
    summary: dict[str, Any]
    comparison: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the results file's content)."""
        return {"config": self.config, "units": self.units,
                "summary": {m: r.to_dict() for m, r in self.summary.items()},
                "comparison": {m: {"test": c["test"].to_dict(), "pvalue_holm": c["pvalue_holm"]}
                               for m, c in self.comparison.items()}}

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as JSON (atomically); return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    def table(self) -> str:
        """A plain-text table: metric, mean, CI over units (and the paired comparison when present)."""
        level = next(iter(self.summary.values())).confidence_level
        head = f"{'metric':<18} {'mean':>11} {f'{level:.0%} CI':>25}"
        if self.comparison:
            head += f" {'other mean':>11} {'r (paired)':>10} {'p (Holm)':>9}"
        lines = [f"{self.config['quantizer']} at {self.config['bits']} bits on {self.config['data']} "
                 f"({len(self.units)} units: {self.config['unit']})", head, "-" * len(head)]
        for m, r in self.summary.items():
            lo, hi = r.confidence_interval
            row = f"{m:<18} {r.statistic:>11.4g} {f'[{lo:.4g}, {hi:.4g}]':>25}"
            if m in self.comparison:
                c = self.comparison[m]
                other = float(np.mean([u[f"other:{m}"] for u in self.units]))
                row += f" {other:>11.4g} {c['test'].effect_size:>10.3f} {c['pvalue_holm']:>9.2g}"
            lines.append(row)
        return "\n".join(lines)


def _json_default(obj):
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


def evaluate(
    quantizer,
    *,
    bits: int,
    data: str | os.PathLike = "gaussian",
    units: int | None = 8,
    seed: int = 0,
    compare=None,
    top_k: int = 5,
    dim: int = 128,
    kv_heads: int = 2,
    q_heads: int = 4,
    seq: int = 512,
    n_q: int = 32,
    window: int = 128,
    layers: Sequence[int] | None = None,
    confidence_level: float = 0.95,
    n_resamples: int = 9999,
    out: str | os.PathLike | None = None,
    data_params: dict | None = None,
    **options,
) -> Evaluation:
    """Evaluate ``quantizer`` at ``bits`` on ``data`` over independent units (see the module doc).

    Args:
        quantizer: scheme name, quantizer name, ``"module:Class"``, a class/factory, or a Scheme.
        bits: budget n (bits per cache element).
        data: a synthetic kind (``"gaussian"``, ``"heavy_tail"``, ``"low_rank"``) or a capture file path.
        units: number of independent units (synthetic: draws; capture: disjoint windows, default all
            when None); at least 2.
        seed: unit ``i`` uses seed ``seed + i`` for its data (synthetic) and its scheme.
        compare: a second ``quantizer`` spec, evaluated on the same units and compared pairwise.
        top_k: k of the top-k recall.
        dim, kv_heads, q_heads, seq, n_q: synthetic shape (cache ``[1, kv_heads, seq, dim]``, ``n_q``
            queries per query head, non-causal: the queries follow the generator's query model).
        window: capture: tokens per unit (causal attention within the window).
        layers: capture: the stored layers to use (default all).
        confidence_level, n_resamples: bootstrap CI of each metric's mean.
        out: write the results JSON here.
        data_params: extra parameters of the synthetic generator (e.g. ``{"df": 3}``).
        **options: passed to the scheme / quantizer constructor (e.g. ``rows="srht"``).
    """
    from kvstats import stats
    from kvstats.data.synthetic import KINDS

    bits = check_int_range(bits, "bits", 1, 8)
    if units is not None:
        units = check_int_range(units, "units", 2, 100_000)
    top_k = check_int_range(top_k, "top_k", 1, 1 << 30)
    path = Path(data)
    is_capture = not (isinstance(data, str) and data in KINDS)
    if is_capture and not path.is_file():
        raise ValueError(f"data must be a synthetic kind {sorted(KINDS)} or an existing capture file, "
                         f"got {str(data)!r}")
    if is_capture:
        window = check_int_range(window, "window", 2, 1 << 30)
        unit_iter = _capture_units(path, units, window, layers)
        unit_desc = f"disjoint windows of {window} tokens, causal within the window, mean over layers"
        causal, offset = True, 0
    else:
        shape = dict(batch=1, kv_heads=kv_heads, q_heads=q_heads, seq=seq, dim=dim, n_q=n_q)
        unit_iter = _synthetic_units(data, units or 8, seed, shape, dict(data_params or {}))
        unit_desc = f"independent draws (seed + i), cache [1, {kv_heads}, {seq}, {dim}], {n_q} queries per head"
        causal, offset = False, None
    rows: list[dict[str, float]] = []
    for i, parts in unit_iter:
        d = parts[0][1].shape[-1]
        specs = [("", quantizer)] + ([("other:", compare)] if compare is not None else [])
        row: dict[str, float] = {"unit": i}
        for prefix, spec in specs:
            scheme = resolve_scheme(spec, bits=bits, dim=d, seed=seed + i, **options)
            per_part = [_unit_metrics(scheme, q, k, v, top_k=top_k, causal=causal, query_offset=offset)
                        for q, k, v in parts]
            row |= {prefix + m: float(np.mean([p[m] for p in per_part])) for m in METRICS}
        rows.append(row)
    summary = {m: stats.bootstrap_ci([r[m] for r in rows], confidence_level=confidence_level,
                                     n_resamples=n_resamples, seed=seed) if np.ptp([r[m] for r in rows]) > 0
               else _constant(m, rows, confidence_level) for m in METRICS}
    comparison = _compare(rows) if compare is not None else {}
    config = {"quantizer": _label(quantizer), "compare": None if compare is None else _label(compare), "bits": bits,
              "data": str(data), "units": len(rows), "unit": unit_desc, "seed": seed, "top_k": top_k,
              "options": {k: str(v) for k, v in options.items()}, "data_params": dict(data_params or {})}
    ev = Evaluation(config, rows, summary, comparison)
    if out is not None:
        ev.save(out)
    return ev


def _label(spec) -> str:
    return spec if isinstance(spec, str) else getattr(spec, "name", None) or getattr(spec, "__name__", repr(spec))


def _constant(metric: str, rows, level: float):
    """A metric equal in every unit (e.g. bits per element): the value with a degenerate CI."""
    from kvstats.stats import BootstrapResult

    x = float(rows[0][metric])
    return BootstrapResult(statistic=x, pvalue=math.nan, method="constant over units (no resampling)",
                           null_hypothesis="none (estimate)", n=len(rows), confidence_interval=(x, x),
                           ci_of=f"mean {metric}", confidence_level=level)


def _compare(rows) -> dict[str, Any]:
    """Paired Wilcoxon signed-rank test per metric over the units, Holm-corrected across the metrics."""
    from statsmodels.stats.multitest import multipletests

    from kvstats import stats

    tested = {}
    for m in METRICS:
        a = np.array([r[m] for r in rows])
        b = np.array([r[f"other:{m}"] for r in rows])
        if np.all(a == b):
            continue
        tested[m] = stats.wilcoxon(a, b)
    if not tested:
        return {}
    holm = multipletests([r.pvalue for r in tested.values()], method="holm")[1]
    return {m: {"test": r, "pvalue_holm": float(p)} for (m, r), p in zip(tested.items(), holm)}
