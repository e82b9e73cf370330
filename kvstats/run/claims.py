"""Claims as typed records: one row of the report, checked when it is made, not after the fact.

    Claim(id="lloyd-max-gaussian-table",
          claim="Max (1960): the b-bit Lloyd–Max quantizer of N(0, 1) has MSE 0.3634, ...",
          source="Max 1960, IRE Trans. Inform. Theory IT-6, table I",
          measurement="exact solver: b=1: 0.363380, ...",
          data="Newton-solved Lloyd–Max codebooks",
          verdict=verdicts.identity(...))          # a kvstats.verdicts.Verdict: computed by a rule

A :class:`Claim` refuses, at construction, a missing or empty text, a verdict that no rule computed
(a bare string), ``measured`` for a published claim and an unknown optional field, with the same messages
:func:`kvstats.report.validate_claim` gives for a dict (it is that check). :func:`kvstats.report.write_claims`
takes Claims (and, for the studies not yet moved to the protocol, dicts). :func:`measurement` joins the
parts of a measurement sentence from short templates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from kvstats.measure.verdicts import Verdict

__all__ = ["Claim", "measurement", "listing"]


@dataclass(frozen=True)
class Claim:
    """A published (or our own, ``source="kvstats"``) statement beside what kvstats measured.

    Attributes:
        id: unique within the study (kebab-case). claim: the statement, with its numbers as printed.
        source: where it is stated (arXiv id, section, equation; "kvstats" for our own measurement).
        measurement: what kvstats measured, one sentence of numbers. data: what it was measured on.
        verdict: a :class:`kvstats.verdicts.Verdict` (its verdict, rule and reason are stored).
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
        from kvstats.run.report import validate_claim

        if not isinstance(self.verdict, Verdict):
            raise TypeError(f"claim {self.id!r}: verdict must be a kvstats.verdicts.Verdict (computed by a rule), "
                            f"got {type(self.verdict).__name__} {self.verdict!r}")
        validate_claim(self.to_dict(), f"claim {self.id!r}", strict=True)

    def to_dict(self) -> dict[str, Any]:
        """The claim as :func:`kvstats.report.validate_claim` reads it (the verdict as its Verdict)."""
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
