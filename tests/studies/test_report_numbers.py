"""Headline numbers of the committed figures/REPORT.md recomputed from the committed figures/data alone.

Each test reads a claim's section of the report and the CSV its numbers come from, recomputes the number with numpy,
scipy or statsmodels (never kvstats' own analysis code), formats it as the report prints it and finds it in the
section: the report says what its data say. The report and its data are regenerated together (``make figures``),
so these hold at any scale; a section or a file that is missing fails, it is not skipped. A row of the full tier
(docs/studies.md, "Tiers") is recomputed from the full tier's data, figures/full/data.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

FIGURES = Path(__file__).resolve().parents[2] / "figures"


@pytest.fixture(scope="module")
def report() -> str:
    return (FIGURES / "REPORT.md").read_text(encoding="utf-8")


def section(report: str, claim_id: str) -> str:
    """The claim's section: from its heading ``### <id> — <verdict>`` to the next heading."""
    match = re.search(rf"^### {re.escape(claim_id)} — .*?(?=^##)", report, flags=re.S | re.M)
    assert match, f"no section for claim {claim_id!r} in figures/REPORT.md"
    return match.group(0)


def data(name: str, where: str | None = None) -> pd.DataFrame:
    """The CSV ``name`` of the tier the claim section ``where`` names (its **Tier** line); without a section, the
    everyday tier's file, else the full tier's (a table only the full tier writes)."""
    everyday, full = FIGURES / "data" / f"{name}.csv", FIGURES / "full" / "data" / f"{name}.csv"
    if where is not None:
        return pd.read_csv(full if "- **Tier:** full" in where else everyday)
    return pd.read_csv(everyday if everyday.is_file() else full)


def listed(text: str) -> list[float]:
    """A list column as the CSV writer stores it ("[0.1, 0.2]")."""
    return [float(x) for x in json.loads(text)]


def test_turboquant_bounds_and_dmse_values(report):
    """D_mse means over the replicates; the bounds 4^−b and (√3π/2)·4^−b in closed form."""
    rows = data("turboquant_distortion")
    mse = rows[rows["method"] == "turbo_mse"].groupby("bits")["d_mse"].mean()
    bounds = section(report, "turboquant-bounds")
    low, high = 4.0 ** -6, math.sqrt(3) * math.pi / 2 * 4.0 ** -6
    assert f"b = 6: D_mse {mse[6]:.2e} in [{low:.2e}, {high:.2e}]" in bounds
    values = section(report, "turboquant-dmse-values")
    assert "measured D_mse (Monte Carlo through turbo_mse) " + ", ".join(f"{mse[b]:.4f}" for b in (1, 2, 3, 4)) \
        in values


def test_lloyd_max_one_bit_is_its_closed_form(report):
    """The 1-bit Lloyd–Max quantizer of N(0, 1) has levels ±√(2/π) and MSE 1 − 2/π."""
    table = data("sphere_law_turboquant_dmse_table").set_index("bits")
    assert table.loc[1, "gaussian_limit_d_mse"] == pytest.approx(1 - 2 / math.pi, abs=1e-6)
    assert f"b=1: {1 - 2 / math.pi:.6f}" in section(report, "lloyd-max-gaussian-table")


def test_beta_figures_counts_by_the_paired_and_the_unpaired_test(report):
    """Per (d, data) cell of the Hadamard sketch: scipy's Wilcoxon signed-rank over the trials (paired) and exact
    Mann–Whitney (the paper's), Holm over the 12 cells (statsmodels), MSE lower: the two counts printed."""
    kl = data("beta_figures_kl")
    paired, unpaired = [], []
    for (_d, _kind), g in kl.groupby(["d", "kind"]):
        a = g[g["method"] == "turbo_mse"].sort_values("trial")["kl"].to_numpy()
        b = g[(g["method"] == "turbo_prod") & (g["sketch"] == "srht")].sort_values("trial")["kl"].to_numpy()
        w = scipy.stats.wilcoxon(a, b)
        diff = a - b
        ranks = scipy.stats.rankdata(np.abs(diff))
        paired.append((w.pvalue, ranks[diff > 0].sum() - ranks[diff < 0].sum()))
        u = scipy.stats.mannwhitneyu(a, b, method="exact")
        unpaired.append((u.pvalue, 2 * u.statistic / (len(a) * len(b)) - 1))

    def wins(tests):
        holm = multipletests([p for p, _ in tests], method="holm")[1]
        return sum(1 for q, (_, effect) in zip(holm, tests) if q < 0.05 and effect < 0)

    text = section(report, "dalberto-beta-figures-mse-wins")
    assert (f"(paired Wilcoxon, Holm p < 0.05) in {wins(paired)}/12 (d, data) cells (the paper's unpaired "
            f"Mann–Whitney: {wins(unpaired)}/12)") in text


def test_qjl_theorem_36_from_its_sketches(report):
    """0 failures in N sketches and the largest / median deviation, from the per-sketch values."""
    rows = data("qjl_variance_theorem36")
    text = section(report, "qjl-theorem-3.6")
    for r in rows.itertuples():
        worst = np.array(listed(r.worst_per_sketch))
        failures = int((worst > 3 * r.eps).sum())
        assert (f"ε = {r.eps:g}, m = {r.m}: {failures}/{len(worst)} sketches with a score outside 1 ± 3ε; largest "
                f"|ŝ/s − 1| {worst.max():.3f} (median {np.median(worst):.3f})") in text


def test_qjl_theorem_36_scaling_needed_sketch_size(report):
    """m* = m·median(deviation)² per log n, n = 4096 over n = 64, at every d (the point estimates)."""
    rows = data("qjl_variance_theorem36_scaling")
    cells = {(r.keys, r.d): r for r in rows.itertuples()}
    text = section(report, "qjl-theorem-3.6-scaling")
    for d in (64, 128, 256):
        a, b = cells[4096, d], cells[64, d]
        ratio = (a.m * np.median(listed(a.worst_per_sketch)) ** 2 / math.log(4096)) / (
            b.m * np.median(listed(b.worst_per_sketch)) ** 2 / math.log(64))
        assert f"d = {d}: {ratio:.3f} [" in text


def test_jensen_kl_ratio_and_holm_p_per_budget(report):
    """KL(QKQV)/KL(KQV) as a ratio of medians and scipy's Wilcoxon over the paired trials, Holm over the 5
    budgets (statsmodels)."""
    rows = data("jensen_schemes")
    budgets = sorted(rows["n"].unique())
    ratios, pvalues = [], []
    for n in budgets:
        at = rows[rows["n"] == n]
        a = at[at["scheme_name"] == "qkqv"].sort_values("trial")["kl"].to_numpy()
        b = at[at["scheme_name"] == "kqv"].sort_values("trial")["kl"].to_numpy()
        ratios.append(np.median(a) / np.median(b))
        pvalues.append(scipy.stats.wilcoxon(a, b).pvalue)
    holm = multipletests(pvalues, method="holm")[1]
    text = section(report, "dalberto-per-instance-bias")
    for n, ratio, p in zip(budgets, ratios, holm):
        assert re.search(rf"n = {n}: .*?KL QKQV / KQV {ratio:.2f} \(Wilcoxon r = [+-][0-9.]+, Holm p = {p:.2g}\)",
                         text), f"n = {n}: ratio {ratio:.2f}, Holm p {p:.2g}"


@pytest.mark.parametrize("name, claim", [("retrieval", "retrieval-fp"), ("retrieval_gemma3", "retrieval-fp-gemma3")])
def test_retrieval_fp_accuracy_and_wilson_intervals(report, name, claim):
    """Each model's fp pass counts per (task, length) from the trials, with statsmodels' Wilson 95% interval."""
    trials = data(f"{name}_trials")
    fp = trials[trials["scheme"] == "fp"]
    text = section(report, claim)
    for (task, length), g in fp.groupby(["task", "length"]):
        k, n = int(g["success"].sum()), len(g)
        lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
        assert f"{length} tokens {100 * k / n:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({k}/{n})" in text, (task, length)


@pytest.mark.parametrize("name, claim", [("model_damage", "model-layer-sensitivity"),
                                         ("model_damage_gemma3", "model-layer-sensitivity-gemma3")])
def test_model_damage_sensitivity_from_the_documents(report, name, claim):
    """The damage of every layer quantized, on each model: the mean over documents of the per-document next-token
    KL."""
    docs = data(f"{name}_sensitivity_documents")
    full = docs[docs["configuration"] == "all"]["damage"]
    assert f"mean next-token KL {full.mean():.3g} [" in section(report, claim)


@pytest.mark.parametrize("name, claim", [("formats", "formats-at-2.625-bits"),
                                         ("formats_gemma3", "formats-at-2.25-bits-gemma3")])
def test_formats_next_token_kl_from_the_units(report, name, claim):
    """A format's mean next-token KL on each model: the mean over the documents (the units) of each document's
    mean; and int_token@2's measured bits inside the budget's band (d = 64: 2 + 32/64; d = 256: 2 + 32/256)."""
    units = data(f"{name}_units")
    int2 = units[units["method"] == "int_token@2"]
    assert f"int_token@2 {int2['out_kl'].mean():.3g} (" in section(report, claim)
    assert (int2["bits"] == (2.5 if name == "formats" else 2.125)).all()


@pytest.mark.parametrize("name, claim, budget", [("recipe", "recipe-additivity", "3.5"),
                                                 ("recipe_gemma3", "recipe-additivity-gemma3", "4.125")])
def test_recipe_additivity_from_the_documents(report, name, claim, budget):
    """The recipe at one budget on each model: predicted (sum of isolated damages) and measured KL, means over the
    documents; the bits it holds: the mean over its layers of each layer's held bits (the maps table)."""
    docs = data(f"{name}_documents")
    at = docs[docs["map"] == f"budget {budget}"]
    maps = data(f"{name}_maps")
    bits = maps[maps["budget"] == float(budget)]["bits_held"].mean()
    assert (f"budget {budget} ({bits:.3g} bits held): predicted {at['predicted'].mean():.3g}, measured "
            f"{at['measured'].mean():.3g}") in section(report, claim)


@pytest.mark.parametrize("name, claim", [("nova", "nova-beats-scalar-n2"),
                                         ("nova_gemma3", "nova-beats-scalar-n2-gemma3")])
def test_nova_lowest_baseline_kl_from_the_units(report, name, claim):
    """NOVA-KV at n = 2 on each model: the median attention KL over (layer, query head) units of nova and of the
    data-oblivious baseline with the lowest median, from the unit rows (one seed)."""
    units = data(f"{name}_units")
    at2 = units[units["n"] == 2]
    medians = at2.groupby("scheme")["kl"].median()
    best = medians[["kqv", "qkqv", "kv", "minmax"]].idxmin()
    assert (f"the baseline with the lowest median KL is {best} ({medians[best]:.3g} vs nova's "
            f"{medians['nova']:.3g}") in section(report, claim)


def test_nova_rotations_equalize_from_the_spectra(report):
    """Top-8 energy shares after the rotation and after NOVA-KV's T: medians and ranges over the units."""
    pars = data("nova_parseval")
    rot, klt = pars["top8_energy_rotated"], pars["top8_energy"]
    text = section(report, "nova-rotations-equalize")
    assert f"median {rot.median():.3f} (range {rot.min():.3f}–{rot.max():.3f}; equal variances give " in text
    assert f"median {klt.median():.3f} (range {klt.min():.3f}–{klt.max():.3f})" in text


def test_jensen_bias_slopes_from_their_summary(report):
    """The QJL stage's residual slope as a share of the MSE stage's, per budget, from the committed summary."""
    rows = data("jensen_bias_summary").set_index(["method", "bits"])
    text = section(report, "dalberto-per-instance-bias")
    for n in (2, 3, 4, 5, 6):
        mse, prod = rows.loc[("turbo_mse", n)], rows.loc[("turbo_prod", n)]
        assert (f"n = {n}: MSE slope {mse['slope']:+.4f} [{mse['slope_lo']:+.4f}, {mse['slope_hi']:+.4f}], "
                f"QJL-stage slope {prod['slope']:+.5f} ({prod['slope'] / abs(mse['slope']):+.1%} of MSE's)") in text


def test_qjl_cache_headline_from_its_row(report):
    """QJL's cache on SmolLM2 at n = 3: next-token KL with its interval and the perplexity ratio, from its CSV row."""
    row = data("end_to_end_qjl").iloc[0]
    text = section(report, "qjl-cache-smollm2")
    assert (f"next-token KL {row['out_kl']:.3g} [{row['out_kl_lo']:.3g}, {row['out_kl_hi']:.3g}] nats, top-1 "
            f"agreement {row['top1']:.3f}, perplexity ×") in text
    # the CSV keeps 6 significant digits (6.7505), the report rounds the full value to 3 decimals: compare the
    # printed ratio to the CSV's perplexities within half a unit of its last digit
    printed = float(re.search(r"perplexity ×([0-9]+\.[0-9]+)", text).group(1))
    assert printed == pytest.approx(row["ppl"] / row["ppl_ref"], abs=5e-4 + 1e-5)
    assert row["ppl_ratio"] == pytest.approx(row["ppl"] / row["ppl_ref"], rel=1e-4)


def test_retrieval_neutral_pass_key_from_the_trials(report):
    """KQV at n = 4 against fp on the pass key: the trial count (planned ≥ 52) and the paired difference."""
    trials = data("retrieval_trials")
    key = trials[trials["task"] == "passkey"]
    fp = key[key["scheme"] == "fp"].set_index(["length", "prompt"])["success"].astype(bool)
    kqv = key[(key["scheme"] == "kqv") & (key["n"] == 4)].set_index(["length", "prompt"])["success"].astype(bool)
    kqv = kqv.loc[fp.index]
    assert len(fp) >= 52
    diff = 100 * (kqv.mean() - fp.mean())
    assert f"passkey {diff:+.1f} pts [90% CI " in section(report, "retrieval-kqv4-neutral")
    assert f"({len(fp)} trials)" in section(report, "retrieval-kqv4-neutral")


def test_values_per_token_from_the_documents(report):
    """QJL §4's value claim: V-only and K-only mean next-token KL per budget, their ratio and the exact paired
    Wilcoxon p (scipy), from the per-document rows."""
    sides = data("model_damage_sides")
    docs = sides[sides["kind"] == "side_document"]
    text = section(report, "qjl-values-per-token")
    for n, g in docs.groupby("bits"):
        k = g[g["side"] == "K"].set_index("document")["out_kl"]
        v = g[g["side"] == "V"].set_index("document")["out_kl"].loc[k.index]
        p = scipy.stats.wilcoxon(v, k, method="exact").pvalue
        assert (f"n = {n}: next-token KL V-only {v.mean():.3g} [") in text
        assert f"vs K-only {k.mean():.3g} [" in text
        assert f"(ratio {v.mean() / k.mean():.2f}; Wilcoxon p = {p:.2g}, r = " in text


def test_second_model_rows_from_their_data(report):
    """Gemma 3 270M's rows: the QKQV/KQV attention-KL ratio at n = 4 inside the model (ratio of the per-segment
    means), the per-layer ratio of median attention KL on its real windows, and the KS range of its rotated keys."""
    segs = data("end_to_end_gemma3_segments")
    at4 = segs[(segs["n"] == 4) & (segs["window"] == 0)]
    ratio = at4[at4["scheme"] == "qkqv"]["attn_kl"].mean() / at4[at4["scheme"] == "kqv"]["attn_kl"].mean()
    assert f"QKQV/KQV at n = 4 = {ratio:.2f} [" in section(report, "e2e-ratio-n4-gemma3")
    ratios = data("budget_sweep_gemma3_kl_ratio")
    r4 = ratios[(ratios["sketch"] == "srht") & (ratios["n"] == 4)]
    text = section(report, "dalberto-kl-ratio-2.25-gemma3")
    for row in r4.itertuples():
        assert f"{row.label.split()[-1]}: {row.median_kl_qkqv / row.median_kl_kqv:.2f} [" in text
    ks = data("kv_anatomy_ks", section(report, "gemma3-wht-sphere-law"))
    gemma = ks[ks["model"] == "gemma3-270m"]
    assert len(gemma) == 18 and (gemma["n"] == 2048).all()
    assert (f"after the WHT {gemma['ks_wht'].min():.3f}–{gemma['ks_wht'].max():.3f}"
            in section(report, "gemma3-wht-sphere-law"))
