"""A claim's sample size planned by power, from its test and the data it ran on (issue 50, docs/statistics.md).

Each builder returns a :class:`kvstats.study.claims.SampleSize`: the n at which the claim's test reaches the target
power (0.8, :data:`kvstats.measure.verdicts.PLAN_POWER`) for the claim's declared effect of interest (the planned n),
the n it got (achieved) and the smallest effect that n detects with that power (the MDE). The spread the power
calculation needs is this run's own (the sd of the paired differences, a CI's standard error); the tier's trial
counts were set from the full tier's committed cells (docs/studies.md, "Tiers"), so a planned n above the
achieved one says the pilot under-estimated the spread, and the report flags it.

* :func:`paired_sample` — a direction claim over cells tested by the paired Wilcoxon signed-rank test: per cell
  rank-based, from the standard error of the Hodges–Lehmann shift the test inverts to
  (:func:`kvstats.measure.stats.signed_rank_shift_se`: KL and error differences are heavy-tailed, and their sd
  would plan thousands of times the pairs the ranks need), else t-based (the paired t test's exact power at
  ``n·3/π`` pairs, the Wilcoxon test's efficiency 3/π on normal differences); the claim's n is its hardest cell's.
  :func:`paired_cells` reads the cells from :func:`kvstats.measure.stats.compare`'s table.
* :func:`tost_sample` — an equivalence claim tested by the paired TOST (:func:`kvstats.measure.stats.tost_sample_size`).
* :func:`interval_sample` — a number or bound claim read from a normal-theory (or bootstrap) CI:
  ``mde = (z_{1−α/2} + z_{power})·se`` with ``se`` the CI's half-width over ``z_{(1+level)/2}``, and the planned n
  ``⌈n·(mde/Δ)²⌉`` for the effect of interest Δ (standard errors shrink as 1/√n).
* :func:`ks_equivalence_sample`, :func:`ks_exceedance_sample` — a law's claim read from Kolmogorov's interval of the
  true KS distance (:func:`kvstats.measure.verdicts.ks_equivalence`).
* :func:`binomial_sample`, :func:`mcnemar_sample` — pass/fail claims (exact binomial test, exact McNemar test).
* :func:`hardest` — a claim whose verdict combines parts takes the part that is shortest of its plan.

A claim computed without sampling (a quadrature, a codebook, a bit count) records the reason instead
(:data:`EXACT`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as _stats

from kvstats.measure.stats import (
    mcnemar_sample_size,
    paired_t_power,
    signed_rank_shift_se,
    tost_sample_size,
    wilcoxon_min_pvalue,
)
from kvstats.measure.stats._planning import binomial_mde, binomial_sample_size, plan_sample_size
from kvstats.measure.stats._power import _detectable_d_z
from kvstats.measure.verdicts import PLAN_POWER
from kvstats.study.claims import SampleSize

__all__ = ["EXACT", "PairedCell", "binomial_sample", "hardest", "interval_sample", "ks_equivalence_sample",
           "ks_exceedance_sample", "mcnemar_sample", "paired_cells", "paired_sample", "tost_sample", "wilcoxon_mde",
           "wilcoxon_n"]

#: The ``sample`` of a claim whose numbers are computed without sampling.
EXACT = "none planned: the values are computed exactly (no sampling), so no sample size applies"


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(value, name: str, low: int = 2) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _alpha(alpha) -> float:
    alpha = _positive(alpha, "alpha")
    if not alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    return alpha


@functools.lru_cache(maxsize=65536)
def _t_test_n(d_z: float, alpha: float, power: float) -> float:
    """Pairs the two-sided paired t test needs to detect the standardised effect ``d_z``
    (:func:`kvstats.measure.stats.paired_t_power`, exact noncentral-t power)."""
    return paired_t_power(effect_size=d_z, power=power, alpha=alpha).n_pairs


def wilcoxon_n(effect: float, sd: float, *, alpha: float, power: float = PLAN_POWER) -> int:
    """Pairs the two-sided Wilcoxon signed-rank test needs to detect a mean difference ``effect`` of differences with
    sd ``sd`` at level ``alpha`` with ``power``: the paired t test's n times π/3 (the Wilcoxon test's asymptotic
    relative efficiency 3/π on normal differences), and at least the fewest pairs whose smallest p-value is below
    ``alpha`` (:func:`kvstats.measure.stats.wilcoxon_min_pvalue`)."""
    effect, alpha = _positive(effect, "effect"), _alpha(alpha)
    if isinstance(sd, bool) or not isinstance(sd, (int, float, np.floating)) or not math.isfinite(float(sd)) or sd < 0:
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    floor = _wilcoxon_floor(alpha)
    if sd == 0:
        return floor
    d_z = float(f"{effect / float(sd):.6g}")  # 6 significant digits: one cached solve serves equal cells
    return max(floor, math.ceil(_t_test_n(d_z, alpha, float(power)) * math.pi / 3 - 1e-9))


def wilcoxon_mde(n: int, sd: float, *, alpha: float, power: float = PLAN_POWER) -> float | None:
    """The mean difference the Wilcoxon signed-rank test on ``n`` pairs of differences with sd ``sd`` detects with
    ``power`` at ``alpha`` (:func:`kvstats.measure.stats.detectable_shift` from the sd alone); None where no p-value
    at n pairs reaches ``alpha``."""
    n, alpha = _count(n, "n"), _alpha(alpha)
    if wilcoxon_min_pvalue(n) >= alpha or n * 3 / math.pi < 2:
        return None
    return float(_detectable_d_z(n * 3.0 / math.pi, float(power), alpha, "two-sided")) * float(sd)


@dataclass(frozen=True)
class PairedCell:
    """One cell of a paired comparison: ``n`` pairs whose differences have sd ``sd``; ``scale`` is the magnitude a
    relative effect is a fraction of (e.g. |the reference scheme's median|), 1 for an absolute effect; ``shift_se``
    the standard error of their Hodges–Lehmann shift (:func:`kvstats.measure.stats.signed_rank_shift_se`), which the
    plan reads when given (the rank-based plan; :meth:`from_differences` sets it)."""

    n: int
    sd: float
    scale: float = 1.0
    shift_se: float | None = None

    @classmethod
    def from_differences(cls, differences, scale: float = 1.0) -> PairedCell:
        """The cell of these paired differences (a − b), with its sd and its Hodges–Lehmann shift's standard error."""
        d = np.asarray(differences, dtype=np.float64).ravel()
        if d.size < 2 or not np.all(np.isfinite(d)):
            raise ValueError(f"differences must hold >= 2 finite values, got {d.size} value(s)"
                             + ("" if np.all(np.isfinite(d)) else " with NaN or inf"))
        return cls(int(d.size), float(np.std(d, ddof=1)), float(scale), signed_rank_shift_se(d))


def paired_cells(table: pd.DataFrame, *, scale: str | None = "median_b") -> list[PairedCell]:
    """The cells of :func:`kvstats.measure.stats.compare`'s paired table (``n_pairs``, ``sd_difference``,
    ``shift_se``; ``scale`` the column whose magnitude a relative effect is of, None for an absolute effect). Rows of
    fewer than 2 pairs carry no test and are left out."""
    missing = [c for c in ("n_pairs", "sd_difference", "shift_se", *([scale] if scale else []))
               if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks the column(s) {missing} (a paired table of kvstats.measure.stats.compare)")
    rows = table[table["n_pairs"] >= 2]
    return [PairedCell(int(r["n_pairs"]), float(r["sd_difference"]), abs(float(r[scale])) if scale else 1.0,
                       float(r["shift_se"])) for _, r in rows.iterrows()]


def _wilcoxon_floor(alpha: float) -> int:
    """The fewest pairs whose smallest two-sided signed-rank p-value is below ``alpha``."""
    floor = 2
    while wilcoxon_min_pvalue(floor) >= alpha:
        floor += 1
    return floor


def _cell_plan(cell: PairedCell, effect: float, alpha: float, power: float) -> tuple[int, float | None]:
    """(planned n, MDE in the differences' units) of one cell: rank-based from its Hodges–Lehmann shift's standard
    error when known — ``mde = (z_{1−α/2} + z_power)·se``, ``n = ⌈n₀·(mde/effect)²⌉`` — else t-based from its sd
    (:func:`wilcoxon_n`, :func:`wilcoxon_mde`); at least the Wilcoxon floor, and no MDE below it."""
    floor = _wilcoxon_floor(alpha)
    if cell.shift_se is None:
        return wilcoxon_n(effect, cell.sd, alpha=alpha, power=power), wilcoxon_mde(cell.n, cell.sd, alpha=alpha,
                                                                                   power=power)
    if isinstance(cell.shift_se, bool) or not math.isfinite(cell.shift_se) or cell.shift_se < 0:
        raise ValueError(f"shift_se must be a finite number >= 0, got {cell.shift_se!r}")
    mde = (_stats.norm.isf(alpha / 2) + _stats.norm.ppf(power)) * cell.shift_se
    planned = max(floor, math.ceil(cell.n * (mde / effect) ** 2 - 1e-9))
    return planned, (float(mde) if cell.n >= floor else None)


def paired_sample(cells: Iterable[PairedCell], *, effect: float, effect_words: str, alpha: float, unit: str,
                  relative: bool = True, power: float = PLAN_POWER,
                  test: str = "paired Wilcoxon signed-rank test") -> SampleSize:
    """The sample size of a direction claim whose cells are paired Wilcoxon tests at level ``alpha`` (per cell:
    Holm's first step α/m is the conservative level). Per cell the effect of interest is ``effect·scale``
    (``relative``) or ``effect``; its planned n and MDE are rank-based where the cell knows its Hodges–Lehmann
    shift's standard error (:meth:`PairedCell.from_differences`, :func:`paired_cells`), else t-based
    (:func:`wilcoxon_n`, :func:`wilcoxon_mde`); the MDE over ``scale`` when relative. The claim's planned n is the
    largest cell's, its achieved n the smallest, its MDE the largest (None when some cell cannot reach ``alpha``
    at its n)."""
    cells = list(cells)
    if not cells:
        raise ValueError("cells must hold at least one PairedCell (a claim with no tested cell has no sample size)")
    effect, alpha = _positive(effect, "effect"), _alpha(alpha)
    planned, mdes = [], []
    for i, c in enumerate(cells):
        scale = _positive(c.scale, f"cells[{i}].scale") if relative else 1.0
        n, mde = _cell_plan(c, effect * scale, alpha, power)
        planned.append(n)
        mdes.append(None if mde is None else mde / scale)
    worst = None if any(m is None for m in mdes) else max(mdes)
    what = "relative shift (of the reference's |median|)" if relative else "shift"
    ranks = all(c.shift_se is not None for c in cells)
    return SampleSize(test=f"{test}, α = {alpha:.3g} per cell, hardest of {len(cells)} cell(s); "
                           + ("planned on the Hodges–Lehmann shift's standard error" if ranks
                              else "planned on the differences' sd (t-based, × π/3)"),
                      effect=effect_words, planned_n=max(planned), achieved_n=min(c.n for c in cells),
                      mde=worst, mde_of=what, power=power, unit=unit)


def tost_sample(sd: float, n: int, *, margin: float, effect_words: str, unit: str, alpha: float = 0.05,
                delta: float = 0.0, power: float = PLAN_POWER) -> SampleSize:
    """The sample size of an equivalence claim tested by the paired TOST within ±``margin`` over ``n`` pairs of sd
    ``sd``, planned for a true difference ``delta`` (0: "no difference"):
    :func:`kvstats.measure.stats.tost_sample_size`; the MDE is the largest |Δ| still shown equivalent with ``power``
    at n."""
    plan = tost_sample_size(delta, _positive(sd, "sd"), margin=margin, alpha=alpha, target=power,
                            n_achieved=_count(n, "n"), n_max=10**12)
    return SampleSize.from_plan(plan, effect=effect_words, mde_of="largest |Δ| shown equivalent", unit=unit)


def interval_sample(ci: Sequence[float], n: int, *, effect: float, effect_words: str, test: str, unit: str,
                    level: float = 0.95, alpha: float = 0.05, power: float = PLAN_POWER,
                    mde_of: str = "difference from the value at stake") -> SampleSize:
    """The sample size of a claim read from a CI ``ci`` at confidence ``level`` over ``n`` samples: standard error
    ``se = (high − low)/(2·z_{(1+level)/2})``, MDE ``(z_{1−α/2} + z_{power})·se`` and planned n ``⌈n·(mde/Δ)²⌉`` (at
    least 2) for the effect of interest Δ = ``effect``."""
    low, high = (float(v) for v in ci)
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"ci must be a finite (low, high) pair with low <= high, got {ci!r}")
    n, effect, alpha = _count(n, "n"), _positive(effect, "effect"), _alpha(alpha)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    se = (high - low) / (2 * _stats.norm.isf((1 - level) / 2))
    mde = (_stats.norm.isf(alpha / 2) + _stats.norm.ppf(power)) * se
    return SampleSize(test=test, effect=effect_words, planned_n=max(2, math.ceil(n * (mde / effect) ** 2 - 1e-9)),
                      achieved_n=n, mde=float(mde), mde_of=mde_of, power=power, unit=unit)


def _ks_critical(n: int, alpha: float) -> float:
    return float(_stats.kstwo.isf(alpha, n))


def ks_equivalence_sample(n: int, *, margin: float, effect_words: str, unit: str = "draws", alpha: float = 0.05,
                          power: float = PLAN_POWER) -> SampleSize:
    """The sample size of "the law is F within KS distance ``margin``", shown when Kolmogorov's interval D ± c_n
    (``c_n = kstwo.isf(α, n)``, :func:`kvstats.measure.stats.ks_distance_interval`) lies below the margin, over ``n``
    i.i.d. draws, planned at a true distance 0: there D has Kolmogorov's exact law, so the power at n is
    ``kstwo.cdf(margin − c_n, n)`` and the planned n the fewest draws reaching ``power``
    (:func:`kvstats.measure.stats.plan_sample_size`). The MDE: the largest true distance Δ still shown within the
    margin with that power, at least ``margin − c_n − kstwo.ppf(power, n)`` (D ≤ Δ + sup|F_n − F|); None where that
    is not positive."""
    n, margin, alpha = _count(n, "n", 1), _positive(margin, "margin"), _alpha(alpha)
    planned = plan_sample_size(lambda m: float(_stats.kstwo.cdf(margin - _ks_critical(m, alpha), m)), target=power,
                               n_min=1, n_max=10**9)
    mde = margin - _ks_critical(n, alpha) - float(_stats.kstwo.ppf(power, n))
    return SampleSize(test=f"Kolmogorov interval of the true KS distance (level {1 - alpha:g}) inside {margin:g}",
                      effect=effect_words, planned_n=planned, achieved_n=n, mde=mde if mde > 0 else None,
                      mde_of=f"largest true KS distance shown within {margin:g}", power=power, unit=unit)


def ks_exceedance_sample(n: int, *, margin: float, gap: float, effect_words: str, unit: str = "draws",
                         alpha: float = 0.05, power: float = PLAN_POWER) -> SampleSize:
    """The sample size of "the law is not F": Kolmogorov's interval D ± c_n lies above ``margin``, planned at a true
    distance ``margin + gap``. At the point x* of the largest gap D ≥ Δ − |F_n(x*) − F(x*)|, whose sd is at most
    1/(2√n), so the power is at least ``Φ(2√n·(gap − c_n))`` (normal approximation of the binomial F_n(x*)); the planned
    n the fewest reaching ``power``, the MDE the excess over the margin shown with that power,
    ``c_n + z_power/(2√n)``."""
    n, margin, gap, alpha = _count(n, "n", 1), _positive(margin, "margin"), _positive(gap, "gap"), _alpha(alpha)
    planned = plan_sample_size(lambda m: float(_stats.norm.cdf(2 * math.sqrt(m) * (gap - _ks_critical(m, alpha)))),
                               target=power, n_min=1, n_max=10**9)
    mde = _ks_critical(n, alpha) + float(_stats.norm.ppf(power)) / (2 * math.sqrt(n))
    return SampleSize(test=f"Kolmogorov interval of the true KS distance (level {1 - alpha:g}) above {margin:g}",
                      effect=effect_words, planned_n=planned, achieved_n=n, mde=mde,
                      mde_of=f"true KS distance beyond {margin:g} shown", power=power, unit=unit)


def binomial_sample(failures: int, trials: int, *, limit: float, expected: float, effect_words: str, unit: str,
                    alpha: float = 0.05, power: float = PLAN_POWER) -> SampleSize:
    """The sample size of "a rate is at most ``limit``" tested exactly (scipy's ``binomtest``, one-sided, H0: rate =
    ``limit``) when the rate expected is ``expected`` < limit: :func:`kvstats.measure.stats.binomial_sample_size`;
    the MDE is the rate − limit (negative) at which ``trials`` show the rate below ``limit`` with ``power``."""
    trials = _count(trials, "trials", 1)
    if isinstance(failures, bool) or not isinstance(failures, (int, np.integer)) or not 0 <= failures <= trials:
        raise ValueError(f"failures must be an int in [0, trials={trials}], got {failures!r}")
    plan = binomial_sample_size(limit, expected, alpha=alpha, target=power, alternative="less", n_achieved=trials)
    mde = binomial_mde(limit, trials, alpha=alpha, target=power, alternative="less")
    return SampleSize(test=f"exact binomial test of the rate against {limit:g} (one-sided, α = {alpha:g})",
                      effect=effect_words, planned_n=int(plan.n_planned), achieved_n=trials,
                      mde=None if math.isnan(mde) else float(mde), mde_of=f"rate − {limit:g} shown below the limit",
                      power=power, unit=unit)


def mcnemar_sample(p10: float, p01: float, n: int, *, effect_words: str, unit: str, alpha: float = 0.05,
                   power: float = PLAN_POWER) -> SampleSize:
    """The sample size of a paired pass/fail claim tested by the exact McNemar test, planned for the discordant
    rates ``p10`` (a passes, b fails) and ``p01``: :func:`kvstats.measure.stats.mcnemar_sample_size`."""
    plan = mcnemar_sample_size(p10, p01, alpha=alpha, target=power, n_achieved=_count(n, "n", 1))
    return SampleSize.from_plan(plan, effect=effect_words, mde_of="p_a − p_b at the same discordance", unit=unit)


def hardest(samples: Iterable[SampleSize | str | None]) -> SampleSize | str:
    """Of a claim's parts, the sample size shortest of its plan (largest planned/achieved); a part without sampling
    (a reason string, or None) counts only when no part samples."""
    samples = list(samples)
    sized = [s for s in samples if isinstance(s, SampleSize)]
    if sized:
        return max(sized, key=lambda s: s.planned_n / s.achieved_n)
    reasons = [s for s in samples if isinstance(s, str)]
    if not reasons:
        raise ValueError("samples must hold a SampleSize or a reason string, got none")
    return reasons[0]
