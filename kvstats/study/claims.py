"""Claims as typed records: one row of the report, checked when it is made, not after the fact.

    Claim(id="lloyd-max-gaussian-table",
          claim="Max (1960): the b-bit Lloyd–Max quantizer of N(0, 1) has MSE 0.3634, ...",
          source="Max 1960, IRE Trans. Inform. Theory IT-6, table I",
          measurement="exact solver: b=1: 0.363380, ...",
          data="Newton-solved Lloyd–Max codebooks",
          verdict=verdicts.identity(...))          # a kvstats.measure.verdicts.Verdict: computed by a rule

A :class:`Claim` refuses, at construction, a missing or empty text, a verdict that no rule computed
(a bare string), ``measured`` for a published claim and an unknown optional field, with the same messages
:func:`validate_claim` gives for a dict (it is that check). :func:`kvstats.study.report.write_claims` takes Claims
(and, for the studies not yet moved to the protocol, dicts). :func:`measurement` joins the
parts of a measurement sentence from short templates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kvstats.measure import verdicts as _verdicts
from kvstats.measure.verdicts import Verdict
from kvstats.study.sweep import SCALES

__all__ = ["CLAIM_KEYS", "Claim", "SampleSize", "VERDICTS", "fmt_p", "listing", "measurement", "validate_claim"]

#: Keys of a claim object; all but ``details``, ``scale``, ``position``, ``discrepancy``, ``rule``, ``reason``,
#: ``code`` (the fingerprint of the code that computed it, :mod:`kvstats.study.fingerprint`) and ``sample`` (its
#: sample size planned by power, :class:`SampleSize`) are required.
CLAIM_KEYS = ("id", "claim", "source", "measurement", "data", "verdict", "figure", "details", "scale", "position",
              "discrepancy", "rule", "reason", "code", "sample")
_REQUIRED = CLAIM_KEYS[:-8]
#: Allowed verdicts (:data:`kvstats.measure.verdicts.VERDICTS`). ``measured``: our own measurement (source kvstats).
VERDICTS = _verdicts.VERDICTS


@dataclass(frozen=True)
class SampleSize:
    """A claim's sample size planned by power (issue 50): the n its test needs to reach each verdict with
    ``power`` for the effect of interest, the n it got, and the smallest effect detectable with that power there.

    Attributes:
        test: the test the verdict rests on ("exact McNemar test", "paired TOST", ...).
        effect: the effect of interest (or margin) the plan is for, in words with its number.
        planned_n, achieved_n: the planned and the achieved sample size (in ``unit``), ≥ 1.
        mde: the minimum detectable effect at ``achieved_n`` (of ``mde_of``), or None where no effect reaches
            ``power`` at that n.
        mde_of: what ``mde`` measures ("p_a − p_b", "|Δ| shown equivalent", ...).
        power: the target power of the plan, in (0, 1). unit: what n counts ("trials", "documents", ...).
    """

    test: str
    effect: str
    planned_n: int
    achieved_n: int
    mde: float | None
    mde_of: str
    power: float = 0.8
    unit: str = "trials"

    def __post_init__(self):
        _check_sample(asdict(self), "SampleSize")

    @classmethod
    def from_plan(cls, plan, *, effect: str, mde_of: str, unit: str = "trials") -> SampleSize:
        """From a :class:`kvstats.measure.stats.SamplePlan` made with ``n_achieved`` (its planned n, target power,
        test, and MDE there)."""
        if getattr(plan, "n_achieved", None) is None:
            raise ValueError("plan must be made with n_achieved= (the sample size the claim got), got none")
        mde = float(plan.mde_achieved)
        return cls(test=plan.test, effect=effect, planned_n=int(plan.n_planned), achieved_n=int(plan.n_achieved),
                   mde=None if math.isnan(mde) else mde, mde_of=mde_of, power=float(plan.target_power), unit=unit)

    @property
    def under_powered(self) -> bool:
        """Whether the claim got fewer than its test needs."""
        return self.achieved_n < self.planned_n


def _check_sample(sample: Any, where: str) -> dict[str, Any] | str:
    """A claim's ``sample`` as a dict of :class:`SampleSize`'s fields, or the reason no sample size applies (a
    non-empty string, e.g. :data:`kvstats.study.sample_plans.EXACT`), checked (ValueError/TypeError naming the
    field and the value)."""
    if isinstance(sample, str):
        if not sample.strip():
            raise ValueError(f"{where} must be a SampleSize or a non-empty reason, got {sample!r}")
        return sample
    if isinstance(sample, SampleSize):
        sample = asdict(sample)
    if not isinstance(sample, Mapping):
        raise TypeError(f"{where} must be a SampleSize, a dict of its fields or a reason string, got "
                        f"{type(sample).__name__}")
    fields = ("test", "effect", "planned_n", "achieved_n", "mde", "mde_of", "power", "unit")
    if set(sample) != set(fields):
        raise ValueError(f"{where} must have exactly the fields {list(fields)}, got {sorted(sample)}")
    for key in ("test", "effect", "mde_of", "unit"):
        if not isinstance(sample[key], str) or not sample[key].strip():
            raise ValueError(f"{where}[{key!r}] must be a non-empty string, got {sample[key]!r}")
    for key in ("planned_n", "achieved_n"):
        value = sample[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}[{key!r}] must be an int >= 1, got {value!r}")
    mde, power = sample["mde"], sample["power"]
    if mde is not None and (isinstance(mde, bool) or not isinstance(mde, (int, float)) or not math.isfinite(mde)):
        raise ValueError(f"{where}['mde'] must be a finite number or None, got {mde!r}")
    if isinstance(power, bool) or not isinstance(power, (int, float)) or not 0 < power < 1:
        raise ValueError(f"{where}['power'] must be in (0, 1), got {power!r}")
    return dict(sample)


@dataclass(frozen=True)
class Claim:
    """A published (or our own, ``source="kvstats"``) statement beside what kvstats measured.

    Attributes:
        id: unique within the study (kebab-case). claim: the statement, with its numbers as printed.
        source: where it is stated (arXiv id, section, equation; "kvstats" for our own measurement).
        measurement: what kvstats measured, one sentence of numbers. data: what it was measured on.
        verdict: a :class:`kvstats.measure.verdicts.Verdict` (its verdict, rule and reason are stored).
        figure: the figure file that shows it, or None. details: a longer note, or None.
        discrepancy: where the paper's number and the verified math disagree, or None.
        sample: its sample size planned by power (:class:`SampleSize`; :mod:`kvstats.study.sample_plans` builds it
            from the claim's test), the reason none applies (a string, e.g. values computed without sampling), or
            None.
    """

    id: str
    claim: str
    source: str
    measurement: str
    data: str
    verdict: Verdict
    figure: str | None = None
    details: str | None = None
    discrepancy: str | None = None
    sample: SampleSize | str | None = None

    def __post_init__(self):
        if not isinstance(self.verdict, Verdict):
            raise TypeError(f"claim {self.id!r}: verdict must be a kvstats.measure.verdicts.Verdict (computed by a "
                            f"rule), got {type(self.verdict).__name__} {self.verdict!r}")
        validate_claim(self.to_dict(), f"claim {self.id!r}", strict=True)

    def to_dict(self) -> dict[str, Any]:
        """The claim as :func:`validate_claim` reads it (the verdict as its Verdict)."""
        record = asdict(self)
        record["verdict"] = self.verdict  # asdict would turn the Verdict into a plain dict
        return record


def listing(values: Iterable[tuple[Any, float]], template: str, *, sep: str = ", ") -> str:
    """``template`` formatted for each (key, value), joined: ``listing(ks.items(), "d = {}: {:.4f}")``."""
    return sep.join(template.format(k, v) for k, v in values)


def measurement(*parts: str, sep: str = "; ", end: str = ".") -> str:
    """One measurement sentence from its parts: the non-empty parts joined by ``sep``, ending in ``end``."""
    text = sep.join(p for p in parts if p)
    return text if text.endswith(end) else text + end


def validate_claim(claim: Mapping[str, Any], where: str = "claim", *, strict: bool = False) -> dict[str, Any]:
    """Check one claim object; return it as a plain dict with the optional keys filled in (None when absent).

    ``claim["verdict"]`` may be a :class:`kvstats.measure.verdicts.Verdict`: its verdict, rule and reason are stored.
    With ``strict`` (what :func:`write_claims` uses) the verdict must come from a rule: a bare verdict string
    is refused. ``measured`` is for the project's own measurements only (source ``"kvstats"``).

    Raises ValueError/TypeError naming the key and the value seen.
    """
    if not isinstance(claim, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(claim).__name__}")
    if isinstance(claim.get("verdict"), _verdicts.Verdict):
        v = claim["verdict"]
        claim = {**claim, "verdict": v.verdict, "rule": v.rule, "reason": v.reason}
    missing = [k for k in _REQUIRED if k not in claim]
    if missing:
        raise ValueError(f"{where} lacks the key(s) {missing} (required: {list(_REQUIRED)})")
    unknown = sorted(set(claim) - set(CLAIM_KEYS))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown} (allowed: {list(CLAIM_KEYS)})")
    out = {k: claim.get(k) for k in CLAIM_KEYS}
    for key in ("id", "claim", "source", "measurement", "data"):
        if not isinstance(out[key], str) or not out[key].strip():
            raise ValueError(f"{where}[{key!r}] must be a non-empty string, got {out[key]!r}")
    if out["verdict"] not in VERDICTS:
        raise ValueError(f"{where}['verdict'] must be one of {list(VERDICTS)}, got {out['verdict']!r}")
    if out["verdict"] == "measured" and out["source"] != "kvstats":
        raise ValueError(f"{where}: a published claim (source {out['source']!r}) needs a verdict by a rule "
                         "(kvstats.measure.verdicts), not 'measured'")
    if strict and (out["rule"] is None or out["reason"] is None):
        raise ValueError(f"{where}['verdict'] must be a kvstats.measure.verdicts.Verdict (computed by a rule, with its "
                         f"reason), got the bare string {out['verdict']!r}")
    for key in ("figure", "details", "discrepancy", "rule", "reason", "code"):
        if out[key] is not None and not isinstance(out[key], str):
            raise TypeError(f"{where}[{key!r}] must be a string or None, got {type(out[key]).__name__}")
    if out["sample"] is not None:
        out["sample"] = _check_sample(out["sample"], f"{where}['sample']")
    if out["scale"] is not None and out["scale"] not in SCALES:
        raise ValueError(f"{where}['scale'] must be one of {list(SCALES)} or None, got {out['scale']!r}")
    _check_position(out["position"], f"{where}['position']")
    return out


def _check_position(position: Any, where: str) -> None:
    if position is not None and (isinstance(position, bool) or not isinstance(position, int)):
        raise TypeError(f"{where} must be an int or None, got {position!r}")


def fmt_p(p: float) -> str:
    """A p-value for text: ``p = 0.031``, ``p = 2.1e-08``, ``p < 1e-300`` (underflow)."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "p = n/a"
    if p == 0.0:
        return "p < 1e-300"
    return f"p = {p:.2g}" if p >= 1e-3 else f"p = {p:.1e}"
