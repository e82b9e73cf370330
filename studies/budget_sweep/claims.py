"""The claims (one function each), the sentences they share, and the check of the paper's published
(r, p, n) triple."""

from __future__ import annotations

import math

import pandas as pd

import kvstats
from kvstats.hf.models import SHIPPED_MODELS
from kvstats.measure import verdicts as V
from kvstats.measure.stats import mann_whitney_min_n, mann_whitney_min_pvalue, rank_biserial_report
from kvstats.studies.budget_sweep.analysis import SUPERLINEAR_RESAMPLES, Analysis, superlinear_table
from kvstats.studies.budget_sweep.cells import (
    ALPHA,
    BUDGETS,
    CROSSOVER,
    DOCUMENT_TITLES,
    FINDING1_METRICS,
    PAPER_N,
    PAPER_P,
    PAPER_R,
    REAL_D,
    REAL_DATA,
    SENSITIVITY_SKETCHES,
    SKETCH,
    STUDY,
    SYNTHETIC_HEADS,
    real_windows,
)
from kvstats.studies.budget_sweep.verdicts import (
    CROSSOVER_DISTINCTIVE,
    SUPERLINEAR_MARGIN,
    crossover_verdict,
    direction_sample,
    energy_verdict,
    kqv_higher,
    kqv_lower,
    ratio_sample,
    ratio_verdict,
    superlinear_sample,
    superlinear_verdict,
)
from kvstats.study.claims import Claim, fmt_p, measurement
from kvstats.study.models import model_claim_id
from kvstats.study.sample_plans import EXACT


def published_triple(r: str = PAPER_R, n: int = PAPER_N) -> dict:
    """Is D'Alberto's (r, p < PAPER_P, n vs n) consistent? The normal-approximation p at the printed r and over its
    rounding interval (r ± half a unit of its last digit), and the exact p at the integer U₁ of that interval."""
    half = V.printed_half_unit(r)
    report = rank_biserial_report(float(r), n, n, r_interval=(float(r) - half, float(r) + half))
    p_low_end, p_high_end = report.p_asymptotic_at_ends
    return {"p_normal": report.pvalue, "p_normal_min": p_low_end, "p_normal_max": p_high_end,
            "u_integers": list(report.u_integers), "p_exact_max": report.p_exact_max}


def triple_text(t: dict, r: str = PAPER_R, n: int = PAPER_N) -> str:
    """One sentence on the published triple, from :func:`published_triple`."""
    holds = t["p_normal"] < PAPER_P
    edge = t["p_normal_min"] < PAPER_P <= t["p_normal_max"]
    return (f"published triple r = {r}, p < {PAPER_P:g}, {n} vs {n} "
            f"{'holds' if holds else 'does not hold'} with the normal approximation at the printed r: "
            f"p = {t['p_normal']:.3g} ({t['p_normal_min']:.3g} to {t['p_normal_max']:.3g} over r's rounding "
            f"interval{': below ' + format(PAPER_P, 'g') + ' only at its end' if edge and not holds else ''}); "
            f"with the exact p (U₁ ∈ {t['u_integers']}: at most {t['p_exact_max']:.2g}) it holds by "
            f"{math.floor(math.log10(PAPER_P / t['p_exact_max']))} orders of magnitude. The paper does not say "
            "which p it reports")


def _cells(pairs, metric, other, sketch=SKETCH, n=None, labels=None):
    sel = pairs[(pairs["metric"] == metric) & (pairs["level_b"] == other) & (pairs["sketch"] == sketch)]
    if n is not None:
        sel = sel[sel["n"] == n]
    if labels is not None:
        sel = sel[sel["label"].isin(labels)]
    return sel


def _pr(sel) -> list[tuple[float, float]]:
    return list(zip(sel["p_holm"], sel["rank_biserial"]))


def _finding1_cells(pairs, sketch) -> pd.DataFrame:
    """Finding 1's rows of the paired table: its metrics, KQV vs QKQV and vs KV, at n = 4."""
    return pd.concat([_cells(pairs, m, other, sketch, 4) for m in FINDING1_METRICS for other in ("qkqv", "kv")])


def _family(a: Analysis, sketch: str = SKETCH) -> int:
    """The size of ``sketch``'s Holm family: its rows of the paired table."""
    return int((a.pairs["sketch"] == sketch).sum())


def _unit(a: Analysis) -> str:
    """What a direction claim's n counts: trials, and windows where the real rows are among its cells."""
    return "trials (windows on SmolLM2)" if a.n_windows else "trials"


def _split(labels):
    peaked = [lab for lab in labels if not lab.startswith("SmolLM2") and not lab.endswith("(isotropic q)")]
    iso = [lab for lab in labels if lab.endswith("(isotropic q)")]
    real = [lab for lab in labels if lab.startswith("SmolLM2")]
    return peaked, iso, real


def _count(sel, sign) -> str:
    k = sum(V.cell_direction(p, r, expected_sign=sign, alpha=ALPHA) == 1 for p, r in _pr(sel))
    return f"{k}/{len(sel)}"


def sketch_txt(sketch: str) -> str:
    return {"srht": "srht sketch (D'Alberto eq. 3)", "gaussian": "dense Gaussian sketch (TurboQuant/QJL)",
            "orthogonal": "orthogonal-rows sketch",
            "srht-original": "srht sketch of the de-rotated residual (original domain)"}[sketch]


def _suffix(sketch: str) -> str:
    """The id suffix of a sensitivity row ("" for the paper's sketch)."""
    return "" if sketch == SKETCH else f"-sketch-{sketch}"


def _sensitivity(sketch: str, where: str = "") -> str:
    """The claim text's note on a sensitivity row ("" for the paper's sketch)."""
    return "" if sketch == SKETCH else f" (sensitivity{where}: {sketch_txt(sketch)})"


def data_text(a: Analysis) -> str:
    """The claims' data sentence."""
    peaked, _, real = _split(a.labels)
    cfg = a.cfg
    return (f"synthetic {', '.join(peaked)} (d = {cfg['d']}, seq {cfg['seq']}, {SYNTHETIC_HEADS[0]} KV / "
            f"{SYNTHETIC_HEADS[1]} query heads, {cfg['n_q']} queries per head, {cfg['trials']} trials), each "
            f"with peaked and with isotropic queries; SmolLM2-135M layers {', '.join(r.split()[-1] for r in real)} "
            f"(d = {REAL_D}, 3 KV / 9 query heads, {a.n_windows} disjoint windows of {cfg['window']} tokens over "
            f"{len({doc for doc, _ in real_windows(cfg['window'])})} documents (of {len(DOCUMENT_TITLES)}: a document "
            f"shorter than a window gives none), last {cfg['n_q'] // 2} queries per head, causal); {a.scale} scale")


def bits_held(name: str, n: int, d: int) -> float:
    """Bits per cache element the scheme holds at budget n and head dimension d (kvstats' BitBudget, K and V
    averaged): the n payload bits plus each stage's norms."""
    return float(kvstats.scheme(name, bits=n, dim=d, seed=0).bits_per_coordinate()["mean"].total)


def dims(a: Analysis) -> list[int]:
    """The head dimensions of the grid: the synthetic d, then SmolLM2's where the real windows ran."""
    return [a.cfg["d"]] + ([REAL_D] if a.n_windows else [])


def bits_text(a: Analysis, n: int = 4) -> str:
    """The bits each D'Alberto scheme holds at budget n, per head dimension of the grid."""
    return ("; ".join(f"d = {d}: " + ", ".join(f"{s.upper()} {bits_held(s, n, d):g}" for s in ("kv", "kqv", "qkqv"))
                      for d in dims(a)))


def conventions(a: Analysis) -> str:
    """The paired tests' conventions, the start of the direction claims' details."""
    return (f"Equal budget n is equal payload bits, not equal bits held: at n = 4 the schemes hold {bits_text(a)} "
            "bits per element (each QJL stage adds its norm; dalberto-equal-budget-fair). "
            f"Paired Wilcoxon signed-rank tests over trials (every scheme sees the same data in a trial); r is the "
            f"matched-pairs rank-biserial r of KQV − other (negative: KQV lower); a cell counts for the claim when "
            f"Holm p < {ALPHA}, Holm within each sketch's tests of figures/data/{STUDY}_wilcoxon.csv (its family: "
            + ", ".join(f"{sketch} {n}" for sketch, n in a.pairs.groupby("sketch").size().items()) + " tests).")


def per_model(a: Analysis, metric: str, other: str, sign: int, sketch: str = SKETCH, n: int | None = None) -> str:
    """Cells for the claim / cells, per query model: "peaked q: k/m; isotropic q: ...; SmolLM2: ..."."""
    peaked, iso, real = _split(a.labels)
    return "; ".join(f"{name}: {_count(_cells(a.pairs, metric, other, sketch, n, labs), sign)}"
                     for name, labs in (("peaked q", peaked), ("isotropic q", iso), ("SmolLM2", real)) if labs)


def finding1_claim(a: Analysis, sketch: str) -> Claim:
    sel = _finding1_cells(a.pairs, sketch)
    parts = ", ".join(f"{m} vs {o.upper()} {per_model(a, m, o, -1, sketch, 4)}"
                      for m in FINDING1_METRICS for o in ("qkqv", "kv"))
    return Claim(
        id="dalberto-finding1-n4-kqv-wins" + _suffix(sketch),
        claim="At n = 4, KQV wins on KL, geometric K error and 6D distance for every distribution and rank "
              "tested." + _sensitivity(sketch),
        source="D'Alberto, arXiv 2605.08114, abstract, finding (1)",
        measurement=measurement(f"{sketch_txt(sketch)}, n = 4, KQV significantly lower (cells for / cells): {parts}"),
        data=data_text(a),
        verdict=kqv_lower(_pr(sel)),
        figure=f"{STUDY}_n4.png",
        sample=direction_sample(sel, _family(a, sketch), unit=_unit(a)),
        details=conventions(a) + " distance_6d: per trial ‖e/m‖ over the six 6D components (docs/metrics_error6d.md).")


def finding2_claim(a: Analysis, sketch: str) -> Claim:
    """Every budget under srht; the sensitivity rows at n = 4."""
    sel = _cells(a.pairs, "attention_kl", "qkqv", sketch)
    r = a.ratios[a.ratios["sketch"] == sketch]
    return Claim(
        id="dalberto-finding2-qkqv-worse-kl" + _suffix(sketch),
        claim="QKQV is worse than KQV in KL at every budget and distribution (the K–V asymmetry is absolute)."
              + _sensitivity(sketch, " at n = 4"),
        source="D'Alberto, arXiv 2605.08114, abstract, finding (2)",
        measurement=measurement(f"{sketch_txt(sketch)}, n ∈ {sorted(set(sel['n']))}: KQV's KL significantly lower "
                                f"in {per_model(a, 'attention_kl', 'qkqv', -1, sketch)} (data, n) cells",
                                f"median KL ratio QKQV/KQV {r['ratio'].min():.2f}–{r['ratio'].max():.2f}×"),
        data=data_text(a),
        verdict=kqv_lower(_pr(sel)),
        figure=f"{STUDY}_kl.png",
        sample=direction_sample(sel, _family(a, sketch), unit=_unit(a)),
        details=conventions(a))


def crossover_markdown(kd: pd.DataFrame, better_q: dict[int, int]) -> str:
    """Finding 3's table: per budget, the paper's better scheme beside what the data show."""
    return ("| n | paper: better K geometry | data sets where QKQV has lower median 1 − cos | median ratio "
            "QKQV/KQV (range over data) |\n|---|---|---|---|\n" +
            "\n".join(f"| {n} | {CROSSOVER[n].upper()} | {better_q[n]}/{int((kd['n'] == n).sum())} | "
                      f"{kd[kd['n'] == n]['ratio'].min():.2f}–{kd[kd['n'] == n]['ratio'].max():.2f} |"
                      for n in BUDGETS))


def finding3_claim(a: Analysis) -> Claim:
    """The crossover of the K geometry (srht)."""
    kd = a.cross[a.cross["metric"] == "k_direction"]
    cells = list(zip(kd["n"], kd["p_holm_k_direction"], kd["rank_biserial_kqv_minus_qkqv"]))
    better_q = {n: int((kd[kd["n"] == n]["better"] == "qkqv").sum()) for n in BUDGETS}
    sel = _cells(a.pairs, "k_direction", "qkqv")  # the verdict's cells: crossover_table's rows at the distinctive n
    sel = sel[sel["n"].isin(CROSSOVER_DISTINCTIVE) & ~sel["label"].str.endswith("(isotropic q)")]
    return Claim(
        id="dalberto-finding3-crossover",
        claim="Crossover: QKQV has better geometric K reconstruction at n ∈ {2, 3, 5}, KQV at n ∈ {4, 6}, "
              "independent of rank and tail weight.",
        source="D'Alberto, arXiv 2605.08114, abstract, finding (3)",
        measurement=measurement(sketch_txt(SKETCH),
                                "k_direction = mean 1 − cos(k, k̂) (independent of the query model): QKQV's median "
                                f"lower in {sum(better_q.values())}/{len(kd)} (data, n) cells, median ratio "
                                f"QKQV/KQV {kd['ratio'].min():.2f}–{kd['ratio'].max():.2f}"),
        data=data_text(a),
        verdict=crossover_verdict(cells),
        figure=f"{STUDY}_crossover.png",
        sample=direction_sample(sel, _family(a), unit=_unit(a)),
        details=crossover_markdown(kd, better_q) + "\n\nThe verdict counts the (data, n) cells at n ∈ "
                f"{{{', '.join(map(str, CROSSOVER_DISTINCTIVE))}}}, where the paper has QKQV better: a cell is for the "
                f"claim when the paired test of k_direction (Holm p < {ALPHA}) points to QKQV. At n ∈ {{4, 6}} the "
                "claim restates finding 1 (KQV better), verdicted there. Same picture with the relative K error in "
                "figures/data/budget_sweep_crossover.csv.")


def _gaussian(a: Analysis) -> list[str]:
    """The gaussian data's labels (one per query model)."""
    return [lab for lab in a.labels if lab.split(" (")[0] == "gaussian"]


def _gaussian_ratios(a: Analysis, r4: pd.DataFrame) -> tuple[list[V.Verdict], list[str]]:
    """The number verdict and the measurement text of each gaussian query model's KL ratio at n = 4."""
    parts, texts = [], []
    for lab in _gaussian(a):
        row = r4.loc[lab]
        parts.append(ratio_verdict((row["ci_low"], row["ci_high"]), row["ratio"]))
        texts.append(f"{lab}{'' if lab.endswith(')') else ' (peaked q)'}: QKQV/KQV = {row['ratio']:.2f}× "
                     f"[95% CI {row['ci_low']:.2f}, {row['ci_high']:.2f}], Mann–Whitney r = "
                     f"{row['mw_rank_biserial']:+.3f}, {fmt_p(row['mw_p'])} ({row['mw_p_method']})")
    return parts, texts


def _ratio_details(r4: pd.DataFrame, triple: dict) -> str:
    """The 2.25× claim's details: every data set's ratio and Mann–Whitney test, and the attainable p."""
    exact_n = mann_whitney_min_n(PAPER_P, method="exact")
    normal_n = mann_whitney_min_n(PAPER_P, method="asymptotic")
    lines = "\n".join(f"| {lab} | {r.ratio:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}] | {r.mw_rank_biserial:+.3f} | "
                      f"{r.mw_r_z:+.3f} | {r.mw_p:.2g} ({r.mw_p_method}) | {r.mw_p_asymptotic:.2g} |"
                      for lab, r in r4.iterrows())
    n_tr = int(r4.loc["gaussian", "n_trials"]) if "gaussian" in r4.index else int(r4["n_trials"].iloc[0])
    p_min = mann_whitney_min_pvalue(n_tr, method="exact")  # complete separation: 2/C(2n, n)
    return ("Number rule on the ratio of medians with its 95% paired bootstrap CI (trials matched), per "
            "query model, combined. SmolLM2 rows: a cluster BCa bootstrap (the documents, then their windows), "
            "shown, not in the verdict. Every data set at n = 4:\n\n| data | QKQV/KQV [95% CI] | Mann–Whitney "
            "rank-biserial r | Z/√N | p | normal-approx. p |\n|---|---|---|---|---|---|\n" + lines +
            f"\n\nWith {n_tr} vs {n_tr} trials the smallest possible two-sided exact p is "
            f"{p_min:.1e}; p < 1e−23 is attainable from {exact_n} trials per "
            f"group with the exact p (2/C(2n, n) at complete separation), from {normal_n} with the "
            f"normal approximation. The paper's own numbers: the {triple_text(triple)}.")


def kl_ratio_claim(a: Analysis, sketch: str) -> Claim:
    """The 2.25× ratio: gaussian data, each query model."""
    r4 = a.ratios[(a.ratios["sketch"] == sketch) & (a.ratios["n"] == 4)].set_index("label")
    parts, texts = _gaussian_ratios(a, r4)
    triple = published_triple()
    return Claim(
        id="dalberto-kl-ratio-2.25" + _suffix(sketch),
        claim="At n = 4, KQV's KL is 2.25× lower than QKQV's (Mann–Whitney r = −0.983, p < 1e−23)."
              + _sensitivity(sketch),
        source="D'Alberto, arXiv 2605.08114, abstract",
        measurement=measurement(f"{sketch_txt(sketch)}, gaussian data: " + "; ".join(texts)),
        data=data_text(a),
        verdict=V.combine(parts) if len(parts) > 1 else parts[0],
        figure=f"{STUDY}_kl_ratio.png",
        sample=ratio_sample(r4.loc[_gaussian(a)], unit="trials"),
        details=_ratio_details(r4, triple),
        discrepancy=(f"D'Alberto's {triple_text(triple)}."
                     if sketch == SKETCH and triple["p_normal"] >= PAPER_P else None))


#: the 6D claim's cells are energy-distance permutation tests, which have no power formula to plan from
ENERGY_SAMPLE = ("none planned: the energy-distance permutation test of two 6D clouds has no closed-form power, so no "
                 "sample size follows from an effect of interest")


def energy_claim(a: Analysis) -> Claim:
    """The 6D energy test (srht): decided where neither attention KL nor a single 6D component separates the
    schemes."""
    resamples, en = a.cfg["resamples"], a.energy
    paper_pair = en[en["other"] == "qkqv"]
    kl_open = en[~en["kl_separates"].astype(bool)]
    open_cells = kl_open[~kl_open["component_separates"].astype(bool)]

    def cell(r) -> str:
        return (f"{r.label} vs {r.other}: KL Holm p = {r.kl_p_holm:.2g}, "
                + (f"{r.separating_components} separate{'s' if ' ' not in r.separating_components else ''} "
                   f"(Holm p = {r.component_min_p_holm:.2g})" if r.component_separates
                   else f"no component separates (smallest Holm p = {r.component_min_p_holm:.2g})")
                + f", ℰ = {r.energy_distance:.3g}, p = {r.p:.2g}")

    return Claim(
        id="dalberto-6d-discriminates-n4",
        claim="The 6D error framework discriminates the schemes' error distributions beyond scalar metrics "
              "(KQV vs QKQV at n = 4).",
        source="D'Alberto, arXiv 2605.08114, abstract (6D error framework); test: energy distance, "
               "docs/metrics_error6d.md",
        measurement=(f"{sketch_txt(SKETCH)}: KQV vs QKQV (the paper's pair) separates on attention KL in "
                     f"{int(paper_pair['kl_separates'].sum())}/{len(paper_pair)} data sets, so the 6D test there "
                     f"(p ≤ {paper_pair['p'].max():.2g}) shows nothing beyond KL. Where KL does not separate KQV from "
                     "another scheme at n = 4: " + ("; ".join(cell(r) for r in kl_open.itertuples())
                                                   if len(kl_open) else "no cell")
                     + f"; {len(open_cells)} cell{'s' if len(open_cells) != 1 else ''} left where no scalar separates"
                     + f" ({resamples} permutations; smallest attainable p = {1 / (resamples + 1):.0e})."),
        data=data_text(a),
        verdict=energy_verdict(en),
        figure=f"{STUDY}_n4.png",
        sample=ENERGY_SAMPLE if len(open_cells) else None,  # None: not testable here
        details="Only a cell where no scalar separates the two schemes — neither attention KL (paired Wilcoxon over "
                "trials, Holm within the paper sketch's tests) nor any one of the six 6D components (paired "
                "Wilcoxon, Holm over the six) — can show the 6D error discriminating beyond scalar metrics; there "
                f"the energy-distance permutation test of the two 6D clouds decides (Holm over those cells, level "
                f"{ALPHA}).\n\n| data | KQV vs | KL Holm p | KL separates | separating components (Holm p) | "
                "energy distance | p |\n|---|---|---|---|---|---|---|\n"
                + "\n".join(f"| {r.label} | {r.other} | {r.kl_p_holm:.2g} | {'yes' if r.kl_separates else 'no'} | "
                            f"{r.separating_components or 'none'} ({r.component_min_p_holm:.2g}) | "
                            f"{r.energy_distance:.3g} | {r.p:.2g} |" for r in en.itertuples()))


def qjl_on_v_claim(a: Analysis) -> Claim:
    """QJL on V: KQV vs KV (same K quantizer) on the attention output error."""
    sel = _cells(a.pairs, "output_error", "kv")
    vsel = _cells(a.pairs, "v_rel_mse", "kv")
    return Claim(
        id="dalberto-qjl-on-v-useful",
        claim="QJL's unbiased correction is genuinely useful on V (KQV's attention output beats KV's at the "
              "same budget).",
        source="D'Alberto, arXiv 2605.08114, §3.3 (effect on V)",
        measurement=measurement(f"{sketch_txt(SKETCH)}: KQV's output error significantly lower than KV's in "
                                f"{per_model(a, 'output_error', 'kv', -1)} (data, n) cells, higher in "
                                f"{per_model(a, 'output_error', 'kv', +1)}",
                                f"V's own error ‖v − v̂‖²/‖v‖² lower for KQV in {per_model(a, 'v_rel_mse', 'kv', -1)}"),
        data=data_text(a),
        verdict=kqv_lower(_pr(sel)),
        figure=f"{STUDY}_n4.png",
        sample=direction_sample(sel, _family(a), unit=_unit(a)),
        details=conventions(a) + f" The verdict uses output_error over {len(sel)} cells; V's error is shown beside "
                f"it ({len(vsel)} cells).")


def top5_claim(a: Analysis) -> Claim:
    """Top-5 routing: KQV vs QKQV."""
    sel = _cells(a.pairs, "top5", "qkqv")
    return Claim(
        id="dalberto-top5-routing",
        claim="KL inflation has routing consequences: QKQV recovers fewer of the reference top-5 tokens "
              "than KQV.",
        source="D'Alberto, arXiv 2605.08114, §3.4",
        measurement=measurement(f"{sketch_txt(SKETCH)}: KQV's top-5 recall significantly higher in "
                                f"{per_model(a, 'top5', 'qkqv', +1)} (data, n) cells",
                                f"median difference of top-5 recall KQV − QKQV {sel['median_difference'].min():+.3f} "
                                f"to {sel['median_difference'].max():+.3f}"),
        data=data_text(a),
        verdict=kqv_higher(_pr(sel)),
        figure=f"{STUDY}_top5.png",
        sample=direction_sample(sel, _family(a), unit=_unit(a), relative=False),
        details=conventions(a) + " top-5 recall: share of the reference top-5 keys (ties broken by index) among "
                "the scheme's top 5 (kvstats.metrics.topk_recall_from_scores).")


def superlinear_claim(a: Analysis) -> Claim:
    """§3.4: KL grows super-linearly with the K direction error, fitted directly."""
    tab = superlinear_table(a.primary)
    edge = 1 + SUPERLINEAR_MARGIN
    above, below = int((tab["lo"] > edge).sum()), int((tab["hi"] < edge).sum())
    return Claim(
        id="dalberto-kl-superlinear-k-direction",
        claim="The convexity of e^x (Jensen) amplifies the K direction error super-linearly into KL: KL grows "
              "super-linearly with the K direction error.",
        source="D'Alberto, arXiv 2605.08114, §3.4",
        measurement=(f"{sketch_txt(SKETCH)}: slope β of log KL on log(1 − cos(k, k̂)) across n ∈ {list(BUDGETS)} "
                     f"and trials, per (data, scheme): {tab['slope'].min():.2f} to {tab['slope'].max():.2f} "
                     f"(median {tab['slope'].median():.2f}); CI above {edge:g} (super-linear beyond the margin "
                     f"{SUPERLINEAR_MARGIN:g}) in {above}/{len(tab)} cells, below it in {below}. At leading order "
                     "KL ≈ ½·Var_p(logit error) and the logit error is ∝ ‖k − k̂‖, "
                     "whose square is ∝ 1 − cos: β = 1 is the quadratic (non-Jensen) baseline."),
        data=data_text(a),
        verdict=superlinear_verdict(tab),
        figure=None,
        sample=superlinear_sample(tab),
        details=("| data | scheme | β [95% CI] | trials |\n|---|---|---|---|\n"
                 + "\n".join(f"| {r.label} | {r.scheme} | {r.slope:.2f} [{r.lo:.2f}, {r.hi:.2f}] | {r.trials} |"
                              for r in tab.itertuples())
                 + f"\n\nOLS on the per-trial points (log 1 − cos, log KL) of every budget; {SUPERLINEAR_RESAMPLES} "
                   "bootstrap resamples of the trials (real windows: documents, then windows), BCa. The points mix "
                   "budgets and data draws, so β describes how KL and direction error co-vary across this grid."))


def minmax_claim(a: Analysis) -> Claim:
    """The KIVI-style min-max baseline (our own measurement)."""
    mm = _cells(a.pairs, "attention_kl", "minmax")
    return Claim(
        id="kvstats-minmax-baseline",
        claim="KIVI-style min-max (K per channel, V per token, fp16 min/scale in groups of d) as a baseline "
              "at the same nominal budget (docs/references.md §7; not in D'Alberto's comparison).",
        source="kvstats",
        measurement=(f"KL: KQV significantly lower than min-max in {_count(mm, -1)} (data, n) cells, min-max "
                     f"lower in {_count(mm, +1)}. Side information: 32/d bits per element, equal to the fp32 "
                     "norm of the other schemes."),
        data=data_text(a),
        verdict=V.measured(f"paired KL tests of KQV vs min-max: KQV lower in {_count(mm, -1)}, min-max lower "
                           f"in {_count(mm, +1)}"),
        figure=f"{STUDY}_kl.png")


def formats_claim(a: Analysis) -> Claim | None:
    """The deployed formats on the real windows beside KQV at the same n (our own measurement; None without them)."""
    if a.formats is None:
        return None
    from kvstats.studies.formats import method_label

    f = a.formats
    med = f.groupby(["scheme", "n"], sort=False)[["attention_kl", "top5", "bits_k", "bits_v"]].median()
    parts = [f"{method_label(spec, int(n))} ({(r.bits_k + r.bits_v) / 2:.3g} bits per element): median attention KL "
             f"{r.attention_kl:.3g}, top-5 recall {r.top5:.3f}" for (spec, n), r in med.iterrows()]
    t = a.formats_tests if a.formats_tests is not None else pd.DataFrame()
    kl = t[t["metric"] == "attention_kl"] if len(t) else t
    lower = kl[(kl["p_holm"] < ALPHA) & (kl["rank_biserial"] < 0)] if len(kl) else kl
    higher = kl[(kl["p_holm"] < ALPHA) & (kl["rank_biserial"] > 0)] if len(kl) else kl
    return Claim(
        id="budget-sweep-formats",
        claim="The deployed formats (int per token-head, KIVI as published, NVFP4, FP8-K/NVFP4-V, FP8 e4m3) on the "
              "same real windows, beside KQV at the same n (attention-level damage of SmolLM2's own queries).",
        source="kvstats",
        measurement=("medians over windows and layers: " + "; ".join(parts)
                     + f". Attention KL against KQV at the same n, per layer (paired Wilcoxon over windows, Holm "
                       f"over the {len(t)} tests of figures/data/{STUDY}_formats_wilcoxon.csv): the format lower in "
                       f"{len(lower)} of {len(kl)} (layer, format) cells, higher in {len(higher)}. The same n is not "
                       "the same bits held (the formats study compares at equal measured bits); bits per element "
                       "here: payload and side information over a window's tokens (fp8 e4m3 has unity scales)."),
        data=data_text(a) + "; the formats on the real windows only (their own sweep: the primary grid's 6D scales "
                            "stay D'Alberto's schemes')",
        verdict=V.measured(f"the format's attention KL lower than KQV's in {len(lower)} of {len(kl)} same-n cells, "
                           f"higher in {len(higher)}"),
        figure=None)


def equal_budget_claim(a: Analysis) -> Claim:
    """D'Alberto's "fair bit budget": the bits each scheme holds at the same n, by kvstats' accounting."""
    rows = [(n, d, s, bits_held(s, n, d)) for d in dims(a) for n in BUDGETS for s in ("kv", "kqv", "qkqv")]
    kv = {(n, d): b for n, d, s, b in rows if s == "kv"}
    others = [(n, d, s, b) for n, d, s, b in rows if s != "kv"]
    return Claim(
        id="dalberto-equal-budget-fair",
        claim="KV, KQV and QKQV are compared at a fair bit budget: at the same n each holds the same bits per "
              "cache element.",
        source="D'Alberto, arXiv 2605.08114, abstract (the three schemes analysed \"under a fair bit budget\")",
        measurement=("bits per element held (kvstats BitBudget: payload n plus each stage's float norms, K and V "
                     "averaged): " + "; ".join(
                         f"d = {d}: " + ", ".join(f"n = {n}: " + "/".join(f"{b:g}" for n_, d_, _, b in rows
                                                                          if n_ == n and d_ == d)
                                                  for n in BUDGETS) for d in dims(a))
                     + " (KV/KQV/QKQV). Beyond KV's bits at every n: "
                     + "; ".join(f"d = {d}: KQV +{bits_held('kqv', 4, d) - kv[4, d]:g}, QKQV "
                                 f"+{bits_held('qkqv', 4, d) - kv[4, d]:g}" for d in dims(a)) + "."),
        data=f"kvstats.scheme(name, bits=n, dim=d).bits_per_coordinate() at n ∈ {list(BUDGETS)}",
        verdict=V.identity([b for *_, b in others], [kv[n, d] for n, d, _, _ in others], atol=1e-9,
                           what="(scheme, n, d) rows of KQV and QKQV (bits held equal to KV's)"),
        figure=None,
        sample=EXACT,
        details="The budget n counts payload bits per element; the QJL stage of KQV's V and of QKQV's K and V keeps "
                "one more norm per vector (float32 by default), 32/d bits per element each. Every comparison of "
                "this study at \"the same n\" therefore gives KQV and QKQV these extra bits; the claims state "
                "them beside their verdicts.",
        discrepancy=("\"Fair bit budget\": at the same n, KQV holds "
                     + ", ".join(f"+{bits_held('kqv', 4, d) - kv[4, d]:g}" for d in dims(a)) + " and QKQV "
                     + ", ".join(f"+{bits_held('qkqv', 4, d) - kv[4, d]:g}" for d in dims(a))
                     + " bits per element more than KV (d = " + ", ".join(map(str, dims(a)))
                     + "): the norms of their QJL stages."))


def claims(a: Analysis) -> list[Claim]:
    """Every claim, in the report's order: D'Alberto's findings (1)–(3) and his 2.25× (each under the paper's
    sketch, then the sensitivity sketches where it has them), the 6D test, QJL on V, top-5, min-max."""
    sketches = (SKETCH, *SENSITIVITY_SKETCHES)
    return ([finding1_claim(a, s) for s in sketches] + [finding2_claim(a, s) for s in sketches]
            + [finding3_claim(a)] + [kl_ratio_claim(a, s) for s in sketches]
            + [energy_claim(a), superlinear_claim(a), qjl_on_v_claim(a), top5_claim(a), minmax_claim(a),
               equal_budget_claim(a)]
            + [c for c in (formats_claim(a),) if c is not None])


def real_data_text(a: Analysis, data: str, sketch: str = SKETCH) -> str:
    """The data sentence of one real model's rows alone (its QJL stages under ``sketch``)."""
    facts, cfg = SHIPPED_MODELS[REAL_DATA[data]], a.cfg
    layers = sorted(int(x) for x in a.table["layer"].unique())
    windows = real_windows(cfg["window"], data)
    return (f"{facts.name} layers {', '.join(map(str, layers))} (d = {facts.head_dim}, {facts.kv_heads} KV / "
            f"{facts.q_heads} query heads), {a.n_windows} disjoint windows of {cfg['window']} tokens over "
            f"{len({doc for doc, _ in windows})} documents (of {len(DOCUMENT_TITLES)}), its own last {cfg['n_q'] // 2} "
            f"queries per head, causal; the {sketch} sketch; Holm over this model's tests alone; {a.scale} scale")


def real_claims(a: Analysis, data: str) -> list[Claim]:
    """D'Alberto's findings (1) and (2) and his 2.25× on one real model's windows alone (an analysis of its rows
    only: its own Holm family per sketch), by the rules of the combined rows: the per-model verdicts that the two
    models' comparison row sets side by side — under the paper's sketch, then under each sensitivity sketch at
    :data:`SENSITIVITY_BUDGETS` where the model's rows have it."""
    sketches = [SKETCH] + [s for s in SENSITIVITY_SKETCHES if (a.ratios["sketch"] == s).any()]
    return [c for sketch in sketches for c in _real_claims(a, data, sketch)]


def _real_claims(a: Analysis, data: str, sketch: str) -> list[Claim]:
    model = REAL_DATA[data]
    name = SHIPPED_MODELS[model].name
    f1 = _finding1_cells(a.pairs, sketch)
    f1_text = ", ".join(f"{m} vs {o.upper()} {_count(_cells(a.pairs, m, o, sketch, 4), -1)}"
                        for m in FINDING1_METRICS for o in ("qkqv", "kv"))
    f2 = _cells(a.pairs, "attention_kl", "qkqv", sketch)
    r = a.ratios[a.ratios["sketch"] == sketch]
    r4 = r[r["n"] == 4]
    ratios = [ratio_verdict((row.ci_low, row.ci_high), row.ratio) for row in r4.itertuples()]
    data_text_ = real_data_text(a, data, sketch)
    note, suffix = _sensitivity(sketch), _suffix(sketch)
    return [
        Claim(id=model_claim_id("dalberto-finding1-n4-kqv-wins-smollm2", model) + suffix,
              claim="At n = 4, KQV wins on KL, geometric K error and 6D distance (here: on one model's real "
                    f"attention, every layer tested){note}.",
              source="D'Alberto, arXiv 2605.08114, abstract, finding (1)",
              measurement=measurement(f"{name}, n = 4, KQV significantly lower (cells for / cells): {f1_text}"),
              data=data_text_, verdict=kqv_lower(_pr(f1)), figure=None,
              sample=direction_sample(f1, _family(a, sketch), unit="windows")),
        Claim(id=model_claim_id("dalberto-finding2-qkqv-worse-kl-smollm2", model) + suffix,
              claim="QKQV is worse than KQV in KL at every budget (here: on one model's real attention, every "
                    f"layer tested){_sensitivity(sketch, ' at n = 4')}.",
              source="D'Alberto, arXiv 2605.08114, abstract, finding (2)",
              measurement=measurement(f"{name}, n ∈ {sorted(set(f2['n']))}: KQV's KL significantly lower in "
                                      f"{_count(f2, -1)} (layer, n) cells",
                                      f"median KL ratio QKQV/KQV {r['ratio'].min():.2f}–{r['ratio'].max():.2f}×"),
              data=data_text_, verdict=kqv_lower(_pr(f2)), figure=None,
              sample=direction_sample(f2, _family(a, sketch), unit="windows")),
        Claim(id=model_claim_id("dalberto-kl-ratio-2.25-smollm2", model) + suffix,
              claim="At n = 4, KQV's KL is 2.25× lower than QKQV's (here: on one model's real attention, per "
                    f"layer){note}.",
              source="D'Alberto, arXiv 2605.08114, abstract",
              measurement=measurement(f"{name}, QKQV/KQV median attention KL at n = 4 per layer: " + ", ".join(
                  f"{lab.split()[-1]}: {row.ratio:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]"
                  for lab, row in r4.set_index("label").iterrows()) + " (95% cluster BCa CIs: documents, then "
                  "windows)"),
              data=data_text_, verdict=V.combine(ratios) if len(ratios) > 1 else ratios[0], figure=None,
              sample=ratio_sample(r4, unit="windows")),
    ]
