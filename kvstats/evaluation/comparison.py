"""The paired comparison of two quantizers over units: which metrics form the family, whether the family can
conclude at all, and the tests (Wilcoxon signed-rank, Holm-corrected, a detectable effect beside every
non-significant row).

    plan = plan_comparison(units=16, family_size=7, alpha=0.05)   # before running: can it conclude?
    result = compare_units(rows, alpha=0.05)                      # after: family, tests, exclusions

**The family** holds the distinct, non-constant metrics only: ``bits_total`` is a property of the design
(reported beside the table and flagged when the sides differ, never tested); a metric equal on both sides in
every unit has nothing to test; a metric that repeats an earlier member of the family in every unit and on
both sides (``6d_attention_kl`` is ``attention_kl`` whenever the K estimator is linear in the code, i.e.
decode-then-dot gives the estimator's logits) would only enlarge the Holm correction.

**The floor.** With n units the Wilcoxon test cannot give a p below ``p_min(n)`` (2/2ⁿ two-sided, exact), so
a family of m tests cannot conclude at level α unless ``m·p_min(n) < α`` (Holm's smallest adjusted p is m
times the smallest p). :func:`plan_comparison` says so before any work, with the units it would need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstats.evaluation.units import METRICS

__all__ = ["COMPARED_METRICS", "ComparisonPlan", "compare_units", "per_document", "plan_comparison", "units_needed"]

#: The metrics a comparison may test, in table order (``bits_total`` is reported, never tested).
COMPARED_METRICS = tuple(m for m in METRICS if m != "bits_total")
#: Two metrics are the same measurement when they agree to this relative tolerance in every unit, on both sides.
#: attention_kl (fp32 estimator logits) and 6d_attention_kl (fp64 logits of the decoded keys) of a linear K
#: estimator differ by fp32 rounding alone: up to 1.7e-6 relative measured (kqv, qkqv at n = 4, d = 128); a
#: non-linear estimator moves the KL by the order of its quantization error (1e-2 relative and more).
REDUNDANT_RTOL = 1e-4


@dataclass(frozen=True)
class ComparisonPlan:
    """Whether a paired comparison of ``family_size`` metrics over ``units`` units can reach ``alpha``.

    smallest_pvalue: the smallest Holm-adjusted p any outcome can give (``family_size · p_min(units)``, at most 1);
    units_needed: the fewest units with ``family_size · p_min(n) < alpha``.
    """

    units: int
    family_size: int
    alpha: float
    smallest_pvalue: float
    units_needed: int

    @property
    def can_conclude(self) -> bool:
        return self.smallest_pvalue < self.alpha

    def message(self) -> str:
        """One sentence for the user (empty when the comparison can conclude)."""
        if self.can_conclude:
            return ""
        return (f"with {self.units} units and {self.family_size} metrics tested, the smallest Holm-corrected "
                f"Wilcoxon p is {self.smallest_pvalue:.3g} >= alpha = {self.alpha:g}: this comparison cannot "
                f"conclude whatever the data; it needs at least {self.units_needed} units")

    def to_dict(self) -> dict[str, Any]:
        return {"units": self.units, "family_size": self.family_size, "alpha": self.alpha,
                "smallest_pvalue": self.smallest_pvalue, "can_conclude": self.can_conclude,
                "units_needed": self.units_needed}


def units_needed(family_size: int, alpha: float) -> int:
    """The fewest units n with ``family_size · p_min(n) < alpha`` (:func:`kvstats.stats.wilcoxon_min_pvalue`)."""
    from kvstats.measure.stats import wilcoxon_min_pvalue

    n = 2
    while family_size * wilcoxon_min_pvalue(n) >= alpha:
        n += 1
    return n


def plan_comparison(units: int, family_size: int, alpha: float) -> ComparisonPlan:
    """The :class:`ComparisonPlan` of ``family_size`` paired Wilcoxon tests over ``units`` units at level ``alpha``."""
    from kvstats.measure.stats import wilcoxon_min_pvalue

    smallest = min(1.0, family_size * wilcoxon_min_pvalue(units))
    return ComparisonPlan(units, family_size, float(alpha), smallest, units_needed(family_size, alpha))


def candidate_family(linear: bool) -> tuple[str, ...]:
    """The metrics a comparison will test at most, known before running: every compared metric, less
    ``6d_attention_kl`` when both sides' K estimators are linear (it then repeats ``attention_kl``)."""
    return tuple(m for m in COMPARED_METRICS if not (linear and m == "6d_attention_kl"))


def _family(rows: list[dict], metrics) -> tuple[list[str], dict[str, str]]:
    family, excluded = [], {"bits_total": "a property of the design, reported beside the table, never tested"}
    columns = {m: (np.array([r[m] for r in rows]), np.array([r[f"other:{m}"] for r in rows])) for m in metrics}
    for m in metrics:
        a, b = columns[m]
        if np.array_equal(a, b):
            excluded[m] = "equal on both sides in every unit: nothing to test"
            continue
        twin = next((f for f in family if all(np.allclose(x, y, rtol=REDUNDANT_RTOL, atol=0.0)
                                              for x, y in zip(columns[m], columns[f]))), None)
        if twin is not None:
            excluded[m] = f"repeats {twin} in every unit on both sides (a linear K estimator): tested once"
            continue
        family.append(m)
    return family, excluded


def compare_units(rows: list[dict], *, alpha: float = 0.05, power: float = 0.8, confidence_level: float = 0.95,
                  n_resamples: int = 9999, seed: int = 0, metrics=COMPARED_METRICS) -> dict[str, Any]:
    """Paired Wilcoxon signed-rank test of each family metric over the units (``row[m]`` against
    ``row["other:" + m]``), Holm-corrected over the family (statsmodels' ``multipletests``); the family is drawn
    from ``metrics`` (default :data:`COMPARED_METRICS`).

    Returns ``{"family": [...], "excluded": {metric: reason}, "plan": ComparisonPlan, "tests": {metric:
    {"test": WilcoxonResult, "pvalue_holm": p, "significant": p < alpha, "detectable_shift": PowerResult or
    None}}}``; a non-significant row carries the shift (in the metric's units) that the test would detect with
    probability ``power`` at level ``alpha / len(family)`` (:func:`kvstats.stats.detectable_shift`; α/m is the
    level of Holm's first step, so the shift is the conservative one).
    """
    from statsmodels.stats.multitest import multipletests

    from kvstats.measure import stats

    family, excluded = _family(rows, metrics)
    plan = plan_comparison(len(rows), max(1, len(family)), alpha)
    tests: dict[str, dict[str, Any]] = {}
    if family:
        raw = {m: stats.wilcoxon([r[m] for r in rows], [r[f"other:{m}"] for r in rows],
                                 confidence_level=confidence_level, n_resamples=n_resamples, seed=seed)
               for m in family}
        holm = multipletests([t.pvalue for t in raw.values()], method="holm")[1]
        for (m, t), p in zip(raw.items(), holm):
            significant = bool(p < alpha)
            shift = None
            if not significant:
                diffs = np.array([r[m] - r[f"other:{m}"] for r in rows])
                shift = stats.detectable_shift(diffs, alpha=alpha / len(family), power=power)
            tests[m] = {"test": t, "pvalue_holm": float(p), "significant": significant, "detectable_shift": shift}
    return {"family": family, "excluded": excluded, "plan": plan, "tests": tests}


def per_document(rows: list[dict], names) -> list[dict]:
    """The rows of units that share a document merged into one row per document: ``document`` and the mean of each
    of ``names`` (and of ``"other:" + name`` where the rows hold it) over its units. Documents, not their windows or
    segments, are then the independent units a CI and a paired test see."""
    docs: dict = {}
    for r in rows:
        docs.setdefault(r["document"], []).append(r)
    out = []
    for doc, members in docs.items():
        row = {"document": doc, "windows": len(members)}
        for name in names:
            for key in (name, f"other:{name}"):
                if key in members[0]:
                    row[key] = float(np.mean([m[key] for m in members]))
        out.append(row)
    return out


def shift_text(shift) -> str:
    """A detectable shift for the table: the number, or "none" when no shift can be detected."""
    if shift is None:
        return ""
    value = shift.extra["shift"]
    return "none" if not math.isfinite(value) else f"{value:.3g}"
