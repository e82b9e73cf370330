"""A quantizer seen through a guard that finds any change a call makes to its inputs (the conformance kit's
``input`` check, :mod:`kvstats.quant.conformance`).

    guarded = InputGuard(quantizer, on_change=lambda message: ...)
    guarded.encode(x)       # x is copied before the call and compared with the copy, bit for bit, after it

Every tensor argument of ``encode``, ``decode``, ``inner``, ``weighted_sum``, of ``inner_plan`` /
``weighted_sum_plan`` and of the plans they return is copied before the call — a :class:`Code` as each of its
tensors — and compared after it: its dtype, shape and bytes (NaN and −0 included). An in-place change that is
idempotent (``x.clamp_``, ``x.abs_()``) leaves nothing to see on a later call with the same tensor; seen at the
first call, it cannot escape. Any other attribute is the quantizer's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from kvstats.quant.quantizers.base import Code

__all__ = ["InputGuard"]

#: The guarded methods and the names of their positional arguments.
ARGUMENTS = {"encode": ("x",), "decode": ("code",), "inner": ("query", "code"), "weighted_sum": ("weights", "code"),
             "inner_plan": ("code",), "weighted_sum_plan": ("code",)}
#: What the plan returned by each ``*_plan`` method takes.
PLAN_ARGUMENT = {"inner_plan": "query", "weighted_sum_plan": "weights"}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _describe(before: torch.Tensor, after) -> str | None:
    """How ``after`` differs from the copy ``before``; None when it is the same tensor, bit for bit."""
    if not isinstance(after, torch.Tensor):
        return f"now a {type(after).__name__}"
    if after.dtype != before.dtype:
        return f"dtype {before.dtype} -> {after.dtype}"
    if after.shape != before.shape:
        return f"shape {tuple(before.shape)} -> {tuple(after.shape)}"
    now, then = _bits(after), _bits(before)
    if torch.equal(now, then):
        return None
    size = before.element_size()
    return f"{int((now.view(-1, size) != then.view(-1, size)).any(-1).sum())} of its {before.numel()} values"


def _snapshot(value):
    """A copy of a tensor, or of every tensor of a Code by name; None for anything else (not an input to guard)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Code):
        return {key: t.detach().clone() for key, t in value.named_tensors() if isinstance(t, torch.Tensor)}
    return None


def _change(value, before) -> str | None:
    if isinstance(before, torch.Tensor):
        return _describe(before, value)
    now = {key: t for key, t in value.named_tensors() if isinstance(t, torch.Tensor)}
    if set(now) != set(before):
        return f"tensors {sorted(before)} -> {sorted(now)}"
    for key, copy in before.items():
        what = _describe(copy, now[key])
        if what is not None:
            return f"tensor {key!r}: {what}"
    return None


class InputGuard:
    """``quantizer`` with every input of every call compared, after the call, with a copy taken before it;
    ``on_change(message)`` is called (it raises) for the first input changed."""

    def __init__(self, quantizer, on_change: Callable[[str], None]):
        self._quantizer, self._on_change = quantizer, on_change

    def __getattr__(self, name: str):
        value = getattr(self._quantizer, name)
        if name in ARGUMENTS and callable(value):
            return functools.partial(self._call, f"{name}()", ARGUMENTS[name], value, PLAN_ARGUMENT.get(name))
        return value

    def __repr__(self) -> str:
        return repr(self._quantizer)

    def _call(self, what: str, names: tuple[str, ...], method, plan_argument: str | None, *args, **kwargs):
        named = [*zip(names, args), *kwargs.items()]
        copies = [(name, value, _snapshot(value)) for name, value in named]
        try:
            result = method(*args, **kwargs)
        finally:
            for name, value, before in copies:
                change = None if before is None else _change(value, before)
                if change is not None:
                    self._on_change(f"{what} changed its {name} in place ({change}): a quantizer must leave every "
                                    "input as it was (the cache and evaluate measure against it)")
        if plan_argument is not None and callable(result):
            return functools.partial(self._call, f"the plan of {what[:-2]}(code)", (plan_argument,), result, None)
        return result
