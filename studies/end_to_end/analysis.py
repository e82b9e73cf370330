"""end_to_end's analysis: per-segment means (the units), the per-cell summary with cluster bootstrap CIs over
documents, the paired Wilcoxon tests of a claim's family (Holm), the QKQV/KQV ratio, the correlations between
attention-level and output-level damage, and the :class:`Analysis` the figures and claims read."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from kvstats.hf.models import SHIPPED_MODELS, SMOLLM2
from kvstats.measure.stats import cluster_bootstrap_ci, detectable_shift, signed_rank_shift_se, spearman, wilcoxon
from kvstats.measure.verdicts import Verdict, cell_direction, direction, number
from kvstats.studies.end_to_end import cells
from kvstats.studies.end_to_end.cells import DOCUMENTS, SCALE, STUDY, _segments
from kvstats.study.models import ModelRun, available_models, file_suffix
from kvstats.study.sweep import cell_seed

#: the generation table's columns (its sweep's parameters and rows), for a scale that runs no generation
GENERATION_COLUMNS = ("scheme", "n", "seed", "window", "prompt_len", "calibration_tokens", "offset",
                      "tokens_before_divergence", "agreement", "new", "fp_nll", "fp_nll_reference")

ALPHA = 0.05
PAPER_RATIO_N4 = "2.25"  # D'Alberto's KQV/QKQV KL ratio at n = 4, as printed
KEYS = ["scheme", "n", "seed", "window"]


def segment_means(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per cell and segment (the unit): mean next-token KL, top-1 agreement, attention KL, top-5 recall over its
    tokens, and the mean NLL increase over the exact model (``d_nll``)."""
    tok = tokens.assign(d_nll=tokens["nll"] - tokens["nll_ref"])
    return tok.groupby(KEYS + ["segment"], as_index=False)[["out_kl", "top1", "attn_kl", "top5", "d_nll", "nll",
                                                             "nll_ref"]].mean()


def segment_documents(size: int, count: int | None, model: str = SMOLLM2) -> dict[int, str]:
    """segment index -> the title of the document it was cut from (the clusters of the CIs), in ``model``'s tokens."""
    return {u: title for u, (title, _) in enumerate(_segments(size, count, model)[1])}


def _ci(x, resamples: int, seed: int, clusters) -> tuple[float, float, float]:
    """The mean of per-segment values with a cluster BCa bootstrap CI: documents, then segments within them
    (segments of one document are not independent; kvstats.stats.cluster_bootstrap_ci). ``clusters[i]``: the
    document of ``x[i]``."""
    x, clusters = np.asarray(x, dtype=float), np.asarray(clusters, dtype=object)
    keep = np.isfinite(x)
    x, clusters = x[keep], clusters[keep]
    if len(x) < 2 or np.ptp(x) == 0:
        m = float(np.mean(x))
        return m, m, m
    r = cluster_bootstrap_ci(x[:, None], np.mean, clusters=list(clusters), n_resamples=resamples, seed=seed)
    return r.statistic, *r.confidence_interval


def summary_table(segs: pd.DataFrame, cells: pd.DataFrame, resamples: int, docs: dict[int, str]) -> pd.DataFrame:
    """One row per cell: means over segments with cluster bootstrap CIs (documents, then segments; ``docs``:
    segment -> document); perplexities."""
    rows = []
    for key, g in segs.groupby(KEYS, sort=False):
        s = cell_seed(STUDY, "ci", *key)
        row = dict(zip(KEYS, key))
        where = g["segment"].map(docs).to_numpy()
        for col in ("out_kl", "top1", "attn_kl", "top5"):
            row[col], row[f"{col}_lo"], row[f"{col}_hi"] = _ci(g[col], resamples, s, where)
        m, lo, hi = _ci(g["d_nll"], resamples, s, where)
        row.update({"ppl_ref": math.exp(g["nll_ref"].mean()), "ppl": math.exp(g["nll"].mean()),
                    "ppl_ratio": math.exp(m), "ppl_ratio_lo": math.exp(lo), "ppl_ratio_hi": math.exp(hi),
                    "segments": len(g)})
        rows.append(row)
    out = pd.DataFrame(rows)
    info = cells[KEYS + ["bits_per_element", "code_bytes", "window_bytes", "fp16_bytes", "max_abs_dlogit",
                         "seconds", "calibration_seconds", "segment_tokens"]]
    return out.merge(info, on=KEYS, how="left")


def paired_tests(segs: pd.DataFrame, pairs, metrics=("out_kl", "d_nll", "attn_kl"), window: int = 0,
                 resamples: int = 999) -> pd.DataFrame:
    """Wilcoxon signed-rank over segments (paired: every scheme sees the same segments) of a − b, per n, for the
    (a, b) scheme pairs present at that n: matched-pairs rank-biserial r (positive: a larger). The rows returned
    are one claim's family: ``p_holm`` is Holm over them, and ``mde`` (the mean difference detectable with 80%
    power) is at α/m, m the family's size; ``sd_difference`` and ``shift_se`` are the sd of the paired differences and
    the standard error of their Hodges–Lehmann shift (:func:`kvstats.measure.stats.signed_rank_shift_se`, what a
    claim's sample size is planned on)."""
    rows, differences = [], []
    sel = segs[segs["window"] == window]
    for n in sorted(sel["n"].unique()):
        at = sel[sel["n"] == n]
        for a, b in pairs:
            ga = at[at["scheme"] == a].groupby("segment")
            gb = at[at["scheme"] == b].groupby("segment")
            if not len(ga) or not len(gb):
                continue
            for m in metrics:
                x, y = ga[m].mean().align(gb[m].mean(), join="inner")
                w = wilcoxon(x.to_numpy(), y.to_numpy(), n_resamples=resamples,
                             seed=cell_seed(STUDY, "wilcoxon", n, a, b, m))
                d = x.to_numpy() - y.to_numpy()
                differences.append(d)
                rows.append({"n": int(n), "a": a, "b": b, "metric": m, "segments": len(x), "mean_a": float(x.mean()),
                             "mean_b": float(y.mean()), "sd_difference": float(np.std(d, ddof=1)) if len(d) > 1
                             else math.nan, "shift_se": signed_rank_shift_se(d) if len(d) > 1 else math.nan,
                             "r": w.rank_biserial, "p": w.pvalue,
                             "p_method": w.pvalue_method, "a_lower_fraction": float((x < y).mean())})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["p_holm"] = multipletests(out["p"].to_numpy(), method="holm")[1]
    alpha_m = ALPHA / len(out)
    out["mde"] = [detectable_shift(d, alpha=alpha_m).extra["shift"] if np.ptp(d) > 0 else math.inf
                  for d in differences]
    return out


def direction_verdict(rows, expected_sign: int, what: str) -> Verdict:
    """The direction rule over one claim's test rows (``p_holm``: Holm over the family, ``r`` of a − b): for where
    significant with sign ``expected_sign``."""
    rows = list(rows)
    cells = [cell_direction(r["p_holm"], r["r"], expected_sign=expected_sign, alpha=ALPHA) for r in rows]
    v = direction(cells, what=what)
    against = [f"{r['b']} on {r['metric']} at n = {r['n']}" for r, c in zip(rows, cells) if c == -1]
    return Verdict(v.verdict, v.rule, v.reason + (f" ({', '.join(against)})" if against else ""))


def ratio_verdict(ratio: float, lo: float, hi: float, published: str = PAPER_RATIO_N4) -> Verdict:
    """D'Alberto's "KQV's KL is 2.25× lower than QKQV's": the number rule on QKQV/KQV (null 1, above)."""
    return number(float(published), (lo, hi), null=1.0, expected_sign=+1, estimate=ratio)


def _spearman_ci(x, y, resamples: int, seed: int):
    """Spearman's ρ with a bootstrap CI (pairs resampled; BCa, percentile when BCa degenerates)."""
    if len(x) < 4:
        rho = stats.spearmanr(x, y)
        return float(rho.statistic), float(rho.pvalue), math.nan, math.nan, "too few points for a CI"
    r = spearman(x, y, n_resamples=resamples, seed=seed)
    return r.statistic, r.pvalue, *r.confidence_interval, r.ci_method


def correlations(summary: pd.DataFrame, tokens: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """Spearman ρ between attention-level and output-level damage: across cells and across tokens per cell."""
    rows = []
    q = summary[summary["scheme"] != "identity"]
    pairs = [("attn_kl", "out_kl"), ("attn_kl", "ppl_ratio"), ("attn_kl", "1-top1"), ("1-top5", "out_kl")]
    q = q.assign(**{"1-top1": 1 - q["top1"], "1-top5": 1 - q["top5"]})
    for a, b in pairs:  # across the designed cells: descriptive (a design, not a sample: no p, no CI)
        rho = float(stats.spearmanr(q[a], q[b]).statistic)
        rows.append({"level": "cells", "scheme": "all", "n": None, "seed": None, "window": None, "x": a, "y": b,
                     "rho": rho, "p": math.nan, "rho_lo": math.nan, "rho_hi": math.nan,
                     "ci_method": "none: the cells are a design, not a sample", "points": len(q)})
    tq = tokens[(tokens["scheme"] != "identity") & (tokens["t"] > 0)]  # t = 0 attends one key: KL is 0
    for key, g in tq.groupby(KEYS, sort=False):
        rho, p, lo, hi, method = _spearman_ci(g["attn_kl"], g["out_kl"], min(resamples, 999),
                                              cell_seed(STUDY, "rho-tokens", *key))
        rows.append({"level": "tokens", "scheme": key[0], "n": key[1], "seed": key[2], "window": key[3],
                     "x": "attn_kl", "y": "out_kl", "rho": rho, "p": p, "rho_lo": lo, "rho_hi": hi,
                     "ci_method": method, "points": len(g)})
    return pd.DataFrame(rows)


def _ratio_of_means(pairs: np.ndarray) -> float:
    """mean of column 0 / mean of column 1 of ``pairs`` [units, 2]."""
    return float(pairs[:, 0].mean() / pairs[:, 1].mean())


def paired_ratio(segs: pd.DataFrame, col: str, n: int, window: int, resamples: int, docs: dict[int, str]):
    """mean(QKQV)/mean(KQV) of a per-segment metric at budget n (seeds averaged), paired cluster BCa bootstrap CI
    (documents, then segments; a segment's two values resampled together)."""
    sel = segs[(segs["n"] == n) & (segs["window"] == window)]
    a = sel[sel["scheme"] == "qkqv"].groupby("segment")[col].mean()
    b = sel[sel["scheme"] == "kqv"].groupby("segment")[col].mean()
    a, b = a.align(b, join="inner")
    pairs = np.stack([a.to_numpy(), b.to_numpy()], axis=1)
    r = cluster_bootstrap_ci([row[None, :] for row in pairs], _ratio_of_means, clusters=[docs[u] for u in a.index],
                             n_resamples=resamples, seed=cell_seed(STUDY, "ratio", col, n, window))
    return r.statistic, *r.confidence_interval


@dataclass(frozen=True, eq=False)
class Analysis(ModelRun):
    """What the figures and claims read: the scale's configuration, the sweeps' tables and what they make
    (per-segment means, the per-cell summary, the correlations), the generation, paths and baseline tables; and
    ``schemes``, the schemes the teacher-forced sweep ran (:data:`~kvstats.studies.end_to_end.cells.SCHEMES`, as
    the run read it), in the order the figures and tables list them."""

    cfg: dict
    scale: str
    schemes: tuple[str, ...]
    summary: pd.DataFrame
    segs: pd.DataFrame
    tokens: pd.DataFrame
    layers: pd.DataFrame
    corr: pd.DataFrame
    gen: pd.DataFrame
    agree: pd.DataFrame
    docs: dict[int, str]
    base: pd.DataFrame | None = None
    qjl_segs: pd.DataFrame | None = None
    qjl_summary: pd.DataFrame | None = None
    formats_segs: pd.DataFrame | None = None
    formats_summary: pd.DataFrame | None = None
    #: the shipped model these tables come from; ``others``: the second model's Analysis (its own sweep),
    #: ``missing``: {model: why it did not run}
    model: str = SMOLLM2
    others: dict = field(default_factory=dict)
    missing: dict = field(default_factory=dict)

    @functools.cached_property
    def budgets(self) -> list[int]:
        """The budgets of the quantized cells (the lossless control left out)."""
        return sorted(int(n) for n in self.summary.loc[self.summary["scheme"] != "identity", "n"].unique())

    @property
    def n_mid(self) -> int:
        """The budget the per-layer and per-token panels show: 4 where measured, else the largest."""
        return 4 if 4 in self.budgets else self.budgets[-1]

    @property
    def n_seg(self) -> int:
        return int(self.segs["segment"].nunique())

    @property
    def n_docs(self) -> int:
        """The documents the segments come from (the clusters of the CIs)."""
        return len(set(self.docs[u] for u in self.segs["segment"].unique()))

    @property
    def seg_len(self) -> int:
        return int(self.summary["segment_tokens"].dropna().iloc[0])

    @property
    def tokens_n(self) -> int:
        """Teacher-forced tokens per cell."""
        return self.n_seg * self.cfg["segment_tokens"]

    @functools.cached_property
    def mean(self) -> pd.DataFrame:
        """Means over seeds per (scheme, n) of the quantized cells without a window."""
        main = self.summary[(self.summary["window"] == 0) & (self.summary["scheme"] != "identity")]
        return main.groupby(["scheme", "n"]).mean(numeric_only=True)

    @property
    def data(self) -> str:
        facts = SHIPPED_MODELS[self.model]
        calibrated = "NOVA-KV" if "nova" in self.schemes else "QJL's outlier channels"
        return (f"{facts.name} (fp32, {facts.layers} layers, {facts.q_heads} q / {facts.kv_heads} KV heads, d = "
                f"{facts.head_dim}), teacher-forced over {self.n_seg} disjoint segments of {self.seg_len} tokens from "
                f"the held-out documents of kvstats' public-domain text ({calibrated} calibrated on "
                f"'{DOCUMENTS[0]}'); budgets {self.budgets}; seeds {list(self.cfg['seeds'])} ({self.scale})")

    @property
    def unit(self) -> str:
        return (f"One unit = one segment of {self.seg_len} tokens (metrics averaged over its tokens); every scheme "
                "sees the same segments, so tests are paired Wilcoxon signed-rank over segments (exact p where there "
                "are no ties), r = matched-pairs rank-biserial of a − b.")


def analyse(tables, scale: str) -> Analysis:
    """The sweeps' tables (teacher-forced, paths, generation, baselines when run) -> :class:`Analysis`."""
    cfg = SCALE[scale]
    table = tables[STUDY]
    tokens = table[table["kind"] == "token"][KEYS + ["segment", "t", "out_kl", "top1", "nll_ref", "nll", "attn_kl",
                                                     "top5"]]
    layers = table[table["kind"] == "layer"][KEYS + ["layer", "attn_kl", "top5"]]
    segs = segment_means(tokens)
    docs = segment_documents(cfg["segment_tokens"], cfg["segments"])
    summary = summary_table(segs, table[table["kind"] == "cell"], cfg["resamples"], docs)
    corr = correlations(summary, tokens, cfg["resamples"])
    # each row names its prompt (offset); no generation at paper scale (a greedy continuation that one fp32 reordering
    # sends down another path is no claim's evidence: the full tier measures it)
    gen = (tables[f"{STUDY}_generation"].drop(columns="offsets") if f"{STUDY}_generation" in tables
           else pd.DataFrame(columns=GENERATION_COLUMNS))
    side = {}
    for name in ("qjl", "formats"):  # the sweeps measured beside the main one
        t = tables.get(f"{STUDY}_{name}")
        ok = t is not None and len(t)
        side[name] = beside(t[t["kind"] == "token"][tokens.columns], t[t["kind"] == "cell"], cfg, docs) if ok else \
            (None, None)
    present, missing = available_models(scale=scale)
    others = {model: model_analysis(tables[f"{STUDY}{file_suffix(model)}"], scale, model,
                                    tables.get(f"{STUDY}{file_suffix(model)}_paths"))
              for model in present if model != SMOLLM2}
    return Analysis(cfg, scale, tuple(cells.SCHEMES), summary, segs, tokens, layers, corr, gen,
                    tables[f"{STUDY}_paths"], docs, tables.get(f"{STUDY}_baselines"), *side["qjl"], *side["formats"],
                    others=others, missing=missing)


def beside(tokens: pd.DataFrame, cell_rows: pd.DataFrame, cfg: dict, docs: dict[int, str]):
    """(segment means, summary) of cells measured beside the main ones (QJL's cache, the deployed formats) from their
    token and cell rows, or (None, None) where none ran."""
    if not len(tokens):
        return None, None
    segs = segment_means(tokens)
    return segs, summary_table(segs, cell_rows, cfg["resamples"], docs)


def model_analysis(table: pd.DataFrame, scale: str, model: str, paths: pd.DataFrame | None = None) -> Analysis:
    """A second model's sweep (:func:`~kvstats.studies.end_to_end.cells.model_cell_grid`) -> its :class:`Analysis`:
    the teacher-forced cells of :data:`~kvstats.studies.end_to_end.cells.MODEL_SCHEMES`, NOVA-KV and the lossless
    control, with QJL's cache and the deployed formats beside them as for SmolLM2, and the two paths' agreement on its
    captured Q/K/V (``paths``); no generation or correlations."""
    cfg = SCALE[scale]
    tokens = table[table["kind"] == "token"][KEYS + ["segment", "t", "out_kl", "top1", "nll_ref", "nll", "attn_kl",
                                                     "top5"]]
    qjl = tokens["scheme"] == "qjl"
    formats = tokens["scheme"].isin({spec for spec, _ in cfg.get("formats", ())})
    main = ~(qjl | formats)
    docs = segment_documents(cfg["segment_tokens"], cfg["segments"], model)
    cell_rows = table[table["kind"] == "cell"]
    segs = segment_means(tokens[main])
    summary = summary_table(segs, cell_rows, cfg["resamples"], docs)
    side = {name: beside(tokens[rows], cell_rows, cfg, docs) for name, rows in (("qjl", qjl), ("formats", formats))}
    empty = pd.DataFrame()
    schemes = tuple(cells.MODEL_SCHEMES) + (("nova",) if "nova" in set(segs["scheme"]) else ())
    return Analysis(cfg, scale, schemes, summary, segs, tokens[main],
                    table[table["kind"] == "layer"][KEYS + ["layer", "attn_kl", "top5"]], empty, empty,
                    empty if paths is None else paths, docs, None, *side["qjl"], *side["formats"], model=model)
