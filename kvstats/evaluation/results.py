"""What an evaluation returns: :class:`Evaluation` (its table, strict JSON, save), the warning of a comparison that
cannot conclude, and the footnotes every comparison table prints (the model evaluation's too)."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvstats.evaluation.units import METRICS
from kvstats.study.strict_json import strict_json

__all__ = ["DEFAULT_SYNTHETIC_UNITS", "DEFAULT_WINDOW", "Evaluation", "InconclusiveWarning", "JsonResults", "SCHEMA",
           "comparison_footnotes"]

#: Version of the results file's layout.
SCHEMA = "kvstats-evaluation/2"
#: Synthetic units by default: enough for a family of 8 Wilcoxon tests to reach p < 0.05 after Holm
#: (8 · 2/2¹⁶ = 2.4e-4), i.e. the documented comparisons can conclude.
DEFAULT_SYNTHETIC_UNITS = 16
#: Tokens of a capture unit by default: a default capture (1,024 tokens) gives 16 disjoint windows.
DEFAULT_WINDOW = 64
#: ``config["inference_units"]`` of a capture of one text: its windows are the units.
ONE_TEXT = "windows of one text"


class InconclusiveWarning(UserWarning):
    """A comparison that cannot reach its level whatever the data (too few units for the family)."""


# ------------------------------------------------------------------------------------------------ the result

class JsonResults:
    """``to_json`` and ``save`` of a results class that has ``to_dict()`` (strict-JSON-ready)."""

    def to_json(self) -> str:
        """:meth:`to_dict` as strict JSON (``allow_nan=False``: every standard parser reads it)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """Write :meth:`to_json` to ``path`` without destroying anything (:mod:`kvstats._files`: an existing file
        needs ``force``); returns the path."""
        from kvstats._files import check_output_path, write_output

        path = check_output_path(path, "path", force=force)
        return write_output(path, self.to_json().encode("utf-8"))


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` measured.

    Attributes:
        config: how it ran (quantizer, compare, bits of both sides, data, units, seeds, options, whether the
            conformance checks ran).
        units: one dict per unit: ``unit``, every metric of :data:`METRICS`, ``bits_claimed``, and
            ``other:<metric>`` for the compared scheme.
        summary: ``{metric: MeanResult}``, the mean over units with its CI (:func:`kvstats.stats.mean_ci`).
        comparison: ``{metric: {"test": WilcoxonResult, "pvalue_holm": float, "significant": bool,
            "detectable_shift": PowerResult or None}}`` for the family's metrics, when ``compare`` was given.
        excluded: ``{metric: reason}`` for the metrics left out of the family.
        plan: the :class:`~kvstats.evaluation.comparison.ComparisonPlan` made before running, for the family the
            comparison could have at most (None without compare).
        family_plan: the same for the family actually tested (constant and repeated metrics left out).
        bits: measured and claimed bits per element of each side, and whether the sides match.
        provenance: versions, commit, device, threads, date, wall time, command line, seeds.
    """

    config: dict[str, Any]
    units: list[dict[str, float]]
    summary: dict[str, Any]
    comparison: dict[str, Any] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    plan: Any = None
    family_plan: Any = None
    bits: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    #: the results file's ``schema``
    schema = SCHEMA

    def _summary_dict(self) -> dict[str, Any]:
        return {m: r.to_dict() for m, r in self.summary.items()}

    def to_dict(self) -> dict[str, Any]:
        """The results file's content: strict-JSON-ready (no NaN or inf: null, with ``null_reasons``)."""
        comparison = {m: {"test": c["test"].to_dict(), "pvalue_holm": c["pvalue_holm"],
                          "significant": c["significant"],
                          "detectable_shift": None if c["detectable_shift"] is None else
                          c["detectable_shift"].to_dict()} for m, c in self.comparison.items()}
        return strict_json({"schema": self.schema, "config": self.config, "bits": self.bits,
                            "plan": None if self.plan is None else {"before_running": self.plan.to_dict(),
                                                                    "family_tested": self.family_plan.to_dict()},
                            "units": self.units, "summary": self._summary_dict(), "comparison": comparison,
                            "excluded": self.excluded, "provenance": self.provenance})

    def to_json(self) -> str:
        """:meth:`to_dict` as strict JSON (``allow_nan=False``: every standard parser reads it)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """Write :meth:`to_json` to ``path`` without destroying anything (:mod:`kvstats._files`): an existing file
        needs ``force``, the input capture is refused, a device or FIFO is written through; returns the path."""
        from kvstats._files import check_output_path, write_output

        path = check_output_path(path, "path", force=force, inputs=self.config.get("inputs", ()))
        return write_output(path, self.to_json().encode("utf-8"))

    def table(self) -> str:
        """A plain-text table: each metric's mean and CI over units, and the paired comparison when present. The
        two sides are A (the evaluated quantizer) and B (the compared one), named in full above the table."""
        from kvstats.evaluation.comparison import per_document, shift_text
        from kvstats.measure.stats import interval_text

        cfg = self.config
        first = next(iter(self.summary.values()))
        me, other = cfg["quantizer"], cfg["compare"]
        by_document = str(cfg.get("inference_units", "")).startswith("documents")
        units = per_document(self.units, METRICS) if by_document else self.units
        width = max(18, *(len(m) for m in self.summary))
        head = f"{'metric':<{width}} {'A mean':>11} {f'{first.confidence_level:.0%} CI of A':>25}"
        if other is not None:
            head += f" {'B mean':>11} {'r':>7} {'p (Holm)':>9} {'detectable':>10}"
        bits = self.bits
        count = (f"{len(units)} documents, {len(self.units)} windows" if by_document else f"{len(self.units)} units")
        lines = [f"A = {me} at {cfg['bits']} bits on {cfg['data']} ({count}: {cfg['unit']})"]
        if cfg.get("inference_units") == ONE_TEXT:
            lines += textwrap.wrap(one_text_note(len(self.units)), 110, initial_indent="  ", subsequent_indent="    ")
        lines.append(_bits_line("A", me, bits["evaluated"]))
        if other is not None:
            lines.append(_bits_line("B", other, bits["compared"]))
            if not bits["matched"]:
                lines += textwrap.wrap(unmatched_note(bits), 110, initial_indent="  ", subsequent_indent="    ")
        lines += [head, "-" * len(head)]
        for m, r in self.summary.items():
            row = f"{m:<{width}} {r.statistic:>11.4g} {interval_text(r):>25}"
            if other is not None:
                row += f" {float(np.mean([u[f'other:{m}'] for u in units])):>11.4g}"
                if m in self.comparison:
                    c = self.comparison[m]
                    mark = "*" if c["significant"] else " "
                    row += (f" {c['test'].effect_size:>7.3f} {c['pvalue_holm']:>8.2g}{mark}"
                            f" {shift_text(c['detectable_shift']):>10}")
            lines.append(row)
        if other is not None:
            lines += comparison_footnotes(self, "A", "B")
        return "\n".join(lines)


def one_text_note(n: int) -> str:
    """What the statistics over ``n`` windows of one text describe (a capture of a single document)."""
    return (f"! the {n} units are windows of one text: they are not independent draws; the intervals and p-values "
            "describe this text, not texts in general (capture several documents into one file, kvstats capture "
            "--text a.txt b.txt ..., to generalise: its documents become the units)")


def _bits_line(letter: str, name: str, b: dict) -> str:
    claimed = b.get("claimed")
    claim = "" if claimed is None or abs(claimed - b["measured"]) <= 1e-9 * max(1.0, b["measured"]) else \
        f"; it claims {claimed:.4g} (bits_per_coordinate)"
    return f"  {letter} = {name}: budget n = {b['budget']}, {b['measured']:.4g} bits per element held (measured){claim}"


def unmatched_note(bits: dict) -> str:
    """Why the two sides hold different bits: without bit matching, how to ask for it; with it, the budgets the
    comparator was measured at (none holds the evaluated side's bits or fewer, or none holds them exactly)."""
    a, b = bits["evaluated"]["measured"], bits["compared"]["measured"]
    tried = bits["compared"].get("budgets_measured")
    if tried is None:
        return (f"! the sides hold different bits per element ({a:.4g} vs {b:.4g}): the comparison is not bit-matched "
                "(match_bits=True, --match-bits, runs the comparator at its largest budget that holds no more bits)")
    listed = ", ".join(f"n = {n}: {v:.4g}" for n, v in tried.items())
    why = ("none of its budgets holds that many or fewer, so it ran at its smallest" if b > a else
           "its largest budget that holds no more is below A's")
    return (f"! the sides hold different bits per element ({a:.4g} vs {b:.4g}) although bit matching was asked "
            f"for: {why} (B's budgets on unit 0, bits per element: {listed})")


def comparison_footnotes(ev, me: str, other: str) -> list[str]:
    """What the comparison columns mean (r's sign, p's correction, the detectable shift, what blank means)."""
    family = len(ev.comparison)
    notes = [f"r: matched-pairs rank-biserial of {me} − {other} over the units (−1: {me} lower in every unit, +1: "
             f"higher); p: paired Wilcoxon signed-rank, Holm-corrected over the {family} metric(s) tested, * below "
             f"alpha = {ev.config['alpha']:g}; detectable: the mean difference the test would find with 80% power "
             "at this many units (non-significant rows; 'none': no difference can be significant here)."]
    by_reason: dict[str, list[str]] = {}
    for m, why in ev.excluded.items():
        by_reason.setdefault(why, []).append(m)
    if by_reason:
        notes.append("blank r/p: " + "; ".join(f"{', '.join(ms)} — {why}" for why, ms in by_reason.items()) + ".")
    if ev.family_plan is not None and not ev.family_plan.can_conclude:
        notes.append("! " + ev.family_plan.message() + ".")
    return [line for note in notes for line in textwrap.wrap(note, 110, subsequent_indent="  ")]
