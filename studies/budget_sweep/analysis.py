"""The analysis of the trial table: the paired Wilcoxon table (Holm per sketch), the KL ratios with
their bootstrap CIs and the paper's Mann–Whitney, the crossover, the 6D energy tests, the
super-linear fit of KL on the K direction error, and the CSVs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvstats.measure.error6d import distance_6d, energy_test
from kvstats.measure.stats import (
    cluster_bootstrap_ci,
    compare,
    mann_whitney,
    ols_slope,
    ratio_ci,
    wilcoxon,
)
from kvstats.studies.budget_sweep.cells import (
    ALPHA,
    BUDGETS,
    E6,
    METRICS,
    NO_SKETCH,
    PRIMARY_QUERIES,
    QUERY_MODELS,
    SCALE,
    SCHEMES,
    SENSITIVITY_BUDGETS,
    SENSITIVITY_SKETCHES,
    SKETCH,
    STUDY,
    SYNTHETIC,
    real_windows,
)
from kvstats.study import plots
from kvstats.study.sweep import cell_seed

#: the label prefix of each real data set's rows
REAL_LABELS = {"smollm2": "SmolLM2", "gemma3": "Gemma3"}


def data_label(row) -> str:
    if row["data"] in REAL_LABELS:
        return f"{REAL_LABELS[row['data']]} layer {int(row['layer'])}"
    return row["data"] if row["queries"] == PRIMARY_QUERIES else f"{row['data']} (isotropic q)"


def add_d6(table: pd.DataFrame) -> pd.DataFrame:
    """Column ``distance_6d``: kvstats.error6d.distance_6d per trial, ‖e / m‖ over the six components, m = the
    component's median over the primary configuration's trials (every scheme, QJL stages with the srht
    sketch) of the same data, query model and n: each component weighs alike, one scale for every scheme and
    sketch."""
    comps = list(E6)
    primary = table[table["sketch"].isin([SKETCH, NO_SKETCH])] if "sketch" in table else table
    med = primary.groupby(["label", "n"])[comps].median().clip(lower=1e-30)
    m = med.loc[pd.MultiIndex.from_frame(table[["label", "n"]])].to_numpy()
    table["distance_6d"] = distance_6d(table[comps], m)
    return table


def view(table: pd.DataFrame, sketch: str) -> pd.DataFrame:
    """The rows of one configuration: QJL schemes with ``sketch``, and kv and minmax (no sketch)."""
    return table[table["sketch"].isin([sketch, NO_SKETCH])]


def paired_family_size(cfg: dict, sketch: str = SKETCH) -> int:
    """Rows of :func:`paired_table` in one sketch's Holm family: per data label and metric, KQV vs each other
    scheme at every budget (the paper's sketch), or vs QKQV and KV at the sensitivity budgets (each other)."""
    labels = len(SYNTHETIC) * len(QUERY_MODELS) + len(cfg["layers"])
    per_label = (len(SCHEMES) - 1) * len(BUDGETS) if sketch == SKETCH else 2 * len(SENSITIVITY_BUDGETS)
    return labels * len(METRICS) * per_label


def paired_table(table: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """Paired Wilcoxon tests (over trials) of KQV against each other scheme, per sketch, data label and n;
    Holm within each sketch's tests (one family per sketch: the paper's sketch, which decides every verdict, is
    not diluted by the sensitivity rows, and each sensitivity sketch is corrected on its own). Beside each test
    its minimum detectable mean difference at α/m, m the size of the same family."""
    from statsmodels.stats.multitest import multipletests

    parts = []
    for sketch in (SKETCH, *SENSITIVITY_SKETCHES):
        sub = view(table, sketch)
        others = [o for o in SCHEMES[1:] if sketch == SKETCH or o != "minmax"]  # sensitivity: vs QKQV and KV
        sizes = {o: len(METRICS) * int((sub[sub["scheme"].isin(["kqv", o])].groupby(["label", "n"])["scheme"]
                                        .nunique() == 2).sum()) for o in others}
        family = sum(sizes.values())
        for other in others:
            if not sizes[other]:
                continue
            pair = sub[sub["scheme"].isin(["kqv", other])]
            # compare's detectable shift is at detectable_alpha / (its own rows): scaled to ALPHA / family
            parts.append(compare(pair, list(METRICS), "scheme", within=["label", "n"], levels=["kqv", other],
                                 paired_by="trial", n_resamples=resamples,
                                 detectable_alpha=ALPHA * sizes[other] / family).assign(sketch=sketch))
    out = pd.concat(parts, ignore_index=True)
    out = out[out["n_pairs"] > 0].reset_index(drop=True)
    out["p_holm"] = out.groupby("sketch")["p"].transform(lambda p: multipletests(p.to_numpy(), method="holm")[1])
    out["p_adj"] = out["p_holm"]
    return out


def _ratio_of_medians(pairs: np.ndarray) -> float:
    """median of column 0 / median of column 1 of ``pairs`` [trials, 2]."""
    return float(np.median(pairs[:, 0]) / np.median(pairs[:, 1]))


def _ratio_interval(b: np.ndarray, a: np.ndarray, trials: np.ndarray, g: pd.DataFrame, resamples: int, n: int):
    """median(b)/median(a) with its 95% paired CI: trials matched; on real data a cluster BCa bootstrap (the
    documents, then their windows: windows of one document are not independent), else the paired BCa bootstrap."""
    if g["data"].isin(list(REAL_LABELS)).all():
        windows = real_windows(int(g["seq"].iloc[0]), g["data"].iloc[0])
        pairs = np.stack([b, a], axis=1)
        return cluster_bootstrap_ci([row[None, :] for row in pairs], _ratio_of_medians,
                                    clusters=[windows[int(t)][0] for t in trials], n_resamples=resamples, seed=n)
    return ratio_ci(b, a, n_resamples=resamples, seed=n, paired=True)


def ratio_table(table: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """Median KL(QKQV)/median KL(KQV) per sketch, data label and n, with its 95% paired bootstrap CI (trials
    matched; clusters of windows by document on real data), and the Mann–Whitney test of the same two samples
    (the paper's test)."""
    rows = []
    for sketch in (SKETCH, *SENSITIVITY_SKETCHES):
        sub = table[table["sketch"] == sketch]
        for (label, n), g in sub.groupby(["label", "n"], sort=False):
            ga, gb = g[g["scheme"] == "kqv"].sort_values("trial"), g[g["scheme"] == "qkqv"].sort_values("trial")
            if not np.array_equal(ga["trial"].to_numpy(), gb["trial"].to_numpy()):
                raise ValueError(f"{label}, n = {n}, sketch {sketch}: KQV and QKQV were not run on the same trials")
            a, b = ga["attention_kl"].to_numpy(), gb["attention_kl"].to_numpy()
            rc = _ratio_interval(b, a, ga["trial"].to_numpy(), g, resamples, int(n))
            mw = mann_whitney(a, b)
            rows.append({"sketch": sketch, "label": label, "n": n, "ratio": rc.statistic,
                         "ci_low": rc.confidence_interval[0], "ci_high": rc.confidence_interval[1],
                         "ci_method": rc.method,
                         "median_kl_kqv": float(np.median(a)), "median_kl_qkqv": float(np.median(b)),
                         "mw_rank_biserial": mw.rank_biserial, "mw_r_z": mw.r_z, "mw_p": mw.pvalue,
                         "mw_p_method": mw.pvalue_method, "mw_p_asymptotic": mw.p_asymptotic, "n_trials": len(a)})
    return pd.DataFrame(rows)


def crossover_table(table: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Per data label (one query model: K errors do not depend on the queries) and n: median QKQV/KQV of the
    K errors, the better scheme, and the paired test of k_direction."""
    rows = []
    for (label, n), g in table[table["sketch"].isin([SKETCH])].groupby(["label", "n"], sort=False):
        if label.endswith("(isotropic q)"):
            continue
        t = pairs[(pairs["sketch"] == SKETCH) & (pairs["label"] == label) & (pairs["n"] == n)
                  & (pairs["metric"] == "k_direction") & (pairs["level_b"] == "qkqv")].iloc[0]
        for metric in ("k_direction", "k_rel_mse"):
            a = g[g["scheme"] == "kqv"][metric].median()
            b = g[g["scheme"] == "qkqv"][metric].median()
            rows.append({"label": label, "n": n, "metric": metric, "ratio": b / a,
                         "better": "qkqv" if b < a else "kqv", "rank_biserial_kqv_minus_qkqv": t["rank_biserial"],
                         "p_holm_k_direction": t["p_holm"]})
    return pd.DataFrame(rows)


def component_tests(kqv: pd.DataFrame, other: pd.DataFrame) -> tuple[float, list[str]]:
    """Each of the six 6D components of two schemes, paired over trials (Wilcoxon signed-rank, Holm over the six):
    the smallest Holm p and the components that separate the schemes at ALPHA. A component identical in both
    schemes (the same coder on that side) has p = 1."""
    from statsmodels.stats.multitest import multipletests

    a, b = kqv.sort_values("trial"), other.sort_values("trial")
    if a["trial"].tolist() != b["trial"].tolist():
        raise ValueError("the 6D component tests pair the schemes by trial: their trials differ")
    p = [1.0 if np.array_equal(a[c].to_numpy(), b[c].to_numpy()) else
         float(wilcoxon(a[c].to_numpy(float), b[c].to_numpy(float), n_resamples=0).pvalue) for c in E6]
    p_holm = multipletests(p, method="holm")[1]
    return float(p_holm.min()), [c for c, q in zip(E6, p_holm) if q < ALPHA]


def energy_table(primary: pd.DataFrame, labels: list[str], resamples: int, pairs: pd.DataFrame) -> pd.DataFrame:
    """The 6D clouds at n = 4 under the paper's sketch: energy-distance permutation test of KQV against each other
    scheme per label, with the pair's attention-KL test (Holm p from :func:`paired_table`) and the six components'
    own tests (:func:`component_tests`) beside it. The test runs for KQV vs QKQV (the paper's pair) and for every
    pair that KL does not separate; the cells that decide :func:`energy_verdict` are those that neither KL nor any
    single component separates."""
    comps, energy = list(E6), []
    kl = pairs[(pairs["metric"] == "attention_kl") & (pairs["sketch"] == SKETCH) & (pairs["n"] == 4)]
    kl = kl.set_index(["label", "level_b"])["p_holm"]
    for label in labels:
        sub = primary[(primary["label"] == label) & (primary["n"] == 4)]
        for other in SCHEMES[1:]:
            separates = bool(kl.get((label, other), 1.0) < ALPHA)
            if other != "qkqv" and separates:
                continue
            kqv_rows, other_rows = sub[sub["scheme"] == "kqv"], sub[sub["scheme"] == other]
            e = energy_test(kqv_rows[comps].to_numpy(), other_rows[comps].to_numpy(), n_resamples=resamples, seed=1)
            min_p, separating = component_tests(kqv_rows, other_rows)
            energy.append({"label": label, "other": other, "kl_p_holm": float(kl.get((label, other), math.nan)),
                           "kl_separates": separates, "component_min_p_holm": min_p,
                           "component_separates": bool(separating), "separating_components": " ".join(separating),
                           "energy_distance": e.statistic, "p": e.pvalue})
    return pd.DataFrame(energy)


def trial_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The sweep's rows as the analysis reads them: column ``scheme``, the data ``label`` and ``distance_6d``."""
    table = raw.rename(columns={"scheme_name": "scheme"})
    table["label"] = table.apply(data_label, axis=1)
    return add_d6(table)


#: schemes whose KL-vs-direction-error growth is fitted (min-max's K error is not a rotated one: shown, not fitted)
SUPERLINEAR_SCHEMES = ("kqv", "qkqv", "kv")


SUPERLINEAR_RESAMPLES = 999


def superlinear_table(primary: pd.DataFrame) -> pd.DataFrame:
    """Per data label and scheme: the slope β of log attention KL on log K direction error (1 − cos) over every
    trial and budget n ∈ BUDGETS, with a 95% bootstrap CI over trials (each trial's budgets resampled together;
    on the real windows over documents, then windows). KL ∝ (direction error)^β: β > 1 is super-linear."""
    rows = []
    for (label, name), g in primary[primary["scheme"].isin(SUPERLINEAR_SCHEMES)].groupby(["label", "scheme"],
                                                                                        sort=False):
        g = g[(g["k_direction"] > 0) & (g["attention_kl"] > 0)]
        trials = sorted(g["trial"].unique())
        units = [np.log(g[g["trial"] == t][["k_direction", "attention_kl"]].to_numpy(dtype=float)) for t in trials]
        clusters = None
        if g["data"].isin(list(REAL_LABELS)).all():
            windows = real_windows(int(g["seq"].iloc[0]), g["data"].iloc[0])
            clusters = [windows[int(t)][0] for t in trials]
        ci = cluster_bootstrap_ci(units, ols_slope, clusters=clusters, n_resamples=SUPERLINEAR_RESAMPLES,
                                  seed=cell_seed(STUDY, "superlinear", label, name))
        lo, hi = ci.confidence_interval
        rows.append({"label": label, "scheme": name, "slope": ci.statistic, "lo": lo, "hi": hi,
                     "trials": len(trials), "points": sum(len(u) for u in units)})
    return pd.DataFrame(rows)


#: the metrics on which each deployed format is tested against KQV at the same n (the 6D distance is left out: its
#: scales are the primary grid's medians, of D'Alberto's schemes)
FORMAT_METRICS = ("attention_kl", "top5", "output_error", "v_rel_mse")


def formats_tests(formats: pd.DataFrame, table: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """Paired Wilcoxon tests (over the real windows) of each deployed format against KQV (srht sketch) at the same
    n, per layer and metric; Holm over all of them (this family alone). Empty where no format has a KQV row."""
    from statsmodels.stats.multitest import multipletests

    ours = table[(table["data"] == "smollm2") & (table["scheme"] == "kqv") & (table["sketch"] == SKETCH)]
    parts = []
    for spec in dict.fromkeys(formats["scheme"]):
        for n in sorted(formats.loc[formats["scheme"] == spec, "n"].unique()):
            kqv = ours[ours["n"] == n]
            if kqv.empty:
                continue
            pair = pd.concat([formats[(formats["scheme"] == spec) & (formats["n"] == n)], kqv], ignore_index=True)
            parts.append(compare(pair, list(FORMAT_METRICS), "scheme", within=["label", "n"], levels=[spec, "kqv"],
                                 paired_by="trial", n_resamples=resamples))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    out["p_holm"] = multipletests(out["p"].to_numpy(), method="holm")[1]
    out["p_adj"] = out["p_holm"]
    return out


@dataclass(frozen=True, eq=False)
class Analysis:
    """What the figures and the claims read: the scale's configuration, the real windows, every trial
    (:func:`trial_table`), its primary view (srht sketch) and data labels, and the test tables."""

    cfg: dict
    scale: str
    n_windows: int
    table: pd.DataFrame
    primary: pd.DataFrame
    labels: list[str]
    pairs: pd.DataFrame  # paired_table
    ratios: pd.DataFrame  # ratio_table
    cross: pd.DataFrame  # crossover_table
    energy: pd.DataFrame  # energy_table
    formats: pd.DataFrame | None = None  # the deployed formats' real trials (trial_table's columns, no 6D distance)
    formats_tests: pd.DataFrame | None = None  # formats_tests


def analyse(table: pd.DataFrame, scale: str, n_windows: int, formats: pd.DataFrame | None = None) -> Analysis:
    """The tests of the trial table (:func:`trial_table`) at ``scale``; ``formats``: the deployed formats' real
    trials (the formats sweep's rows), tested against KQV at the same n."""
    cfg = SCALE[scale]
    primary = view(table, SKETCH)
    labels = list(dict.fromkeys(primary["label"]))
    pairs = paired_table(table, cfg["paired_resamples"])  # resamples of each paired rank-biserial CI
    ratios = ratio_table(table, cfg["resamples"])
    cross = crossover_table(table, pairs)
    energy = energy_table(primary, labels, cfg["resamples"], pairs)
    tests = None
    if formats is not None and len(formats):
        formats = formats.rename(columns={"scheme_name": "scheme"})
        formats["label"] = formats.apply(data_label, axis=1)
        tests = formats_tests(formats, table, cfg["paired_resamples"])
    else:
        formats = None
    return Analysis(cfg, scale, n_windows, table, primary, labels, pairs, ratios, cross, energy, formats, tests)


def write_tables(a: Analysis) -> None:
    """The CSVs of figures/data/: every trial, the paired tests, the KL ratios, the paper's Mann–Whitney rows,
    the crossover and the energy tests."""
    plots.write_csv(f"{STUDY}_trials", a.table)
    plots.write_csv(f"{STUDY}_wilcoxon", a.pairs)
    plots.write_csv(f"{STUDY}_kl_ratio", a.ratios)
    plots.write_csv(f"{STUDY}_mannwhitney", a.ratios[a.ratios["n"] == 4][
        ["sketch", "label", "n", "n_trials", "mw_rank_biserial", "mw_r_z", "mw_p", "mw_p_method", "mw_p_asymptotic"]])
    plots.write_csv(f"{STUDY}_crossover", a.cross)
    plots.write_csv(f"{STUDY}_energy", a.energy)
    if a.formats is not None:
        plots.write_csv(f"{STUDY}_formats", a.formats.groupby(["scheme", "n", "label"], sort=False)[
            ["attention_kl", "top5", "output_error", "v_rel_mse", "bits_k", "bits_v"]].median().reset_index())
        plots.write_csv(f"{STUDY}_formats_wilcoxon", a.formats_tests)
