"""end_to_end's figures and data files: the output damage, the attention damage and the predictivity of attention
KL, against the budget n, one line per scheme (the CIs: documents, then segments)."""

from __future__ import annotations

import matplotlib.ticker
import numpy as np
import pandas as pd

from kvstats.hf.models import SHIPPED_MODELS
from kvstats.studies.end_to_end.analysis import Analysis
from kvstats.studies.end_to_end.cells import STUDY
from kvstats.study import plots
from kvstats.study.models import file_suffix

STYLE = {"mse": {"color": "#17becf", "marker": "v", "label": "TurboQuant_mse on K and V"},
         "nova": {"color": "#9467bd", "marker": "*", "label": "NOVA-KV (calibrated)"}}


def style(name: str) -> dict[str, str]:
    return STYLE.get(name) or plots.style(name)


def _by_n(summary: pd.DataFrame, scheme: str, window: int) -> pd.DataFrame:
    g = summary[(summary["scheme"] == scheme) & (summary["window"] == window)]
    return g.groupby("n", as_index=False).mean(numeric_only=True).sort_values("n")


def _errorbar(ax, x, mid, lo, hi, name, offset=0.0, label=None):
    st = style(name)
    ax.errorbar(np.asarray(x) + offset, mid, yerr=[np.maximum(mid - lo, 0), np.maximum(hi - mid, 0)],
                color=st["color"], marker=st["marker"], ms=5, capsize=3, lw=1.4, label=label or st["label"])


def _window_lines(axes, summary: pd.DataFrame, window: int, schemes) -> None:
    """The output panels' non-zero full-precision windows (paper scale), dashed."""
    for wv in sorted(set(summary["window"]) - {window}):
        for name in schemes:
            g = _by_n(summary, name, wv)
            st = style(name)
            axes[0, 0].plot(g["n"], g["out_kl"], color=st["color"], ls="--", lw=1, marker=st["marker"], ms=3,
                            mfc="none", label=f"{name.upper()}, last {wv} tokens exact")
            axes[0, 1].plot(g["n"], g["ppl_ratio"], color=st["color"], ls="--", lw=1, marker=st["marker"], ms=3,
                            mfc="none")
            axes[0, 2].plot(g["n"], g["top1"], color=st["color"], ls="--", lw=1, marker=st["marker"], ms=3,
                            mfc="none")


def _output_axes(axes, a: Analysis) -> None:
    """The output panels' control note, scales, labels, titles, reference lines, legends and ticks."""
    summary, gen = a.summary, a.gen
    control = summary[summary["scheme"] == "identity"]
    if len(control):
        axes[0, 0].text(0.98, 0.97, f"lossless control: {float(control['out_kl'].mean()):.0e} nats",
                        transform=axes[0, 0].transAxes, ha="right", va="top", fontsize=7)
    axes[0, 0].set(yscale="log", xlabel="budget n (bits per element, payload)", ylabel="mean KL(p_fp ‖ p_quant), nats",
                   title="next-token KL")
    axes[0, 1].axhline(1.0, color="k", ls=":", lw=1)
    axes[0, 1].set(yscale="log", xlabel="budget n", ylabel="perplexity ratio quant / fp",
                   title=f"perplexity (fp: {float(summary['ppl_ref'].iloc[0]):.2f})")
    axes[0, 2].set(xlabel="budget n", ylabel="fraction of tokens", title="top-1 agreement with fp", ylim=(0, 1.02))
    if len(gen):
        ref_nll = gen.drop_duplicates("offset")["fp_nll_reference"].mean()
        axes[0, 3].axhline(ref_nll, color="k", ls=":", lw=1, label="fp's own greedy text")
        axes[0, 3].legend(loc="upper right", fontsize=7)
    else:
        axes[0, 3].text(0.5, 0.5, f"not run at {a.scale} scale\n(the full tier's)", transform=axes[0, 3].transAxes,
                        ha="center", va="center", fontsize=8)
    axes[0, 3].set(xlabel="budget n", ylabel="NLL under the fp model (nats/token)",
                   title=f"greedy generation ({int(gen['new'].max()) if len(gen) else 0} tokens, "
                         f"{gen['offset'].nunique() if len(gen) else 0} prompt(s))")
    axes[0, 0].legend(loc="lower left", fontsize=7)
    for ax in axes[0]:
        ax.set_xticks(a.budgets)


def output_figure(a: Analysis) -> None:
    """Output damage: next-token KL, perplexity ratio, top-1 agreement and greedy generation's NLL against n."""
    summary, gen, window = a.summary, a.gen, 0
    fig, axes = plots.panels(1, 4, f"SmolLM2-135M with a quantized KV cache: output damage "
                                   f"(teacher-forced, {a.tokens_n} tokens, {a.scale} scale; 95% CIs: documents, "
                                   "then segments)",
                             width=4.0, height=3.4)
    for k, name in enumerate(a.schemes):
        g = _by_n(summary, name, window)
        off = (k - 2.5) * 0.05
        _errorbar(axes[0, 0], g["n"], g["out_kl"], g["out_kl_lo"], g["out_kl_hi"], name, off)
        _errorbar(axes[0, 1], g["n"], g["ppl_ratio"], g["ppl_ratio_lo"], g["ppl_ratio_hi"], name, off)
        _errorbar(axes[0, 2], g["n"], g["top1"], g["top1_lo"], g["top1_hi"], name, off)
        gg = gen[(gen["scheme"] == name) & (gen["window"] == window)].groupby("n")["fp_nll"]
        st = style(name)
        axes[0, 3].plot(gg.mean().index + off, gg.mean().values, color=st["color"], marker=st["marker"], lw=1.4,
                        label=st["label"])
    _window_lines(axes, summary, window, a.schemes)
    _output_axes(axes, a)
    plots.save(fig, f"{STUDY}_output")


def attention_figure(a: Analysis) -> None:
    """Attention damage in the same forward: attention KL and top-5 recall against n, attention KL by layer."""
    summary, layers, n_mid, window = a.summary, a.layers, a.n_mid, 0
    fig, axes = plots.panels(1, 3, "Attention damage in the same forward (mean over 30 layers × 9 heads × tokens)",
                             width=4.2, height=3.4)
    for k, name in enumerate(a.schemes):
        g = _by_n(summary, name, window)
        off = (k - 2.5) * 0.05
        _errorbar(axes[0, 0], g["n"], g["attn_kl"], g["attn_kl_lo"], g["attn_kl_hi"], name, off)
        _errorbar(axes[0, 1], g["n"], g["top5"], g["top5_lo"], g["top5_hi"], name, off)
        lay = layers[(layers["scheme"] == name) & (layers["n"] == n_mid) & (layers["window"] == window)]
        lay = lay.groupby("layer")["attn_kl"].mean()
        st = style(name)
        axes[0, 2].plot(lay.index, lay.values, color=st["color"], marker=st["marker"], ms=3, lw=1.2, label=st["label"])
    axes[0, 0].set(yscale="log", xlabel="budget n", ylabel="attention KL (nats)", title="attention KL")
    axes[0, 1].set(xlabel="budget n", ylabel="top-5 recall", title="top-5 recall", ylim=(0, 1.02))
    axes[0, 2].set(yscale="log", xlabel="layer", ylabel="attention KL (nats)",
                   title=f"attention KL by layer, n = {n_mid}")
    axes[0, 0].legend(loc="lower left", fontsize=7)
    for ax in axes[0, :2]:
        ax.set_xticks(a.budgets)
    plots.save(fig, f"{STUDY}_attention")


def _cells_panel(ax, summary: pd.DataFrame, corr: pd.DataFrame, schemes) -> None:
    """Attention KL against next-token KL, one point per cell, with ρ across cells."""
    q = summary[summary["scheme"] != "identity"]
    for name in schemes:
        g = q[q["scheme"] == name]
        st = style(name)
        ax.scatter(g["attn_kl"], g["out_kl"], color=st["color"], marker=st["marker"], s=30, label=st["label"])
        for _, r in g[g["seed"] == g["seed"].min()].iterrows():
            ax.annotate(f"{int(r['n'])}{'w' if r['window'] else ''}", (r["attn_kl"], r["out_kl"]), fontsize=7,
                        xytext=(3, 2), textcoords="offset points")
    c = corr[(corr["level"] == "cells") & (corr["x"] == "attn_kl") & (corr["y"] == "out_kl")].iloc[0]
    ax.set(xscale="log", yscale="log", xlabel="attention KL (mean)", ylabel="next-token KL (mean)",
           title=f"across cells: ρ = {c['rho']:.2f} [{c['rho_lo']:.2f}, {c['rho_hi']:.2f}], {int(c['points'])} cells")
    ax.legend(fontsize=7, loc="upper left")


def _tokens_panel(ax, tokens: pd.DataFrame, corr: pd.DataFrame, n_mid: int, window: int) -> None:
    """KQV at n_mid, one point per token, with ρ over tokens."""
    sel = tokens[(tokens["scheme"] == "kqv") & (tokens["n"] == n_mid) & (tokens["seed"] == tokens["seed"].min())
                 & (tokens["window"] == window) & (tokens["t"] > 0)]
    ct = corr[(corr["level"] == "tokens") & (corr["scheme"] == "kqv") & (corr["n"] == n_mid)
              & (corr["window"] == window)].iloc[0]
    ax.scatter(sel["attn_kl"], sel["out_kl"].clip(lower=1e-6), s=6, alpha=0.5, color=style("kqv")["color"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set(xscale="log", yscale="log", xlabel="attention KL at token t", ylabel="next-token KL at token t",
           title=f"KQV n = {n_mid}, per token: ρ = {ct['rho']:.2f} [{ct['rho_lo']:.2f}, {ct['rho_hi']:.2f}]")


def predictivity_figure(a: Analysis) -> None:
    """Does attention KL predict output damage: across cells, per token at n_mid, per-token ρ against n."""
    corr, window = a.corr, 0
    fig, axes = plots.panels(1, 3, "Does attention KL predict output damage? (Spearman ρ, bootstrap 95% CI)",
                             width=4.3, height=3.6)
    _cells_panel(axes[0, 0], a.summary, corr, a.schemes)
    _tokens_panel(axes[0, 1], a.tokens, corr, a.n_mid, window)
    ax = axes[0, 2]
    ctok = corr[(corr["level"] == "tokens") & (corr["window"] == window)]
    for k, name in enumerate(a.schemes):
        g = ctok[ctok["scheme"] == name].groupby("n", as_index=False).mean(numeric_only=True)
        _errorbar(ax, g["n"], g["rho"], g["rho_lo"], g["rho_hi"], name, (k - 2.5) * 0.05)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="budget n", ylabel="Spearman ρ over tokens", title="per-token ρ(attention KL, next-token KL)",
           ylim=(-0.2, 1.0))
    ax.set_xticks(a.budgets)
    ax.legend(fontsize=7, loc="lower right")
    plots.save(fig, f"{STUDY}_predictivity")


def models_figure(a: Analysis) -> None:
    """Next-token KL and attention KL against n on each model, the schemes both ran (end_to_end_models.png)."""
    runs = [a, *a.others.values()]
    fig, axes = plots.panels(2, len(runs), "The same schemes inside two models: output and attention damage "
                             "(95% cluster CIs)", width=4.4, height=3.2)
    for col, m in enumerate(runs):
        shared = [x for x in m.schemes if x in runs[-1].schemes and x in runs[0].schemes]
        for row, metric in enumerate(("out_kl", "attn_kl")):
            ax = axes[row, col]
            for k, name in enumerate(shared):
                g = _by_n(m.summary, name, 0)
                _errorbar(ax, g["n"], g[metric], g[f"{metric}_lo"], g[f"{metric}_hi"], name, offset=0.06 * (k - 2))
            ax.set_yscale("log")
            ax.set_xlabel("bits per element n")
            ax.set_ylabel("next-token KL (nats)" if metric == "out_kl" else "attention KL (nats)")
            ax.set_title(f"{m.model_name} (d = {SHIPPED_MODELS[m.model].head_dim})", fontsize=9)
            ax.set_xticks(m.budgets)
    axes[0, -1].legend(fontsize=7, loc="upper right")
    plots.save(fig, f"{STUDY}_models")


def figures(a: Analysis) -> None:
    """The data CSVs and the figures."""
    if a.base is not None:
        plots.write_csv(f"{STUDY}_baselines", a.base)
    plots.write_csv(STUDY, a.summary)
    if a.formats_summary is not None:
        plots.write_csv(f"{STUDY}_formats", a.formats_summary)
    plots.write_csv(f"{STUDY}_segments", a.segs)
    plots.write_csv(f"{STUDY}_tokens", a.tokens)
    plots.write_csv(f"{STUDY}_layers", a.layers)
    plots.write_csv(f"{STUDY}_correlation", a.corr)
    if len(a.gen):
        plots.write_csv(f"{STUDY}_generation", a.gen)
    plots.write_csv(f"{STUDY}_paths", a.agree)
    if a.qjl_summary is not None:
        plots.write_csv(f"{STUDY}_qjl", a.qjl_summary)
    for model, other in a.others.items():  # a second model's cells: summary (QJL's cache and the formats' rows
        # included), segments
        plots.write_csv(f"{STUDY}{file_suffix(model)}", pd.concat([other.summary, other.qjl_summary,
                                                                other.formats_summary]))
        plots.write_csv(f"{STUDY}{file_suffix(model)}_segments", pd.concat([other.segs, other.qjl_segs,
                                                                         other.formats_segs]))
        if len(other.agree):
            plots.write_csv(f"{STUDY}{file_suffix(model)}_paths", other.agree)
    plots.setup()
    output_figure(a)
    attention_figure(a)
    predictivity_figure(a)
    if a.others:
        models_figure(a)
