"""The figures of the primary configuration (srht sketch)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvstats.studies.budget_sweep.cells import BUDGETS, PAPER_RATIO, SCHEMES, SKETCH, STUDY
from kvstats.study import plots


def figures(table: pd.DataFrame, labels: list[str], ratios: pd.DataFrame, cross: pd.DataFrame, n_trials: str) -> None:
    """The figures of the primary configuration (srht sketch); ``table`` is its view."""
    plots.setup()
    budget_figure(table, labels, "attention_kl", "attention_kl: KL(p_ref ‖ p_quant) [nats]", "kl", n_trials, log=True)
    budget_figure(table, labels, "top5", "top-5 recall", "top5", n_trials, log=False)
    crossover_figure(labels, cross)
    kl_ratio_figure(labels, ratios)
    n4_figure(table, labels, n_trials)


def budget_figure(table: pd.DataFrame, labels: list[str], metric: str, ylabel: str, name: str, n_trials: str, *,
                  log: bool) -> None:
    """``metric`` against the budget n per data label: median and IQR of each scheme."""
    cols = 4
    rows = math.ceil(len(labels) / cols)
    fig, axes = plots.panels(rows, cols, f"{ylabel} vs budget n: median and IQR over {n_trials} trials per point",
                             width=3.6, height=2.9)
    for ax, label in zip(axes.flat, labels):
        sub = table[table["label"] == label]
        for sch in SCHEMES:
            g = sub[sub["scheme"] == sch].groupby("n")[metric]
            st = plots.style(sch)
            med, lo, hi = g.median(), g.quantile(0.25), g.quantile(0.75)
            ax.errorbar(med.index, med, yerr=[med - lo, hi - med], color=st["color"], marker=st["marker"],
                        ms=4, capsize=2, lw=1.2, label=st["label"])
        ax.set_title(label)
        ax.set_xlabel("budget n [bits per element]")
        ax.set_ylabel(ylabel if metric == "top5" else "attention_kl [nats]")
        ax.set_xticks(BUDGETS)
        if log:
            ax.set_yscale("log")
    for ax in axes.flat[len(labels):]:
        ax.set_visible(False)
    handles, leg = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, leg, loc="outside lower center", ncol=4)
    plots.save(fig, f"{STUDY}_{name}")


def crossover_figure(labels: list[str], cross: pd.DataFrame) -> None:
    """Median QKQV / median KQV of the two K errors against n, per data label."""
    fig, axes = plots.panels(1, 2, "Geometric K error of QKQV relative to KQV: the crossover test", width=6.0,
                             height=4.0)
    for metric, ax, what in (("k_direction", axes[0, 0], "k_direction: mean 1 − cos(k, k̂)"),
                             ("k_rel_mse", axes[0, 1], "mean ‖k − k̂‖² / ‖k‖²")):
        for i, label in enumerate(labels):
            c = cross[(cross["label"] == label) & (cross["metric"] == metric)]
            ax.plot(c["n"], c["ratio"], marker="o", ms=3.5, lw=1.1, color=plt_color(i), label=label)
        ax.axhline(1.0, color="black", lw=1)
        ax.axhspan(0, 1.0, color="#d62728", alpha=0.07)
        ax.text(0.02, 0.02, "below 1: QKQV better (paper: at n = 2, 3, 5)", transform=ax.transAxes, fontsize=7,
                va="bottom")
        ax.set_xticks(BUDGETS)
        ax.set_ylim(0, cross[cross["metric"] == metric]["ratio"].max() * 1.1)
        ax.set_xlabel("budget n [bits per element]")
        ax.set_ylabel(f"median QKQV / median KQV of {what}")
        ax.set_title(f"K error: {what}")
    axes[0, 1].legend(fontsize=7, ncol=2)
    plots.save(fig, f"{STUDY}_crossover")


def kl_ratio_figure(labels: list[str], ratios: pd.DataFrame) -> None:
    """The KL ratio QKQV / KQV (srht sketch) against n with its CI, per data label, and the paper's 2.25×."""
    fig, axes = plots.panels(1, 1, f"KL ratio QKQV / KQV vs n, {SKETCH} sketch (ratio of medians, 95% paired "
                             "bootstrap CI)", width=7.5, height=4.5)
    ax = axes[0, 0]
    offsets = np.linspace(-0.25, 0.25, len(labels))
    for i, label in enumerate(labels):
        r = ratios[(ratios["label"] == label) & (ratios["sketch"] == SKETCH)]
        ax.errorbar(r["n"] + offsets[i], r["ratio"], yerr=[r["ratio"] - r["ci_low"], r["ci_high"] - r["ratio"]],
                    marker="o", ms=3.5, lw=1, capsize=2, color=plt_color(i), label=label)
    ax.plot([4], [float(PAPER_RATIO)], marker="*", ms=14, color="black", ls="none",
            label=f"D'Alberto: QKQV {PAPER_RATIO}× higher at n = 4")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(BUDGETS)
    ax.set_xlabel("budget n [bits per element]")
    ax.set_ylabel("median KL(QKQV) / median KL(KQV)")
    ax.legend(fontsize=6, ncol=2, loc="best")
    plots.save(fig, f"{STUDY}_kl_ratio")


def n4_figure(table: pd.DataFrame, labels: list[str], n_trials: str) -> None:
    """Boxes of every scheme at n = 4, per data label, for KL, top-5 recall, K direction and 6D distance."""
    n4 = table[table["n"] == 4]
    fig, axes = plots.panels(2, 2, f"All schemes at n = 4 ({n_trials} trials per box)", width=7.0, height=3.6)
    for ax, (metric, ylabel, log) in zip(axes.flat, (("attention_kl", "attention_kl [nats]", True),
                                                     ("top5", "top-5 recall", False),
                                                     ("k_direction", "k_direction: mean 1 − cos(k, k̂)", True),
                                                     ("distance_6d", "distance_6d (median-scaled norm)", True))):
        width = 0.8 / len(SCHEMES)
        for j, sch in enumerate(SCHEMES):
            data = [n4[(n4["label"] == lab) & (n4["scheme"] == sch)][metric].to_numpy() for lab in labels]
            pos = np.arange(len(labels)) + (j - (len(SCHEMES) - 1) / 2) * width
            st = plots.style(sch)
            bp = ax.boxplot(data, positions=pos, widths=width * 0.85, patch_artist=True,
                            flierprops={"marker": "o", "markerfacecolor": "none", "markersize": 3})
            for patch in bp["boxes"]:
                patch.set_facecolor(st["color"])
                patch.set_alpha(0.55)
            for med in bp["medians"]:
                med.set_color("black")
            ax.plot([], [], color=st["color"], lw=6, alpha=0.55, label=st["label"])
        ax.set_xticks(np.arange(len(labels)), labels, rotation=25, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7, loc="best")
    plots.save(fig, f"{STUDY}_n4")


def plt_color(i: int) -> str:
    return ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf", "#393b79", "#637939"][i % 12]
