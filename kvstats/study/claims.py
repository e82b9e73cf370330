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

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kvstats.measure import verdicts as _verdicts
from kvstats.measure.verdicts import Verdict
from kvstats.study.sweep import SCALES

__all__ = ["CLAIM_KEYS", "Claim", "VERDICTS", "listing", "measurement", "validate_claim"]

#: Keys of a claim object; all but ``details``, ``scale``, ``position``, ``discrepancy``, ``rule``, ``reason`` and
#: ``code`` (the fingerprint of the code that computed it, :mod:`kvstats.study.fingerprint`) are required.
CLAIM_KEYS = ("id", "claim", "source", "measurement", "data", "verdict", "figure", "details", "scale", "position",
              "discrepancy", "rule", "reason", "code")
_REQUIRED = CLAIM_KEYS[:-7]
#: Allowed verdicts (:data:`kvstats.measure.verdicts.VERDICTS`). ``measured``: our own measurement (source kvstats).
VERDICTS = _verdicts.VERDICTS


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
    if out["scale"] is not None and out["scale"] not in SCALES:
        raise ValueError(f"{where}['scale'] must be one of {list(SCALES)} or None, got {out['scale']!r}")
    _check_position(out["position"], f"{where}['position']")
    return out


def _check_position(position: Any, where: str) -> None:
    if position is not None and (isinstance(position, bool) or not isinstance(position, int)):
        raise TypeError(f"{where} must be an int or None, got {position!r}")
