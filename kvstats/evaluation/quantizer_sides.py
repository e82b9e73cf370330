"""The two sides of an evaluation: building a quantizer spec into a scheme, checking it, measuring its bits.

    side = Side("quantizer", "kqv", bits=4, options={})
    scheme = side.scheme(dim=128, seed=0)               # a kvstats Scheme (K and V quantizers)
    check_side(side, scheme, dim=128, seed=0, heads=2)  # check_quantizer on both; QuantizerCheckError otherwise

A spec is a registered scheme (``"kqv"``), a registered quantizer (``"turbo_mse"``: K and V with independent
seeds), an importable ``"module:Class"``, a class or factory ``factory(bits=, dim=, seed=)``, or a ready
:class:`~kvstats.schemes.Scheme`. Errors name the side's role ("quantizer" or "compare") and the spec.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstats._random import spawn_seeds

__all__ = ["QuantizerCheckError", "Side", "Sides", "check_side", "label", "match_bits", "measured_bits",
           "prepare_sides", "resolve_scheme", "scheme_builder"]

_PROTOCOL = ("encode", "decode", "inner", "bits_per_coordinate")


class QuantizerCheckError(ValueError):
    """A quantizer failed :func:`kvstats.testing.check_quantizer`; the message names the side and the check."""


# --------------------------------------------------------------------------------------- building the sides


def _import(spec: str, role: str):
    module, _, attr = spec.partition(":")
    if not (attr.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        raise ValueError(f"{role} must be 'module:attribute' (a module's dotted name and a name in it, e.g. "
                         f"'mypkg.quant:Int4'), got {spec!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{role} {spec!r}: cannot import {attr!r} from module {module!r} ({exc})") from None


def _factory(spec, role: str, options: dict):
    """(label, factory(bits=, dim=, seed=) -> quantizer) for a quantizer name, 'module:Class' or a callable."""
    from kvstats.quant.quantizers import QUANTIZERS, quantizer

    if isinstance(spec, str) and spec in QUANTIZERS:
        cls = QUANTIZERS[spec]
        if getattr(cls, "needs_calibration", False):
            raise ValueError(f"{role} {spec!r} needs calibration, which evaluate does not do (an uncalibrated "
                             f"{spec} runs on its data-free prior, not the method): calibrate it on held-out data "
                             "and pass the calibrated Scheme (kvstats.schemes.NovaScheme.calibrate)")

        def build(bits, dim, seed):
            return quantizer(spec, bits=bits, dim=dim, seed=seed, **options)

        return spec, build
    if isinstance(spec, str) and ":" in spec:
        return spec, _import(spec, role)
    if callable(spec) and not isinstance(spec, str):
        return getattr(spec, "__name__", type(spec).__name__), spec
    from kvstats.quant.schemes import SCHEMES

    raise ValueError(f"{role} must be a scheme ({sorted(SCHEMES)}), a quantizer ({sorted(QUANTIZERS)}), a pair "
                     f"'K/V' of quantizers (e.g. 'fp8_e4m3/nvfp4'), 'module:Class', a class/factory or a Scheme, "
                     f"got {spec!r}")


def _is_layer_map(spec) -> bool:
    """Whether ``spec`` is a per-layer recipe (:class:`kvstats.evaluation.layer_recipe.LayerMap`): its schemes differ by
    layer, so it is measured on a model only."""
    from kvstats.evaluation.layer_recipe import LayerMap

    return isinstance(spec, LayerMap)


def _is_pair(spec) -> bool:
    """Whether ``spec`` is a pair ``"K/V"`` of registered quantizers (:func:`kvstats.schemes.pair_widths`)."""
    return isinstance(spec, str) and "/" in spec


def _by_scheme(spec) -> bool:
    """Whether :func:`kvstats.scheme` builds ``spec``: a registered data-oblivious scheme or a pair of quantizers
    (a bare quantizer name is built by :func:`_factory`, K and V by the quantizer's own class)."""
    from kvstats.quant.schemes import SCHEMES

    return isinstance(spec, str) and (spec in SCHEMES or _is_pair(spec))


def _check_protocol(q, role: str, label: str, part: str) -> None:
    missing = [m for m in _PROTOCOL if not callable(getattr(q, m, None))]
    if missing or not isinstance(getattr(q, "dim", None), int):
        what = f"no method(s) {missing}" if missing else f"no int dim (got {getattr(q, 'dim', None)!r})"
        raise TypeError(f"{role} {label!r} built a {type(q).__name__} for {part} with {what}: a quantizer needs "
                        "encode, decode, inner, bits_per_coordinate(n_tokens=) and dim (docs/quantizers.md)")
    if getattr(q, "needs_calibration", False) and not getattr(q, "calibrated", True):
        raise ValueError(f"{role} {label!r}: its {part} quantizer {q!r} needs calibration and is not calibrated")


def scheme_builder(spec, *, role: str = "quantizer", **options) -> Callable[..., Any]:
    """``spec`` (see the module doc) resolved once into ``build(bits=, dim=, seed=) -> Scheme``: a registry lookup,
    an import or a refusal happens here, not at every unit; errors name the ``role`` ("quantizer" or "compare")
    and the spec."""
    from kvstats.quant.schemes import CALIBRATED_SCHEMES, Scheme, scheme

    if _is_layer_map(spec):
        def per_layer(bits: int, dim: int, seed: int):
            return spec.schemes(dim, seed)  # layer -> Scheme: a model's cache takes it, layer by layer

        return per_layer
    if isinstance(spec, Scheme):
        def ready(bits: int, dim: int, seed: int) -> Scheme:
            if spec.dim != dim:
                raise ValueError(f"{role} {spec.name!r} is a Scheme of dim {spec.dim}, but the data have head dim "
                                 f"{dim}")
            return spec

        return ready
    if isinstance(spec, str) and spec in CALIBRATED_SCHEMES:
        _factory(spec, role, options)  # the calibration refusal, worded once
    if _by_scheme(spec):
        def registered(bits: int, dim: int, seed: int) -> Scheme:
            try:
                return scheme(spec, bits=bits, dim=dim, seed=seed, **options)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"{role} {spec!r}: {exc}") from None

        return registered
    name, factory = _factory(spec, role, options)

    def built(bits: int, dim: int, seed: int) -> Scheme:
        seed_k, seed_v = spawn_seeds(seed, 2)
        try:
            k, v = factory(bits=bits, dim=dim, seed=seed_k), factory(bits=bits, dim=dim, seed=seed_v)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{role} {name!r}: {exc}") from None
        for part, q in (("K", k), ("V", v)):
            _check_protocol(q, role, str(name), part)
        return Scheme(str(name), bits, k, v, seed)

    return built


def resolve_scheme(spec, *, bits: int, dim: int, seed: int = 0, role: str = "quantizer", **options):
    """Build the scheme that ``spec`` names (see the module doc) at budget ``bits`` and head dim ``dim``; errors name
    the ``role`` ("quantizer" or "compare") and the spec."""
    return scheme_builder(spec, role=role, **options)(bits=bits, dim=dim, seed=seed)


def label(spec) -> str:
    """The name a spec is shown by: the string itself, a class's or factory's ``__name__``, a Scheme's name."""
    if isinstance(spec, str):
        return spec
    if _is_layer_map(spec):
        return spec.name
    return getattr(spec, "__name__", None) or getattr(spec, "name", None) or repr(spec)


@dataclass
class Side:
    """One side of an evaluation: its spec, budget and a scheme per unit."""

    role: str
    spec: Any
    bits: int
    options: dict

    def __post_init__(self) -> None:
        from kvstats.quant.schemes import Scheme

        if isinstance(self.spec, Scheme):  # a ready Scheme's budget is its own: the label and records say so
            self.bits = self.spec.bits
        elif _is_layer_map(self.spec):  # so is a layer map's (the mean of its nominal widths)
            self.bits = self.spec.mean_bits
        self._build = scheme_builder(self.spec, role=self.role, **self.options)  # resolved once, not per unit

    def scheme(self, dim: int, seed: int):
        """The side's scheme for one unit: its budget, head dim ``dim`` and the unit's ``seed``."""
        return self._build(bits=self.bits, dim=dim, seed=seed)

    @property
    def label(self) -> str:
        return label(self.spec)

    def identity(self) -> dict | None:
        from kvstats.evaluation.unit_store import code_identity
        from kvstats.quant.schemes import CALIBRATED_SCHEMES, SCHEMES, Scheme

        if _is_layer_map(self.spec):  # registered kvstats formats: the map and kvstats' own code identify it
            return {"layer_map": self.spec.to_dict(), "code": code_identity(type(self.spec)), "bits": self.bits}
        if isinstance(self.spec, Scheme):
            parts = [code_identity(q) for q in (self.spec.k, self.spec.v)]
            if None in parts:
                return None
            prov = [q.provenance().fingerprint if callable(getattr(q, "provenance", None)) else repr(q)
                    for q in (self.spec.k, self.spec.v)]
            return {"scheme": repr(self.spec), "code": parts, "provenance": prov, "bits": self.bits}
        from kvstats.quant.quantizers import QUANTIZERS

        if _is_pair(self.spec):  # the two registered classes and their widths at this budget
            from kvstats.quant.schemes import pair_widths

            widths = pair_widths(self.spec, self.bits)
            parts = [code_identity(QUANTIZERS[name]) for name, _ in widths]
            code = None if None in parts else {"pair": parts, "widths": [w for _, w in widths]}
        elif isinstance(self.spec, str) and self.spec in {**SCHEMES, **CALIBRATED_SCHEMES}:
            code = code_identity({**SCHEMES, **CALIBRATED_SCHEMES}[self.spec][0])
        elif isinstance(self.spec, str) and self.spec in QUANTIZERS:  # the registered class itself (kvstats' or not)
            code = code_identity(QUANTIZERS[self.spec])
        else:
            code = code_identity(_factory(self.spec, self.role, self.options)[1])
        if code is None:
            return None
        return {"spec": self.label, "code": code, "bits": self.bits,
                "options": {k: repr(v) for k, v in sorted(self.options.items())}}


def _portable_builder(side: Side):
    """A picklable ``build(bits=, dim=, seed=)`` of the side's quantizer for a fresh process, or (None, why)."""
    import functools
    import pickle

    from kvstats.quant.quantizers import QUANTIZERS
    from kvstats.quant.schemes import CALIBRATED_SCHEMES, Scheme

    if isinstance(side.spec, Scheme):
        return None, "a ready Scheme cannot be rebuilt in a fresh process"
    if _by_scheme(side.spec) or (isinstance(side.spec, str) and side.spec in CALIBRATED_SCHEMES):
        return None, "a registered scheme"
    if isinstance(side.spec, str) and side.spec in QUANTIZERS:
        cls = QUANTIZERS[side.spec]
        build = functools.partial(cls, **side.options)
    else:
        build = _factory(side.spec, side.role, side.options)[1]
    module = getattr(getattr(build, "func", build), "__module__", "") or ""
    if module == "kvstats" or module.startswith("kvstats."):
        return None, "kvstats' own quantizer (tested by its suite)"
    try:
        pickle.dumps(build)
    except Exception as exc:  # noqa: BLE001 - lambdas, closures, objects defined in __main__
        return None, f"its factory cannot be pickled for a fresh process ({type(exc).__name__})"
    return build, ""


def check_side(side: Side, scheme, dim: int, seed: int, heads: int, *, linear: bool = True,
               parts=None, isolated: bool = True) -> dict[str, str]:
    """check_quantizer on the side's K and V quantizers, on caches of the data's ``heads`` KV heads (what the
    scheme will be given); then, with ``parts`` (the first unit's (q, k, v)), that the codes hold no more bits at the
    evaluation's own length than the scheme claims there; then, with ``isolated``, that a quantizer built in a
    fresh process decodes the codes to the same x̂ (a decoder that keeps anything outside the code fails).
    QuantizerCheckError naming the side and the check."""
    from kvstats.quant.conformance import check_quantizer, decode_in_fresh_process
    from kvstats.quant.schemes import Scheme

    builder = None
    if not isinstance(side.spec, Scheme) and not _by_scheme(side.spec):
        builder = _factory(side.spec, side.role, side.options)[1]
    result: dict[str, str] = {}

    def refuse(what: str, message: str):
        raise QuantizerCheckError(
            f"{side.role} {side.label!r}: {what} fails the conformance checks: {message}. Fix it, or pass --no-check "
            "(check=False) to measure it anyway (the results then record that the checks were skipped)") from None

    for part in ("k", "v"):
        q = getattr(scheme, part)

        def again(_seed, _part=part):  # the same quantizer rebuilt from the unit's seed
            return getattr(side.scheme(dim, seed), _part)

        try:
            check_quantizer(q, factory=None if isinstance(side.spec, Scheme) else again, build=builder, heads=heads,
                            linear=linear)
        except AssertionError as exc:
            refuse(f"its {part.upper()} quantizer", str(exc))
        result[part.upper()] = "passed"
    if parts is not None:
        measured = measured_bits(scheme, parts)
        n_tokens = parts[0][1].shape[-2]
        claimed = float(scheme.bits_per_coordinate(n_tokens=n_tokens)["mean"].total)
        if measured > claimed * (1 + 1e-9):
            refuse("its scheme", f"check_quantizer[bits] at the evaluation's own {n_tokens} tokens: the codes hold "
                                 f"{measured:.6g} bits per element, more than the {claimed:.6g} that "
                                 f"bits_per_coordinate(n_tokens={n_tokens}) claims")
        result["bits at the evaluation's length"] = "passed"
    if isolated:
        build, why = _portable_builder(side)
        if build is None:
            result["fresh process"] = f"not run: {why}"
        else:
            from kvstats._random import spawn_seeds

            seeds = dict(zip("kv", spawn_seeds(seed, 2)))
            failure = decode_in_fresh_process([(build, side.bits, dim, seeds[p], getattr(scheme, p)) for p in "kv"],
                                              heads=heads)
            if failure:
                refuse("its quantizer", failure)
            result["fresh process"] = "passed"
    return result


def scheme_record(scheme) -> dict:
    """What results files record of a side's scheme: :meth:`kvstats.schemes.Scheme.config` as a dict, each
    quantizer's config with its class and registry name (``{"repr": ...}`` for one that is not a kvstats
    Quantizer and so has no config)."""
    record = scheme.config.to_dict()
    for role in ("k", "v"):
        q = getattr(scheme, role)
        where = {"class": f"{type(q).__module__}.{type(q).__qualname__}", "name": getattr(q, "name", "")}
        record[role] = where | ({"repr": repr(q)} if record[role] is None else record[role])
    return record


def measured_bits(scheme, parts) -> float:
    from kvstats.quant.quantizers.base import held_bytes

    held = elements = 0
    for _, k, v in parts:
        code = scheme.encode(k, v)
        held, elements = held + held_bytes(code.k) + held_bytes(code.v), elements + k.numel() + v.numel()
    return 8.0 * held / elements


def match_bits(side: Side, target: float, dim: int, seed: int, parts) -> tuple[int, float, dict[int, float]]:
    """The comparator's budget: the largest n in 1..8 whose measured bits do not exceed ``target``, else the
    smallest n that builds. Returns (n, its measured bits, {every n that builds: its measured bits})."""
    from kvstats.quant.schemes import Scheme

    if isinstance(side.spec, Scheme):
        raise ValueError("match_bits needs a compare spec that builds at any budget (a name, 'module:Class' or a "
                         f"factory), got the ready Scheme {side.spec.name!r}")
    options = []
    for n in range(1, 9):
        try:
            scheme = resolve_scheme(side.spec, bits=n, dim=dim, seed=seed, role=side.role, **side.options)
        except (ValueError, TypeError):
            continue
        options.append((n, measured_bits(scheme, parts)))
    if not options:
        raise ValueError(f"compare {side.label!r} builds at no budget in 1..8 for dim {dim}")
    fitting = [o for o in options if o[1] <= target * (1 + 1e-12)]
    n, bits = max(fitting, key=lambda o: o[0]) if fitting else options[0]
    return n, bits, dict(options)


@dataclass
class Sides:
    """The two sides of an evaluation once built and checked on unit 0: ``main`` and ``other`` (None without a
    comparison), what their checks said and what the results record of their unit-0 schemes."""

    main: Side
    other: Side | None
    checks: dict[str, Any]
    records: dict[str, Any]

    def identities(self) -> list[dict | None]:
        return [self.main.identity()] + ([] if self.other is None else [self.other.identity()])

    def budgets(self, rows: list[dict], *, claimed: bool) -> dict[str, Any]:
        """Each side's budget and the bits per element its codes held (mean over the units), with the
        quantizers' own claim when ``claimed``, and whether the two sides' measured bits match; where the units
        carry ``bits_codes`` (a model's cache with its exact window), ``measured_codes``: the codes' alone."""
        by_side = {"evaluated": ("", self.main)} | ({} if self.other is None else {"compared": ("other:", self.other)})
        info = {}
        for name, (prefix, side) in by_side.items():
            info[name] = {"budget": side.bits, "measured": float(np.mean([r[prefix + "bits_total"] for r in rows]))}
            if prefix + "bits_codes" in rows[0]:  # on a model: the quantized tokens alone, without the exact window
                info[name]["measured_codes"] = float(np.mean([r[prefix + "bits_codes"] for r in rows]))
            if claimed:
                info[name]["claimed"] = float(np.mean([r[prefix + "bits_claimed"] for r in rows]))
        if self.other is not None:
            a, b = info["evaluated"]["measured"], info["compared"]["measured"]
            info["matched"] = abs(a - b) <= 1e-9 * max(a, b)
            tried = getattr(self.other, "budgets_measured", None)
            if tried is not None:  # match_bits ran: the budgets it measured on unit 0
                info["compared"]["budgets_measured"] = {str(n): bits for n, bits in tried.items()}
        return info


def prepare_sides(quantizer, compare, bits: int, options: dict, *, dim: int, heads: int, seed0: int, parts,
                  check: bool, linear: bool, match: bool) -> Sides:
    """Build the sides, check each on unit 0's scheme (``check_side``) and, with ``match``, set the comparator's
    budget to the evaluated quantizer's measured bits (:func:`match_bits`). ``parts()`` gives the unit-0 tensors
    the checks and the bit matching read (each call its own copy where the caller measures on the originals)."""
    main = Side("quantizer", quantizer, bits, dict(options))
    other = None if compare is None else Side("compare", compare, bits, dict(options))
    skipped = "skipped (check=False)"

    def checked(side: Side, scheme0):
        if _is_layer_map(side.spec):  # every layer's quantizers are kvstats' registered formats
            return "not run: a layer map of kvstats' own registered quantizers (tested by its suite)"
        return check_side(side, scheme0, dim, seed0, heads, linear=linear, parts=parts()) if check else skipped

    def record(side: Side, scheme0):
        return side.spec.to_dict() if _is_layer_map(side.spec) else scheme_record(scheme0)

    scheme0 = main.scheme(dim, seed0)
    checks, records = {"quantizer": checked(main, scheme0)}, {"evaluated": record(main, scheme0)}
    if other is not None:
        if match:
            if _is_layer_map(other.spec):
                raise ValueError("match_bits sets the budget of the compared spec; a layer map's is its own: compare "
                                 "a spec that builds at any budget, or pass the map as the quantizer")
            target = (float(np.mean([measured_bits(main.spec.scheme(i, dim, seed0 + i), parts())
                                     for i in range(len(main.spec))])) if _is_layer_map(main.spec)
                      else measured_bits(scheme0, parts()))
            other.bits, _, other.budgets_measured = match_bits(other, target, dim, seed0, parts())
        other_scheme0 = other.scheme(dim, seed0)
        records["compared"] = record(other, other_scheme0)
        checks["compare"] = checked(other, other_scheme0)
    return Sides(main, other, checks, records)
