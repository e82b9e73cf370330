"""Which methods a metric tells apart at one budget: paired tests over shared units, Holm, a compact letter display.

    groups = significance_groups(units, "next_token_kl", by="method", paired_by="document", bits="bits",
                                 budget=4.5, tolerance=0.25)
    groups.table        # method, units, mean, CI, bits held, grouped, letters, note
    print(groups.markdown())

The letters are Piepho's insert-and-absorb compact letter display (H.-P. Piepho, "An algorithm for a letter-based
representation of all-pairwise comparisons", J. Comput. Graph. Stat. 13(2):456–466, 2004): two methods share a
letter exactly when their paired test, Holm-corrected over every pair of the table, is not significant.
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvstats.measure.stats._bootstrap import mean_ci
from kvstats.measure.stats._compare import compare

__all__ = ["SignificanceGroups", "compact_letters", "significance_groups"]

#: the letters of the display, in order (26 lower case, then 26 upper case)
LETTERS = string.ascii_lowercase + string.ascii_uppercase


def compact_letters(methods: Sequence[Hashable], significant: Iterable[tuple[Hashable, Hashable]]) -> dict:
    """A compact letter display: ``{method: letters}`` such that two methods share a letter exactly when the pair is
    not in ``significant``.

    Piepho's insert-and-absorb (2004, §3): start from one column holding every method; for each significant pair
    (i, j), every column holding both is replaced by two, one without i and one without j; after each pair, columns
    that are a subset of another are absorbed. A non-significant pair keeps a column holding both (a split removes
    only a member of a significant pair), a significant pair keeps none. Columns are lettered in the order of
    ``methods`` (the best first: the first method's columns get the first letters), each method's letters sorted.

    Args:
        methods: the methods, best first (the order of the letters); each once.
        significant: pairs (a, b) of methods whose difference is significant.
    """
    methods = list(methods)
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods must name each method once, got {methods}")
    rank = {m: i for i, m in enumerate(methods)}
    pairs = []
    for pair in significant:
        a, b = pair
        for m in (a, b):
            if m not in rank:
                raise ValueError(f"significant pair {pair!r} names {m!r}, which is not among methods {methods}")
        if a == b:
            raise ValueError(f"significant pair {pair!r} pairs a method with itself")
        pairs.append((a, b))
    columns = [frozenset(methods)] if methods else []
    for a, b in sorted(pairs, key=lambda p: sorted((rank[p[0]], rank[p[1]]))):
        split = []
        for column in columns:
            split += [column - {a}, column - {b}] if a in column and b in column else [column]
        columns = _absorb(split)
    if len(columns) > len(LETTERS):
        raise ValueError(f"the display needs {len(columns)} letters, more than the {len(LETTERS)} it has")
    columns.sort(key=lambda c: sorted(rank[m] for m in c))
    return {m: "".join(LETTERS[i] for i, c in enumerate(columns) if m in c) for m in methods}


def _absorb(columns: list[frozenset]) -> list[frozenset]:
    """The columns that are not a subset of another (one of equal columns kept), in their order."""
    kept: list[frozenset] = []
    for i, c in enumerate(columns):
        if any(c < o or (c == o and j < i) for j, o in enumerate(columns)):
            continue
        kept.append(c)
    return kept


@dataclass
class SignificanceGroups:
    """Result of :func:`significance_groups`.

    ``table``: one row per method, best mean first: ``method``, ``units``, ``mean``, ``ci_low``, ``ci_high``,
    ``ci_method``, ``bits`` (mean bits per element held; nan without a bits column), ``grouped`` (whether it was
    tested: within ``tolerance`` of ``budget``), ``letters`` (the compact letter display; "" when not grouped) and
    ``note``. ``pairs``: :func:`kvstats.stats.compare`'s paired rows among the grouped methods, with ``significant``
    (``p_adj < alpha``).
    """

    metric: str
    budget: float | None
    tolerance: float | None
    alpha: float
    correction: str
    lower_is_better: bool
    table: pd.DataFrame
    pairs: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def distinguishable(self, a, b) -> bool | None:
        """Whether methods a and b were found significantly different (None: the pair was not tested)."""
        row = self.pairs[((self.pairs.level_a == a) & (self.pairs.level_b == b))
                         | ((self.pairs.level_a == b) & (self.pairs.level_b == a))]
        return None if row.empty else bool(row.significant.iloc[0])

    def markdown(self, digits: int = 4) -> str:
        """The table as Markdown: methods sharing a letter are not significantly different; then the notes."""
        def num(x: float) -> str:
            return "–" if not math.isfinite(x) else f"{x:.{digits}g}"

        lines = [f"| method | bits held | {self.metric} (mean) | 95% CI | units | group |",
                 "|---|---:|---:|---|---:|---|"]
        for r in self.table.itertuples():
            ci = "no interval" if r.ci_low == r.ci_high else f"[{num(r.ci_low)}, {num(r.ci_high)}]"
            group = r.letters if r.grouped else f"not grouped: {r.note}"
            lines.append(f"| {r.method} | {num(r.bits)} | {num(r.mean)} | {ci} | {r.units} | {group} |")
        return "\n".join(lines + [""] + [f"- {n}" for n in self.notes])


def _check(table, metric, by, paired_by, bits, budget, tolerance, alpha) -> None:
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a pandas.DataFrame, got {type(table).__name__}")
    for name, col in (("metric", metric), ("by", by), ("paired_by", paired_by)) + ((("bits", bits),) if bits else ()):
        if not isinstance(col, str) or col not in table.columns:
            raise ValueError(f"{name} must name a column of table ({list(table.columns)}), got {col!r}")
    if (budget is None) != (tolerance is None):
        raise ValueError(f"budget and tolerance go together (the band of bits a grouped method holds), got "
                         f"budget={budget!r}, tolerance={tolerance!r}")
    if budget is not None:
        if bits is None:
            raise ValueError("budget needs bits= (the column of bits per element each unit's codes held)")
        for name, v in (("budget", budget), ("tolerance", tolerance)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0 (bits per element), got {v!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if table.empty:
        raise ValueError("table has no rows: there is no method to group")
    values = table[metric].to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"metric column {metric!r} holds {int((~np.isfinite(values)).sum())} non-finite value(s)")


def _summary_rows(table, metric, by, bits, budget, tolerance, confidence_level, n_resamples, seed) -> list[dict]:
    rows = []
    for method, part in table.groupby(by, sort=False):
        x = part[metric].to_numpy(dtype=np.float64)
        held = float(part[bits].mean()) if bits else math.nan
        grouped = budget is None or abs(held - budget) <= tolerance
        if x.size >= 2:
            m = mean_ci(x, confidence_level, n_resamples=n_resamples, seed=seed)
            mean, (low, high), how = m.statistic, m.confidence_interval, m.ci_method
        else:
            mean, low, high, how = float(x.mean()), math.nan, math.nan, "no interval (one unit)"
        note = "" if grouped else "bits held not measured" if math.isnan(held) else \
            f"holds {held:.4g} bits per element, outside {budget:g} ± {tolerance:g}"
        rows.append({"method": method, "units": int(x.size), "mean": mean, "ci_low": low, "ci_high": high,
                     "ci_method": how, "bits": held, "grouped": grouped, "letters": "", "note": note})
    return rows


def significance_groups(
    table: pd.DataFrame,
    metric: str,
    by: str,
    paired_by: str,
    *,
    bits: str | None = None,
    budget: float | None = None,
    tolerance: float | None = None,
    alpha: float = 0.05,
    correction: str = "holm",
    lower_is_better: bool = True,
    confidence_level: float = 0.95,
    n_resamples: int = 1999,
    seed: int = 0,
) -> SignificanceGroups:
    """Which methods (levels of ``by``) the ``metric`` tells apart, measured on the same units (``paired_by``).

    Per method: the mean over its units with :func:`kvstats.stats.mean_ci`'s interval and, with ``bits`` (a column of
    the bits per element each unit's codes held), the mean bits held. With ``budget`` and ``tolerance`` only the
    methods holding budget ± tolerance bits are grouped: comparing methods at unequal bits would credit a method
    with bits it spends; the others are listed, marked "not grouped" with the bits they hold.

    Every pair of grouped methods gets the paired Wilcoxon signed-rank test over the units both were measured on
    (:func:`kvstats.stats.compare` with ``paired_by``), ``correction`` (Holm) over all those pairs; a pair is
    significant when its corrected p < ``alpha``. Methods are ordered best first (lowest mean when
    ``lower_is_better``) and lettered by :func:`compact_letters`: methods that share a letter are not significantly
    different. ``notes`` says when no pair could be significant at this many units (the smallest p the exact test
    can give, times the pairs, is not below alpha): the letters then say "undecided", not "equal".

    Args:
        table: tidy units, one row per method and unit.
        metric, by, paired_by, bits: column names.
        budget, tolerance: the band of bits per element a grouped method holds (both or neither).
        alpha, correction: level and multiple-testing method (any ``statsmodels`` ``multipletests`` name).
        lower_is_better: the metric's direction (KL: True; top-1 agreement, accuracy: False).
        confidence_level, n_resamples, seed: the per-method interval (and compare's rank-biserial interval).
    """
    _check(table, metric, by, paired_by, bits, budget, tolerance, alpha)
    rows = _summary_rows(table, metric, by, bits, budget, tolerance, confidence_level, n_resamples, seed)
    sign = 1.0 if lower_is_better else -1.0
    rows.sort(key=lambda r: (not r["grouped"], sign * r["mean"], str(r["method"])))
    grouped = [r["method"] for r in rows if r["grouped"]]
    notes = []
    pairs = pd.DataFrame()
    if len(grouped) >= 2:
        inside = table[table[by].isin(grouped)]
        pairs = compare(inside, metric, by, paired_by=paired_by, correction=correction, levels=grouped,
                        family="metric", confidence_level=confidence_level, n_resamples=n_resamples, seed=seed,
                        detectable_alpha=alpha)
        pairs["significant"] = pairs["p_adj"] < alpha
        missing = [p for p in itertools.combinations(grouped, 2)
                   if not ((pairs.level_a == p[0]) & (pairs.level_b == p[1])).any()]
        if missing:
            raise ValueError(f"paired_by {paired_by!r}: the methods {missing[0]} share no unit, so they cannot be "
                             "compared pair by pair; measure every method on the same units")
        if np.isinf(pairs["detectable_shift"]).all():
            notes.append(f"no pair can be significant at {int(pairs['n_pairs'].min())} shared units and "
                         f"{len(pairs)} pairs (alpha = {alpha:g}, {correction}): shared letters here mean undecided, "
                         "not equal")
        letters = compact_letters(grouped, [(r.level_a, r.level_b) for r in pairs.itertuples() if r.significant])
        for r in rows:
            r["letters"] = letters.get(r["method"], "")
    elif len(grouped) == 1:
        rows[0]["letters"] = "a"
        notes.append("one method within the band: nothing to compare")
    if budget is not None and len(grouped) < len(rows):
        notes.append(f"grouped: the methods holding {budget:g} ± {tolerance:g} bits per element (measured); the others "
                     "are not compared with them")
    return SignificanceGroups(metric, budget, tolerance, float(alpha), correction, bool(lower_is_better),
                              pd.DataFrame(rows), pairs, notes)
