"""Study: TurboQuant's distortions D_mse and D_prod vs bits, against its bounds and its printed table.

    python studies/turboquant_distortion.py --scale quick|paper [--scheduler ADDR]

Monte Carlo through the real quantizers (kvstats.quantizer("turbo_mse"/"turbo_prod")) at d = 128, b = 1..6:
unit vectors x uniform on the sphere, an independent unit y per x, fresh quantizer seeds per replicate;
D_mse = E‖x − x̂‖², D_prod = E(⟨y, x⟩ − ⟨y, x̂⟩)² (reported as d·D_prod, the numbers TurboQuant prints).
Exact values: D_mse from the exact Lloyd–Max codebook of f_d (kvstats.codebooks.beta_codebook(d, b).d_mse),
D_prod = (π/2 − 1/d)·D_mse(b−1)/d (REFERENCE §3, derived; D_mse(0) = 1). Bounds (TurboQuant Thm 1, 2):
4^−b ≤ D_mse ≤ (√3π/2)·4^−b and 4^−b/d ≤ D_prod ≤ (√3π²/d)·4^−b for unit y.

Two known discrepancies are measured here too:
* the D_prod formula holds averaged over y's direction, not for every y: for y ∥ x it is
  ((π/2)·D_mse − E⟨r, x⟩²)/d (kvstats.inference.turbo_prod_distortion with cos² = 1);
* the randomized WHT is not a Haar rotation: the 1-hot vector e_1 maps to ±1/√d in every coordinate, the
  worst case for a scalar codebook (b = 2: squared error 0.255 vs D_mse 0.116); a Haar rotation gives ≈ D_mse.

Writes figures/turboquant_distortion.png, figures/turboquant_distortion_worst_case.png, figures/data/
turboquant_distortion{,_table,_worst_case}.csv and the claims file.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd
import scipy.stats
import torch

from kvstats import plots, study
from kvstats.codebooks import beta_codebook, gaussian_codebook
from kvstats.inference import turbo_prod_distortion
from kvstats.quantizers import quantizer
from kvstats.sphere import sample_sphere
from kvstats.sweep import cell_seed, grid

STUDY = "turboquant_distortion"
VERSION = "1"
POSITION = 40  # place in figures/REPORT.md (kvstats.report.study_order)
D = 128
BITS = (1, 2, 3, 4, 5, 6)
PRINTED_DMSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}
PRINTED_DPROD_TIMES_D = {1: 1.57, 2: 0.56, 3: 0.18, 4: 0.047}
SCALE = {"quick": {"vectors": 2000, "reps": 4, "worst_reps": 16},
         "paper": {"vectors": 20000, "reps": 10, "worst_reps": 64}}


def exact_dmse(d: int, bits: int) -> float:
    return 1.0 if bits == 0 else beta_codebook(d, bits).d_mse


def exact_dprod(d: int, bits: int) -> float:
    return turbo_prod_distortion(exact_dmse(d, bits - 1), d)


def cell(method: str, bits: int, d: int, vectors: int, rep: int) -> list[dict]:
    """One replicate: mean squared errors over ``vectors`` unit x (with unit y ⟂-random, and y = x)."""
    x = sample_sphere(vectors, d, seed=cell_seed(STUDY, "x", d, vectors, rep)).float()
    y = sample_sphere(vectors, d, seed=cell_seed(STUDY, "y", d, vectors, rep)).float()
    q = quantizer(method, bits=bits, dim=d, seed=cell_seed(STUDY, "quant", method, bits, d, rep))
    code = q.encode(x)
    x_hat = q.decode(code).double()
    x64, y64 = x.double(), y.double()
    sq = (x64 - x_hat).pow(2).sum(-1)
    ip_err = (y64 * (x64 - x_hat)).sum(-1)      # ⟨y, x⟩ − ⟨y, x̂⟩ (decode-then-dot = each method's estimator)
    par_err = (x64 * (x64 - x_hat)).sum(-1)     # y = x: ⟨x, x⟩ − ⟨x, x̂⟩
    row = {"d_mse": float(sq.mean()), "d_mse_se": float(sq.std() / math.sqrt(vectors)),
           "d_prod_x_d": d * float(ip_err.pow(2).mean()),
           "d_prod_parallel_x_d": d * float(par_err.pow(2).mean()),
           "bias_ip": float(ip_err.mean())}
    if method == "turbo_prod":
        # the residual of the MSE stage along x: A = E⟨r, x⟩² enters D_prod for y ∥ x
        if q.mse is None:
            r_par2 = 1.0
        else:
            mse_hat = q.mse.decode(code.parts["mse"]).double()
            r_par2 = float((x64 * (x64 - mse_hat)).sum(-1).pow(2).mean())
        row["residual_parallel2"] = r_par2
    return [row]


def worst_cell(rotation: str, vector: str, bits: int, d: int, rep: int) -> list[dict]:
    """Squared error of turbo_mse(bits) on one vector (e_1 or a uniform unit vector) for one rotation seed."""
    if vector == "e1":
        x = torch.zeros(1, d)
        x[0, 0] = 1.0
    else:
        x = sample_sphere(1, d, seed=cell_seed(STUDY, "worst-x", d, rep)).float()
    q = quantizer("turbo_mse", bits=bits, dim=d, seed=cell_seed(STUDY, "worst", rotation, d, rep), rotation=rotation)
    return [{"sq_error": float((x - q.decode(q.encode(x))).double().pow(2).sum())}]


def main(argv: list[str] | None = None) -> int:
    shell = study.start(STUDY, __doc__, argv, position=POSITION)
    args = shell.args
    cfg = SCALE[args.scale]
    table = shell.sweep(cell, grid(method=["turbo_mse", "turbo_prod"], bits=list(BITS), d=D, vectors=cfg["vectors"],
                                   rep=list(range(cfg["reps"]))), version=VERSION)
    worst = shell.sweep(worst_cell, grid(rotation=["wht", "haar"], vector=["e1", "uniform"], bits=2, d=D,
                                         rep=list(range(cfg["worst_reps"]))), version=VERSION, name=f"{STUDY}_worst")
    plots.write_csv(STUDY, table)
    plots.write_csv(f"{STUDY}_worst_case", worst)

    def summary(method, column):
        g = table[table["method"] == method].groupby("bits")[column]
        n = g.count()
        mean, sd = g.mean(), g.std()
        t = scipy.stats.t.ppf(0.975, n - 1)
        return mean, mean - t * sd / np.sqrt(n), mean + t * sd / np.sqrt(n)

    rows = []
    for b in BITS:
        r = {"bits": b, "d": D, "exact_d_mse": exact_dmse(D, b), "gaussian_limit_d_mse": gaussian_codebook(b).d_mse,
             "exact_d_prod_x_d": D * exact_dprod(D, b), "printed_d_mse": PRINTED_DMSE.get(b, math.nan),
             "printed_d_prod_x_d": PRINTED_DPROD_TIMES_D.get(b, math.nan),
             "lower_d_mse": 4.0**-b, "upper_d_mse": math.sqrt(3) * math.pi / 2 * 4.0**-b,
             "lower_d_prod_x_d": 4.0**-b, "upper_d_prod_x_d": math.sqrt(3) * math.pi**2 * 4.0**-b}
        for method in ("turbo_mse", "turbo_prod"):
            for col in ("d_mse", "d_prod_x_d", "d_prod_parallel_x_d"):
                m, lo, hi = (s[b] for s in summary(method, col))
                r[f"{method}_{col}"], r[f"{method}_{col}_lo"], r[f"{method}_{col}_hi"] = m, lo, hi
        prod = table[(table["method"] == "turbo_prod") & (table["bits"] == b)]
        a = float(prod["residual_parallel2"].mean())
        r["exact_d_prod_parallel_x_d"] = D * turbo_prod_distortion(exact_dmse(D, b - 1), D, cos2=1.0,
                                                                   residual_parallel2=min(a, exact_dmse(D, b - 1)))
        rows.append(r)
    tab = pd.DataFrame(rows)
    plots.write_csv(f"{STUDY}_table", tab)

    plots.setup()
    fig, axes = plots.panels(1, 2, f"TurboQuant distortion vs bits at d = {D} (Monte Carlo: mean and 95% CI over "
                             f"{cfg['reps']} × {cfg['vectors']} vectors)", width=5.6, height=4.3)
    b = np.array(BITS)
    for ax, col, exact, lo, hi, printed, ylabel in (
            (axes[0, 0], "d_prod_x_d", "exact_d_prod_x_d", "lower_d_prod_x_d", "upper_d_prod_x_d",
             "printed_d_prod_x_d", "d · D_prod = d · E(⟨y,x⟩ − ⟨y,x̂⟩)²  (unit x, y)"),
            (axes[0, 1], "d_mse", "exact_d_mse", "lower_d_mse", "upper_d_mse", "printed_d_mse",
             "D_mse = E‖x − x̂‖²  (unit x)")):
        for method in ("turbo_prod", "turbo_mse"):
            st = plots.style(method)
            m = tab[f"{method}_{col}"]
            ax.errorbar(b, m, yerr=[m - tab[f"{method}_{col}_lo"], tab[f"{method}_{col}_hi"] - m], color=st["color"],
                        marker=st["marker"], ms=5, capsize=3, label=f"{st['label']} (measured)")
        ax.plot(b, tab[exact], "k:", lw=1.2, label="exact (codebook): TurboQuant_prod" if col == "d_prod_x_d"
                else "exact (codebook)")
        prod = col != "d_mse"
        ax.plot(b, tab[lo], "--", color="#2ca02c", lw=1.2, label="lower bound: d·D_prod ≥ 4⁻ᵇ" if prod
                else "lower bound: D_mse ≥ 4⁻ᵇ")
        ax.plot(b, tab[hi], "--", color="#9467bd", lw=1.2,
                label="upper bound: d·D_prod ≤ √3π²·4⁻ᵇ" if prod else "upper bound: D_mse ≤ (√3π/2)·4⁻ᵇ")
        ax.plot(b[:4], tab[printed][:4], "*", color="black", ms=9, label="TurboQuant's printed values")
        ax.set_yscale("log")
        ax.set_xlabel("bits per coordinate b")
        ax.set_ylabel(ylabel)
        ax.set_xticks(BITS)
        ax.legend(fontsize=7)
    axes[0, 0].set_title("inner-product distortion")
    axes[0, 1].set_title("MSE distortion")
    plots.save(fig, STUDY)

    fig, axes = plots.panels(1, 1, f"turbo_mse, b = 2, d = {D}: squared error of one vector over "
                             f"{cfg['worst_reps']} rotation seeds", width=7.0, height=4.0)
    ax = axes[0, 0]
    groups = {f"{rot.upper()}, {vec}": worst[(worst["rotation"] == rot) & (worst["vector"] == vec)]["sq_error"]
              for rot in ("wht", "haar") for vec in ("e1", "uniform")}
    plots.boxplot(ax, groups, colors=["#d62728", "#ff9896", "#1f77b4", "#aec7e8"], ylabel="‖x − x̂‖²")
    ax.axhline(exact_dmse(D, 2), color="black", ls=":", label=f"D_mse(d = {D}, b = 2) = {exact_dmse(D, 2):.4f}")
    ax.legend()
    plots.save(fig, f"{STUDY}_worst_case")

    t4 = tab[tab["bits"] <= 4]
    mse_md = ("| b | measured D_mse [95% CI] | exact (codebook, d = 128) | printed | printed vs exact | "
              "Gaussian limit |\n|---|---|---|---|---|---|\n" +
              "\n".join(f"| {r.bits} | {r.turbo_mse_d_mse:.5f} [{r.turbo_mse_d_mse_lo:.5f}, {r.turbo_mse_d_mse_hi:.5f}]"
                        f" | {r.exact_d_mse:.6f} | {r.printed_d_mse} | "
                        f"{100 * (r.printed_d_mse - r.exact_d_mse) / r.exact_d_mse:+.1f}% | "
                        f"{r.gaussian_limit_d_mse:.5f} |" for r in t4.itertuples()))
    prod_md = ("| b | measured d·D_prod [95% CI] | exact (π/2 − 1/d)·D_mse(b−1) | printed | printed vs exact | "
               "Gaussian limit (π/2)·D_mse(b−1) |\n|---|---|---|---|---|---|\n" +
               "\n".join(f"| {r.bits} | {r.turbo_prod_d_prod_x_d:.4f} [{r.turbo_prod_d_prod_x_d_lo:.4f}, "
                         f"{r.turbo_prod_d_prod_x_d_hi:.4f}] | {r.exact_d_prod_x_d:.4f} | {r.printed_d_prod_x_d} | "
                         f"{100 * (r.printed_d_prod_x_d - r.exact_d_prod_x_d) / r.exact_d_prod_x_d:+.1f}% | "
                         f"{math.pi / 2 * (1.0 if r.bits == 1 else gaussian_codebook(r.bits - 1).d_mse):.4f} |"
                         for r in t4.itertuples()))
    mse_in = all(r.turbo_mse_d_mse_lo <= r.exact_d_mse <= r.turbo_mse_d_mse_hi for r in tab.itertuples())
    prod_in = all(r.turbo_prod_d_prod_x_d_lo <= r.exact_d_prod_x_d <= r.turbo_prod_d_prod_x_d_hi
                  for r in tab.itertuples())
    off_mse = [(r.bits, 100 * (r.printed_d_mse - r.exact_d_mse) / r.exact_d_mse) for r in t4.itertuples()]
    off_prod = [(r.bits, 100 * (r.printed_d_prod_x_d - r.exact_d_prod_x_d) / r.exact_d_prod_x_d)
                for r in t4.itertuples()]
    bounds_ok = all(r.lower_d_mse <= r.turbo_mse_d_mse <= r.upper_d_mse and
                    r.lower_d_prod_x_d <= r.turbo_prod_d_prod_x_d <= r.upper_d_prod_x_d for r in tab.itertuples())
    data_txt = (f"unit vectors uniform on S^{D - 1}, d = {D}, {cfg['reps']} replicates (fresh rotation/sketch seeds) "
                f"× {cfg['vectors']} vectors per bit width ({args.scale} scale)")
    b2 = tab[tab["bits"] == 2].iloc[0]
    # published numbers more than 10% off the exact values: stated under "Known discrepancies" in REPORT.md
    big_mse = [r for r in t4.itertuples() if abs(r.printed_d_mse - r.exact_d_mse) > 0.1 * r.exact_d_mse]
    big_prod = {r.bits: r for r in t4.itertuples()
                if abs(r.printed_d_prod_x_d - r.exact_d_prod_x_d) > 0.1 * r.exact_d_prod_x_d}

    def off_text(r) -> str:
        pct = 100 * (r.printed_d_mse - r.exact_d_mse) / r.exact_d_mse
        return (f"TurboQuant's printed D_mse at b = {r.bits} ({r.printed_d_mse:g}) is {abs(pct):.1f}% "
                f"{'below' if pct < 0 else 'above'} the exact value {r.exact_d_mse:.6f} at d = {D}")

    mse_gap = "; ".join(off_text(r) + (f"; its printed D_prod at b = {r.bits + 1} "
                                       f"({big_prod[r.bits + 1].printed_d_prod_x_d:g}/d) inherits the rounding"
                                       if r.bits + 1 in big_prod else "") for r in big_mse)
    par, avg = b2["turbo_prod_d_prod_parallel_x_d"], b2["exact_d_prod_x_d"]
    par_outside = not (b2["turbo_prod_d_prod_parallel_x_d_lo"] <= avg <= b2["turbo_prod_d_prod_parallel_x_d_hi"])
    par_pct = 100 * (b2["exact_d_prod_parallel_x_d"] / avg - 1)
    w = worst.groupby(["rotation", "vector"])["sq_error"]
    wm, ws = w.mean(), w.std()
    w_e1, w_haar, d_mse2 = wm[("wht", "e1")], wm[("haar", "e1")], exact_dmse(D, 2)
    claims = [
        {
            "id": "turboquant-dmse-values",
            "claim": "TurboQuant_mse: D_mse ≈ 0.36, 0.117, 0.03, 0.009 at b = 1, 2, 3, 4 (unit vectors).",
            "source": "Zandieh et al., TurboQuant, arXiv 2504.19874, Theorem 1 / table of D_mse (REFERENCE §3)",
            "measurement": ("measured (Monte Carlo through turbo_mse) agrees with the exact codebook value at every b "
                            f"({'all' if mse_in else 'not all'} exact values inside the 95% CIs); "
                            "printed vs exact: " + ", ".join(f"b={b_}: {o:+.1f}%" for b_, o in off_mse) + "."
                            + (f" {mse_gap} (figures/data/{STUDY}_table.csv)." if mse_gap else "")),
            "data": data_txt,
            "verdict": "partly",
            "figure": f"{STUDY}.png",
            "details": mse_md + "\n\nThe printed values are rounded Gaussian-limit values"
                       + (f"; the rounding at b = {', '.join(str(r.bits) for r in big_mse)} misses by more than 10%."
                          if big_mse else "."),
            "discrepancy": f"{mse_gap} (figures/data/{STUDY}_table.csv)." if mse_gap else None,
        },
        {
            "id": "turboquant-dprod-values",
            "claim": "TurboQuant_prod: D_prod ≈ 1.57/d, 0.56/d, 0.18/d, 0.047/d at b = 1, 2, 3, 4 (unit x and y); "
                     "exact at finite d (derived): (π/2 − 1/d)·D_mse(b−1)/d.",
            "source": "Zandieh et al., TurboQuant, arXiv 2504.19874, Theorem 2 (REFERENCE §3)",
            "measurement": (f"measured d·D_prod {', '.join(f'{r.turbo_prod_d_prod_x_d:.3f}' for r in t4.itertuples())}"
                            f" at b = 1..4 (exact formula {'inside every' if prod_in else 'outside some'} 95% CI); "
                            "printed vs exact: " + ", ".join(f"b={b_}: {o:+.1f}%" for b_, o in off_prod) + "."),
            "data": data_txt + "; y independent of x",
            "verdict": "reproduced" if prod_in and max(abs(o) for _, o in off_prod) < 10 else "partly",
            "figure": f"{STUDY}.png",
            "details": prod_md + "".join(
                f"\n\nThe printed b = {b_} value {r.printed_d_prod_x_d:g} ≈ (π/2)·{PRINTED_DMSE[b_ - 1]:g} inherits "
                f"the rounding of the printed D_mse({b_ - 1}) = {PRINTED_DMSE[b_ - 1]:g} (exact "
                f"{exact_dmse(D, b_ - 1):.4f}), hence its "
                f"{100 * (r.printed_d_prod_x_d - r.exact_d_prod_x_d) / r.exact_d_prod_x_d:+.0f}% gap."
                for b_, r in big_prod.items() if b_ - 1 in PRINTED_DMSE),
        },
        {
            "id": "turboquant-bounds",
            "claim": "4^−b ≤ D_mse ≤ (√3π/2)·4^−b and 4^−b/d ≤ D_prod ≤ (√3π²/d)·4^−b (TurboQuant's figure 3).",
            "source": "Zandieh et al., TurboQuant, arXiv 2504.19874, Theorems 1–3, figure 3",
            "measurement": ("every measured D_mse and D_prod at b = 1..6 lies between the bounds" if bounds_ok else
                            "some measured values lie outside the bounds") +
                           f" (e.g. b = 6: D_mse {tab.iloc[-1].turbo_mse_d_mse:.2e} in "
                           f"[{tab.iloc[-1].lower_d_mse:.2e}, {tab.iloc[-1].upper_d_mse:.2e}]).",
            "data": data_txt,
            "verdict": "reproduced" if bounds_ok else "not reproduced",
            "figure": f"{STUDY}.png",
            "details": "The D_prod upper bound √3π²/d·4^−b is TurboQuant's Theorem 2 as stated in the paper "
                       "(REFERENCE §3 lists only the lower bound).",
        },
        {
            "id": "turboquant-dprod-any-y",
            "claim": "D_prod = (π/2 − 1/d)·D_mse(b−1)·‖y‖²/d holds \"for any y\".",
            "source": "REFERENCE §3 (derived formula; TurboQuant states D_prod for any y)",
            "measurement": (f"for y = x at b = 2: measured d·D_prod {b2['turbo_prod_d_prod_parallel_x_d']:.4f} "
                            f"[{b2['turbo_prod_d_prod_parallel_x_d_lo']:.4f}, "
                            f"{b2['turbo_prod_d_prod_parallel_x_d_hi']:.4f}]"
                            f" vs the y∥x formula ((π/2)D_mse − E⟨r,x⟩²) = {b2['exact_d_prod_parallel_x_d']:.4f} and "
                            f"the averaged formula {b2['exact_d_prod_x_d']:.4f} "
                            f"({100 * (b2['turbo_prod_d_prod_parallel_x_d'] / b2['exact_d_prod_x_d'] - 1):+.0f}%); for "
                            f"independent y: {b2['turbo_prod_d_prod_x_d']:.4f}."),
            "data": data_txt,
            "verdict": "partly",
            "figure": None,
            "details": "The residual r = x − x̂_mse has a component along x (E⟨r, x⟩ = D_mse), so E⟨r, y⟩² depends on "
                       "the angle between x and y; the formula holds averaged over y's direction "
                       "(kvstats.inference.turbo_prod_distortion gives both).",
            "discrepancy": (f"D_prod = (π/2 − 1/d)·D_mse(b−1)/d \"for any y\" holds only averaged over y's direction: "
                            f"for y ∥ x it is ((π/2)·D_mse − E⟨r,x⟩²)/d (kvstats.inference.turbo_prod_distortion), "
                            f"{abs(par_pct):.0f}% {'lower' if par_pct < 0 else 'higher'} at b = 2 (measured d·D_prod "
                            f"{par:.4f} vs {avg:.4f})." if par_outside else None),
        },
        {
            "id": "kvstats-wht-worst-case",
            "claim": "TurboQuant's D_mse guarantee assumes a random rotation; with a randomized Walsh–Hadamard "
                     "rotation the 1-hot vector e_1 maps to ±1/√d in every coordinate, its worst case.",
            "source": "kvstats (REFERENCE §3 assumes a random orthogonal Π; the WHT is a structured one)",
            "measurement": (f"b = 2, d = {D}: ‖e_1 − ê_1‖² = {wm[('wht', 'e1')]:.3f} (sd {ws[('wht', 'e1')]:.1e} over "
                            f"{cfg['worst_reps']} seeds) with the WHT vs {wm[('haar', 'e1')]:.3f} ± "
                            f"{ws[('haar', 'e1')]:.3f} with a Haar rotation; D_mse = {exact_dmse(D, 2):.3f}."),
            "data": f"e_1 and uniform unit vectors, d = {D}, b = 2, {cfg['worst_reps']} rotation seeds",
            "verdict": "measured",
            "figure": f"{STUDY}_worst_case.png",
            "details": None,
            "discrepancy": (f"The randomized Walsh–Hadamard rotation maps the 1-hot vector e₁ to ±1/√d in every "
                            f"coordinate, its worst case: squared error {w_e1:.3f} vs D_mse {d_mse2:.3f} at d = {D}, "
                            f"b = 2 (a Haar rotation gives {w_haar:.3f})." if w_e1 > 1.5 * d_mse2 else None),
        },
    ]
    return shell.finish(claims)


if __name__ == "__main__":
    sys.exit(main())
