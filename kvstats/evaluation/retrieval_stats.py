"""Statistics of retrieval trials (pass/fail per needle, paired across the caches that read the same prompts):
accuracies with Wilson intervals, exact McNemar tests with Holm, equivalence (TOST) on Newcombe's paired interval,
and the plan that says before a run whether its trials can conclude.

A trials table has one row per (cache, needle): the columns :data:`TRIAL` identify the needle (every cache sees the
same ones), ``scheme`` and ``n`` the cache, ``success`` the outcome, ``attn_kl`` and ``bits_per_element`` what the
cache measured (nan where it measured nothing: the fp model).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from kvstats.measure.stats import mcnemar, proportion_ci

__all__ = ["TRIAL", "accuracy_table", "equivalence_trials", "mcnemar_row", "min_discordant", "outcomes",
           "tests_table", "verdict"]

TRIAL = ["task", "length", "prompt", "needle"]


def accuracy_table(trials: pd.DataFrame, by: list[str], *, confidence_level: float = 0.95) -> pd.DataFrame:
    """Accuracy per group of ``by`` with its Wilson interval, the mean attention KL and bits per element."""
    rows = []
    for key, g in trials.groupby(by, sort=False):
        r = proportion_ci(g["success"].to_numpy(), confidence_level=confidence_level)
        rows.append({**dict(zip(by, key)), "passed": r.successes, "trials": r.n, "accuracy": r.statistic,
                     "ci_low": r.confidence_interval.low, "ci_high": r.confidence_interval.high,
                     "attn_kl": float(g["attn_kl"].mean()), "bits_per_element": float(g["bits_per_element"].mean())})
    return pd.DataFrame(rows)


def outcomes(trials: pd.DataFrame, scheme: str, n) -> pd.Series:
    """The outcomes of cache (``scheme``, ``n``), indexed by the trial (:data:`TRIAL`)."""
    sel = trials[(trials["scheme"] == scheme) & (trials["n"] == n)]
    return sel.set_index(TRIAL)["success"]


def mcnemar_row(trials: pd.DataFrame, a: tuple[str, int], b: tuple[str, int], *,
                confidence_level: float = 0.95) -> dict | None:
    """Exact McNemar of cache ``a`` = (scheme, n) against ``b`` on the trials both ran (None when none): the
    accuracies, the difference p_a − p_b with Newcombe's paired interval at ``confidence_level``, the discordant
    counts and p (:func:`kvstats.stats.mcnemar`)."""
    x, y = outcomes(trials, *a), outcomes(trials, *b)
    x, y = x.align(y, join="inner")
    if x.empty:
        return None
    r = mcnemar(x.to_numpy(), y.to_numpy(), confidence_level=confidence_level)
    (n11, n10), (n01, n00) = r.table
    return {"trials": r.n, "accuracy_a": r.proportions[0], "accuracy_b": r.proportions[1],
            "difference": r.effect_size, "diff_low": r.confidence_interval.low, "diff_high": r.confidence_interval.high,
            "a_only": n10, "b_only": n01, "p": r.pvalue}


def tests_table(trials: pd.DataFrame, pairs: list[tuple[tuple[str, int], tuple[str, int]]], *,
                alpha: float = 0.05) -> pd.DataFrame:
    """Exact McNemar of each pair in ``pairs`` per task pooled over its lengths (``length = "all"``: the primary
    family, Holm over every task and pair) and per (task, length) (Holm within each (task, length)); ``p_holm`` and
    ``significant`` (p_holm < ``alpha``) per row."""
    def family(rows: list[dict]) -> list[dict]:
        if rows:
            holm = multipletests([r["p"] for r in rows], method="holm")[1]
            for r, h in zip(rows, holm):
                r["p_holm"], r["significant"] = float(h), bool(h < alpha)
        return rows

    def rows_of(g: pd.DataFrame, task: str, length) -> list[dict]:
        return [{"task": task, "length": str(length), "a": a[0], "n_a": a[1], "b": b[0], "n_b": b[1], **r}
                for a, b in pairs if (r := mcnemar_row(g, a, b)) is not None]

    primary = family([r for task, g in trials.groupby("task", sort=False) for r in rows_of(g, task, "all")])
    per_length = [r for (task, length), g in trials.groupby(["task", "length"], sort=False)
                  for r in family(rows_of(g, task, length))]
    return pd.DataFrame(primary + per_length)


def equivalence_trials(margin: float, *, alpha: float = 0.05, power: float = 0.8, discordance: float = 0.1) -> int:
    """Paired trials a TOST at ``alpha`` needs to conclude |p_a − p_b| < ``margin`` with probability ``power`` when
    the two caches are equally accurate and disagree on a fraction ``discordance`` of the trials: the normal
    approximation for paired proportions at a true difference of 0 (Liu, Hsueh, Hsieh and Chen 2002, Stat. Med.
    21:231), n = (z₁₋α + z₁₋β/₂)² · π_d / δ², rounded up. The interval the analysis uses (Newcombe's) is slightly
    wider than the Wald interval this assumes: a plan, not a guarantee."""
    for name, value, low, high in (("margin", margin, 0.0, 1.0), ("alpha", alpha, 0.0, 0.5),
                                   ("power", power, 0.0, 1.0), ("discordance", discordance, 0.0, 1.0)):
        if not (isinstance(value, (int, float)) and low < value < high):
            raise ValueError(f"{name} must be in ({low:g}, {high:g}), got {value!r}")
    z = sps.norm.ppf(1 - alpha) + sps.norm.ppf(1 - (1 - power) / 2)
    return int(math.ceil(z * z * discordance / margin ** 2))


def min_discordant(alpha: float, family: int) -> int:
    """The fewest discordant pairs with which an exact McNemar test can reach p < ``alpha`` / ``family`` (Holm's
    first threshold): every one in one direction gives p = 2 · 2⁻ᵇ, so b > log₂(2 · family / alpha)."""
    if not 0 < alpha < 1 or family < 1:
        raise ValueError(f"alpha must be in (0, 1) and family at least 1, got {alpha!r} and {family!r}")
    return int(math.floor(math.log2(2 * family / alpha))) + 1


def verdict(test: dict, margin: float) -> str:
    """One word for a pooled comparison row (its p_holm and its (1 − 2α) interval ``eq_low``, ``eq_high``):
    "worse"/"better" when McNemar rejects after Holm, "equivalent" when the TOST interval lies inside ±margin,
    else "undecided"."""
    if test["significant"]:
        return "worse" if test["difference"] < 0 else "better"
    if np.isfinite(test["eq_low"]) and -margin < test["eq_low"] and test["eq_high"] < margin:
        return "equivalent"
    return "undecided"
