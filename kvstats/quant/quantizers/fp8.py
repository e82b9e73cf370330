"""FP8 KV caches: ``fp8_e4m3`` and ``fp8_e5m2``, the quantized caches of vLLM and SGLang (``kv_cache_dtype="fp8"``,
``"fp8_e4m3"``, ``"fp8_e5m2"``).

The formats are those of the OCP 8-bit Floating Point Specification (OFP8), revision 1.0 (2023), the ones torch
implements as ``torch.float8_e4m3fn`` and ``torch.float8_e5m2``. A code byte is sign s, exponent field e, mantissa
field m:

    ============  =====================================  ======================================
                  E4M3 (torch.float8_e4m3fn)             E5M2 (torch.float8_e5m2)
    ============  =====================================  ======================================
    bias          7                                      15
    normal        (−1)^s · 2^(e−7) · (1 + m/8), e ≥ 1     (−1)^s · 2^(e−15) · (1 + m/4), 1 ≤ e ≤ 30
    subnormal     (−1)^s · 2^−6 · m/8, e = 0              (−1)^s · 2^−14 · m/4, e = 0
    largest       S.1111.110 = ±448                      S.11110.11 = ±57344
    smallest      S.0000.001 = ±2^−9                     S.00000.01 = ±2^−16
    infinities    none                                   S.11111.00
    NaN           S.1111.111 (0x7F, 0xFF)                S.11111.{01, 10, 11}
    ============  =====================================  ======================================

Encode (x [..., d], a scale s > 0 fixed by ``scale``):

    y = x / s                     in fp32 (fp64 for fp64 x): x itself when s = 1 (``scale="unity"``)
    code = RNE(sat(y))            sat(y) = clamp(y, −max, max); RNE: the nearest value of the format, a tie to the
                                  one whose code is even (last mantissa bit 0)

Saturating, as vLLM's conversion (it clamps to ±max before the cast): a finite value beyond the largest becomes the
largest. (A plain ``.to(torch.float8_e5m2)`` overflows to ±inf; ``float8_e4m3fn`` has no inf, and what its plain
cast gives beyond ±448 depends on the torch version: ±448 on the CPU in torch 2.13.) fp32, fp16 and bf16 x
are rounded once, by torch's cast from fp32; fp64 x (references) is rounded to fp32 *to odd* first, so that its fp8
code is the correct rounding of the fp64 quotient, not a double rounding (Boldo & Melquiond, "Emulation of FMA and
correctly rounded sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008).

Decode: x̂ = fp8 value · s in fp32 (fp64 for fp64 x), cast to x's dtype (every fp8 value is exact in fp16, bf16 and
fp32: with ``scale="unity"`` x̂ is the fp8 value itself).

Scales (``scale``), fp32 like vLLM's ``k_scale`` / ``v_scale``, and what one covers (``granularity``):

* ``"unity"``: s = 1, nothing stored (vLLM without checkpoint scales; e5m2's usual setting);
* ``"dynamic"``: s = amax / max from the data of each encode call (fp32; fp64 for fp64 x), stored in the code:
  ``granularity="head"`` one per KV head and call (``scalars["scale"]`` of shape x.shape[:-2]), ``"tensor"`` one per
  sequence and call over all its KV heads (x [..., H, n, d] → x.shape[:-3]). Per sequence, not per batch: a scale
  shared by the batch would make one sequence's codes depend on another's tokens and break beam search
  (docs/quantizers.md, "What a quantizer owes the cache"). A cache that encodes one token per decode step pays one
  scale per token and step: the codes are not per vector (``codes_per_vector`` False);
* ``"calibrated"``: fixed scales from :meth:`FP8Quantizer.calibrate` (amax / max of calibration data) or
  :meth:`FP8Quantizer.load_scales` (a checkpoint's), held by the quantizer, not by the codes: one, or one per KV head.
  Values beyond max · s saturate. Encoding before either is refused.

Bits per coordinate (:meth:`FP8Quantizer.bits_per_coordinate`), n = ``n_tokens`` (default 1), d = dim, H = heads:
payload 8 (one byte per element, no padding); side 0 for unity, else one fp32 scale per H·n·d coordinates (tensor)
or per n·d (head): side = 32 / (n · d · H) or 32 / (n · d). For dynamic scales n is the tokens of one encode call
(what the code holds is 8 · nbytes exactly); for calibrated scales n is the cached tokens they are amortised over.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch

from kvstats._validation import check_float_tensor, check_int_range, finite_max_abs
from kvstats.quant import ops
from kvstats.quant.quantizers._common import DeviceCache
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import FP8Config, FP8E4M3Config, FP8E5M2Config
from kvstats.quant.quantizers.numerics import acc_dtype
from kvstats.quant.quantizers.plans import GroupedPlan, flat_keys

__all__ = ["FP8Format", "E4M3", "E5M2", "FP8Quantizer", "FP8E4M3", "FP8E5M2", "fp8_codes", "fp8_values"]

#: bits of one stored scale (fp32, as vLLM's k_scale / v_scale)
SCALE_BITS = 32


@dataclass(frozen=True)
class FP8Format:
    """One OFP8 format: its torch dtype, field widths, exponent bias and largest finite value."""

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def special_mask(self) -> int:
        """The bits that are all ones in exactly the NaN and inf codes (the sign aside): the whole exponent field
        where the top exponent is reserved (E5M2), the exponent and mantissa fields where it holds finite values
        and only S.1111.111 is NaN (E4M3)."""
        exponent = ((1 << self.exponent_bits) - 1) << self.mantissa_bits
        top_finite = self.max >= 2.0 ** ((1 << self.exponent_bits) - 1 - self.bias)
        return exponent | ((1 << self.mantissa_bits) - 1) if top_finite else exponent

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)


E4M3 = FP8Format("e4m3", torch.float8_e4m3fn, 4, 3, 7, 448.0)
E5M2 = FP8Format("e5m2", torch.float8_e5m2, 5, 2, 15, 57344.0)


def _fp32_round_to_odd(y: torch.Tensor) -> torch.Tensor:
    """fp64 y rounded to fp32 to odd: truncated toward zero, the last bit set when inexact. A round to nearest even
    of it to a format of at most 22 significand bits is the round to nearest even of y itself."""
    near = y.to(torch.float32)
    back = near.to(torch.float64)
    trunc = torch.where(back.abs() > y.abs(), torch.nextafter(near, torch.zeros_like(near)), near)
    bits = trunc.view(torch.int32)
    return torch.where(back != y, bits | 1, bits).view(torch.float32)


def fp8_codes(y: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """The saturating round-to-nearest-even fp8 codes (uint8, y's shape) of finite fp32 or fp64 y."""
    y = y.clamp(-fmt.max, fmt.max)
    if y.dtype == torch.float64:
        y = _fp32_round_to_odd(y)
    return y.to(fmt.dtype).view(torch.uint8)


def fp8_values(codes: torch.Tensor, fmt: FP8Format, dtype: torch.dtype) -> torch.Tensor:
    """The values of fp8 codes (uint8) in a float dtype (exact in fp16, bf16, fp32 and fp64)."""
    return codes.view(fmt.dtype).to(dtype)


@functools.lru_cache(maxsize=2)
def fp8_table(fmt: FP8Format) -> DeviceCache:
    """The value of every code byte 0..255 (fp64 [256]), the levels the Lloyd kernels look codes up in. The NaN and
    inf codes, which encode never writes (it saturates and refuses NaN), stand at 0: ``lloyd_weighted_sum`` sums
    the weights per level before multiplying by every level, so a NaN level would reach every output."""
    values = fp8_values(torch.arange(256, dtype=torch.uint8), fmt, torch.float64)
    return DeviceCache(torch.where(torch.isfinite(values), values, 0.0))


class FP8Quantizer(Quantizer):
    """An OFP8 format (module docstring) with unity, dynamic or calibrated fp32 scales, per tensor or per KV head.

    Args:
        bits: 8 (the only width). dim: d. seed: unused (deterministic).
        scale: ``"unity"`` (default), ``"dynamic"`` or ``"calibrated"`` (call :meth:`calibrate` or :meth:`load_scales`
            before encoding).
        granularity: ``"tensor"`` (default) or ``"head"``; ``"head"`` needs a scale.
        heads: H, the KV heads of x [..., H, n, d]; needed for ``"tensor"`` scales (their bits are spread over H
            heads) and calibrated ``"head"`` scales (one per head); when given, x must have that head axis.
    Inner products and weighted sums from the codes (no x̂ formed): x̂ⱼ = sⱼ · v[codeⱼ] with v the format's value of
    each code byte (:func:`fp8_table`) and sⱼ the scale key j was encoded with, so ⟨q, x̂ⱼ⟩ = sⱼ · Σ_d q_d v[code_jd]
    and Σⱼ wⱼ x̂ⱼ = Σⱼ (wⱼ sⱼ) v[codeⱼ]: the Lloyd kernels with 8-bit codes, the table as levels and sⱼ as the norm
    (``lloyd_scores`` / ``lloyd_weighted_sum``, and the fused decode step through :meth:`decode_parts`); equal to
    decode-then-dot up to fp32 summation order.
    """

    fmt: FP8Format = E4M3
    min_bits = max_bits = 8
    Config = FP8Config

    def _setup_from_config(self) -> None:
        #: True while encoding needs scales not yet given (``scale="calibrated"``; evaluate refuses it by name)
        self.needs_calibration = self._qconfig.scale == "calibrated"
        self._scales: torch.Tensor | None = None
        self._digest = "not calibrated"

    @property
    def codes_per_vector(self) -> bool:
        """Unity and calibrated scales: each vector's code is its own; dynamic: the scale is the call's."""
        return self._qconfig.scale != "dynamic"

    @property
    def calibrated(self) -> bool:
        """Whether the quantizer can encode: always, unless its calibrated scales are still to be given."""
        return self._scales is not None or not self.needs_calibration

    @property
    def scales(self) -> torch.Tensor | None:
        """The calibrated fp32 scales (a copy: [] per tensor, [heads] per head), or None."""
        return None if self._scales is None else self._scales.clone()

    # ---------------------------------------------------------------------------------- calibration
    def calibrate(self, keys: torch.Tensor) -> FP8Quantizer:
        """Fix the scales at amax / max of calibration data (the keys or values of the layer side): per tensor from
        all of ``keys`` [..., d]; per head from ``keys`` [..., heads, n, d], head by head. The arithmetic of a dynamic
        scale: fp32(amax) / max in fp32. Returns self."""
        self._need_scale_option("calibrate")
        check_float_tensor(keys, "keys")
        if keys.shape[-1] != self.dim:
            raise ValueError(f"keys.shape[-1] must equal the quantizer's dim {self.dim}, got {keys.shape[-1]}")
        big, limit = finite_max_abs(keys, "keys"), torch.finfo(torch.float32).max / 4
        if big > limit:
            raise ValueError(f"keys has max |keys| = {big:.4g}, beyond {limit:.4g} (fp32 max / 4): rescale the data")
        if self.granularity == "head":
            self._check_heads(keys, "keys")
            amax = keys.detach().movedim(-3, 0).reshape(self.heads, -1).abs().amax(-1)
        else:
            amax = keys.detach().abs().amax()
        if not bool((amax > 0).all()):
            where = "" if amax.dim() == 0 else f" (head {int((amax <= 0).nonzero()[0, 0])})"
            raise ValueError(f"keys are all zero{where}: no scale can be calibrated from them")
        return self._set_scales(amax.to(torch.float32).cpu() / self.fmt.max)

    def load_scales(self, scales) -> FP8Quantizer:
        """Set the calibrated scales as given (a checkpoint's ``k_scale`` / ``v_scale``): a number or a tensor of one
        value per tensor, ``heads`` values per head; each finite, > 0 and ≤ fp32 max / (4 · max). Returns self."""
        self._need_scale_option("load_scales")
        want = (self.heads,) if self.granularity == "head" else ()
        t = torch.as_tensor(scales, dtype=torch.float64).detach().cpu()
        if t.numel() == 1 and not want:
            t = t.reshape(())
        if tuple(t.shape) != want:
            raise ValueError(f"scales must have shape {list(want)} for granularity={self.granularity!r}, got "
                             f"{list(t.shape)}")
        top = torch.finfo(torch.float32).max / (4 * self.fmt.max)
        if not bool(((t > 0) & (t <= top)).all()):
            raise ValueError(f"scales must be finite, > 0 and <= {top:.4g}, got {t.tolist()}")
        return self._set_scales(t.to(torch.float32))

    def _need_scale_option(self, what: str) -> None:
        if not self.needs_calibration:
            raise ValueError(f"{what} sets the scales of scale='calibrated'; this {self!r} has scale="
                             f"{self.scale!r}")

    def _set_scales(self, scales: torch.Tensor) -> FP8Quantizer:
        self._scales = scales.contiguous()
        self._digest = hashlib.sha256(self._scales.numpy().tobytes()).hexdigest()[:16]
        return self

    def options(self) -> dict:
        """The config's options, and for calibrated scales a digest of their values (state, not configuration)."""
        options = self._qconfig.options()
        return {**options, "scales": self._digest} if self.needs_calibration else options

    # ----------------------------------------------------------------------------------------- codec
    def _check_heads(self, x: torch.Tensor, name: str) -> None:
        if self.heads is not None and (x.dim() < 3 or x.shape[-3] != self.heads):
            raise ValueError(f"{name} must be [..., {self.heads} (heads), n, {self.dim}] for {self!r}, got shape "
                             f"{tuple(x.shape)}")

    def _calibrated_scales(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The calibrated scales shaped to broadcast against x [..., H, n, d]."""
        if self._scales is None:
            raise ValueError(f"{self!r} has scale='calibrated' and no scales yet: call .calibrate(keys) (or "
                             ".load_scales(scales)) before encoding")
        s = self._scales.to(device=device, dtype=dtype)
        return s.reshape(-1, 1, 1) if self.granularity == "head" else s

    def _reduced_dims(self) -> tuple[int, ...]:
        return (-2, -1) if self.granularity == "head" else (-3, -2, -1)

    def _encode(self, x: torch.Tensor) -> Code:
        self._check_heads(x, "x")
        acc = acc_dtype(x.dtype)
        xa = x.to(acc)
        if self.scale == "unity":
            return Code(x.shape, x.dtype, payload={"codes": fp8_codes(xa, self.fmt)})
        if self.scale == "calibrated":
            y = xa / self._calibrated_scales(acc, x.device)
            return Code(x.shape, x.dtype, payload={"codes": fp8_codes(y, self.fmt)})
        dims = self._reduced_dims()  # "tensor" needs heads, so x is [..., H, n, d] (_check_heads)
        scale = xa.abs().amax(dim=dims) / self.fmt.max
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = fp8_codes(xa / safe.reshape(*safe.shape, *(1,) * len(dims)), self.fmt)
        return Code(x.shape, x.dtype, payload={"codes": codes}, scalars={"scale": scale.contiguous()})

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        values = fp8_values(code.payload["codes"], self.fmt, acc)
        if self.scale == "unity":
            return values
        if self.scale == "calibrated":
            return values * self._calibrated_scales(acc, values.device)
        scale = code.scalars["scale"].to(acc)
        return values * scale.reshape(*scale.shape, *(1,) * len(self._reduced_dims()))

    # ------------------------------------------------------------------------------- from the codes
    def _key_scales(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """sⱼ, the scale each vector of the code was encoded with, [*code.shape[:-1]] in ``acc``."""
        device = code.payload["codes"].device
        if self.scale == "unity":
            s = torch.ones((), dtype=acc, device=device)
        elif self.scale == "calibrated":
            s = self._calibrated_scales(acc, device)
            s = s.squeeze(-1) if s.dim() else s  # [H, 1, 1] -> [H, 1] (per head), [] (per tensor)
        else:
            s = code.scalars["scale"].to(acc)
            s = s.reshape(*s.shape, *(1,) * (len(self._reduced_dims()) - 1))
        return s.expand(code.shape[:-1]).contiguous()

    def _levels(self, device: torch.device, acc: torch.dtype) -> torch.Tensor:
        return fp8_table(self.fmt).on(device, acc)

    def _scores_kernel(self, q3: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return ops.lloyd_scores(q3, codes, scales, self._levels(q3.device, q3.dtype), 8)

    def _weighted_kernel(self, w3: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return ops.lloyd_weighted_sum(w3, codes, scales, self._levels(w3.device, w3.dtype), 8, self.dim)

    def _from_codes(self, code: Code) -> bool:
        """Whether the kernels reproduce decode-then-dot on what :meth:`decode` returns: with unity scales (x̂ is
        the fp8 value, exact in every float dtype) or codes of fp32/fp64 x (sⱼ·v[c] in that dtype); decode rounds
        sⱼ·v[c] to an fp16 or bf16 x's dtype, which those inputs keep (decode-then-dot)."""
        return self.scale == "unity" or code.dtype in (torch.float32, torch.float64)

    def _finite_codes(self, code: Code) -> torch.Tensor:
        """The code bytes, refused by name when one is a NaN or inf code, which encode never writes: the kernels
        read those at level 0 (:func:`fp8_table`), where decode-then-dot would have given a non-finite score."""
        codes, mask = code.payload["codes"], self.fmt.special_mask
        if bool(((codes & mask) == mask).any()):  # integer ops on the bytes: no float8 cast (the slow part)
            raise ValueError(f"{self!r}: the code holds NaN or inf {self.fmt.name} bytes, which encode never writes "
                             "(a corrupted or foreign code)")
        return codes

    def _plan(self, kernel, code: Code, acc: torch.dtype) -> GroupedPlan:
        return GroupedPlan(kernel, self._finite_codes(code), self._key_scales(code, acc), key_dims=(1, 0))

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        if not self._from_codes(code):
            return super()._inner(query, code)
        acc = acc_dtype(query.dtype)
        return self._plan(self._scores_kernel, code, acc).broadcast(query if query.dtype == acc else query.to(acc))

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        # weights already in the accumulation dtype (weighted_sum)
        if not self._from_codes(code):
            return super()._weighted_sum(weights, code)
        return self._plan(self._weighted_kernel, code, weights.dtype).broadcast(weights)

    def inner_plan(self, code: Code):
        if not (self._plan_reproduces("_inner", FP8Quantizer) and self._from_codes(code)):
            return super().inner_plan(code)
        return self._plan(self._scores_kernel, code, acc_dtype(code.dtype))

    def weighted_sum_plan(self, code: Code):
        if not (self._plan_reproduces("_weighted_sum", FP8Quantizer) and self._from_codes(code)):
            return super().weighted_sum_plan(code)
        return self._plan(self._weighted_kernel, code, acc_dtype(code.dtype))

    def decode_parts(self, code: Code, dtype: torch.dtype):
        """A Lloyd part without rotation: the code bytes as 8-bit codes, the format's values as levels, sⱼ as the
        norm (None where a subclass changed what the parts stand for)."""
        if not (self._methods_of(FP8Quantizer, "inner_plan", "weighted_sum_plan", "_inner", "_weighted_sum",
                                 "_key_scales", "_levels") and self._from_codes(code)):
            return None
        codes = self._finite_codes(code)
        return ops.CodeParts(packed=flat_keys(codes, 1), norm=flat_keys(self._key_scales(code, dtype), 0),
                             levels=self._levels(codes.device, dtype), bits=8)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        """payload 8; side 0 (unity), else one fp32 scale per n·d·H coordinates (tensor) or n·d (head), n = n_tokens
        (default 1: the most a scale can cost, a dynamic scale of a one-token decode step)."""
        n = 1 if n_tokens is None else check_int_range(n_tokens, "n_tokens", 1, 1 << 40)
        if self.scale == "unity":
            return BitBudget(payload=8.0)
        covered = n * self.dim * (self.heads if self.granularity == "tensor" else 1)
        return BitBudget(payload=8.0, side=SCALE_BITS / covered)

    def __repr__(self) -> str:
        extra = f", calibrated={self.calibrated}" if self.needs_calibration else ""
        return (f"{type(self).__name__}(dim={self.dim}, scale={self.scale!r}, granularity={self.granularity!r}, "
                f"heads={self.heads}{extra})")


class FP8E4M3(FP8Quantizer):
    """``fp8_e4m3``: OFP8 E4M3 (torch.float8_e4m3fn): 3 mantissa bits, largest 448, smallest 2^−9, no inf."""

    name = "fp8_e4m3"
    fmt = E4M3
    Config = FP8E4M3Config


class FP8E5M2(FP8Quantizer):
    """``fp8_e5m2``: OFP8 E5M2 (torch.float8_e5m2): 2 mantissa bits, largest 57344, smallest 2^−16."""

    name = "fp8_e5m2"
    fmt = E5M2
    Config = FP8E5M2Config
