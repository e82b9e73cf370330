"""The figures: the estimator's variance against m and cos, and TurboQuant's error histograms."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvstats.measure.stats import t_interval
from kvstats.studies.qjl_variance.analysis import method_errors
from kvstats.studies.qjl_variance.cells import COS_AT_M, M_AT_COS, STUDY, D
from kvstats.study import plots


def variance_figure(main_tab: pd.DataFrame, cfg: dict) -> None:
    """Variance vs m at COS_AT_M and vs cos at M_AT_COS, both row kinds, with the closed forms."""
    fig, axes = plots.panels(1, 2, f"QJL estimator variance at d = {D} (unit q, k; mean and 95% CI over "
                             f"{cfg['sketches']} sketches × {cfg['pairs']} pairs)", width=5.6, height=4.2)
    for ax, xcol, fixed, fixed_val in ((axes[0, 0], "m", "cos", COS_AT_M), (axes[0, 1], "cos", "m", M_AT_COS)):
        sub = main_tab[main_tab[fixed] == fixed_val].sort_values(xcol)
        for rows, color, marker in (("gaussian", "#d62728", "o"), ("orthogonal", "#1f77b4", "s")):
            s = sub[sub["rows"] == rows]
            ax.errorbar(s[xcol], s["var"], yerr=[s["var"] - s["var_lo"], s["var_hi"] - s["var"]], color=color,
                        marker=marker, ls="none", ms=5, capsize=3, label=f"QJL, {rows} rows (measured)")
        s = sub[sub["rows"] == "gaussian"]
        ax.plot(s[xcol], s["qjl_closed_form"], "-", color="#d62728", lw=1, label="closed form ((π/2) − cos²)/m")
        ax.plot(s[xcol], s["jl_closed_form"], ":", color="black", lw=1, label="unquantized JL (1 + cos²)/m")
        ax.set_ylabel("Var[Prod(q, k)]  (unit q, k)")
        ax.legend(fontsize=7)
        if xcol == "m":
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sketch rows m (bits per key)")
            ax.set_title(f"vs m at cos∠(q, k) = {COS_AT_M}")
        else:
            ax.set_xlabel("cos∠(q, k)")
            ax.set_title(f"vs cos∠(q, k) at m = {M_AT_COS}")
    plots.save(fig, STUDY)


def errors_figure(errs: pd.DataFrame, cfg: dict) -> None:
    """TurboQuant's figure 1: histograms of the inner-product error of turbo_mse and turbo_prod, b = 1..4."""
    fig, axes = plots.panels(1, 4, f"Inner-product error ⟨y, x̂⟩ − ⟨y, x⟩ at d = {D}, ⟨y, x⟩ = 0.5 "
                             f"({cfg['err_vectors']} vectors per histogram)", width=3.4, height=3.2)
    for ax, bits in zip(axes.flat, (1, 2, 3, 4)):
        lim = 0
        for method in ("turbo_mse", "turbo_prod"):
            lim = max(lim, np.quantile(np.abs(method_errors(errs, method, bits)), 0.995))
        bins = np.linspace(-lim, lim, 50)
        for method in ("turbo_mse", "turbo_prod"):
            e = method_errors(errs, method, bits)
            st = plots.style(method)
            m = t_interval(e).statistic
            ax.hist(e, bins=bins, histtype="stepfilled", alpha=0.4, color=st["color"],
                    label=f"{st['label']} (mean {m:+.4f})")
            ax.axvline(m, color=st["color"], lw=1.2)
        ax.axvline(0, color="black", lw=0.8, ls=":")
        ax.set_title(f"b = {bits}")
        ax.set_xlabel("⟨y, x̂⟩ − ⟨y, x⟩")
        ax.set_ylabel("count")
        ax.legend(fontsize=6.5, loc="upper left")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    plots.save(fig, f"{STUDY}_errors")
