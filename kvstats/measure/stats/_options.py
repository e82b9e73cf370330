"""How a measurement's intervals and tests are computed, as one frozen object (scipy's and torchao's habit of a
validated configuration), instead of four keyword arguments travelling through every function."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvstats._validation import check_int_range
from kvstats.measure.stats._common import _check_level, check_resamples

__all__ = ["InferenceOptions"]


@dataclass(frozen=True)
class InferenceOptions:
    """The inference settings of an evaluation, a sensitivity sweep or a study, validated once where made.

        opts = InferenceOptions(confidence_level=0.9, n_resamples=1999)
        kvstats.evaluate("kqv", bits=4, data="gaussian", inference=opts)

    Attributes:
        confidence_level: of every confidence interval, in (0, 1).
        alpha: level of every test, of a family after its correction (Holm), in (0, 1).
        n_resamples: of every bootstrap; None takes each interval's own default (:meth:`resamples`); at least
            ⌈2/(1 − confidence_level)⌉ (each tail needs a resample beyond its bound).
        seed: of every bootstrap; None takes the measurement's own seed (:meth:`bootstrap_seed`).
    """

    confidence_level: float = 0.95
    alpha: float = 0.05
    n_resamples: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("confidence_level", "alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"InferenceOptions.{name} must be a number in (0, 1), got {value!r}")
        level = _check_level(self.confidence_level)
        if not 0.0 < float(self.alpha) < 1.0:
            raise ValueError(f"InferenceOptions.alpha must be in (0, 1), got {self.alpha!r}")
        object.__setattr__(self, "confidence_level", level)
        object.__setattr__(self, "alpha", float(self.alpha))
        if self.n_resamples is not None:
            object.__setattr__(self, "n_resamples", check_resamples(self.n_resamples, level))
        if self.seed is not None:
            object.__setattr__(self, "seed", check_int_range(self.seed, "InferenceOptions.seed", 0, 2**63 - 1))

    def resamples(self, default: int) -> int:
        """``n_resamples``, or the interval's own ``default`` when it is None."""
        return default if self.n_resamples is None else self.n_resamples

    def bootstrap_seed(self, seed: int) -> int:
        """``seed`` of these options, or the measurement's ``seed`` when it is None."""
        return seed if self.seed is None else self.seed

    def replace(self, **changes) -> InferenceOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def inference_options(inference) -> InferenceOptions:
    """``inference`` as :class:`InferenceOptions` (None: the defaults); anything else is refused by name."""
    if inference is None:
        return InferenceOptions()
    if not isinstance(inference, InferenceOptions):
        raise TypeError(f"inference must be a kvstats.stats.InferenceOptions (or None: the defaults), got "
                        f"{type(inference).__name__} {inference!r}")
    return inference
