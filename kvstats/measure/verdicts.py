"""Verdict rules: how a measurement is held to a published claim.

Every verdict in ``figures/REPORT.md`` is computed by one of the rules below, never written by hand. A
claim is of one of four kinds, and each kind has one rule:

==================  =====================================================================================
kind                rule
==================  =====================================================================================
direction           the claim states a direction and no number ("A's KL is lower than B's"). Each cell
                    (data set, budget, ...) is *for* the claim when a test rejects the null in the claimed
                    direction at level ``alpha``, *against* when it rejects it in the other direction,
                    *undecided* otherwise. reproduced: for in every cell; not reproduced: against in some
                    cell and for in none; inconclusive: every cell undecided; partly: otherwise.
number              the claim states a number ("2.25× lower"). reproduced: the published value lies in our
                    CI (or within a declared relative tolerance ``rtol``·|published| of it: the same for every
                    entry of a table, never derived from the printed digits) and the CI excludes the null on
                    the claimed side; inconclusive: the CI holds both the published value and the null;
                    partly: the CI excludes the published value but the direction holds; not reproduced: the
                    CI excludes the published value and the direction is not established. A claim whose null
                    is the trivial bound of the quantity (0 for a distortion or a variance) has no direction
                    part (``null=None``): the CI holding the value reproduces it, excluding it does not.
                    Where the quantity has an exact value the CI is ``(v, v)``, and whether the printed number
                    is the exact value rounded to its printed digits is stated separately (:func:`rounding`).
bound               the claim states a bound ("≤ 1 ± 3ε", "at most D"). A cell *meets* the bound when its
                    CI's far end does (the upper end for an upper bound), *violates* it when the near end lies
                    beyond it, is *undecided* otherwise. reproduced: every cell meets it; not reproduced:
                    some cell violates it; inconclusive: every cell undecided; partly: some meet it, the
                    rest are undecided.
identity            the claim states an exact value or identity (a closed form) and the value is computed
                    without sampling (quadrature, a codebook, a bit count). reproduced: every value within
                    ``atol + rtol·|expected|``; not reproduced: none; partly: some. A Monte Carlo estimate of a
                    closed form is held to it by the equivalence rule with a declared margin (a z-score inside
                    ±z_crit is absence of evidence, not agreement), a sample's law by :func:`ks_equivalence`.
equivalence         the claim states "no worse than δ" / "quality-neutral" (an equivalence, with a declared
                    margin δ). Each cell's (1 − 2α) CI of the difference (the TOST interval,
                    :func:`kvstats.stats.equivalence`): *equivalent* when it lies inside (−δ, δ),
                    *different* when it lies wholly outside, *undecided* otherwise. reproduced: every cell
                    equivalent; not reproduced: some cell different; inconclusive: every cell undecided;
                    partly: otherwise.
==================  =====================================================================================

The rules are symmetric in noise: a claim is *not reproduced* only when the data exclude it and *reproduced*
only when they exclude the alternative; where they exclude neither the verdict is *inconclusive*, and its reason
gives the minimum detectable effect at the sample size used and the sample size that would decide it
(:class:`Plan`, from the interval with ``n=`` or passed as ``plan=``).

Further outcomes are not rules but labels, each with its reason: ``measured`` (our own measurement,
allowed only for claims whose source is kvstats), ``not testable here`` (e.g. a benchmark that needs
a model or data set this project cannot obtain) and ``implementation check`` (a published statement that
holds by a theorem or by construction, e.g. Jensen's inequality or an identity of the transform: no data
can contradict it, so agreeing with it is evidence for kvstats' code, not for the paper;
:func:`implementation_check` wraps the rule that checked it and reads ``check failed`` when it did not hold).
:func:`combine` merges the verdicts of a claim's parts: all reproduced gives reproduced, all inconclusive gives
inconclusive, not reproduced with nothing reproduced or partly beside it gives not reproduced, anything else
partly; :func:`chain` merges the links of one argument ("A, which causes B; hence C"), where one link not
reproduced makes the claim not reproduced.

Each rule returns a :class:`Verdict` whose ``reason`` is generated from the numbers it was given, so the
report's text can never say more than the rule checked.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from scipy import stats as _stats
from scipy.optimize import brentq as _brentq

from kvstats.measure.stats import ks_distance_interval

__all__ = [
    "KINDS",
    "RULE_VERDICTS",
    "VERDICTS",
    "Plan",
    "Verdict",
    "bound",
    "cell_direction",
    "chain",
    "combine",
    "direction",
    "equivalence",
    "hardest",
    "identity",
    "implementation_check",
    "ks_equivalence",
    "measured",
    "not_testable",
    "number",
    "plan_from_binomial",
    "plan_from_interval",
    "plan_from_test",
    "printed_half_unit",
    "rounding",
]

#: Every verdict the report knows, in the order of its summary line.
VERDICTS = ("reproduced", "partly", "not reproduced", "inconclusive", "measured", "not testable here",
            "implementation check", "check failed")
#: The verdicts a rule (or :func:`combine`) gives.
RULE_VERDICTS = ("reproduced", "partly", "not reproduced", "inconclusive")
#: The claim kinds that have a rule.
KINDS = ("direction", "number", "bound", "identity", "equivalence")
#: The power at which a :class:`Plan` states the minimum detectable effect and the sample size that decides.
PLAN_POWER = 0.8


@dataclass(frozen=True)
class Verdict:
    """A verdict and how it was reached.

    Attributes:
        verdict: one of :data:`VERDICTS`.
        rule: the rule that produced it (one of :data:`KINDS`, ``"combine"``, ``"measured"``,
            ``"not testable"``).
        reason: one sentence generated from the numbers the rule saw.
    """

    verdict: str
    rule: str
    reason: str

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {list(VERDICTS)}, got {self.verdict!r}")

    def __str__(self) -> str:
        return self.verdict


@dataclass(frozen=True)
class Plan:
    """What an undecided measurement would need: its minimum detectable effect and the sample size that decides.

    With the standard error ``se`` of the estimate at sample size ``n``, a two-sided level ``alpha`` and power
    ``power`` (:data:`PLAN_POWER`), the minimum detectable effect is ``mde = (z_{1-α/2} + z_{power})·se``; a
    distance ``Δ`` at stake (between the claim and its null, an estimate and its bound) is decided at about
    ``n_needed = ⌈n·(mde/Δ)²⌉`` (standard errors shrink as 1/√n). ``n_needed`` is None when ``Δ = 0`` (no
    sample size decides it).
    """

    n: int
    mde: float
    n_needed: int | None
    unit: str = "samples"
    alpha: float = 0.05

    def __str__(self) -> str:
        decide = (f"about {self.n_needed:,} {self.unit} would decide it" if self.n_needed is not None
                  else "no sample size decides an estimate that sits on the boundary")
        return (f"minimum detectable effect {self.mde:.3g} at n = {self.n:,} {self.unit} (two-sided α = "
                f"{self.alpha:g}, power {PLAN_POWER:g}); {decide}")


def _finite(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    return float(x)


def _count(n, name: str = "n") -> int:
    try:
        count = operator.index(n) if not isinstance(n, bool) else None
    except TypeError:
        count = None
    if count is None or count < 2:
        raise ValueError(f"{name} must be an int >= 2 (the sample size behind the interval), got {n!r}")
    return count


def _unit_interval(x, name: str) -> float:
    x = _finite(x, name)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {x!r}")
    return x


def _plan(se: float, n: int, distance: float, alpha: float, unit: str) -> Plan:
    mde = (_stats.norm.isf(alpha / 2) + _stats.norm.ppf(PLAN_POWER)) * se
    needed = math.ceil(n * (mde / distance) ** 2) if distance > 0 else None
    return Plan(n=n, mde=float(mde), n_needed=None if needed is None else max(needed, n + 1), unit=unit,
                alpha=alpha)


def plan_from_interval(ci, n: int, *, distance: float, level: float = 0.95, unit: str = "samples") -> Plan:
    """The :class:`Plan` of a symmetric normal-theory interval ``ci`` at confidence ``level`` over ``n`` samples.

    ``se = (high − low) / (2·z_{(1+level)/2})``; ``distance`` is the gap at stake (≥ 0).
    """
    lo, hi = _interval(ci, "ci")
    n = _count(n)
    level = _unit_interval(level, "level")
    distance = abs(_finite(distance, "distance"))
    se = (hi - lo) / (2 * _stats.norm.isf((1 - level) / 2))
    return _plan(se, n, distance, 1 - level, unit)


def plan_from_test(pvalue: float, effect: float, n: int, *, alpha: float = 0.05, unit: str = "samples") -> Plan:
    """The :class:`Plan` of a test that gave two-sided ``pvalue`` for an observed ``effect`` over ``n`` samples.

    The standard error is read back from the test, ``se = |effect| / z_{1−p/2}``; the distance at stake is the
    observed effect itself, so ``n_needed`` is where an effect of that size would be detected with the stated
    power.
    """
    p = _finite(pvalue, "pvalue")
    if not 0.0 < p < 1.0:
        raise ValueError(f"pvalue must be in (0, 1) to read a standard error from it, got {pvalue!r}")
    effect = abs(_finite(effect, "effect"))
    if effect == 0.0:
        raise ValueError("effect must be non-zero to read a standard error from the test, got 0")
    se = effect / _stats.norm.isf(p / 2)
    return _plan(se, _count(n), effect, _unit_interval(alpha, "alpha"), unit)


def _clopper_pearson(x: int, trials: int, alpha: float) -> tuple[float, float]:
    ci = _stats.binomtest(x, trials).proportion_ci(1 - alpha, method="exact")
    return float(ci.low), float(ci.high)


def hardest(plans: Sequence[Plan]) -> Plan:
    """The plan that needs the most samples (one with no deciding sample size counts as needing infinitely many):
    the one that decides a verdict over several undecided cells."""
    return max(plans, key=lambda p: math.inf if p.n_needed is None else p.n_needed)


def plan_from_binomial(failures: int, trials: int, limit: float, *, alpha: float = 0.05, unit: str = "trials",
                       scale: float = 1.0) -> Plan:
    """The :class:`Plan` of "a probability is at most ``limit``" judged by a two-sided (1 − α) Clopper–Pearson
    interval of ``failures`` in ``trials`` (exact: no normal approximation, which fails near 0 failures).

    ``mde``: the smallest excess p₁ − limit that ``trials`` would show as a violation (interval's low end above
    ``limit``) with power :data:`PLAN_POWER`, times ``scale`` (the unit of the bound rule's estimates, e.g. × n).
    ``n_needed``: the fewest trials at which the observed rate would decide the bound (the interval's high end
    at or below ``limit``, or its low end above it); 0 failures decide it from ⌈ln(α/2)/ln(1 − limit)⌉.
    """
    trials = _count(trials, "trials")
    failures = operator.index(failures)
    if not 0 <= failures <= trials:
        raise ValueError(f"failures must be in [0, trials={trials}], got {failures!r}")
    limit = _unit_interval(limit, "limit")
    alpha = _unit_interval(alpha, "alpha")
    rate = failures / trials
    critical = next((x for x in range(trials + 1) if _clopper_pearson(x, trials, alpha)[0] > limit), None)
    mde = math.inf if critical is None else scale * (
        _brentq(lambda p: _stats.binom.sf(critical - 1, trials, p) - PLAN_POWER, limit, 1.0) - limit)

    def decided(size: int) -> bool:
        lo, hi = _clopper_pearson(round(rate * size), size, alpha)
        return hi <= limit if rate < limit else lo > limit

    needed, high = None, trials
    if rate != limit:
        while not decided(high) and high < 10**9:
            high *= 2
        if decided(high):
            low = 1
            while low < high:  # the fewest trials that decide (decided() is monotone up to rounding of the count)
                mid = (low + high) // 2
                low, high = (low, mid) if decided(mid) else (mid + 1, high)
            needed = high
    return Plan(n=trials, mde=float(mde), n_needed=needed, unit=unit, alpha=alpha)


def _undecided(reason: str, plan: Plan | None) -> str:
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"plan must be a Plan (plan_from_interval, plan_from_test) or None, got {plan!r}")
    return f"{reason}; undecided: {plan}" if plan is not None else f"{reason}; undecided (no sample size given)"


def _interval(ci, name: str) -> tuple[float, float]:
    try:
        lo, hi = ci
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (low, high) pair, got {ci!r}") from None
    lo, hi = _finite(lo, f"{name}[0]"), _finite(hi, f"{name}[1]")
    if lo > hi:
        raise ValueError(f"{name} must have low <= high, got ({lo}, {hi})")
    return lo, hi


def _check_sign(sign: int) -> int:
    if sign not in (-1, 1):
        raise ValueError(f"expected_sign must be +1 or -1, got {sign!r}")
    return sign


def _of_total(k: int, n: int, what: str) -> str:
    return f"{k} of {n} {what}"


def printed_half_unit(printed: str) -> float:
    """Half a unit of the last printed digit of a published number: ``"2.25"`` -> 0.005, ``"0.03"`` -> 0.005.

    A number printed with its last digit rounded stands for any value within this distance.
    """
    try:
        exponent = Decimal(str(printed).strip()).as_tuple().exponent
    except InvalidOperation:
        raise ValueError(f"printed must be a number as printed in a paper, e.g. '2.25', got {printed!r}") from None
    if not isinstance(exponent, int):
        raise ValueError(f"printed must be a finite number, got {printed!r}")
    return 0.5 * 10.0 ** exponent


def cell_direction(pvalue: float, effect: float, *, expected_sign: int, alpha: float = 0.05) -> int:
    """One cell of a direction claim: +1 for (significant in the claimed direction), -1 against, 0 undecided.

    Args:
        pvalue: two-sided p-value of the cell's test.
        effect: signed effect (e.g. rank-biserial r, log ratio) whose sign is the observed direction.
        expected_sign: +1 or -1, the direction the claim states for ``effect``.
        alpha: significance level.
    """
    _check_sign(expected_sign)
    p = _finite(pvalue, "pvalue")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"pvalue must be in [0, 1], got {pvalue!r}")
    _unit_interval(alpha, "alpha")
    e = _finite(effect, "effect")
    if p >= alpha or e == 0.0:
        return 0
    return 1 if math.copysign(1.0, e) == expected_sign else -1


def direction(cells: Sequence[int], *, what: str = "cells", plan: Plan | None = None) -> Verdict:
    """The direction rule over cells scored by :func:`cell_direction` (+1 for, 0 undecided, -1 against).

    ``plan`` (:func:`plan_from_test` of the weakest cell) is quoted when every cell is undecided.
    """
    cells = list(cells)
    if not cells:
        raise ValueError("cells must hold at least one cell")
    bad = [c for c in cells if isinstance(c, bool) or c not in (-1, 0, 1)]
    if bad:
        raise ValueError(f"cells must be +1, 0 or -1 (from cell_direction), got {bad[0]!r}")
    n, pro, con = len(cells), cells.count(1), cells.count(-1)
    reason = (f"the claimed direction is significant in {_of_total(pro, n, what)}"
              + (f", the opposite direction in {con}" if con else ""))
    if pro == n:
        return Verdict("reproduced", "direction", reason)
    if pro == 0 and con:
        return Verdict("not reproduced", "direction", reason)
    if pro == 0:
        return Verdict("inconclusive", "direction", _undecided(reason, plan))
    return Verdict("partly", "direction", reason)


def number(published: float, ci, *, null: float | None, expected_sign: int = 1, rtol: float = 0.0,
           estimate: float | None = None, n: int | None = None, level: float = 0.95,
           unit: str = "samples") -> Verdict:
    """The number rule: does our CI hold the published value, and does it exclude the null?

    Args:
        published: the paper's number (e.g. a ratio 2.25).
        ci: our (low, high) confidence interval for the same quantity ((v, v) for an exact value v).
        null: the value meaning "no effect" (1 for a ratio, 0 for a difference), on the other side of the
            published value from ``expected_sign``; None where the only null is the trivial bound of the
            quantity (0 for a distortion or a variance), which no estimate can cross: then the claim has no
            direction part.
        expected_sign: +1 when the claim says the quantity exceeds ``null``, -1 when below.
        rtol: declared relative tolerance: the published value meets the CI when its distance to it is at
            most ``rtol·|published|`` (0: it must lie inside). Never derived from the printed digits.
        estimate: our point estimate, quoted in the reason when given.
        n, level, unit: the sample size behind ``ci`` and its confidence level, for the :class:`Plan` of an
            inconclusive verdict (distance at stake: |published − null|).
    """
    published = _finite(published, "published")
    lo, hi = _interval(ci, "ci")
    _check_sign(expected_sign)
    rtol = _finite(rtol, "rtol")
    if not 0.0 <= rtol < 1.0:
        raise ValueError(f"rtol must be in [0, 1), got {rtol!r}")
    if null is not None:
        null = _finite(null, "null")
        if expected_sign * (published - null) <= 0:
            side = "above" if expected_sign > 0 else "below"
            raise ValueError(f"published {published:g} must lie on the claimed side ({side}) of null {null:g}")
    est = "" if estimate is None else f"{_finite(estimate, 'estimate'):.4g} "
    gap = max(lo - published, published - hi, 0.0)
    inside = gap <= rtol * abs(published)
    ours = f"{est}[{lo:.4g}, {hi:.4g}]" if lo < hi else f"{lo:.5g}"
    where = (f"published {published:g} {'inside' if inside else 'outside'} our {ours}"
             + (f" (tolerance {rtol:.0%} of the published value; off by {gap / abs(published):.1%})"
                if rtol and published else ""))
    if null is None:
        return Verdict("reproduced" if inside else "not reproduced", "number",
                       f"{where}; no direction part (the null is the trivial bound of the quantity)")
    direction_holds = lo > null if expected_sign > 0 else hi < null
    side = "above" if expected_sign > 0 else "below"
    holds = f"the CI {'lies' if direction_holds else 'does not lie'} wholly {side} {null:g}"
    if inside and direction_holds:
        return Verdict("reproduced", "number", f"{where}; {holds}")
    if inside:
        plan = None if n is None else plan_from_interval((lo, hi), n, distance=published - null, level=level,
                                                         unit=unit)
        return Verdict("inconclusive", "number", _undecided(f"{where}; {holds}: it holds the null too", plan))
    if direction_holds:
        return Verdict("partly", "number", f"{where}; direction holds ({holds})")
    return Verdict("not reproduced", "number", f"{where}; {holds}")


def rounding(printed: str, exact: float) -> str:
    """Whether a printed number is ``exact`` rounded to its printed digits, as one phrase for a report.

    ``rounding("0.03", 0.033966)`` -> "0.03 is 0.033966 rounded to 2 decimals (printed -11.7% off)";
    ``rounding("0.117", 0.11640)`` -> "0.117 is not 0.1164 rounded to 3 decimals (that is 0.116; printed +0.5% off)".
    """
    exact = _finite(exact, "exact")
    half = printed_half_unit(printed)
    value = float(printed)
    decimals = max(0, -round(math.log10(2 * half)))
    rounded = Decimal(repr(exact)).quantize(Decimal(1).scaleb(-decimals)) if decimals else round(exact)
    off = f"{100 * (value - exact) / exact:+.1f}% off" if exact else "exact value 0"
    where = f"{decimals} decimal{'s' if decimals != 1 else ''}"
    if abs(float(rounded) - value) < half / 10:
        return f"{printed} is {exact:.5g} rounded to {where} (printed {off})"
    return f"{printed} is not {exact:.5g} rounded to {where} (that is {rounded}; printed {off})"


def bound(estimates: Sequence[float], cis: Sequence, limit: float, *, upper: bool = True,
          what: str = "cells", n: int | Sequence[int] | None = None, level: float = 0.95,
          unit: str = "samples", plan: Plan | None = None) -> Verdict:
    """The bound rule: ``estimates[i]`` (with ``cis[i]``) against a claimed upper (or lower) ``limit``.

    A cell meets the bound when its CI's far end does, violates it when the near end lies beyond it, and is
    undecided otherwise. ``n`` (one sample size, or one per cell) and ``level`` plan the undecided cells from
    their normal-theory intervals: the :class:`Plan` of the undecided cell that needs the most samples (distance
    at stake: |estimate − limit|). ``plan`` gives the plan directly instead (e.g. an exact binomial one).
    """
    estimates = [_finite(e, f"estimates[{i}]") for i, e in enumerate(estimates)]
    cis = [_interval(c, f"cis[{i}]") for i, c in enumerate(cis)]
    if not estimates or len(estimates) != len(cis):
        raise ValueError(f"estimates and cis must be non-empty and of one length, got {len(estimates)} and {len(cis)}")
    limit = _finite(limit, "limit")
    sign = 1.0 if upper else -1.0
    far = [hi if upper else lo for lo, hi in cis]
    near = [lo if upper else hi for lo, hi in cis]
    met = [i for i in range(len(cis)) if sign * (far[i] - limit) <= 0]
    violated = [i for i in range(len(cis)) if sign * (near[i] - limit) > 0]
    undecided = [i for i in range(len(cis)) if i not in met and i not in violated]
    total = len(estimates)
    kind = "upper" if upper else "lower"
    reason = (f"{_of_total(len(met), total, what)} within the {kind} bound {limit:.4g} at the CI's far end"
              + (f"; {len(violated)} significantly beyond it" if violated else "")
              + (f"; {len(undecided)} undecided (CI across the bound)" if undecided else ""))
    if len(met) == total:
        return Verdict("reproduced", "bound", reason)
    if violated:
        return Verdict("not reproduced", "bound", reason)
    if met:
        return Verdict("partly", "bound", reason)
    if plan is None and n is not None:
        sizes = list(n) if isinstance(n, Sequence) else [n] * total
        if len(sizes) != total:
            raise ValueError(f"n must be one sample size or {total} (one per cell), got {len(sizes)}")
        plans = [plan_from_interval(cis[i], sizes[i], distance=estimates[i] - limit, level=level, unit=unit)
                 for i in undecided]
        plan = hardest(plans)
    return Verdict("inconclusive", "bound", _undecided(reason, plan))


def identity(values: Sequence[float], expected: Sequence[float] | float, *, atol: float = 0.0,
             rtol: float = 0.0, what: str = "values") -> Verdict:
    """The identity rule: ``|values[i] - expected[i]| <= atol + rtol·|expected[i]|`` for every i."""
    values = [_finite(v, f"values[{i}]") for i, v in enumerate(values)]
    if not values:
        raise ValueError("values must hold at least one value")
    if isinstance(expected, (int, float)):
        expected = [expected] * len(values)
    expected = [_finite(e, f"expected[{i}]") for i, e in enumerate(expected)]
    if len(expected) != len(values):
        raise ValueError(f"expected must have {len(values)} entries like values, got {len(expected)}")
    atol, rtol = _finite(atol, "atol"), _finite(rtol, "rtol")
    if atol < 0 or rtol < 0 or atol == rtol == 0:
        raise ValueError(f"atol and rtol must be >= 0 and not both 0, got atol={atol}, rtol={rtol}")
    gaps = [abs(v - e) for v, e in zip(values, expected)]
    ok = [g <= atol + rtol * abs(e) for g, e in zip(gaps, expected)]
    n, k = len(ok), sum(ok)
    reason = f"{_of_total(k, n, what)} within atol {atol:g} + rtol {rtol:g} (largest gap {max(gaps):.3g})"
    if k == n:
        return Verdict("reproduced", "identity", reason)
    if k == 0:
        return Verdict("not reproduced", "identity", reason)
    return Verdict("partly", "identity", reason)


def equivalence(cis: Sequence, margin: float, *, what: str = "cells", n: int | None = None,
                alpha: float = 0.05, unit: str = "samples") -> Verdict:
    """The equivalence rule: each cell's (1 − 2α) CI of the difference (a − b) against the margin (−δ, δ).

    ``cis[i]`` is the TOST interval of cell i (:func:`kvstats.stats.equivalence`'s ``confidence_interval``):
    inside (−δ, δ) is TOST's rejection at α (equivalent within δ); wholly outside is a difference larger than
    δ at that level. ``n`` plans an inconclusive verdict: the sample size at which the widest undecided cell's
    interval, centred where it is, would fit inside the margin or clear it (level 1 − 2α)."""
    cis = [_interval(c, f"cis[{i}]") for i, c in enumerate(cis)]
    if not cis:
        raise ValueError("cis must hold at least one interval")
    delta = _finite(margin, "margin")
    if delta <= 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    alpha = _unit_interval(alpha, "alpha")
    inside = [i for i, (lo, hi) in enumerate(cis) if -delta < lo and hi < delta]
    outside = [i for i, (lo, hi) in enumerate(cis) if hi <= -delta or lo >= delta]
    total = len(cis)
    reason = (f"{_of_total(len(inside), total, what)} equivalent within ±{delta:g} (CI inside the margin)"
              + (f"; {len(outside)} different by more than the margin" if outside else ""))
    if len(inside) == total:
        return Verdict("reproduced", "equivalence", reason)
    if outside:
        return Verdict("not reproduced", "equivalence", reason)
    if inside:
        return Verdict("partly", "equivalence", reason)
    plan = None
    if n is not None:
        plans = [plan_from_interval(ci, n, distance=delta - abs((ci[0] + ci[1]) / 2), level=1 - 2 * alpha,
                                    unit=unit) for ci in cis]
        plan = hardest(plans)
    return Verdict("inconclusive", "equivalence", _undecided(reason, plan))


def ks_equivalence(distances: Sequence[float], ns: Sequence[int], margin: float, *, alpha: float = 0.05,
                   what: str = "samples") -> Verdict:
    """Goodness of fit as the equivalence rule: "the sample follows the law G" holds within ``margin`` in Kolmogorov
    distance. Each KS distance ``distances[i]`` of ``ns[i]`` i.i.d. draws gives the interval of the true distance
    sup|F − G| (:func:`kvstats.measure.stats.ks_distance_interval`, level 1 − α: each end a one-sided bound at
    1 − α, as TOST's); inside [0, margin) is *equivalent*, wholly at or beyond it *different*. A KS test that
    merely fails to reject is not evidence of fit (it always passes at small n); this rule is inconclusive there."""
    distances, ns = list(distances), list(ns)
    if len(distances) != len(ns):
        raise ValueError(f"ns must have {len(distances)} entries like distances, got {len(ns)}")
    alpha = _unit_interval(alpha, "alpha")
    cis = [ks_distance_interval(d, n, confidence_level=1 - alpha) for d, n in zip(distances, ns)]
    return equivalence(cis, margin, what=f"{what} (KS distance)", n=min(ns) if ns else None, alpha=alpha / 2,
                       unit="draws")


def combine(parts: Sequence[Verdict]) -> Verdict:
    """Merge the verdicts of a claim's parts.

    All reproduced -> reproduced; all inconclusive -> inconclusive; some not reproduced with the rest
    inconclusive -> not reproduced (the data exclude a part and support none); anything else -> partly.
    """
    parts = list(parts)
    if not parts or not all(isinstance(p, Verdict) for p in parts):
        raise TypeError("parts must be a non-empty list of Verdict")
    if any(p.verdict not in RULE_VERDICTS for p in parts):
        raise ValueError("combine takes rule verdicts only, not 'measured', 'not testable here' or an "
                         "implementation check")
    kinds = {p.verdict for p in parts}
    reason = "; ".join(f"{p.rule}: {p.verdict} ({p.reason})" for p in parts)
    if kinds == {"reproduced"}:
        return Verdict("reproduced", "combine", reason)
    if kinds == {"inconclusive"}:
        return Verdict("inconclusive", "combine", reason)
    if kinds <= {"not reproduced", "inconclusive"}:
        return Verdict("not reproduced", "combine", reason)
    return Verdict("partly", "combine", reason)


def chain(parts: Sequence[Verdict]) -> Verdict:
    """Merge the verdicts of a claim whose parts are links of one argument ("A, which causes B; hence C"): every
    link is necessary, so one link the data exclude excludes the claim.

    Any part not reproduced -> not reproduced; all reproduced -> reproduced; all inconclusive -> inconclusive;
    anything else -> partly.
    """
    merged = combine(parts)
    if any(p.verdict == "not reproduced" for p in parts) and merged.verdict != "not reproduced":
        return Verdict("not reproduced", "chain", f"a necessary link is not reproduced; {merged.reason}")
    return Verdict(merged.verdict, "chain", merged.reason)


def implementation_check(check: Verdict, why: str) -> Verdict:
    """A statement no data can contradict (a theorem, an identity of a construction), checked by a rule.

    Args:
        check: the rule's verdict on the statement (e.g. :func:`identity` or :func:`bound`).
        why: why the statement cannot fail (e.g. "Jensen's inequality", "the transform is built to satisfy it").

    Returns ``implementation check`` when the rule reproduced it (evidence that kvstats computes it right, not
    for the paper), ``check failed`` otherwise (a defect of kvstats or of its sampling, never a refutation).
    """
    if not isinstance(check, Verdict) or check.verdict not in RULE_VERDICTS:
        raise TypeError(f"check must be a rule's Verdict (identity, bound, ...), got {check!r}")
    if not isinstance(why, str) or not why.strip():
        raise ValueError(f"why must be a non-empty string, got {why!r}")
    label = "implementation check" if check.verdict == "reproduced" else "check failed"
    return Verdict(label, "implementation check",
                   f"holds by {why.strip()}: {check.rule} {check.verdict} ({check.reason})")


def measured(reason: str) -> Verdict:
    """Our own measurement, with no published counterpart (claims whose source is kvstats only)."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"reason must be a non-empty string, got {reason!r}")
    return Verdict("measured", "measured", reason)


def not_testable(reason: str) -> Verdict:
    """A published claim this project cannot test, and why (e.g. a benchmark needing a model we lack)."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"reason must be a non-empty string, got {reason!r}")
    return Verdict("not testable here", "not testable", reason)
