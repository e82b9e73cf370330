"""The quantizer protocol: codes, bit budgets and the base class every quantizer derives from.

    code = q.encode(x)          # x [..., d] -> Code (packed payload + per-vector scalars); exact .nbytes
    x_hat = q.decode(code)      # [..., d], x's dtype
    s = q.inner(query, code)    # estimates <query_i, x_j>: query [..., n_q, d] -> [..., n_q, n_k]
    q.bits_per_coordinate()     # BitBudget(payload, norms, side, total), bits per coordinate
    q.bits_per_coordinate(n_tokens=1024)   # the same, side information amortised over 1024 cached tokens

Provenance: every code records which quantizer made it (:class:`CodeSource`: name, dim, bits and a
fingerprint of the seed and the options); ``decode`` and ``inner`` refuse a code made by another
quantizer (other method, seed, dim, bits or options) with a ValueError naming both.

The numerics every quantizer shares (accumulation dtype, decode headroom, saturating cast, the range checks of
its inputs and results) live in :mod:`kvstats.quant.quantizers.numerics`, the kernel plans of one code in
:mod:`kvstats.quant.quantizers.plans`; the names kvstats' modules import from here are re-exported.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvstats._validation import all_finite, check_float_tensor, check_not_meta
from kvstats.quant.quantizers.config import QuantizerConfig
from kvstats.quant.quantizers.numerics import (  # noqa: F401 - InnerOverflowError re-exported
    ACC_DTYPES,
    InnerOverflowError,
    RangeChecks,
    acc_dtype,
    decode_headroom,
    saturating_cast,
)
from kvstats.quant.quantizers.plans import GroupedPlan, broadcast_groups, flat_keys  # noqa: F401 - re-exported

__all__ = ["BitBudget", "Code", "CodeSource", "Quantizer", "ACC_DTYPES", "held_bytes", "decode_headroom",
           "saturating_cast"]


#: marks a constructor argument left to the config's default
_GIVEN_BY_CONFIG = object()


@dataclass(frozen=True)
class BitBudget:
    """Storage cost in bits per coordinate (per cache element).

    payload: the codes themselves as stored, byte padding included (ceil(d·b/8) bytes per vector, so
        exactly b when d·b is a multiple of 8; the nominal budget n of a scheme counts this);
    norms: per-vector norms (‖x‖, and γ = ‖r‖ for QJL residuals) at their stored precision;
    side: other side information (min/scale of min-max groups, calibration data amortised, ...);
    total: payload + norms + side.
    """

    payload: float
    norms: float = 0.0
    side: float = 0.0

    @property
    def total(self) -> float:
        return self.payload + self.norms + self.side

    def __add__(self, other: BitBudget) -> BitBudget:
        return BitBudget(self.payload + other.payload, self.norms + other.norms, self.side + other.side)

    def scaled(self, factor: float) -> BitBudget:
        return BitBudget(self.payload * factor, self.norms * factor, self.side * factor)

    def to_dict(self) -> dict[str, float]:
        return {"payload": self.payload, "norms": self.norms, "side": self.side, "total": self.total}


@dataclass(frozen=True)
class CodeSource:
    """Which quantizer made a code: its registry name, dim, bits and a fingerprint of seed and options.

    ``fingerprint`` is the first 16 hex digits of the SHA-256 of (class, name, dim, bits, seed, options);
    ``describe`` is the quantizer's repr, for error messages.
    """

    name: str
    dim: int
    bits: float
    fingerprint: str
    describe: str = ""

    def __str__(self) -> str:
        return f"{self.describe or self.name} [dim={self.dim}, bits={self.bits:g}, fingerprint {self.fingerprint}]"


@dataclass
class Code:
    """An encoded batch of vectors: packed payloads and per-vector scalars, all real tensors.

    Attributes:
        shape: shape of the encoded x, [..., n, d].
        dtype: dtype of the encoded x (decode returns it).
        payload: named packed tensors (uint8), e.g. {"indices": [..., n, ceil(d·b/8)]}.
        scalars: named per-vector (or per-group) scalars, e.g. {"norm": [..., n]} in the stored dtype.
        parts: nested codes of composite quantizers (e.g. turbo_prod's MSE and QJL stages).
        source: the :class:`CodeSource` of the quantizer that made it (set by ``Quantizer.encode``;
            None for codes assembled by hand, which are checked for structure only).
    """

    shape: torch.Size
    dtype: torch.dtype
    payload: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, torch.Tensor] = field(default_factory=dict)
    parts: dict[str, Code] = field(default_factory=dict)
    source: CodeSource | None = None

    @property
    def nbytes(self) -> int:
        """Exact bytes held by the code's tensors (payloads, scalars and nested parts)."""
        own = sum(t.numel() * t.element_size() for t in (*self.payload.values(), *self.scalars.values()))
        return own + sum(p.nbytes for p in self.parts.values())

    @property
    def device(self) -> torch.device:
        for t in (*self.payload.values(), *self.scalars.values()):
            return t.device
        return next(iter(self.parts.values())).device

    # -------------------------------------------------------------------------- structure (the cache's algebra)
    @property
    def token_axis(self) -> int:
        """The axis of the encoded tokens: x is ``[..., n, d]``, so ``len(shape) - 2``."""
        return len(self.shape) - 2

    def named_tensors(self, prefix: str = ""):
        """``(name, tensor)`` for every tensor the code holds: its payloads, its scalars, then its nested parts'
        (named ``part.field``)."""
        for key, t in (*self.payload.items(), *self.scalars.items()):
            yield prefix + key, t
        for part_name, part in self.parts.items():
            yield from part.named_tensors(f"{prefix}{part_name}.")

    def named_scalars(self, prefix: str = ""):
        """``(name, tensor)`` for the scalars of the code and of its nested parts."""
        for key, t in self.scalars.items():
            yield prefix + key, t
        for part_name, part in self.parts.items():
            yield from part.named_scalars(f"{prefix}{part_name}.")

    def map(self, fn, shape_of) -> Code:
        """A code whose every tensor is ``fn(tensor)``, of x of shape ``shape_of(self.shape)`` (nested parts get
        ``shape_of`` of their own shapes); dtype and provenance kept."""
        return dataclasses.replace(self, shape=torch.Size(shape_of(self.shape)),
                                   payload={k: fn(t) for k, t in self.payload.items()},
                                   scalars={k: fn(t) for k, t in self.scalars.items()},
                                   parts={k: p.map(fn, shape_of) for k, p in self.parts.items()})

    def is_per_vector(self) -> bool:
        """True when every tensor is indexed ``[..., n, ...]`` like x (so codes concatenate and narrow along n).

        False for codes with groups across tokens (min-max per channel): those can only be kept whole."""
        axis = self.token_axis
        lead = tuple(self.shape[: axis + 1])
        return all(t.dim() > axis and tuple(t.shape[: axis + 1]) == lead for _, t in self.named_tensors())

    def cat(self, other: Code) -> Code:
        """This code's tokens, then ``other``'s, along the token axis; both per-vector codes of one quantizer."""
        if self.source != other.source:
            raise ValueError(f"cannot append a code made by {other.source} to one made by {self.source}")
        axis = self.token_axis
        if other.shape[:axis] != self.shape[:axis] or other.shape[axis + 1:] != self.shape[axis + 1:]:
            raise ValueError(f"cannot append a code of x {tuple(other.shape)} to one of x {tuple(self.shape)}: only "
                             "the token axis (-2) may differ")
        shape = torch.Size((*self.shape[:axis], self.shape[axis] + other.shape[axis], *self.shape[axis + 1:]))
        return dataclasses.replace(
            self, shape=shape,
            payload={k: torch.cat([t, other.payload[k]], dim=axis) for k, t in self.payload.items()},
            scalars={k: torch.cat([t, other.scalars[k]], dim=axis) for k, t in self.scalars.items()},
            parts={k: p.cat(other.parts[k]) for k, p in self.parts.items()})

    def narrow(self, stop: int, *, copy: bool = True) -> Code:
        """The first ``stop`` tokens of a per-vector code: copies of its tensors, or views with ``copy=False``."""
        axis = self.token_axis
        cut = (lambda t: t.narrow(axis, 0, stop).clone()) if copy else (lambda t: t.narrow(axis, 0, stop))
        return self.map(cut, lambda shape: (*shape[:axis], stop, *shape[axis + 1:]))

    def map_batch(self, fn) -> Code:
        """Apply a batch-axis operation (``index_select``, ``repeat_interleave``) to every tensor of the code: a
        code of the selected rows of x (every tensor keeps the batch axis first)."""
        rows = fn(torch.empty(self.shape[0], 0)).shape[0]
        return self.map(fn, lambda shape: (rows, *shape[1:]))

    def equal(self, other: Code) -> bool:
        """Whether both codes hold the same tensors (names, shapes, dtypes and values) for x of the same shape."""
        if not isinstance(other, Code) or tuple(self.shape) != tuple(other.shape) or self.dtype != other.dtype:
            return False
        ta, tb = dict(self.named_tensors()), dict(other.named_tensors())
        return (ta.keys() == tb.keys()
                and all(ta[k].shape == tb[k].shape and ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k])
                        for k in ta))


def held_bytes(code: Code) -> int:
    """The bytes ``code`` holds — Σ numel · element size over its payloads, scalars and nested parts — read from the
    dataclass fields themselves, so a Code subclass that overrides ``nbytes`` (or ``named_tensors``) cannot
    understate what it holds. What kvstats measures bits by (evaluate's ``bits_total``, the cache's memory)."""
    field = object.__getattribute__  # the instance's own fields, past any property a subclass defines
    tensors = (*field(code, "payload").values(), *field(code, "scalars").values())
    return (sum(t.numel() * t.element_size() for t in tensors)
            + sum(held_bytes(part) for part in field(code, "parts").values()))


class Quantizer(RangeChecks):
    """Base class. Subclasses set ``name`` and implement _encode/_decode (and _inner when the method's
    estimator is not decode-then-dot) and bits_per_coordinate.

    Configuration: a quantizer is built from a frozen, validated ``config`` (an instance of exactly its class's
    ``Config``, :mod:`kvstats.quant.quantizers.config`), checked once when it is made. The constructor's keywords are
    the config's fields; :meth:`from_config` builds from a config; the options read as attributes
    (``q.norm_dtype`` is ``q.config.norm_dtype``). A subclass without a ``Config`` of its own gets one whose bit
    range is its ``min_bits`` / ``max_bits``; derived state is set up in :meth:`_setup_from_config`. kvstats
    reads the config from ``_qconfig`` (``config`` is the same object), so a subclass that keeps settings of its
    own under ``self.config`` does not change what is fingerprinted.
    """

    name: str = ""
    #: True for quantizers fitted to data (calibrate before encode); False for data-oblivious ones.
    needs_calibration: bool = False
    min_bits: int = 1
    max_bits: int = 8
    #: stored scalar name -> the constructor option that sets its dtype (named in overflow errors)
    storage_options: dict[str, str] = {}
    #: True when each vector's code is a function of that vector alone (and of the quantizer's fixed state): codes
    #: made in pieces equal the code of one encode, so a cache may encode a token before it is due, cut codes and
    #: join them. False when codes have groups across tokens (min-max per channel); None: not declared (a cache
    #: then joins and cuts codes whose tensors are all indexed by token, and never encodes ahead).
    codes_per_vector: bool | None = None
    Config: type[QuantizerConfig] = QuantizerConfig
    config: QuantizerConfig

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        base = cls.Config
        if not (isinstance(base, type) and issubclass(base, QuantizerConfig)):
            raise TypeError(f"{cls.__name__}.Config must be a subclass of "
                            f"kvstats.quant.quantizers.config.QuantizerConfig (Config is the quantizer's configuration "
                            f"class), got {base!r}")
        if "Config" not in cls.__dict__ and (base.min_bits, base.max_bits) != (cls.min_bits, cls.max_bits):
            # named <class>.Config, so pickle finds it as an attribute of the quantizer class
            cls.Config = dataclass(frozen=True)(type("Config", (base,), {
                "__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}.Config",
                "min_bits": cls.min_bits, "max_bits": cls.max_bits, "method": cls.name or base.method}))

    def __init__(self, bits=_GIVEN_BY_CONFIG, dim=_GIVEN_BY_CONFIG, seed=_GIVEN_BY_CONFIG, *,
                 config: QuantizerConfig | None = None, **options):
        given = {k: v for k, v in (("bits", bits), ("dim", dim), ("seed", seed)) if v is not _GIVEN_BY_CONFIG}
        if config is None:
            config = self.Config.build(type(self).__name__, given, options)
        elif given or options:
            raise TypeError(f"{type(self).__name__}: give config= or the arguments {sorted([*given, *options])}, "
                            "not both (use config.replace(...) to change a config)")
        elif type(config) is not self.Config and not self._any_config:
            raise TypeError(f"config must be a {self.Config.__name__} for {type(self).__name__}, "
                            f"got {type(config).__name__}")
        self._qconfig = self.config = config
        self.bits, self.dim = config.bits, config.dim
        #: the seed used (for seed=None, the fresh one drawn: rebuild with it to reproduce the object)
        self.seed = config.seed
        self._setup_from_config()

    #: True for a wrapper that takes the config of the quantizers it wraps (PerHeadQuantizer)
    _any_config = False

    @classmethod
    def from_config(cls, config: QuantizerConfig) -> Quantizer:
        """The quantizer of ``config`` (an instance of exactly ``cls.Config``)."""
        return cls(config=config)

    def _setup_from_config(self) -> None:
        """Set up the state derived from ``self._qconfig`` (codebooks, rotations, sketches); subclasses."""

    def __getattr__(self, name: str):
        # options read as attributes; only reached when normal lookup fails (never for the config itself)
        config = self.__dict__.get("_qconfig")
        if config is None or name.startswith("_") or name not in config.__dataclass_fields__ \
                or name in ("bits", "dim", "seed"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(config, name)

    # ------------------------------------------------------------------------------------ public API
    def encode(self, x: torch.Tensor) -> Code:
        """Encode x [..., d] (fp16/bf16/fp32, or fp64 for references); arithmetic in fp32.

        Raises ValueError when a stored scalar (norm, min, scale) overflows its storage dtype, naming it, and
        when max |x| exceeds :func:`decode_headroom` (its decode's fp32 arithmetic could overflow: fp32 or
        bf16 x beyond about 1e35 / d).
        """
        self._check_vectors(x, "x", check_finite=False)
        self._check_headroom(x)
        code = self._encode(x)
        self._check_stored(code, x)
        code.source = self.provenance()
        return code

    def decode(self, code: Code) -> torch.Tensor:
        """Reconstruct x̂ [..., d] in the dtype x had.

        Computed in the accumulation dtype and cast saturating (:func:`saturating_cast`): a coordinate beyond
        the dtype's largest finite value (an fp16 x near 65,504 whose reconstruction overshoots) decodes to
        ±max, never to inf.
        """
        self.check_code(code)
        with self._code_fields(code):
            return self._decoded(code)

    def _decoded(self, code: Code) -> torch.Tensor:
        """``_decode`` cast to the code's dtype, saturating; an inf or NaN in its accumulation dtype — impossible
        for a finite x below :meth:`input_limit` — is refused as a fault of this quantizer."""
        x_hat = self._decode(code)
        try:
            return saturating_cast(x_hat, code.dtype)
        except ValueError as exc:
            raise ValueError(f"{self!r} decoded a code of finite {code.dtype} x to non-finite values ({exc}): a fault "
                             "of the quantizer's decode") from None

    def inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        """Estimate ⟨query_i, x_j⟩ for query [..., n_q, d] and code of x [..., n_k, d] -> [..., n_q, n_k].

        Leading dims broadcast. Uses the estimator the method prescribes (decode-then-dot unless the
        subclass overrides ``_inner``). Returned in fp32 (fp64 for fp64 queries). Finite queries whose products
        overflow fp32 on the way are scored as ``2^e · inner(2^-e · query)`` with ``2^e ≥ max |query|`` (exact: the
        estimators are linear in the query, and a power of two scales without rounding); a score beyond the output
        dtype's range is refused with a ValueError naming its magnitude.
        """
        self._check_vectors(query, "query")
        if query.dim() < 2:
            raise ValueError(f"query must be [..., n_q, d], got shape {tuple(query.shape)}")
        self.check_code(code)
        if len(code.shape) < 2:
            raise ValueError(f"inner needs a code of x [..., n_k, d], got a code of shape {tuple(code.shape)}")
        try:
            if query.shape[:-2] != code.shape[:-2]:
                torch.broadcast_shapes(query.shape[:-2], code.shape[:-2])
        except RuntimeError:
            raise ValueError(f"query's leading dims {tuple(query.shape[:-2])} (query [..., n_q, d] = "
                             f"{tuple(query.shape)}) do not broadcast with the code's {tuple(code.shape[:-2])} "
                             f"(code of x [..., n_k, d] = {tuple(code.shape)})") from None
        with self._code_fields(code):
            scores = self._inner(query, code)
            return scores if all_finite(scores) else self._inner_rescaled(query, code)

    def weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        """Σⱼ wᵢⱼ x̂ⱼ for weights [..., n_q, n_k] and the code of x [..., n_k, d] -> [..., n_q, d].

        Attention's output from a value cache: ``weights @ decode(code)``, equal to it up to fp32 summation order.
        Leading dims broadcast. The built-in quantizers compute it from the codes without forming x̂ (one inverse
        rotation or sketch transpose per output row, none per vector; kvstats.ops ``*_weighted_sum``); others
        decode then multiply. Returned in fp32 (fp64 for fp64 weights).
        """
        check_float_tensor(weights, "weights")
        if weights.dim() < 2:
            raise ValueError(f"weights must be [..., n_q, n_k], got shape {tuple(weights.shape)}")
        self.check_code(code)
        if len(code.shape) < 2 or code.shape[-2] != weights.shape[-1]:
            raise ValueError(f"weights [..., n_q, n_k] = {tuple(weights.shape)} need a code of x [..., n_k, d] with "
                             f"n_k = {weights.shape[-1]}, got a code of shape {tuple(code.shape)}")
        try:
            if weights.shape[:-2] != code.shape[:-2]:
                torch.broadcast_shapes(weights.shape[:-2], code.shape[:-2])
        except RuntimeError:
            raise ValueError(f"weights' leading dims {tuple(weights.shape[:-2])} do not broadcast with the code's "
                             f"{tuple(code.shape[:-2])}") from None
        with self._code_fields(code):
            return self._weighted_sum(weights.to(acc_dtype(weights.dtype)), code)

    def inner_plan(self, code: Code) -> Callable[[torch.Tensor], torch.Tensor]:
        """``query -> _inner(query, code)`` for many queries against one code this quantizer made (a cache's decode
        steps): query [..., n_q, d] in the accumulation dtype (fp32; fp64 for fp64 codes) -> [..., n_q, n_k], the
        same numbers as :meth:`inner` without its checks. Quantizers with fused kernels override it to work out once
        what does not depend on the query (:class:`GroupedPlan`); the code must not change while the plan is used."""
        return functools.partial(self._planned, self._inner, code)

    def weighted_sum_plan(self, code: Code) -> Callable[[torch.Tensor], torch.Tensor]:
        """``weights -> _weighted_sum(weights, code)``, as :meth:`inner_plan`: weights [..., n_q, n_k] in the
        accumulation dtype -> [..., n_q, d], the numbers of :meth:`weighted_sum` without its checks."""
        return functools.partial(self._planned, self._weighted_sum, code)

    def decode_parts(self, code: Code, dtype: torch.dtype):
        """This quantizer's code as the fused decode step reads it (:class:`kvstats.ops.CodeParts`: the tensors
        flattened over the code's leading dims to [G, n_k, ·], side tensors in ``dtype``, the accumulation dtype),
        or None where :func:`kvstats.ops.decode_attention` cannot read it; a cache then runs :meth:`inner_plan`
        and :meth:`weighted_sum_plan`, whose numbers the op's equal where it can. None by default; lloyd,
        turbo_mse, turbo_prod (with the ``wht`` rotation at d a power of two, or none) and qjl (without outlier
        channels) give their parts, unless a subclass overrides one of the methods the parts stand for."""
        return None

    def _methods_of(self, owner: type, *methods: str) -> bool:
        """Whether each of ``methods`` of this quantizer is still ``owner``'s (not overridden by a subclass)."""
        return all(getattr(type(self), m) is getattr(owner, m) for m in methods)

    def _plan_reproduces(self, method: str, owner: type) -> bool:
        """Whether this quantizer's ``method`` (``"_inner"`` or ``"_weighted_sum"``) is still ``owner``'s, whose
        plan an override of :meth:`inner_plan` / :meth:`weighted_sum_plan` in ``owner`` reproduces: a subclass that
        overrides the estimator itself gets the default plan, which calls its own method."""
        return self._methods_of(owner, method)

    def _planned(self, method, code: Code, x: torch.Tensor) -> torch.Tensor:
        with self._code_fields(code):
            return method(x, code)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        """Bits per coordinate (per cache element), every overhead counted.

        n_tokens: cached tokens that side information shared across tokens is amortised over (per-channel
        min-max groups, NOVA's calibration); quantizers whose cost is per vector ignore it.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------------------------- provenance
    def options(self) -> dict:
        """The constructor options that change the codes (beyond bits, dim and seed), for the fingerprint:
        the config's options."""
        return self._qconfig.options()

    def provenance(self) -> CodeSource:
        """The :class:`CodeSource` this quantizer stamps on its codes. Computed once per config when the options
        are the frozen config's (every code check compares it); a quantizer whose :meth:`options` say more (NOVA's
        calibration digest, a per-head wrapper's heads) computes it on every call, so a recalibration changes it."""
        if type(self).options is not Quantizer.options:
            return self._provenance()
        memo = self.__dict__.get("_provenance_memo")
        if memo is not None and memo[0] is self._qconfig and memo[1] == repr(self):
            return memo[2]
        source = self._provenance()
        self.__dict__["_provenance_memo"] = (self._qconfig, repr(self), source)
        return source

    def _provenance(self) -> CodeSource:
        key = repr((type(self).__qualname__, self.name, self.dim, self.bits, self.seed,
                    sorted((k, repr(v)) for k, v in self.options().items())))
        return CodeSource(self.name, self.dim, self.bits, hashlib.sha256(key.encode()).hexdigest()[:16], repr(self))

    def check_code(self, code: Code) -> None:
        """Refuse anything but a Code this quantizer (same method, dim, bits, seed and options) made."""
        if not isinstance(code, Code):
            raise TypeError(f"code must be a kvstats Code, got {type(code).__name__}")
        for key, t in code.named_tensors():
            check_not_meta(t, f"code field {key!r}")
        if code.source is None:
            if code.shape and code.shape[-1] != self.dim:
                raise ValueError(f"code is of vectors of dim {code.shape[-1]}, but {self!r} has dim {self.dim}")
            return
        mine = self.provenance()
        if code.source.fingerprint != mine.fingerprint:
            raise ValueError(f"code was made by {code.source}, not by this quantizer {mine}: decode a code with "
                             "the quantizer (same method, dim, bits, seed and options) that encoded it")

    def _code_fields(self, code: Code):
        return _MissingField(self, code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bits={self.bits}, dim={self.dim}, seed={self.seed})"

    # ------------------------------------ for subclasses (the range checks they call: RangeChecks, numerics.py)
    def _encode(self, x: torch.Tensor) -> Code:
        raise NotImplementedError

    def _decode(self, code: Code) -> torch.Tensor:
        # x̂ in the code's dtype or a wider one (decode casts it, saturating)
        raise NotImplementedError

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        # decode-then-dot on exactly what decode returns (x̂ in the code's dtype)
        acc = acc_dtype(query.dtype)
        x_hat = self._decoded(code).to(acc)
        return query.to(acc) @ x_hat.transpose(-1, -2)

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        # weights already in the accumulation dtype (weighted_sum)
        return weights @ self._decoded(code).to(weights.dtype)


class _MissingField:
    """Turns a KeyError for a code field the quantizer needs into a ValueError naming field and quantizer."""

    def __init__(self, quantizer: Quantizer, code: Code):
        self.quantizer, self.code = quantizer, code

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # a field name is a str the code does not hold; any other KeyError is the quantizer's own and propagates
        if exc_type is KeyError and exc.args and isinstance(exc.args[0], str) and exc.args[0] not in {
                *self.code.payload, *self.code.scalars, *self.code.parts}:
            have = sorted([*self.code.payload, *self.code.scalars, *self.code.parts])
            raise ValueError(f"code lacks the field {exc.args[0]!r} that {self.quantizer!r} needs (it holds "
                             f"{have}): it was not made by this quantizer") from None
        return False
