"""The tables the claims read: units per query head and per KV head, nova's paired tests against each
scheme (Holm over the table), the grouping and ablation tests, the bit counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvstats.hf.models import SHIPPED_MODELS, SMOLLM2
from kvstats.measure.stats import detectable_shift, mann_whitney, signed_rank_shift_se, wilcoxon
from kvstats.quant.quantizers.nova import (
    DEFAULT_AMORTIZE_TOKENS,
    RotatedMinMax,
)
from kvstats.studies.nova.cells import (
    ABLATION_FAMILIES,
    ALPHA,
    BUDGETS,
    METRICS,
    OBLIVIOUS,
    STUDY,
    WILCOXON_RESAMPLES,
    make_scheme,
)
from kvstats.study.models import ModelAnalysis
from kvstats.study.sweep import cell_seed


def unit_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per (scheme, n, layer, query head): metrics averaged over seeds."""
    units = table[table["kind"] == "unit"]
    cols = list(METRICS) + ["logit_mse", "sink_mass", "abs_logit_err_sink", "abs_logit_err_rest", "bits_k", "bits_v",
                            "window"]
    return units.groupby(["scheme", "n", "layer", "head", "kv_head"], as_index=False)[cols].mean()


def kv_units(units: pd.DataFrame) -> pd.DataFrame:
    """Per (scheme, n, layer, KV head): the means over the KV head's query heads, the units of the tests (query
    heads of one KV head share its quantized keys, so they are not independent units)."""
    return units.groupby(["scheme", "n", "layer", "kv_head"], as_index=False)[list(METRICS)].mean()


def tests(units: pd.DataFrame) -> pd.DataFrame:
    """nova against every other scheme, per n and metric.

    ``w_*``: Wilcoxon signed-rank over (layer, KV head) units paired across schemes (:func:`kv_units`;
    matched-pairs rank-biserial r of nova − other: negative = nova smaller), Holm over the table: the test the
    verdicts use; ``sd_difference`` the sd of its paired differences and ``shift_se`` their Hodges–Lehmann shift's
    standard error (the spread its sample size is planned on).
    ``rank_biserial``, ``p``: Mann–Whitney over (layer, query head) units (the figure's r).
    """
    from statsmodels.stats.multitest import multipletests

    rows = []
    kv = kv_units(units)
    others = [s for s in units["scheme"].unique() if s != "nova"]
    for n in BUDGETS:
        sub, ksub = units[units["n"] == n], kv[kv["n"] == n]
        a_all = sub[sub["scheme"] == "nova"].set_index(["layer", "head"]).sort_index()
        ka_all = ksub[ksub["scheme"] == "nova"].set_index(["layer", "kv_head"]).sort_index()
        for other in others:
            b_all = sub[sub["scheme"] == other].set_index(["layer", "head"]).sort_index()
            kb_all = ksub[ksub["scheme"] == other].set_index(["layer", "kv_head"]).sort_index()
            for metric, (_, _, better) in METRICS.items():
                a, b = a_all[metric].align(b_all[metric], join="inner")
                ka, kb = ka_all[metric].align(kb_all[metric], join="inner")
                res = mann_whitney(a.to_numpy(), b.to_numpy())
                w = wilcoxon(ka.to_numpy(), kb.to_numpy(), n_resamples=WILCOXON_RESAMPLES,
                             seed=cell_seed(STUDY, "wilcoxon", n, other, metric))
                diff, kdiff = (a - b).to_numpy(), (ka - kb).to_numpy()
                win = (diff < 0) if better == "low" else (diff > 0)
                rows.append({"n": n, "metric": metric, "nova_vs": other, "units": len(a), "kv_units": len(ka),
                             "median_nova": float(a.median()), "median_other": float(b.median()),
                             "median_ratio": float(a.median() / b.median()) if b.median() else math.nan,
                             "rank_biserial": res.rank_biserial, "r_z": res.r_z, "p": res.pvalue,
                             "p_method": res.pvalue_method, "nova_better_fraction": float(win.mean()),
                             "w_r": w.rank_biserial, "w_p": w.pvalue, "w_p_method": w.pvalue_method,
                             **_spread(kdiff), "_diffs": kdiff})
    out = pd.DataFrame(rows)
    out["p_holm"] = multipletests(out["p"].to_numpy(), method="holm")[1]
    out["w_p_holm"] = multipletests(out["w_p"].to_numpy(), method="holm")[1]
    out["w_detectable_shift"] = [_detectable(d, len(out)) for d in out.pop("_diffs")]
    return out


def _spread(differences: np.ndarray) -> dict[str, float]:
    """A test's paired differences' sd (ddof 1) and their Hodges–Lehmann shift's standard error
    (:func:`kvstats.measure.stats.signed_rank_shift_se`: the spread its sample size is planned on); nan under 2
    pairs."""
    if differences.size < 2:
        return {"sd_difference": math.nan, "shift_se": math.nan}
    return {"sd_difference": float(np.std(differences, ddof=1)), "shift_se": signed_rank_shift_se(differences)}


def _detectable(differences: np.ndarray, family: int) -> float:
    """The mean difference the Wilcoxon test on these units detects with 80% power at α/family (the minimum
    detectable effect beside a non-significant row; inf where none can be detected)."""
    if differences.size < 2 or np.ptp(differences) == 0:
        return math.inf
    return detectable_shift(differences, alpha=ALPHA / family).extra["shift"]


def grouping_tests(grp: pd.DataFrame) -> pd.DataFrame:
    """Stratified vs contiguous groups per n: Wilcoxon over (layer, KV head) units of the held-out coefficient MSE
    and of the attention KL (r of stratified − contiguous: negative = stratified lower)."""
    rows = []
    for n, g in grp.groupby("n"):
        for metric in ("coef_mse", "kl"):
            a, b = g[f"{metric}_stratified"].to_numpy(), g[f"{metric}_contiguous"].to_numpy()
            w = wilcoxon(a, b, n_resamples=WILCOXON_RESAMPLES, seed=cell_seed(STUDY, "grouping", n, metric))
            rows.append({"n": int(n), "metric": metric, "units": len(a), "median_stratified": float(np.median(a)),
                         "median_contiguous": float(np.median(b)), "stratified_lower_fraction": float((a < b).mean()),
                         "w_r": w.rank_biserial, "w_p": w.pvalue, "w_p_method": w.pvalue_method,
                         **_spread(a - b), "w_detectable_shift": _detectable(a - b, 1),
                         "logvol_spread_stratified": float(g["logvol_spread_stratified"].median()),
                         "logvol_spread_contiguous": float(g["logvol_spread_contiguous"].median())})
    return pd.DataFrame(rows)


def ablation_tests(abl: pd.DataFrame) -> pd.DataFrame:
    """The ablation's paired comparisons (:data:`ABLATION_FAMILIES`) per n and metric: Wilcoxon signed-rank of
    arm a − arm b over (layer, KV head) units (metrics averaged over the KV head's query heads), Holm within each
    claim's family (``p_holm``)."""
    from statsmodels.stats.multitest import multipletests

    cols = [m for m in METRICS if m in abl.columns]
    kv = abl.groupby(["scheme", "n", "layer", "kv_head"], as_index=False)[cols].mean()
    out = []
    for family, (pairs, claim_metrics) in ABLATION_FAMILIES.items():
        rows = []
        for n in sorted(kv["n"].unique()):
            sub = kv[kv["n"] == n]
            for a_arm, b_arm, held in pairs:
                a_all = sub[sub["scheme"] == a_arm].set_index(["layer", "kv_head"]).sort_index()
                b_all = sub[sub["scheme"] == b_arm].set_index(["layer", "kv_head"]).sort_index()
                for metric, sign in claim_metrics.items():
                    a, b = a_all[metric].align(b_all[metric], join="inner")
                    w = wilcoxon(a.to_numpy(), b.to_numpy(), n_resamples=WILCOXON_RESAMPLES,
                                 seed=cell_seed(STUDY, "ablation", n, a_arm, b_arm, metric))
                    diff = (a - b).to_numpy()
                    rows.append({"family": family, "n": int(n), "a": a_arm, "b": b_arm, "held": held,
                                 "metric": metric, "expected_sign": sign, "units": len(a),
                                 "median_a": float(a.median()), "median_b": float(b.median()),
                                 "a_better_fraction": float(((diff < 0) if sign < 0 else (diff > 0)).mean()),
                                 "w_r": w.rank_biserial, "w_p": w.pvalue, "w_p_method": w.pvalue_method,
                                 **_spread(diff), "_diffs": diff})
        fam = pd.DataFrame(rows)
        fam["p_holm"] = multipletests(fam["w_p"].to_numpy(), method="holm")[1]
        fam["w_detectable_shift"] = [_detectable(d, len(fam)) for d in fam.pop("_diffs")]
        out.append(fam)
    return pd.concat(out, ignore_index=True)


#: head dims of the bit counts: SmolLM2's 64, the paper's 128 (Qwen3-8B), Gemma 3 270M's 256
BITS_DIMS = (64, 128, 256)


def bits_table() -> pd.DataFrame:
    """Bits per element of each scheme at n = 2, 3 and every head dim of :data:`BITS_DIMS`."""
    rows = []
    for d in BITS_DIMS:
        for n in BUDGETS:
            from kvstats.quant.quantizers.nova import NovaQuantizer

            nk = NovaQuantizer(n, d)
            for tokens in (1024, 8192, DEFAULT_AMORTIZE_TOKENS):
                kb, vb = nk.bits_per_coordinate(n_tokens=tokens), RotatedMinMax(n, d).bits_per_coordinate()
                rows.append({"scheme": "nova", "d": d, "n": n, "tokens": tokens, "k_payload": kb.payload,
                             "k_norms": kb.norms, "k_side": kb.side, "v_payload": vb.payload, "v_side": vb.side,
                             "k_total": kb.total, "v_total": vb.total, "mean_total": (kb.total + vb.total) / 2})
            for name in OBLIVIOUS:
                s = make_scheme(name, n, d, 0)
                k = s.k.bits_per_coordinate(d) if name == "minmax" else s.k.bits_per_coordinate()
                v = s.v.bits_per_coordinate()
                rows.append({"scheme": name, "d": d, "n": n, "tokens": None, "k_payload": k.payload,
                             "k_norms": k.norms, "k_side": k.side, "v_payload": v.payload, "v_side": v.side + v.norms,
                             "k_total": k.total, "v_total": v.total, "mean_total": (k.total + v.total) / 2})
    return pd.DataFrame(rows)


def data_text(units: pd.DataFrame, cfg: dict, scale: str, model: str = SMOLLM2) -> str:
    """The claims' data sentence: the model, the texts, the test units, the queries, the seeds and the scale."""
    facts = SHIPPED_MODELS[model]
    n_layers = units["layer"].nunique()
    windows = units.groupby("layer")["window"].first()
    sliding = int((windows > 0).sum())
    within = (f" ({sliding} of the {n_layers} layers within their {int(windows.max())}-token sliding window, as the "
              "model attends)" if sliding else "")
    return (f"{facts.name} (head dim {facts.head_dim}), calibration on the Declaration of Independence (one forward "
            f"pass), measurement on the rest of the shipped text (a separate pass: Constitution, Bill of Rights, "
            f"Lincoln): {n_layers} layers × {facts.kv_heads} KV head(s) = {n_layers * facts.kv_heads} test units "
            f"({n_layers * facts.q_heads} query-head units) per scheme, last {cfg['n_q']} queries attending "
            f"causally{within}, {len(cfg['seeds'])} seed(s) ({scale} scale)")


@dataclass(frozen=True)
class Analysis(ModelAnalysis):
    """What the figures and claims read, for one model: the scale's configuration, the per-(query head) units,
    nova's tests against every other scheme, the Parseval rows per (layer, KV head), the bit counts, the grouping
    tests, the schemes shown and the claims' data sentence; SmolLM2's analysis holds every other model's
    (``others``) and the models that could not run (``missing``: model -> why)."""

    cfg: dict
    scale: str
    units: pd.DataFrame
    tst: pd.DataFrame
    pars: pd.DataFrame
    bits: pd.DataFrame
    grp: pd.DataFrame
    schemes: list[str]
    data: str
    ablation: pd.DataFrame = None
    ablation_tests: pd.DataFrame = None
    study = STUDY

    @property
    def dim(self) -> int:
        return SHIPPED_MODELS[self.model].head_dim
