"""Result objects of kvstats' statistical functions, in the manner of scipy's and statsmodels'.

Every test or estimate returns a frozen dataclass derived from :class:`TestResult`: it carries the
statistic, the p-value, an effect size where one applies, a confidence interval, the method, the null
hypothesis in words and the sample size, and prints a readable ``summary()``. ``to_dict()`` gives a
flat dict ready for a pandas row or JSON. Like scipy's results, a result unpacks into its statistic and
p-value: ``stat, p = kvstats.stats.wilcoxon(a, b)``. Confidence intervals are :class:`ConfidenceInterval`
objects, as in scipy: ``ci.low`` and ``ci.high``, and they unpack as a pair (``lo, hi = result.confidence_interval``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["ConfidenceInterval", "TestResult"]


class ConfidenceInterval(NamedTuple):
    """A confidence interval: ``.low`` and ``.high`` (scipy's ``ConfidenceInterval`` fields); a tuple, so it
    unpacks as ``lo, hi = ci``, indexes as ``ci[0]`` and is written to JSON as ``[low, high]``."""

    low: float
    high: float


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}" if 1e-3 <= abs(value) < 1e5 or value == 0 else f"{value:.3e}"
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, float) for v in value):
        return f"[{_fmt(value[0])}, {_fmt(value[1])}]"
    return str(value)


@dataclass(frozen=True)
class TestResult:
    """A hypothesis test or estimate: the fields every kvstats result has.

    Attributes:
        statistic: the test statistic (its meaning is given by ``method``).
        pvalue: p-value under ``null_hypothesis`` (nan when the result is an estimate only).
        method: name of the test / estimator, e.g. "Mann-Whitney U (exact)".
        null_hypothesis: the null in words.
        n: sample size(s), an int or a tuple for two-sample tests.
        effect_size: the headline effect size (nan when none applies); ``effect_size_name`` says which.
        confidence_interval: :class:`ConfidenceInterval` (low, high) for the quantity named by ``ci_of`` at
            ``confidence_level`` (a plain pair given to the constructor is converted).
        extra: further named values (e.g. medians, alternative effect sizes).
    """

    __test__ = False  # not a pytest test class despite the name

    statistic: float
    pvalue: float
    method: str
    null_hypothesis: str
    n: int | tuple[int, ...]
    effect_size: float = float("nan")
    effect_size_name: str = ""
    confidence_interval: ConfidenceInterval = ConfidenceInterval(float("nan"), float("nan"))
    ci_of: str = ""
    confidence_level: float = 0.95
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ci = self.confidence_interval
        if not isinstance(ci, ConfidenceInterval):
            low, high = ci
            object.__setattr__(self, "confidence_interval", ConfidenceInterval(float(low), float(high)))

    def __iter__(self) -> Iterator[float]:
        """``stat, p = result``, as with scipy's result objects."""
        return iter((self.statistic, self.pvalue))

    def __len__(self) -> int:
        return 2

    def to_dict(self) -> dict[str, Any]:
        """Flat dict: the fields, the CI as ci_low/ci_high, and ``extra`` merged in."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra",)}
        low, high = out.pop("confidence_interval")
        out["ci_low"], out["ci_high"] = low, high
        out.update(self.extra)
        return out

    def summary(self) -> str:
        """A short text table, like statsmodels' summary()."""
        rows = [
            ("method", self.method),
            ("H0", self.null_hypothesis),
            ("n", self.n),
            ("statistic", self.statistic),
            ("p-value", self.pvalue),
        ]
        if self.effect_size_name:
            rows.append((f"effect size ({self.effect_size_name})", self.effect_size))
        if self.ci_of:
            rows.append((f"{self.confidence_level:.0%} CI of {self.ci_of}", self.confidence_interval))
        rows += list(self.extra.items())
        width = max(len(k) for k, _ in rows)
        title = type(self).__name__
        line = "=" * max(len(title), width + 30)
        body = "\n".join(f"{k:<{width}}  {_fmt(v)}" for k, v in rows)
        return f"{title}\n{line}\n{body}\n{line}"

    def summary_with(self, names, **computed: Any) -> str:
        """summary() with the subclass's own fields ``names`` (then ``computed`` values, then ``extra``) listed."""
        extra = {name: getattr(self, name) for name in names} | computed | self.extra
        return TestResult.summary(dataclasses.replace(self, extra=extra))

    def __str__(self) -> str:
        return self.summary()
