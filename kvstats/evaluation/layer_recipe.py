"""Per-layer, per-K/V precision recipes: the layer map, the budget solver with its bootstrap stability, and the
additivity check the solver's objective rests on.

    m = LayerMap([("int_token@4", "int_token@2"), ("fp8_e4m3@8", "nvfp4@4")])   # layer -> (K format, V format)
    cache = m.cache(model.config)                          # a KVStatsCache with each layer's own K and V quantizers
    m.save("recipe.json"); LayerMap.load("recipe.json")    # kvstats-kv-layer-map/1, round-trips exactly

    choice = solve_recipe(damage, widths, budget=3.0)      # damage [L, 2, F]: isolated damage of format f on (l, K/V)

A format is a registered quantizer at a width, ``"name@b"`` (``"int_token@4"``, ``"nvfp4@4"``, ``"fp8_e4m3@8"``), or
``"exact"`` (the side kept as the model gives it: its dtype's width). K and V of a layer hold equally many elements
(``[B, H_kv, S, d]`` each), so a map's mean bits per element is the mean of its 2L widths (declared); the bits the
codes hold are measured by the cache (``KVStatsCache.memory()``).

**The solver** (:func:`solve_recipe`): binary x[l, s, f] = 1 when (layer l, side s) takes format f; minimise the
predicted damage Σ damage[l, s, f]·x[l, s, f] subject to one format per (l, s) and the mean width
Σ width[f]·x[l, s, f] / 2L ≤ budget — a mixed-integer linear program (scipy.optimize.milp, HiGHS), the objective of
NVIDIA Model-Optimizer's KV AutoQuantize. Its premise is that isolated damages add up: :func:`additivity` measures
the recipe's damage and compares it with the sum of its parts, paired over documents.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EXACT", "LAYER_MAP_SCHEMA", "LayerMap", "additivity", "format_width", "solve_recipe",
           "recipe_stability"]

LAYER_MAP_SCHEMA = "kvstats-kv-layer-map/1"
EXACT = "exact"
_FORMAT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)@(?P<bits>[0-9]+)$")
#: the width of an exact side, by the model's dtype
_EXACT_BITS = {"float32": 32, "bfloat16": 16, "float16": 16, "float64": 64}


def _check_exact_bits(value, what: str) -> int:
    """``value`` as the width of an exact side: one of the model dtypes' widths, else ValueError naming ``what``."""
    if isinstance(value, bool) or value not in _EXACT_BITS.values():
        raise ValueError(f"{what} must be one of {sorted(set(_EXACT_BITS.values()))} (the model dtype's width), got "
                         f"{value!r}")
    return int(value)


def format_width(fmt: str, *, exact_bits: int = 32) -> int:
    """The bits per element of a format: ``b`` of ``"name@b"`` (the name a registered quantizer), ``exact_bits`` for
    ``"exact"``; ValueError naming the format otherwise."""
    from kvstats.quant.quantizers import QUANTIZERS

    if fmt == EXACT:
        return exact_bits
    m = _FORMAT.match(fmt) if isinstance(fmt, str) else None
    if m is None or m["name"] not in QUANTIZERS:
        raise ValueError(f"format must be 'exact' or 'name@bits' with a registered quantizer ({sorted(QUANTIZERS)}), "
                         f"got {fmt!r}")
    return int(m["bits"])


@dataclass(frozen=True)
class LayerMap:
    """Layer ℓ → (K format, V format): a per-layer, per-tensor precision recipe. ``exact_bits``: the width an
    ``"exact"`` side counts (the model's dtype: 32 for fp32, 16 for bf16/fp16)."""

    layers: tuple[tuple[str, str], ...]
    exact_bits: int = 32

    def __post_init__(self) -> None:
        _check_exact_bits(self.exact_bits, "exact_bits")
        layers = tuple(tuple(pair) for pair in self.layers)
        if not layers or any(len(p) != 2 for p in layers):
            raise ValueError(f"layers must hold one (K format, V format) pair per layer, got {self.layers!r}")
        for i, pair in enumerate(layers):
            for role, fmt in zip("KV", pair):
                try:
                    format_width(fmt, exact_bits=self.exact_bits)
                except ValueError as exc:
                    raise ValueError(f"layers[{i}] {role}: {exc}") from None
        object.__setattr__(self, "layers", layers)

    def __len__(self) -> int:
        return len(self.layers)

    def widths(self) -> np.ndarray:
        """[L, 2]: the declared bits per element of each (layer, K/V)."""
        return np.array([[format_width(f, exact_bits=self.exact_bits) for f in pair] for pair in self.layers],
                        dtype=float)

    @property
    def name(self) -> str:
        """How results name the map: its layers and nominal mean bits."""
        return f"layer map ({len(self.layers)} layers, {self.mean_bits:g} bits nominal)"

    def summary(self) -> str:
        """How many slots take each format, K then V: ``"3 × K int_token@2, 27 × K int_token@4, 30 × V exact"``."""
        counts: dict[tuple[str, str], int] = {}
        for k, v in self.layers:
            for side, fmt in (("K", k), ("V", v)):
                counts[side, fmt] = counts.get((side, fmt), 0) + 1
        return ", ".join(f"{n} × {side} {fmt}" for (side, fmt), n in sorted(counts.items()))

    @property
    def mean_bits(self) -> float:
        """The declared mean bits per element: the mean of the 2L widths (K and V hold as many elements)."""
        return float(self.widths().mean())

    def scheme(self, layer: int, dim: int, seed: int = 0):
        """Layer ``layer``'s :class:`~kvstats.schemes.Scheme`: its K and V quantizers at their widths (an exact side
        lossless), K and V seeded by the children of ``seed`` (kvstats._random.spawn_seeds)."""
        from kvstats._random import spawn_seeds
        from kvstats.quant.quantizers import IdentityQuantizer, quantizer
        from kvstats.quant.schemes import Scheme

        parts = []
        for fmt, child in zip(self.layers[layer], spawn_seeds(seed, 2)):
            if fmt == EXACT:
                parts.append(IdentityQuantizer(dim))
            else:
                name, bits = fmt.split("@")
                parts.append(quantizer(name, bits=int(bits), dim=dim, seed=child))
        k, v = self.layers[layer]
        bits = float(self.widths()[layer].mean())
        return Scheme(f"{k}/{v}", int(bits) if bits.is_integer() else bits, parts[0], parts[1], seed)

    def schemes(self, dim: int, seed: int = 0):
        """``layer -> Scheme`` (:meth:`scheme`, layer ℓ seeded ``seed + ℓ``), built once per layer: what
        :class:`~kvstats.cache.KVStatsCache` takes."""
        built: dict[int, Any] = {}

        def by_layer(i: int):
            if not 0 <= i < len(self.layers):
                raise ValueError(f"the layer map has {len(self.layers)} layers, the model asked for layer {i}")
            if i not in built:
                built[i] = self.scheme(i, dim, seed + i)
            return built[i]

        by_layer.__name__ = f"LayerMap({len(self.layers)} layers, {self.mean_bits:g} bits)"
        return by_layer

    def cache(self, config, *, seed: int = 0, **kwargs):
        """A :class:`~kvstats.cache.KVStatsCache` for the model of ``config`` with each layer's own schemes; its
        layer count must be the map's (refused by name otherwise)."""
        from kvstats.hf.cache import KVStatsCache, model_dims

        dims = model_dims(config)
        if dims["layers"] != len(self.layers):
            raise ValueError(f"the layer map has {len(self.layers)} layers, the model {dims['layers']}")
        return KVStatsCache.from_config(config, self.schemes(dims["head_dim"], seed), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON layer map (docs/recipe.md): schema, exact_bits, mean_bits and one
        ``{"layer", "k", "v", "k_bits", "v_bits"}`` per layer."""
        w = self.widths()
        return {"schema": LAYER_MAP_SCHEMA, "exact_bits": self.exact_bits, "mean_bits": self.mean_bits,
                "layers": [{"layer": i, "k": k, "v": v, "k_bits": int(w[i, 0]), "v_bits": int(w[i, 1])}
                           for i, (k, v) in enumerate(self.layers)]}

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        from kvstats._files import check_output_path, write_output

        path = check_output_path(path, "path", force=force)
        return write_output(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def from_dict(cls, data: dict) -> LayerMap:
        """The map of :meth:`to_dict`'s layout; its schema, layer order and declared widths are checked."""
        if not isinstance(data, dict) or data.get("schema") != LAYER_MAP_SCHEMA:
            raise ValueError(f"a layer map needs schema {LAYER_MAP_SCHEMA!r}, got "
                             f"{data.get('schema') if isinstance(data, dict) else type(data).__name__!r}")
        rows = data.get("layers")
        fields = ("layer", "k", "v", "k_bits", "v_bits")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and all(f in r for f in fields) for r in rows):
            raise ValueError(f"a layer map's layers must be a list of objects with {list(fields)}")
        if [r["layer"] for r in rows] != list(range(len(rows))):
            raise ValueError("a layer map's layers must be listed in order 0, 1, ... each once")
        exact_bits = _check_exact_bits(data.get("exact_bits", 32), "a layer map's exact_bits")
        m = cls(tuple((r["k"], r["v"]) for r in rows), exact_bits)
        stated = [(r.get("k_bits"), r.get("v_bits")) for r in rows]
        if stated != [tuple(int(x) for x in row) for row in m.widths()]:
            raise ValueError("a layer map's k_bits/v_bits disagree with its formats' widths")
        return m

    @classmethod
    def load(cls, path: str | os.PathLike) -> LayerMap:
        """The map saved at ``path``; a file that is not a layer map's JSON is refused naming the path."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"path {str(path)!r} is not a kvstats layer map: {exc}") from None


def _check_damage(damage, widths) -> tuple[np.ndarray, np.ndarray]:
    d, w = np.asarray(damage, dtype=float), np.asarray(widths, dtype=float)
    if d.ndim != 3 or d.shape[1] != 2 or d.shape[2] != w.size or w.ndim != 1:
        raise ValueError(f"damage must be [layers, 2 (K, V), formats] and widths [formats], got {d.shape} and "
                         f"{w.shape}")
    if not (np.isfinite(d).all() and np.isfinite(w).all()):
        raise ValueError("damage and widths must be finite")
    return d, w


def solve_recipe(damage, widths, budget: float, *, tie_kv: bool = False) -> np.ndarray:
    """The format index per (layer, K/V) ([L, 2] ints) minimising Σ damage[l, s, f] over the chosen formats subject
    to a mean width Σ widths[f] / 2L ≤ ``budget`` (module doc; scipy.optimize.milp). ``tie_kv``: K and V of a layer
    take the same format (x[l, K, f] = x[l, V, f]), as engines store one KV-cache dtype per layer. ValueError when no
    map fits the budget (the narrowest formats everywhere exceed it)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array

    d, w = _check_damage(damage, widths)
    n_layers, _, n_formats = d.shape
    slots = 2 * n_layers
    if not (isinstance(budget, (int, float)) and math.isfinite(budget)):
        raise ValueError(f"budget must be a finite number of bits per element, got {budget!r}")
    if w.min() > budget + 1e-12:
        raise ValueError(f"budget {budget:g} bits is below the narrowest format ({w.min():g} bits)")
    cols = slots * n_formats
    one = csr_array((np.ones(cols), (np.repeat(np.arange(slots), n_formats), np.arange(cols))), shape=(slots, cols))
    mean = np.tile(w, slots)[None, :] / slots
    constraints = [LinearConstraint(one, 1, 1), LinearConstraint(mean, -np.inf, budget + 1e-9)]
    if tie_kv:  # column (2l + s)·F + f: K's columns of layer l minus V's, each 0
        k_cols = (2 * np.arange(n_layers)[:, None] * n_formats + np.arange(n_formats)).reshape(-1)
        rows = np.arange(k_cols.size)
        values = np.r_[np.ones(rows.size), -np.ones(rows.size)]
        tie = csr_array((values, (np.r_[rows, rows], np.r_[k_cols, k_cols + n_formats])), shape=(rows.size, cols))
        constraints.append(LinearConstraint(tie, 0, 0))
    res = milp(d.reshape(-1), integrality=np.ones(cols), bounds=Bounds(0, 1), constraints=constraints)
    if res.status != 0 or res.x is None:
        raise ValueError(f"no map fits budget {budget:g} bits: {res.message}")
    return np.rint(res.x).reshape(n_layers, 2, n_formats).argmax(-1)


def recipe_stability(per_document, widths, budget: float, *, resamples: int = 200, seed: int = 0,
                     tie_kv: bool = False) -> dict[str, Any]:
    """How stable the chosen map is under the documents' sampling: the map solved on the mean damage over
    documents (``per_document`` [docs, L, 2, F]) and on ``resamples`` bootstrap resamples of the documents.
    Returns ``choice`` [L, 2], ``agreement`` [L, 2] (the share of resamples choosing the same format for that
    (layer, side)), ``same_map`` (the share choosing the whole map), ``frequencies`` [L, 2, F] and ``maps``: every
    distinct map the resamples chose, as (choice [L, 2], share), the most frequent first. ``tie_kv``: as
    :func:`solve_recipe`'s."""
    from kvstats._validation import check_int_range

    resamples = check_int_range(resamples, "resamples", 1, 1 << 20)
    per = np.asarray(per_document, dtype=float)
    if per.ndim != 4 or per.shape[0] < 2:
        raise ValueError(f"per_document must be [documents >= 2, layers, 2, formats], got {per.shape}")
    choice = solve_recipe(per.mean(0), widths, budget, tie_kv=tie_kv)
    rng = np.random.default_rng(seed)
    freq = np.zeros(per.shape[1:])
    maps: dict[bytes, list] = {}
    for _ in range(resamples):
        idx = rng.integers(0, per.shape[0], per.shape[0])
        c = solve_recipe(per[idx].mean(0), widths, budget, tie_kv=tie_kv)
        np.put_along_axis(freq, c[..., None], np.take_along_axis(freq, c[..., None], -1) + 1, -1)
        maps.setdefault(c.tobytes(), [c, 0])[1] += 1
    freq /= resamples
    same = maps.get(choice.tobytes(), [choice, 0])[1]
    return {"choice": choice, "agreement": np.take_along_axis(freq, choice[..., None], -1)[..., 0],
            "same_map": same / resamples, "frequencies": freq, "resamples": resamples,
            "maps": [(c, n / resamples) for c, n in sorted(maps.values(), key=lambda x: -x[1])]}


def additivity(isolated, measured, *, margin: float = 0.2, confidence_level: float = 0.95) -> dict[str, Any]:
    """Whether isolated damages add up, paired over documents: ``isolated`` [docs, parts] — each quantized part's
    damage measured alone (the solver's predictions) — and ``measured`` [docs] — the damage of all of them together.
    Per document the prediction is Σ parts; the paired differences measured − predicted get a t interval
    (:func:`kvstats.stats.mean_ci`, ``confidence_level``), and the relative gap (measured − predicted) / predicted
    (means over documents) is reported. Verdict: "additive" when the interval of the difference lies within
    ±``margin`` · mean prediction, else "super-additive" (the parts interact to more damage) or "sub-additive" when
    it lies wholly above or below 0, else "undecided"."""
    from kvstats.measure.stats import mean_ci

    iso, meas = np.asarray(isolated, dtype=float), np.asarray(measured, dtype=float)
    if iso.ndim != 2 or meas.shape != (iso.shape[0],) or iso.shape[0] < 2:
        raise ValueError(f"isolated must be [documents >= 2, parts] and measured [documents], got {iso.shape} and "
                         f"{meas.shape}")
    predicted = iso.sum(1)
    diff = mean_ci(meas - predicted, confidence_level, method="t")
    low, high = diff.confidence_interval
    scale = float(predicted.mean())
    if -margin * scale < low and high < margin * scale:
        verdict = "additive"
    elif low > 0 or high < 0:
        verdict = "super-additive" if low > 0 else "sub-additive"
    else:
        verdict = "undecided"
    return {"predicted": scale, "measured": float(meas.mean()), "difference": diff,
            "relative_gap": (float(meas.mean()) - scale) / scale if scale > 0 else math.nan,
            "margin": margin, "verdict": verdict}

