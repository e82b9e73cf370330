"""All pairwise comparisons of a table: Mann–Whitney or Wilcoxon per pair, Holm and BH."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from kvstats.measure.stats._mann_whitney import mann_whitney
from kvstats.measure.stats._power import detectable_shift, signed_rank_shift_se
from kvstats.measure.stats._wilcoxon import wilcoxon


def _columns(value, name: str) -> list[str]:
    """A column name or a list of them -> list (a bare string is one column, never its letters)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        out = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a column name or a list of column names, got {value!r}") from None
    if not all(isinstance(c, str) for c in out):
        raise TypeError(f"{name} must be a column name or a list of column names, got {value!r}")
    return out


_UNPAIRED_COLUMNS = ["level_a", "level_b", "n_a", "n_b", "u1", "p", "p_method", "p_exact", "p_asymptotic", "p_holm",
                     "p_bh", "p_adj", "rank_biserial", "r_z", "hl_shift", "hl_ci_low", "hl_ci_high", "median_a",
                     "median_b", "median_ratio"]
_PAIRED_COLUMNS = ["level_a", "level_b", "n_pairs", "n_zero", "w_plus", "w_minus", "p", "p_method", "p_holm", "p_bh",
                   "p_adj", "rank_biserial", "rb_ci_low", "rb_ci_high", "median_difference", "median_a", "median_b",
                   "median_ratio", "sd_difference", "shift_se", "detectable_shift"]


def _paired_levels(cell: pd.DataFrame, by: str, levels, metrics: list[str], pair: list[str]) -> dict:
    """Per level of ``by`` in ``cell``: its rows' ``metrics`` indexed by the ``pair`` columns (split once per cell,
    not once per metric and pair of levels); a level whose key repeats raises."""
    out = {}
    for level in levels:
        part = cell.loc[cell[by] == level, pair + metrics]
        dup = part.duplicated(pair)
        if dup.any():
            raise ValueError(f"paired_by {pair} does not identify a unit: level {level!r} has "
                             f"{int(dup.sum())} repeated key(s), e.g. {part.loc[dup, pair].iloc[0].tolist()}")
        out[level] = part.set_index(pair)
    return out


def _paired_values(by_level: dict, la, lb, metric: str):
    """The metric of levels la and lb matched on their index (inner join), as two aligned arrays."""
    a, b = by_level[la][metric].align(by_level[lb][metric], join="inner")
    return a.to_numpy(dtype=np.float64), b.to_numpy(dtype=np.float64)


def _identical_pairs(x: np.ndarray) -> dict:
    """The paired row of two levels equal on every one of their units: no difference to rank, p = 1 (as McNemar's
    with no discordant pair), r = 0 with the point as its interval."""
    median = float(np.median(x))
    return {"n_pairs": x.size, "n_zero": x.size, "w_plus": 0.0, "w_minus": 0.0, "p": 1.0,
            "p_method": "none: equal on every unit", "rank_biserial": 0.0, "rb_ci_low": 0.0, "rb_ci_high": 0.0,
            "median_difference": 0.0, "median_a": median, "median_b": median,
            "median_ratio": 1.0 if median != 0 else float("nan")}


def compare(
    table: pd.DataFrame,
    metric: str | Sequence[str],
    by: str,
    within: str | Sequence[str] | None = None,
    correction: str = "holm",
    *,
    alternative: str = "two-sided",
    levels: Sequence | None = None,
    family: str = "all",
    confidence_level: float = 0.95,
    paired_by: str | Sequence[str] | None = None,
    n_resamples: int = 1999,
    seed: int = 0,
    detectable_alpha: float = 0.05,
) -> pd.DataFrame:
    """All pairwise comparisons of the levels of ``by``, per metric, within each cell of ``within``.

    For every metric of ``metric`` (a column name or a list), every cell (a combination of the ``within``
    columns, a name or a list; the whole table when None) and every pair of levels ``(A, B)`` of ``by`` (in
    the order of ``levels``, default sorted; A before B), runs

    * unpaired (``paired_by=None``, independent samples): ``mann_whitney(metric | A, metric | B)``;
    * paired (``paired_by`` = the column(s) naming the unit both levels were measured on, e.g. "seed" or
      ["seed", "query"]): rows of A and B are matched on that key (units present in both only) and
      ``wilcoxon(metric | A, metric | B)`` tests the differences, with the rank-biserial CI from
      ``n_resamples`` paired bootstrap resamples (``seed``); two levels equal on every shared unit (pass/fail
      outcomes often are) get p = 1, r = 0 and ``p_method`` "none: equal on every unit" (no evidence of a
      difference, as McNemar's test without discordant pairs) rather than the signed-rank test's refusal.

    Pairs where either group is empty (or no unit is shared) are skipped.

    Multiple testing: ONE correction over a family of tests. ``family="all"`` (default): every row returned,
    all metrics together; ``"metric"``: within each metric; ``"cell"``: within each metric × cell. Holm
    (``p_holm``) and Benjamini–Hochberg (``p_bh``) through ``statsmodels.stats.multitest.multipletests``;
    ``p_adj`` repeats the one named by ``correction`` (any multipletests method name).

    Returns:
        Tidy DataFrame: the ``within`` columns, ``metric``, then unpaired: ``level_a``, ``level_b``,
        ``n_a``, ``n_b``, ``u1``, ``p`` (raw), ``p_method``, ``p_exact``, ``p_asymptotic``, ``p_holm``,
        ``p_bh``, ``p_adj``, ``rank_biserial``, ``r_z``, ``hl_shift``, ``hl_ci_low``, ``hl_ci_high``,
        ``median_a``, ``median_b``, ``median_ratio``; paired: ``level_a``, ``level_b``, ``n_pairs``,
        ``n_zero``, ``w_plus``, ``w_minus``, ``p``, ``p_method``, ``p_holm``, ``p_bh``, ``p_adj``,
        ``rank_biserial`` (matched pairs, positive when A is larger), ``rb_ci_low``, ``rb_ci_high``,
        ``median_difference`` (of A − B), ``median_a``, ``median_b``, ``median_ratio``, ``sd_difference`` (sd of
        A − B over the pairs, ddof 1; nan for one pair), ``shift_se`` (the standard error of the paired Hodges–Lehmann
        shift, :func:`kvstats.stats.signed_rank_shift_se`: what the signed-rank test's sample size is planned on),
        ``detectable_shift``:
        the mean difference A − B the Wilcoxon test on these pairs detects with 80% power at
        ``detectable_alpha / m`` (m the size of the row's correction family; :func:`kvstats.stats.detectable_shift`,
        inf where no p can reach that level), the minimum detectable effect to read beside a non-significant row.
    """
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a pandas.DataFrame, got {type(table).__name__}")
    metrics = _columns(metric, "metric")
    within = _columns(within, "within")
    pair = _columns(paired_by, "paired_by")
    if not metrics:
        raise ValueError("metric must name at least one column, got an empty list")
    if not isinstance(by, str):
        raise TypeError(f"by must be one column name, got {by!r}")
    for col, name in [(m, "metric") for m in metrics] + [(by, "by")] + [(w, "within") for w in within] + \
            [(c, "paired_by") for c in pair]:
        if col not in table.columns:
            raise ValueError(f"{name} column {col!r} is not in table (columns: {list(table.columns)})")
    if family not in ("all", "metric", "cell"):
        raise ValueError(f"family must be 'all', 'metric' or 'cell', got {family!r}")
    if isinstance(detectable_alpha, bool) or not isinstance(detectable_alpha, (int, float)) \
            or not 0.0 < float(detectable_alpha) < 0.5:
        raise ValueError(f"detectable_alpha must be in (0, 0.5), got {detectable_alpha!r}")
    if levels is None:
        levels = sorted(table[by].dropna().unique().tolist())
    levels = list(levels)
    columns = within + ["metric"] + (_PAIRED_COLUMNS if pair else _UNPAIRED_COLUMNS)
    rows, differences = [], []
    cells = list(table.groupby(within, sort=True, dropna=False)) if within else [((), table)]
    cells = [(k if isinstance(k, tuple) else (k,), c) for k, c in cells]
    split = {k: _paired_levels(c, by, levels, metrics, pair) for k, c in cells} if pair else {}
    for m in metrics:
        for key, cell in cells:
            for la, lb in itertools.combinations(levels, 2):
                head = dict(zip(within, key)) | {"metric": m, "level_a": la, "level_b": lb, "_family": (m, key)}
                if pair:
                    xa, xb = _paired_values(split[key], la, lb, m)
                    if xa.size == 0:
                        continue
                    if np.array_equal(xa, xb):  # equal on every unit (pass/fail outcomes often are): no evidence
                        rows.append(head | _identical_pairs(xa))
                        differences.append(xa - xb)
                        continue
                    w = wilcoxon(xa, xb, alternative=alternative, confidence_level=confidence_level,
                                 n_resamples=n_resamples, seed=seed)
                    rows.append(head | {
                        "n_pairs": w.n_pairs, "n_zero": w.n_zero, "w_plus": w.w_plus, "w_minus": w.w_minus,
                        "p": w.pvalue, "p_method": w.pvalue_method, "rank_biserial": w.rank_biserial,
                        "rb_ci_low": w.confidence_interval[0], "rb_ci_high": w.confidence_interval[1],
                        "median_difference": w.median_difference, "median_a": w.median_a, "median_b": w.median_b,
                        "median_ratio": w.median_ratio})
                    differences.append(xa - xb)
                    continue
                xa = cell.loc[cell[by] == la, m].to_numpy(dtype=np.float64)
                xb = cell.loc[cell[by] == lb, m].to_numpy(dtype=np.float64)
                if xa.size == 0 or xb.size == 0:
                    continue
                r = mann_whitney(xa, xb, alternative=alternative, confidence_level=confidence_level)
                rows.append(head | {
                    "n_a": xa.size, "n_b": xb.size, "u1": r.u1, "p": r.pvalue,
                    "p_method": r.pvalue_method, "p_exact": r.p_exact, "p_asymptotic": r.p_asymptotic,
                    "rank_biserial": r.rank_biserial, "r_z": r.r_z, "hl_shift": r.hl_shift,
                    "hl_ci_low": r.confidence_interval[0], "hl_ci_high": r.confidence_interval[1],
                    "median_a": r.median_a, "median_b": r.median_b, "median_ratio": r.median_ratio})
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=columns)
    if family == "all":
        groups = [np.arange(len(out))]
    else:
        labels = out["_family"].map(lambda f: f[0] if family == "metric" else f)
        groups = [np.flatnonzero(labels.map(lambda x, k=k: x == k).to_numpy()) for k in dict.fromkeys(labels)]
    for col, how in (("p_holm", "holm"), ("p_bh", "fdr_bh"), ("p_adj", correction)):
        adjusted = np.empty(len(out))
        for idx in groups:
            adjusted[idx] = multipletests(out["p"].to_numpy()[idx], method=how)[1]
        out[col] = adjusted
    if pair:
        shift = np.empty(len(out))
        out["sd_difference"] = [float(np.std(d, ddof=1)) if d.size >= 2 else math.nan for d in differences]
        out["shift_se"] = [signed_rank_shift_se(d) if d.size >= 2 else math.nan for d in differences]
        for idx in groups:
            for i in idx:
                d = differences[i]  # no spread: detectable_shift says inf itself; one pair: no test to size
                shift[i] = math.inf if d.size < 2 else \
                    detectable_shift(d, alpha=detectable_alpha / len(idx)).extra["shift"]
        out["detectable_shift"] = shift
    return out[columns]
