"""The arithmetic of a quantizer and the range of inputs it admits: the accumulation dtype (:func:`acc_dtype`), the
largest input a decode can sum without overflow (:func:`decode_headroom`), the saturating cast of a reconstruction
to its dtype (:func:`saturating_cast`), and the checks :class:`~kvstats.quant.quantizers.base.Quantizer` runs on its
inputs, stored scalars and scores against those ranges (:class:`RangeChecks`, a mixin of the quantizer)."""

from __future__ import annotations

import math

import torch

from kvstats._validation import all_finite, check_float_tensor, finite_max_abs

__all__ = ["ACC_DTYPES", "InnerOverflowError", "RangeChecks", "acc_dtype", "decode_headroom", "saturating_cast"]

#: Inputs of any float dtype are computed in fp32, except fp64 inputs (references and oracles).
ACC_DTYPES = {torch.float64: torch.float64}


class InnerOverflowError(ValueError):
    """Scores of finite inputs beyond the range of their dtype (:meth:`Quantizer.inner`)."""


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return ACC_DTYPES.get(dtype, torch.float32)


def decode_headroom(dtype: torch.dtype, dim: int) -> float:
    """The largest max |x| of a vector of dim d that ``encode`` accepts in this dtype: finfo(acc).max / (4·d).

    A decode accumulates in acc (fp32, fp64 for fp64 x), and its largest intermediate is at most
    √d · ‖x̂‖ ≤ 1.5·d · max |x| (an unnormalised Walsh–Hadamard butterfly sums d terms of ‖x̂‖ ≤ 1.5‖x‖,
    ‖x‖ ≤ √d · max |x|), so below this bound nothing overflows. Only fp32/bf16/fp64 inputs can reach it
    (fp16's largest value, 65,504, is far below it for any d).
    """
    return torch.finfo(acc_dtype(dtype)).max / (4 * dim)


def saturating_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x cast to dtype with values beyond its largest finite value clamped to ±finfo(dtype).max (never inf).

    For a reconstruction x̂ of a finite x in dtype this is the projection onto the box [−max, max]^d, which
    contains x, so it never moves a coordinate of x̂ away from x: |clamp(x̂ⱼ) − xⱼ| ≤ |x̂ⱼ − xⱼ|. Only finite
    values are clamped: x holding NaN or ±inf (arithmetic that overflowed x's own dtype, a fault of whatever
    computed it) raises ValueError. One aminmax pass; the clamp (a copy: x may be a stored payload) only when a
    value lies beyond the range.
    """
    if x.dtype == dtype or not x.is_floating_point() or torch.finfo(x.dtype).max <= torch.finfo(dtype).max:
        return x.to(dtype)
    if x.numel():
        lo, hi = (float(v) for v in torch.aminmax(x))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"a reconstruction in {x.dtype} holds {lo if not math.isfinite(lo) else hi}: its "
                             "arithmetic overflowed before the cast to " + str(dtype))
        big = torch.finfo(dtype).max
        if hi > big or lo < -big:
            x = x.clamp(-big, big)
    return x.to(dtype)



class RangeChecks:
    """The range checks of a quantizer (a mixin of :class:`~kvstats.quant.quantizers.base.Quantizer`, whose ``dim``,
    ``storage_options``, ``_inner`` and repr they use): x of the right shape and finite, below the headroom of its
    decode (:meth:`input_limit`), storable in a storage dtype; stored scalars that did not overflow theirs; and
    scores whose products overflow fp32 computed rescaled (:meth:`_inner_rescaled`)."""

    dim: int
    storage_options: dict[str, str]

    def _check_stored(self, code, x: torch.Tensor) -> None:
        """Refuse a code (a :class:`~kvstats.quant.quantizers.base.Code` of x) whose stored scalars overflowed their
        storage dtype (never return inf silently)."""
        for key, t in code.named_scalars():
            if t.numel() and t.is_floating_point() and not all_finite(t):
                big = float(x.detach().abs().amax())
                nan = torch.isnan(t)
                if bool(nan.any()):  # not an overflow: an undefined operation (0/0, inf − inf) in the encode
                    row = tuple(int(i) for i in nan.nonzero()[0])
                    if t.shape == x.shape[:-1]:  # one scalar per vector: say which vector
                        at = f"x[{', '.join(map(str, row))}] (‖x‖ = {float(x.detach()[row].double().norm()):.4g})"
                    else:
                        at = f"x (its entry [{', '.join(map(str, row))}] of shape {list(t.shape)})"
                    raise ValueError(
                        f"{self!r} stored NaN as {key} of {at}, max |x| = {big:.4g}: its encode computed an undefined "
                        "value there (0/0 on a zero or constant vector, inf − inf) — a fault of the quantizer for this "
                        "input, not an overflow")
                option = self.storage_options.get(key.rsplit(".", 1)[-1], "its storage dtype")
                fix = "rescale x" if t.dtype in (torch.float32, torch.float64) else \
                    f"pass {option}=torch.float32 or rescale x"
                raise ValueError(
                    f"x (max |x| = {big:.4g}) is too large for {self!r}: its stored {key} overflows {t.dtype} "
                    f"(largest finite {torch.finfo(t.dtype).max:.6g}); {fix}")

    def _check_storable(self, x: torch.Tensor, dtype: torch.dtype, name: str, arg: str) -> None:
        """Refuse x whose values the storage dtype cannot hold (|x| above its largest finite value)."""
        if x.numel() and x.is_floating_point() and torch.finfo(x.dtype).max > torch.finfo(dtype).max:
            big = float(x.detach().abs().amax())
            if big > torch.finfo(dtype).max:
                raise ValueError(f"{name} has max |{name}| = {big:.4g}, which {arg}={dtype} cannot hold (largest "
                                 f"finite {torch.finfo(dtype).max:.6g})")

    def _check_headroom(self, x: torch.Tensor) -> None:
        """Refuse non-finite x, and x too large for its decode's accumulation dtype (one aminmax pass)."""
        big = finite_max_abs(x, "x")
        limit = self.input_limit(x.dtype)
        if big > limit:
            acc = acc_dtype(x.dtype)
            wider = " or encode it as float64" if acc != torch.float64 else ""
            raise ValueError(f"x (max |x| = {big:.4g}) is too large for {self!r}: its decode accumulates in {acc}, "
                             f"whose sums could overflow above max |x| = {limit:.4g}; rescale x{wider}")

    def input_limit(self, dtype: torch.dtype) -> float:
        """The largest max |x| the range check of encode admits in dtype (:func:`decode_headroom`; larger for a decode
        without sums). A stored scalar can still overflow below it (NOVA's calibrated scales): refused by name."""
        return decode_headroom(dtype, self.dim)

    def _check_vectors(self, x: torch.Tensor, name: str, check_finite: bool = True) -> None:
        check_float_tensor(x, name, check_finite=check_finite)
        if x.shape[-1] != self.dim:
            raise ValueError(f"{name}.shape[-1] must equal the quantizer's dim {self.dim}, got {x.shape[-1]}")

    def _inner_rescaled(self, query: torch.Tensor, code) -> torch.Tensor:
        """``2^e · _inner(2^-e · query)`` in float64 with ``2^e ≥ max |query|`` (see ``Quantizer.inner``), cast to the
        scores' dtype; refused naming the magnitude when the scores lie beyond that dtype's range."""
        big = float(query.detach().abs().amax())
        e = math.frexp(big)[1]  # big = m · 2^e with 1/2 ≤ m < 1
        small = self._inner((query.double() * 2.0**-e).to(query.dtype), code)
        dtype = small.dtype
        wide = small.double() * 2.0 ** (e // 2) * 2.0 ** (e - e // 2)  # two factors: 2^1024 is beyond a float
        peak = float(wide.abs().max()) if wide.numel() else 0.0
        if not math.isfinite(peak) or peak > torch.finfo(dtype).max:
            wider = "pass the query as float64 or rescale it" if dtype != torch.float64 else "rescale the query"
            raise InnerOverflowError(f"inner(query, code) of {self!r} reaches |⟨query, x⟩| = {peak:.4g}, beyond "
                             f"{str(dtype)[6:]}'s largest finite value {torch.finfo(dtype).max:.4g} (max |query| = "
                             f"{big:.4g}): {wider}")
        return wide.to(dtype)
