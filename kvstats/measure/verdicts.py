"""Verdict rules: how a measurement is held to a published claim.

Every verdict in ``figures/REPORT.md`` is computed by one of the rules below, never written by hand. A
claim is of one of four kinds, and each kind has one rule:

==================  =====================================================================================
kind                rule
==================  =====================================================================================
direction           the claim states a direction and no number ("A's KL is lower than B's"). Each cell
                    (data set, budget, ...) is *for* the claim when a test rejects the null in the claimed
                    direction at level ``alpha``, *against* when it rejects it in the other direction,
                    *inconclusive* otherwise. reproduced: for in every cell; not reproduced: for in none;
                    partly: for in some.
number              the claim states a number ("2.25× lower"). reproduced: the published value lies in our
                    CI, or within a declared relative tolerance ``rtol``·|published| of it (the same for
                    every entry of a table, so a coarsely printed number gains no slack: the printed
                    digits are never the tolerance); partly: it does not, but the direction holds (the
                    CI excludes the null value on the claimed side); not reproduced: the direction fails
                    too. Where the quantity has an exact value, the CI is that value ((v, v)), and whether
                    the printed number is the exact value rounded to its printed digits is stated
                    separately (:func:`rounding`).
bound               the claim states a bound ("≤ 1 ± 3ε", "at most D"). reproduced: every cell's estimate
                    is within the bound; not reproduced: some cell's CI lies wholly outside it (a
                    significant violation); partly: some estimate lies outside but not significantly.
identity            the claim states an exact value or identity (a closed form). reproduced: every value
                    within ``atol + rtol·|expected|``; not reproduced: none; partly: some.
equivalence         the claim states "no worse than δ" / "quality-neutral" (an equivalence, with a declared
                    margin δ). Each cell's (1 − 2α) CI of the difference (the TOST interval,
                    :func:`kvstats.stats.equivalence`): *equivalent* when it lies inside (−δ, δ),
                    *different* when it lies wholly outside, *inconclusive* otherwise. reproduced: every
                    cell equivalent; not reproduced: some cell different; partly: otherwise.
==================  =====================================================================================

Further outcomes are not rules but labels, each with its reason: ``measured`` (our own measurement,
allowed only for claims whose source is kvstats), ``not testable here`` (e.g. a benchmark that needs
a model or data set this project cannot obtain) and ``implementation check`` (a published statement that
holds by a theorem or by construction, e.g. Jensen's inequality or an identity of the transform: no data
can contradict it, so agreeing with it is evidence for kvstats' code, not for the paper;
:func:`implementation_check` wraps the rule that checked it and reads ``check failed`` when it did not hold).
:func:`combine` merges the verdicts of a claim's parts: all reproduced gives reproduced, all not reproduced
gives not reproduced, anything else partly.

Each rule returns a :class:`Verdict` whose ``reason`` is generated from the numbers it was given, so the
report's text can never say more than the rule checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = [
    "KINDS",
    "VERDICTS",
    "Verdict",
    "bound",
    "cell_direction",
    "combine",
    "direction",
    "equivalence",
    "identity",
    "implementation_check",
    "measured",
    "not_testable",
    "number",
    "printed_half_unit",
    "rounding",
]

#: Every verdict the report knows, in the order of its summary line.
VERDICTS = ("reproduced", "partly", "not reproduced", "measured", "not testable here", "implementation check",
            "check failed")
#: The claim kinds that have a rule.
KINDS = ("direction", "number", "bound", "identity", "equivalence")


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


def _finite(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    return float(x)


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
    """One cell of a direction claim: +1 for (significant in the claimed direction), -1 against, 0 neither.

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
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    e = _finite(effect, "effect")
    if p >= alpha or e == 0.0:
        return 0
    return 1 if math.copysign(1.0, e) == expected_sign else -1


def direction(cells: Sequence[int], *, what: str = "cells") -> Verdict:
    """The direction rule over cells scored by :func:`cell_direction` (+1 for, 0 inconclusive, -1 against)."""
    cells = list(cells)
    if not cells:
        raise ValueError("cells must hold at least one cell")
    bad = [c for c in cells if c not in (-1, 0, 1)]
    if bad:
        raise ValueError(f"cells must be +1, 0 or -1 (from cell_direction), got {bad[0]!r}")
    n, pro, con = len(cells), cells.count(1), cells.count(-1)
    reason = (f"the claimed direction is significant in {_of_total(pro, n, what)}"
              + (f", the opposite direction in {con}" if con else ""))
    if pro == n:
        return Verdict("reproduced", "direction", reason)
    if pro == 0:
        return Verdict("not reproduced", "direction", reason)
    return Verdict("partly", "direction", reason)


def number(published: float, ci, *, null: float, expected_sign: int, rtol: float = 0.0,
           estimate: float | None = None) -> Verdict:
    """The number rule: does the published value meet our CI, and does the direction hold?

    Args:
        published: the paper's number (e.g. a ratio 2.25).
        ci: our (low, high) confidence interval for the same quantity ((v, v) for an exact value v).
        null: the value meaning "no effect" (1 for a ratio, 0 for a difference).
        expected_sign: +1 when the claim says the quantity exceeds ``null``, -1 when below.
        rtol: declared relative tolerance: the published value meets the CI when its distance to it is at
            most ``rtol·|published|`` (0: it must lie inside). Never derived from the printed digits.
        estimate: our point estimate, quoted in the reason when given.
    """
    published = _finite(published, "published")
    lo, hi = _interval(ci, "ci")
    null = _finite(null, "null")
    _check_sign(expected_sign)
    rtol = _finite(rtol, "rtol")
    if not 0.0 <= rtol < 1.0:
        raise ValueError(f"rtol must be in [0, 1), got {rtol!r}")
    est = "" if estimate is None else f"{_finite(estimate, 'estimate'):.4g} "
    gap = max(lo - published, published - hi, 0.0)
    inside = gap <= rtol * abs(published)
    direction_holds = lo > null if expected_sign > 0 else hi < null
    ours = f"{est}[{lo:.4g}, {hi:.4g}]" if lo < hi else f"{lo:.5g}"
    where = (f"published {published:g} {'inside' if inside else 'outside'} our {ours}"
             + (f" (tolerance {rtol:.0%} of the published value; off by {gap / abs(published):.1%})"
                if rtol and published else ""))
    side = "above" if expected_sign > 0 else "below"
    holds = f"the CI {'lies' if direction_holds else 'does not lie'} wholly {side} {null:g}"
    if inside and direction_holds:
        return Verdict("reproduced", "number", f"{where}; {holds}")
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
          what: str = "cells") -> Verdict:
    """The bound rule: ``estimates[i]`` (with ``cis[i]``) against a claimed upper (or lower) ``limit``."""
    estimates = [_finite(e, f"estimates[{i}]") for i, e in enumerate(estimates)]
    cis = [_interval(c, f"cis[{i}]") for i, c in enumerate(cis)]
    if not estimates or len(estimates) != len(cis):
        raise ValueError(f"estimates and cis must be non-empty and of one length, got {len(estimates)} and {len(cis)}")
    limit = _finite(limit, "limit")
    sign = 1.0 if upper else -1.0
    outside = [i for i, e in enumerate(estimates) if sign * (e - limit) > 0]
    significant = [i for i in outside if sign * ((cis[i][0] if upper else cis[i][1]) - limit) > 0]
    n = len(estimates)
    kind = "upper" if upper else "lower"
    reason = (f"{_of_total(n - len(outside), n, what)} within the {kind} bound {limit:.4g}"
              + (f"; {len(significant)} significantly outside" if significant else ""))
    if not outside:
        return Verdict("reproduced", "bound", reason)
    if significant:
        return Verdict("not reproduced", "bound", reason)
    return Verdict("partly", "bound", reason)


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


def equivalence(cis: Sequence, margin: float, *, what: str = "cells") -> Verdict:
    """The equivalence rule: each cell's (1 − 2α) CI of the difference (a − b) against the margin (−δ, δ).

    ``cis[i]`` is the TOST interval of cell i (:func:`kvstats.stats.equivalence`'s ``confidence_interval``):
    inside (−δ, δ) is TOST's rejection at α (equivalent within δ); wholly outside is a difference larger than
    δ at that level."""
    cis = [_interval(c, f"cis[{i}]") for i, c in enumerate(cis)]
    if not cis:
        raise ValueError("cis must hold at least one interval")
    delta = _finite(margin, "margin")
    if delta <= 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    inside = [i for i, (lo, hi) in enumerate(cis) if -delta < lo and hi < delta]
    outside = [i for i, (lo, hi) in enumerate(cis) if hi <= -delta or lo >= delta]
    n = len(cis)
    reason = (f"{_of_total(len(inside), n, what)} equivalent within ±{delta:g} (CI inside the margin)"
              + (f"; {len(outside)} different by more than the margin" if outside else ""))
    if len(inside) == n:
        return Verdict("reproduced", "equivalence", reason)
    if outside:
        return Verdict("not reproduced", "equivalence", reason)
    return Verdict("partly", "equivalence", reason)


def combine(parts: Sequence[Verdict]) -> Verdict:
    """Merge the verdicts of a claim's parts: all reproduced -> reproduced, all not -> not, else partly."""
    parts = list(parts)
    if not parts or not all(isinstance(p, Verdict) for p in parts):
        raise TypeError("parts must be a non-empty list of Verdict")
    if any(p.verdict in ("measured", "not testable here", "implementation check", "check failed") for p in parts):
        raise ValueError("combine takes rule verdicts only, not 'measured', 'not testable here' or an "
                         "implementation check")
    kinds = [p.verdict for p in parts]
    reason = "; ".join(f"{p.rule}: {p.verdict} ({p.reason})" for p in parts)
    if all(k == "reproduced" for k in kinds):
        return Verdict("reproduced", "combine", reason)
    if all(k == "not reproduced" for k in kinds):
        return Verdict("not reproduced", "combine", reason)
    return Verdict("partly", "combine", reason)


def implementation_check(check: Verdict, why: str) -> Verdict:
    """A statement no data can contradict (a theorem, an identity of a construction), checked by a rule.

    Args:
        check: the rule's verdict on the statement (e.g. :func:`identity` or :func:`bound`).
        why: why the statement cannot fail (e.g. "Jensen's inequality", "the transform is built to satisfy it").

    Returns ``implementation check`` when the rule reproduced it (evidence that kvstats computes it right, not
    for the paper), ``check failed`` otherwise (a defect of kvstats or of its sampling, never a refutation).
    """
    if not isinstance(check, Verdict) or check.verdict in ("measured", "not testable here", "implementation check",
                                                           "check failed"):
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
