"""retrieval's figures: accuracy over length × needle depth per task (one heatmap per budget) and pooled accuracy
against attention KL."""

from __future__ import annotations

from kvstats.studies.retrieval.analysis import NOVA_BITS, Analysis
from kvstats.studies.retrieval.cells import BASELINE, FP, FP_BITS
from kvstats.study import plots

STYLE = {FP: {"color": "#000000", "marker": "o", "label": "fp32 (no quantization)"},
         BASELINE: {"color": "#8c564b", "marker": "P", "label": "transformers QuantizedCache (quanto)"},
         "mse": {"color": "#17becf", "marker": "v", "label": "TurboQuant_mse on K and V"},
         "nova": {"color": "#9467bd", "marker": "*", "label": "NOVA-KV (calibrated)"}}


def style(name: str) -> dict[str, str]:
    return STYLE.get(name) or plots.style(name)


def heatmap(a: Analysis, n: int = NOVA_BITS) -> None:
    """Accuracy over length × depth: one row of panels per task, fp and the schemes at ``n``
    (:func:`kvstats.evaluation.retrieval_report.draw_heatmap`, the drawing of ``kvstats retrieval --figure``)."""
    import matplotlib.pyplot as plt

    from kvstats.evaluation.retrieval_report import draw_heatmap

    cols = [(FP, FP_BITS)] + [(s, n) for s in ("kqv", "minmax", "mse", "nova", BASELINE)
                         if ((a.grid["scheme"] == s) & (a.grid["n"] == n)).any()]
    grid = a.grid.assign(column=list(zip(a.grid["scheme"], a.grid["n"])))
    fig = draw_heatmap(grid, {t: list(ls) for t, ls in a.cfg["tasks"].items()},
                       [((s, b), style(s)["label"] if s in (FP, BASELINE) else s) for s, b in cols],
                       f"Retrieval accuracy over context length × needle depth ({a.model_name}; quantized caches at "
                       f"n = {n})")
    plots.save(fig, f"{a.prefix}_heatmap_n{n}")
    plt.close(fig)


def accuracy_vs_kl(a: Analysis) -> None:
    """Pooled accuracy (Wilson interval) against the mean attention KL, one point per (scheme, n), per task."""
    tasks = list(a.cfg["tasks"])
    fig, axes = plots.panels(1, len(tasks), f"Retrieval accuracy against attention KL ({a.model_name})", width=3.4,
                             height=3.0)
    for ax, task in zip(axes[0], tasks):
        g = a.pooled[a.pooled["task"] == task]
        fp = g[g["scheme"] == FP].iloc[0]
        ax.axhspan(fp["ci_low"], fp["ci_high"], color="0.85", label="fp32 (95% CI)")
        for s in a.schemes:
            r = g[g["scheme"] == s].sort_values("n")
            if r.empty:
                continue
            st = style(s)
            ax.errorbar(r["attn_kl"], r["accuracy"], yerr=[r["accuracy"] - r["ci_low"], r["ci_high"] - r["accuracy"]],
                        color=st["color"], marker=st["marker"], ls="-", lw=0.8, ms=4, capsize=2, label=s)
        ax.set_xscale("log")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("mean attention KL (nats)")
        ax.set_title(task)
    axes[0, 0].set_ylabel("accuracy (Wilson 95% CI)")
    axes[0, -1].legend(fontsize=6, frameon=False, loc="lower left")
    plots.save(fig, f"{a.prefix}_accuracy_vs_kl")
