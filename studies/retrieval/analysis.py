"""retrieval's analysis: accuracies with Wilson intervals, exact McNemar tests on the same trials (Holm within each
family), the paired differences' Newcombe intervals for the equivalence claim, NOVA-KV's recovered fraction, and the
:class:`Analysis` the figures and claims read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from kvstats.evaluation.retrieval_stats import accuracy_table, mcnemar_row, outcomes
from kvstats.hf.models import SMOLLM2
from kvstats.measure.stats import cluster_bootstrap_ci
from kvstats.studies.retrieval import cells
from kvstats.studies.retrieval.cells import ALPHA, BASELINE, FP, FP_BITS, SCALE, STUDY
from kvstats.study.models import ModelAnalysis
from kvstats.study.sweep import cell_seed

#: the per-element ("scalar") methods NOVA-KV's claim compares with: KIVI-style min-max, quanto's int codes, a
#: Lloyd codebook per coordinate and TurboQuant_mse (a codebook per coordinate after a rotation)
SCALAR = ("minmax", BASELINE, "kv", "mse")
#: scheme pairs tested against each other at each n (besides every scheme against the fp model)
PAIRS = (("nova", "minmax"), ("nova", "mse"), ("nova", "kv"), ("nova", BASELINE), ("kqv", "qkqv"), ("kqv", "mse"))
NOVA_BITS = 2


def _mcnemar_row(trials: pd.DataFrame, a: str, b: str, n: int, level: float = 0.95) -> dict | None:
    """Exact McNemar of scheme ``a`` against ``b`` at budget ``n`` (the fp model at its own row's n):
    :func:`kvstats.evaluation.retrieval_stats.mcnemar_row` with the schemes and n named."""
    r = mcnemar_row(trials, (a, FP_BITS if a == FP else n), (b, FP_BITS if b == FP else n), confidence_level=level)
    return None if r is None else {"a": a, "b": b, "n": n, **r}


def tests_table(trials: pd.DataFrame, bits: tuple, schemes: tuple | None = None) -> pd.DataFrame:
    """Exact McNemar per (task, length) and pooled over lengths ("all"): every scheme (``schemes``, default the
    cells' :data:`~kvstats.studies.retrieval.cells.SCHEMES`, then transformers' cache) against the fp model
    (``family = "vs fp"``) and the :data:`PAIRS` (``"between"``), Holm within each (task, length, family)."""
    rows = []
    schemes = [s for s in (*(cells.SCHEMES if schemes is None else schemes), BASELINE) if s in set(trials["scheme"])]
    for task, tt in trials.groupby("task", sort=False):
        for length, g in [*tt.groupby("length"), ("all", tt)]:
            for family, pairs in (("vs fp", [(s, FP) for s in schemes]), ("between", PAIRS)):
                part = [r for n in bits for a, b in pairs if (r := _mcnemar_row(g, a, b, n)) is not None]
                if not part:
                    continue
                holm = multipletests([r["p"] for r in part], method="holm")[1]
                rows += [{"task": task, "length": str(length), "family": family, **r, "p_holm": float(h)}
                         for r, h in zip(part, holm)]
    return pd.DataFrame(rows)


def equivalence_rows(trials: pd.DataFrame, scheme: str, n: int) -> list[dict]:
    """Per task, the paired difference scheme − fp with Newcombe's 90% interval: TOST at α = 0.05 (margin δ)."""
    out = []
    for task, g in trials.groupby("task", sort=False):
        r = _mcnemar_row(g, scheme, FP, n, level=1 - 2 * ALPHA)
        if r is not None:
            out.append({"task": task, **r})
    return out


def formats_tests(trials: pd.DataFrame, formats: tuple[tuple[str, int], ...]) -> pd.DataFrame:
    """Exact McNemar pooled over lengths, per task: each deployed format (spec, n) against the fp model
    (``family = "formats vs fp"``) and against transformers' quantized cache at the same n where it ran
    (``"formats vs quanto"``), Holm within each (task, family)."""
    rows = []
    for task, g in trials.groupby("task", sort=False):
        for family, other in (("formats vs fp", FP), (f"formats vs {BASELINE}", BASELINE)):
            part = [r for spec, n in formats if (r := _mcnemar_row(g, spec, other, n)) is not None]
            if part:
                holm = multipletests([r["p"] for r in part], method="holm")[1]
                rows += [{"task": task, "length": "all", "family": family, **r, "p_holm": float(h)}
                         for r, h in zip(part, holm)]
    return pd.DataFrame(rows)


@dataclass(frozen=True, eq=False)
class Analysis(ModelAnalysis):
    """The trials (one row per scheme, n and needle), the accuracies (per task, length, scheme, n; per task
    pooled over lengths; per task, length and depth) and the McNemar tests of one model; ``schemes``, the kvstats
    schemes the cells ran (:data:`~kvstats.studies.retrieval.cells.SCHEMES`, as the run read it); ``cfg`` the scale's
    with the model's tasks (:func:`~kvstats.studies.retrieval.cells.model_tasks`); ``baseline_refused`` why
    transformers' quantized cache did not run on the model (empty when it ran); ``others``: another model's
    Analysis, ``missing``: {model: why it did not run} (SmolLM2's analysis holds them)."""

    cfg: dict
    scale: str
    schemes: tuple[str, ...]
    trials: pd.DataFrame
    accuracy: pd.DataFrame
    pooled: pd.DataFrame
    grid: pd.DataFrame
    tests: pd.DataFrame
    formats: tuple[tuple[str, int], ...] = ()  # the deployed formats' (spec, n) the formats sweep ran
    baseline_refused: str = ""
    study = STUDY


def analyse(trials: pd.DataFrame, scale: str, formats: pd.DataFrame | None = None, *, model: str = SMOLLM2,
            others: dict | None = None, missing: dict | None = None) -> Analysis:
    """One model's trials of the schemes (and the formats sweep's, on the same prompts: ``formats``) ->
    :class:`Analysis`; the formats' McNemar tests (:func:`formats_tests`) follow the schemes' in ``tests``."""
    cfg, schemes = {**SCALE[scale], "tasks": cells.model_tasks(SCALE[scale], model)}, tuple(cells.SCHEMES)
    refused = ""
    if "baseline_refused" in trials:
        reasons = sorted(set(trials["baseline_refused"].dropna()) - {""})
        refused = "; ".join(reasons)
        trials = trials.drop(columns=["baseline_refused"])
    ran: tuple = ()
    if formats is not None and len(formats):
        trials = pd.concat([trials, formats], ignore_index=True)
        ran = tuple(dict.fromkeys((s, int(n)) for s, n in zip(formats["scheme"], formats["n"])))
    trials = trials.assign(success=trials["success"].astype(bool))
    tests = tests_table(trials, cfg["bits"], schemes)
    if ran:
        tests = pd.concat([tests, formats_tests(trials, ran)], ignore_index=True)
    return Analysis(cfg, scale, schemes, trials, accuracy_table(trials, ["task", "length", "scheme", "n"]),
                    accuracy_table(trials, ["task", "scheme", "n"]),
                    accuracy_table(trials, ["task", "length", "depth", "scheme", "n"]), tests, ran, refused,
                    model=model, others=dict(others or {}), missing=dict(missing or {}))


def compact_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The trial table as committed: the cells' own parameters dropped (which budgets, calibration or formats a cell
    ran: each row's scheme and n say it), the attention KL rounded to 6 significant digits; every test of the
    study recomputes from it."""
    out = trials.drop(columns=[c for c in ("bits", "calibration_tokens", "formats") if c in trials])
    if "attn_kl" in out:
        out["attn_kl"] = out["attn_kl"].map(lambda x: float(f"{x:.6g}") if pd.notna(x) else x)
    return out


def _recovered(rows: np.ndarray) -> float:
    """(accuracy of column 1 − of column 2) / (of column 0 − of column 2): the share of what the scalar method
    (column 2) loses against fp (column 0) that NOVA-KV (column 1) recovers; nan where nothing is lost."""
    fp, nova, scalar = rows.mean(axis=0)
    return float((nova - scalar) / (fp - scalar)) if fp > scalar else float("nan")


def recovered_fraction(trials: pd.DataFrame, scalar: str) -> tuple[float, tuple[float, float]]:
    """NOVA-KV's recovered fraction at 2 bits over every trial, with a cluster bootstrap CI over prompts (a prompt's
    needles share its text): the estimate and (low, high), nan when some resample loses nothing."""
    cols = [outcomes(trials, name, FP_BITS if name == FP else NOVA_BITS) for name in (FP, "nova", scalar)]
    table = pd.concat(cols, axis=1, join="inner").astype(float)
    prompts = [key[:3] for key in table.index]  # (task, length, prompt)
    units = [row[None, :] for row in table.to_numpy()]
    estimate = _recovered(table.to_numpy())
    if not np.isfinite(estimate) or len(set(prompts)) < 3:
        return estimate, (float("nan"), float("nan"))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = cluster_bootstrap_ci(units, _recovered, clusters=prompts, n_resamples=1999, method="percentile",
                                 seed=cell_seed(STUDY, "recovered", scalar))
    return estimate, tuple(r.confidence_interval)
