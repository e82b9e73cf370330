"""The figures: attention per scheme, per layer, and the generalized Parseval relation on real keys."""

from __future__ import annotations

from kvstats.quant.quantizers.nova import (
    DEFAULT_RIDGE,
)
from kvstats.studies.nova.analysis import Analysis
from kvstats.studies.nova.cells import BUDGETS, METRICS
from kvstats.study import plots

STYLE = {"nova": {"color": "#9467bd", "marker": "*", "label": "NOVA-KV (calibrated, held-out text)"},
         "nova_insample": {"color": "#c5b0d5", "marker": "P", "label": "NOVA-KV calibrated in-sample"}}


def style(name: str) -> dict[str, str]:
    return STYLE.get(name) or plots.style(name)


def attention_figure(a: Analysis) -> None:
    """Boxes per scheme of KL, top-5 recall and KL with the sink exact, per budget (nova_attention.png; a second
    model's nova_<label>_attention.png)."""
    units, tst, schemes = a.units, a.tst, a.schemes
    n_units = units[(units["scheme"] == "nova") & (units["n"] == 2)].shape[0]
    fig, axes = plots.panels(3, 2, f"Held-out {a.model_name} attention: NOVA-KV vs data-oblivious schemes "
                                   f"({n_units} (layer, query head) units per box, {a.scale} scale)\n"
                                   "r: rank-biserial r of nova vs that scheme, 2U₁/(n₁n₂) − 1 (negative: nova lower);"
                                   " KL lower is better, recall higher",
                             width=5.2, height=3.3)
    for col, n in enumerate(BUDGETS):
        for row, metric in enumerate(("kl", "top5", "kl_sink_exact")):
            ax = axes[row, col]
            label, log, _ = METRICS[metric]
            groups = {sch: units[(units["scheme"] == sch) & (units["n"] == n)][metric].to_numpy() for sch in schemes}
            plots.boxplot(ax, groups, colors=[style(s)["color"] for s in schemes], ylabel=label, log=log)
            ax.set_title(f"n = {n} bits: {label}")
            t = tst[(tst["n"] == n) & (tst["metric"] == metric)].set_index("nova_vs")
            ax.set_xticks(range(1, len(schemes) + 1),
                          [sch if sch not in t.index else f"{sch}\nr={t.loc[sch, 'rank_biserial']:+.2f}"
                           for sch in schemes])
    plots.save(fig, f"{a.prefix}_attention")


def layers_figure(a: Analysis) -> None:
    """Median KL and top-5 recall over query heads per layer, per scheme and budget (nova_layers.png)."""
    units, schemes = a.units, a.schemes
    fig, axes = plots.panels(2, 2, f"{a.model_name}, per layer: median over query heads", width=5.2, height=3.4)
    for col, n in enumerate(BUDGETS):
        for row, metric in enumerate(("kl", "top5")):
            ax = axes[row, col]
            label, log, _ = METRICS[metric]
            for sch in schemes:
                med = units[(units["scheme"] == sch) & (units["n"] == n)].groupby("layer")[metric].median()
                st = style(sch)
                ax.plot(med.index, med.to_numpy(), marker=st["marker"], color=st["color"], ms=4, lw=1.1,
                        label=st["label"])
            ax.set_xlabel("layer")
            ax.set_ylabel(label)
            ax.set_title(f"n = {n} bits")
            if log:
                ax.set_yscale("log")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3)
    plots.save(fig, f"{a.prefix}_layers")


def parseval_figure(a: Analysis) -> None:
    """‖y − ŷ‖² against the squared logit error per (layer, KV head), and their ratio per layer
    (nova_parseval.png)."""
    pars = a.pars
    fig, axes = plots.panels(1, 2, f"Generalized Parseval on {a.model_name}'s keys (NOVA-KV, n = 2, held-out keys; "
                                   "one point per layer and KV head)", width=5.2, height=4.2)
    ax = axes[0, 0]
    lo = min(pars["coef_mse"].min(), pars["logit_mse_heldout_q"].min()) * 0.7
    hi = max(pars["coef_mse"].max(), pars["logit_mse_heldout_q"].max()) * 1.4
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="y = x")
    ax.scatter(pars["coef_mse"], pars["logit_mse_calib_q"], s=14, color="#9467bd",
               label="E_q over the calibration queries")
    ax.scatter(pars["coef_mse"], pars["logit_mse_heldout_q"], s=14, marker="x", color="#ff7f0e",
               label="E_q over the held-out queries")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean ‖y − ŷ‖² (coefficient-domain MSE)")
    ax.set_ylabel("mean (qᵀ(k − k̂))² (squared logit error)")
    ax.legend()
    ax = axes[0, 1]
    layers = pars.groupby("layer")
    ax.plot(layers["layer"].first(), (layers["logit_mse_calib_q"].sum() / layers["coef_mse"].sum()).to_numpy(),
            "o-", color="#9467bd", ms=4, label="calibration queries")
    ax.plot(layers["layer"].first(), (layers["logit_mse_heldout_q"].sum() / layers["coef_mse"].sum()).to_numpy(),
            "x-", color="#ff7f0e", ms=5, label="held-out queries")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("E_q[(qᵀ(k − k̂))²] / ‖y − ŷ‖²")
    ax.set_title(f"ratio per layer (calibration: 1 − ridge share, ρ = {DEFAULT_RIDGE:g})")
    ax.legend()
    plots.save(fig, f"{a.prefix}_parseval")
