"""The figures: distortion vs bits, and the worst case of the WHT."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvstats.studies.turboquant_distortion.cells import BITS, STUDY, D, exact_dmse
from kvstats.study import plots


def distortion_figure(tab: pd.DataFrame, cfg: dict) -> None:
    """d·D_prod and D_mse against b: measured (with CIs), exact, bounds and TurboQuant's printed values."""
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


def worst_case_figure(worst: pd.DataFrame, cfg: dict) -> None:
    """Box plots of turbo_mse(2)'s squared error on e_1 and on uniform vectors, WHT vs Haar rotation."""
    fig, axes = plots.panels(1, 1, f"turbo_mse, b = 2, d = {D}: squared error of one vector over "
                             f"{cfg['worst_reps']} rotation seeds", width=7.0, height=4.0)
    ax = axes[0, 0]
    groups = {f"{rot.upper()}, {vec}": worst[(worst["rotation"] == rot) & (worst["vector"] == vec)]["sq_error"]
              for rot in ("wht", "haar") for vec in ("e1", "uniform")}
    plots.boxplot(ax, groups, colors=["#d62728", "#ff9896", "#1f77b4", "#aec7e8"], ylabel="‖x − x̂‖²")
    ax.axhline(exact_dmse(D, 2), color="black", ls=":", label=f"D_mse(d = {D}, b = 2) = {exact_dmse(D, 2):.4f}")
    ax.legend()
    plots.save(fig, f"{STUDY}_worst_case")
