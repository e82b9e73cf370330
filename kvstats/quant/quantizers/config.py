"""Frozen, validated quantizer configurations: what a quantizer is built from, checked once.

    cfg = TurboProdConfig(bits=4, dim=128, seed=0, rows="srht")    # validated here, immutable after
    q = TurboProd.from_config(cfg)                                  # == TurboProd(bits=4, dim=128, rows="srht")
    q.config.to_dict()   # {"method": "turbo_prod", "bits": 4, "dim": 128, "seed": 0, "rotation": "wht", ...}

Every registered quantizer declares its ``Config`` (a subclass of :class:`QuantizerConfig`); its constructor's
keywords are the config's fields, so ``quantizer(name, **kwargs)`` and ``from_config`` build the same object.
The config is what the fingerprint of a code hashes (:meth:`kvstats.quantizers.Quantizer.provenance`) and what
results files record. Ranges are checked here and nowhere later on the way to the kernels (the ops check only
their own tensor contract).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kvstats._random import check_seed
from kvstats._validation import check_int_range
from kvstats.quant.quantizers.nova_calibration import (
    DEFAULT_AMORTIZE_TOKENS,
    DEFAULT_RIDGE,
    SIDE_DTYPES,
    default_group_dim,
)

__all__ = ["QuantizerConfig", "PerHeadConfig", "LloydConfig", "TurboMSEConfig", "TurboProdConfig", "QJLConfig",
           "MinMaxConfig", "RotatedMinMaxConfig", "NovaConfig", "IdentityConfig", "NORM_DTYPES", "ROTATIONS", "ROWS",
           "SKETCH_DOMAINS", "MAX_HAAR_DIM", "NOVA_TRANSFORMS", "check_norm_dtype", "IntTokenConfig", "NVFP4Config",
           "FP8Config", "FP8E4M3Config", "FP8E5M2Config", "FP8_SCALES", "FP8_GRANULARITIES"]

NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The rotations of the rotated quantizers (kvstats.quant.rotations.make_rotation).
ROTATIONS = ("wht", "haar")
#: The sketch kinds of every QJL stage (qjl, turbo_prod's residual).
ROWS = ("gaussian", "orthogonal", "srht")
#: where turbo_prod sketches its residual (TurboProdConfig.sketch_domain)
SKETCH_DOMAINS = ("rotated", "original")
_BASE_FIELDS = ("bits", "dim", "seed")


def check_norm_dtype(dtype: torch.dtype, name: str = "norm_dtype") -> torch.dtype:
    if dtype not in NORM_DTYPES:
        raise ValueError(f"{name} must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
    return dtype


def _check_choice(value, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


#: Largest dim of a Haar rotation (a dense d × d matrix; kvstats.quant.rotations.HaarRotation)
MAX_HAAR_DIM = 1 << 14


def _check_rotation(rotation, dim: int) -> str:
    _check_choice(rotation, "rotation", ROTATIONS)
    if rotation == "haar" and dim > MAX_HAAR_DIM:
        raise ValueError(f"dim must be at most {MAX_HAAR_DIM} for rotation='haar' (a dense d × d matrix), got {dim}; "
                         "use rotation='wht'")
    return rotation


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, QuantizerConfig):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class QuantizerConfig:
    """bits ∈ [min_bits, max_bits] (an int), dim ∈ [2, 32768], seed under the package's seed rule (None draws
    a fresh one, which the config then holds). Subclasses add their options as fields with defaults and check
    them in :meth:`validate`; a value derived from the others (a default that depends on dim, say) is set there
    with :meth:`_derive`, which marks it, so that :meth:`replace` derives it again instead of carrying it over."""

    bits: int
    dim: int
    seed: int | None = 0
    #: the fields whose values were derived (left to their default), not given
    _derived: frozenset = field(default=frozenset(), init=False, repr=False, compare=False)
    #: the registry name of the quantizer the config builds ("" for the base)
    method: ClassVar[str] = ""
    min_bits: ClassVar[int] = 1
    max_bits: ClassVar[int] = 8

    def __post_init__(self):
        self._set("bits", self.check_bits(self.bits))
        self._set("dim", check_int_range(self.dim, "dim", 2, 1 << 15))
        self._set("seed", check_seed(self.seed))
        self.validate()

    def check_bits(self, bits):
        return check_int_range(bits, "bits", self.min_bits, self.max_bits)

    def validate(self) -> None:
        """Check the options (subclasses); raise ValueError/TypeError naming the field and the value."""

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)

    def _derive(self, name: str, value) -> None:
        """Set a field left to its default to the value derived for it."""
        self._set(name, value)
        self._set("_derived", self._derived | {name})

    def options(self) -> dict[str, Any]:
        """The fields beyond bits, dim and seed (the options that change the codes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in _BASE_FIELDS and not f.name.startswith("_")}

    def kwargs(self) -> dict[str, Any]:
        """The constructor keywords that rebuild the quantizer: ``type(q)(**q.config.kwargs())`` (derived values
        left out: they are derived again)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.init and f.name not in self._derived}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: method, bits, dim, seed and the options (dtypes as their names, tuples as lists)."""
        return {"method": self.method, "bits": self.bits, "dim": self.dim, "seed": self.seed,
                **{k: _jsonable(v) for k, v in self.options().items()}}

    def replace(self, **changes) -> QuantizerConfig:
        """A copy with ``changes``, validated again; values that were derived are derived again for it
        (``MinMaxConfig(bits=3, dim=64).replace(dim=128).group_size`` is 128)."""
        kept = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in self._derived - set(changes):
            kept[name] = defaults[name]
        return type(self)(**(kept | changes))

    @classmethod
    def build(cls, owner: str, given: dict, options: dict) -> QuantizerConfig:
        """The config from constructor arguments (``given``: those of bits, dim and seed passed); an unknown
        option or a missing required argument is a TypeError naming ``owner``."""
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise TypeError(f"{owner} got unexpected option(s) {unknown}; its options are "
                            f"{sorted(set(fields) - set(_BASE_FIELDS))}")
        missing = [n for n in _BASE_FIELDS if n in fields and n not in given
                   and fields[n].default is dataclasses.MISSING and fields[n].default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{owner} needs {', '.join(missing)}")
        return cls(**{k: v for k, v in given.items() if k in fields}, **options)


@dataclass(frozen=True)
class LloydConfig(QuantizerConfig):
    """``lloyd``: norm_dtype, the precision ‖x‖ is stored in (fp32 default)."""

    norm_dtype: torch.dtype = torch.float32
    method: ClassVar[str] = "lloyd"

    def validate(self) -> None:
        check_norm_dtype(self.norm_dtype)


@dataclass(frozen=True)
class TurboMSEConfig(LloydConfig):
    """``turbo_mse``: rotation ("wht" default, or "haar") and norm_dtype."""

    rotation: str = "wht"
    method: ClassVar[str] = "turbo_mse"

    def validate(self) -> None:
        super().validate()
        _check_rotation(self.rotation, self.dim)


@dataclass(frozen=True)
class TurboProdConfig(QuantizerConfig):
    """``turbo_prod``: rotation of the MSE stage, rows of the residual sketch and the domain it sketches in
    (``"rotated"``: S r with r in the MSE stage's rotated domain, D'Alberto §2.2 literally; ``"original"``:
    S Πᵀ r, the residual in the data's own coordinates), norm_dtype of ‖x‖ and γ."""

    rotation: str = "wht"
    rows: str = "gaussian"
    sketch_domain: str = "rotated"
    norm_dtype: torch.dtype = torch.float32
    method: ClassVar[str] = "turbo_prod"

    def validate(self) -> None:
        _check_rotation(self.rotation, self.dim)
        _check_choice(self.rows, "rows", ROWS)
        _check_choice(self.sketch_domain, "sketch_domain", SKETCH_DOMAINS)
        check_norm_dtype(self.norm_dtype)


@dataclass(frozen=True)
class QJLConfig(QuantizerConfig):
    """``qjl``: m sketch rows (default bits·dim, bits default 1; bits is then m/dim, a float), rows, outlier
    channels (a sorted tuple, leaving ≥ 2 inliers), outlier_m (default m) and norm_dtype."""

    bits: float | None = None
    dim: int = 128
    m: int | None = None
    rows: str = "orthogonal"
    outliers: tuple[int, ...] | None = None
    outlier_m: int | None = None
    norm_dtype: torch.dtype = torch.float32
    method: ClassVar[str] = "qjl"

    def kwargs(self) -> dict[str, Any]:
        # m determines bits (= m/dim, possibly fractional): rebuild from m alone
        return {k: v for k, v in {**super().kwargs(), "m": self.m}.items() if k != "bits"}

    def replace(self, **changes) -> QJLConfig:
        # bits and m are two spellings of one choice: changing one re-derives the other
        for one, other in (("bits", "m"), ("m", "bits")):
            if one in changes and other not in changes:
                changes[other] = None
        if "bits" not in changes and "bits" not in self._derived:
            changes["bits"] = int(self.bits)  # given as an int in [1, 8], held as m/dim
        return super().replace(**changes)

    def check_bits(self, bits):
        return bits  # bits and m are checked together in validate (bits = m / dim)

    def validate(self) -> None:
        m, bits = self.m, self.bits
        if m is None:
            self._derive("m", check_int_range(1 if bits is None else bits, "bits", 1, 8) * self.dim)
        elif bits is not None and bits * self.dim != m:
            raise ValueError(f"bits={bits} and m={m} disagree for dim={self.dim} (m = bits·dim); give one")
        else:
            self._set("m", check_int_range(m, "m", 1, 1 << 16))
        (self._derive if bits is None else self._set)("bits", self.m / self.dim)
        _check_choice(self.rows, "rows", ROWS)
        check_norm_dtype(self.norm_dtype)
        if self.outliers is None or len(self.outliers) == 0:
            self._set("outliers", None)
            self._set("outlier_m", None)
            return
        idx = sorted({int(i) for i in self.outliers})
        if idx[0] < 0 or idx[-1] >= self.dim or len(idx) >= self.dim - 1:
            raise ValueError(f"outliers must be distinct channel indices in [0, {self.dim}) leaving at least "
                             f"2 inlier channels, got {list(self.outliers)}")
        self._set("outliers", tuple(idx))
        if self.outlier_m is None:
            self._derive("outlier_m", self.m)
        else:
            self._set("outlier_m", check_int_range(self.outlier_m, "outlier_m", 1, 1 << 16))


@dataclass(frozen=True)
class MinMaxConfig(QuantizerConfig):
    """``minmax``: axis ("token": groups of coordinates; "channel": groups of tokens), group_size (default d
    per token, 32 per channel; must divide d per token), side_dtype of lo and step (fp16 default)."""

    axis: str = "token"
    group_size: int | None = None
    side_dtype: torch.dtype = torch.float16
    method: ClassVar[str] = "minmax"

    def validate(self) -> None:
        if self.axis not in ("token", "channel"):
            raise ValueError(f"axis must be 'token' or 'channel', got {self.axis!r}")
        default = self.dim if self.axis == "token" else 32
        size = check_int_range(default if self.group_size is None else self.group_size, "group_size", 1, 1 << 20)
        if self.axis == "token" and self.dim % size:
            raise ValueError(f"group_size must divide dim={self.dim} for axis='token', got {size}")
        (self._derive if self.group_size is None else self._set)("group_size", size)
        check_norm_dtype(self.side_dtype, "side_dtype")


@dataclass(frozen=True)
class IntTokenConfig(MinMaxConfig):
    """``int_token``: min-max per token and head — axis "token" and one group of all d coordinates, both fixed
    (set here, not options: a code holds one lo and one step per vector); side_dtype of lo and step (fp16)."""

    axis: str = field(default="token", init=False)
    group_size: int | None = field(default=None, init=False)
    method: ClassVar[str] = "int_token"

    def validate(self) -> None:
        self._set("axis", "token")
        self._set("group_size", self.dim)
        check_norm_dtype(self.side_dtype, "side_dtype")


@dataclass(frozen=True)
class RotatedMinMaxConfig(QuantizerConfig):
    """``rotated_minmax``: rotation ("wht" or "haar"), then per-token min-max with side_dtype."""

    rotation: str = "wht"
    side_dtype: torch.dtype = torch.float16
    method: ClassVar[str] = "rotated_minmax"

    def validate(self) -> None:
        _check_rotation(self.rotation, self.dim)
        check_norm_dtype(self.side_dtype, "side_dtype")

    def minmax_stage(self) -> MinMaxConfig:
        return MinMaxConfig(bits=self.bits, dim=self.dim, seed=0, axis="token", side_dtype=self.side_dtype)


#: the transforms a :class:`NovaConfig` can calibrate (kvstats.quant.quantizers.nova)
NOVA_TRANSFORMS = ("attention", "klt", "rotation")


@dataclass(frozen=True)
class NovaConfig(QuantizerConfig):
    """``nova``: group_dim (default from bits and d; divides d, group_dim·bits ≤ 8), ridge ≥ 0, kmeans_iters,
    scale_dtype, side_dtype of the calibration data, amortize_tokens (the n its side bits are spread over),
    transform (:data:`NOVA_TRANSFORMS`: "attention", NOVA-KV's key transform; "klt", its value transform;
    "rotation", a data-oblivious randomized Hadamard rotation, the ablation's control)."""

    bits: int = 2
    dim: int = 128
    group_dim: int | None = None
    ridge: float = DEFAULT_RIDGE
    kmeans_iters: int = 20
    scale_dtype: torch.dtype = torch.float16
    side_dtype: torch.dtype = torch.float16
    amortize_tokens: int = DEFAULT_AMORTIZE_TOKENS
    transform: str = "attention"
    method: ClassVar[str] = "nova"

    def validate(self) -> None:
        g = default_group_dim(self.bits, self.dim) if self.group_dim is None else self.group_dim
        g = check_int_range(g, "group_dim", 1, self.dim)
        if self.dim % g or g * self.bits > 8:
            raise ValueError(f"group_dim must divide dim={self.dim} and satisfy group_dim*bits <= 8 "
                             f"(bits={self.bits}), got {g}")
        (self._derive if self.group_dim is None else self._set)("group_dim", g)
        ridge = self.ridge
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not (ridge >= 0 and math.isfinite(ridge)):
            raise ValueError(f"ridge must be a finite float >= 0, got {ridge!r}")
        self._set("ridge", float(ridge))
        check_int_range(self.kmeans_iters, "kmeans_iters", 1, 10_000)
        check_norm_dtype(self.scale_dtype, "scale_dtype")
        if self.side_dtype not in SIDE_DTYPES:
            raise ValueError(f"side_dtype must be one of {SIDE_DTYPES}, got {self.side_dtype}")
        check_int_range(self.amortize_tokens, "amortize_tokens", 1, 1 << 40)
        if self.transform not in NOVA_TRANSFORMS:
            raise ValueError(f"transform must be one of {NOVA_TRANSFORMS}, got {self.transform!r}")


#: what one NVFP4 global scale covers (NVFP4Config.granularity)
NVFP4_GRANULARITIES = ("head", "token")


@dataclass(frozen=True)
class NVFP4Config(QuantizerConfig):
    """``nvfp4``: bits is 4 (E2M1 codes; nothing else exists), dim a multiple of 16 (the NVFP4 block),
    granularity of the fp32 global scale (:data:`NVFP4_GRANULARITIES`: "head", one per leading index over all the
    tokens of one encode, x [..., n, d] -> [...]; "token", one per vector, -> [..., n])."""

    bits: int = 4
    dim: int = 128
    granularity: str = "head"
    method: ClassVar[str] = "nvfp4"
    min_bits: ClassVar[int] = 4
    max_bits: ClassVar[int] = 4

    def check_bits(self, bits):
        if check_int_range(bits, "bits", 1, 8) != 4:
            raise ValueError(f"bits must be 4 for nvfp4 (4-bit E2M1 codes; the e4m3 block scales and the fp32 "
                             f"global scale are counted on top), got {bits!r}")
        return 4

    def validate(self) -> None:
        if self.dim % 16:
            raise ValueError(f"dim must be a multiple of 16 for nvfp4 (blocks of 16 values along d, each with its "
                             f"e4m3 scale), got {self.dim}")
        _check_choice(self.granularity, "granularity", NVFP4_GRANULARITIES)


#: the scales of the FP8 formats (kvstats.quant.quantizers.fp8): none, from each encode call, from calibration
FP8_SCALES = ("unity", "dynamic", "calibrated")
#: what one FP8 scale covers: a sequence's whole tensor (all its KV heads), or one KV head
FP8_GRANULARITIES = ("tensor", "head")


@dataclass(frozen=True)
class FP8Config(QuantizerConfig):
    """``fp8_e4m3`` / ``fp8_e5m2``: bits is 8 (one OFP8 byte per element); scale (:data:`FP8_SCALES`), granularity
    (:data:`FP8_GRANULARITIES`; "head" needs a scale), heads H of x [..., H, n, d] (needed for "tensor" scales, whose
    bits are spread over H heads, and calibrated "head" scales, one per head; int in [1, 65536] or None)."""

    bits: int = 8
    dim: int = 128
    scale: str = "unity"
    granularity: str = "tensor"
    heads: int | None = None
    method: ClassVar[str] = ""
    min_bits: ClassVar[int] = 8
    max_bits: ClassVar[int] = 8

    def check_bits(self, bits):
        if check_int_range(bits, "bits", -(1 << 62), 1 << 62) != 8:  # an int (else a TypeError naming bits), then 8
            raise ValueError(f"bits must be 8 for an FP8 format (one byte per element; the scales are counted on "
                             f"top), got {bits!r}")
        return 8

    def validate(self) -> None:
        _check_choice(self.scale, "scale", FP8_SCALES)
        _check_choice(self.granularity, "granularity", FP8_GRANULARITIES)
        if self.heads is not None:
            self._set("heads", check_int_range(self.heads, "heads", 1, 1 << 16))
        if self.scale == "unity" and self.granularity == "head":
            raise ValueError("granularity must be 'tensor' with scale='unity' (there are no scales to keep per "
                             "head), got 'head'")
        per_call_head = self.scale == "dynamic" and self.granularity == "head"  # a scale per [n, d] slab of x
        if self.heads is None and self.scale != "unity" and not per_call_head:
            raise ValueError(f"heads must be given (the KV heads H of x [..., H, n, d]) for scale={self.scale!r} with "
                             f"granularity={self.granularity!r}: "
                             + ("one scale per head is kept" if self.granularity == "head" else
                                "a scale covers all H heads, and its bits are counted over them"))


@dataclass(frozen=True)
class FP8E4M3Config(FP8Config):
    """``fp8_e4m3``: OFP8 E4M3 (torch.float8_e4m3fn, largest 448)."""

    method: ClassVar[str] = "fp8_e4m3"


@dataclass(frozen=True)
class FP8E5M2Config(FP8Config):
    """``fp8_e5m2``: OFP8 E5M2 (torch.float8_e5m2, largest 57344)."""

    method: ClassVar[str] = "fp8_e5m2"


@dataclass(frozen=True)
class IdentityConfig(QuantizerConfig):
    """The lossless quantizer: dtype None (store as given) or a float dtype; bits is that dtype's width."""

    bits: int = field(default=32, init=False)
    dim: int = 128
    dtype: torch.dtype | None = None
    method: ClassVar[str] = "identity"
    min_bits: ClassVar[int] = 8
    max_bits: ClassVar[int] = 64

    def check_bits(self, bits):
        return bits

    def validate(self) -> None:
        if self.dtype is not None and self.dtype not in (torch.float16, torch.bfloat16, torch.float32,
                                                         torch.float64):
            raise ValueError(f"dtype must be None or a float dtype, got {self.dtype}")
        self._set("bits", torch.finfo(self.dtype or torch.float32).bits)


@dataclass(frozen=True)
class PerHeadConfig(QuantizerConfig):
    """:class:`~kvstats.quantizers.PerHeadQuantizer`: the configs of its heads (one per KV head, of one method,
    bits and dim); bits, dim and seed are head 0's."""

    heads: tuple = ()
    method: ClassVar[str] = "per_head"

    def check_bits(self, bits):
        return bits  # the heads' configs checked theirs

    def validate(self) -> None:
        if not self.heads or not all(isinstance(h, QuantizerConfig) for h in self.heads):
            raise TypeError(f"heads must be a non-empty tuple of QuantizerConfig, got {self.heads!r}")
        self._set("heads", tuple(self.heads))

