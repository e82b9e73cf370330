"""What a retrieval evaluation shows: its plain-text table and its heat map (accuracy over context length × needle
depth). The heat map's drawing is shared with the retrieval study (:func:`draw_heatmap`)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pandas as pd

from kvstats.evaluation.retrieval_tasks import DEPTHS

__all__ = ["draw_heatmap", "figure", "table"]


def _cell(r) -> str:
    return f"{r['accuracy']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def table(ev) -> str:
    """The table of :meth:`kvstats.evaluation.retrieval.RetrievalEvaluation.table`."""
    cfg, plan = ev.config, ev.plan
    sides = cfg["sides"]
    names = {k: "the model's own cache, no quantization (the control)" if k == "fp" else
             f"{v['label']} at {v['bits']} bits" for k, v in sides.items()}
    order = [k for k in ("fp", "A", "B") if k in sides]
    bits = {k: next((u[k]["bits_per_element"] for u in ev.units if k in u), float("nan")) for k in order if k != "fp"}
    lines = [f"retrieval on {cfg['model']}: tasks {', '.join(cfg['tasks'])} at {', '.join(map(str, cfg['lengths']))} "
             f"tokens, {cfg['prompts']} prompts each; the context prefilled exactly, the questions teacher-forced "
             "through each cache on the estimator path; a needle passes when every answer token is the argmax"]
    lines += [f"  {k} = {names[k]}" + (f": {bits[k]:.4g} bits per element held (measured)" if k in bits else "")
              for k in order]
    eq = plan["equivalence"]
    lines += textwrap.wrap(
        f"plan: trials per task {', '.join(f'{t} {n}' for t, n in plan['trials'].items())}; an exact McNemar test "
        f"needs at least {plan['min_discordant_to_reject']} discordant trials to reject over the family of "
        f"{plan['family']} (Holm); a TOST at ±{eq['margin']:g} needs about {eq['trials_needed']} trials at 80% power "
        f"if the caches disagree on {eq['assumed_discordance']:.0%} of them", 112, initial_indent="",
        subsequent_indent="  ")
    pooled = pd.DataFrame(ev.pooled)
    level = 0.95
    lines.append(f"accuracy per task over its lengths ({level:.0%} Wilson interval):")
    head = f"  {'task':<10} {'trials':>6} " + " ".join(f"{k:<22}" for k in order)
    lines.append(head)
    for task in cfg["tasks"]:
        g = pooled[pooled["task"] == task].set_index("side")
        lines.append(f"  {task:<10} {int(g['trials'].iloc[0]):>6} "
                     + " ".join(f"{_cell(g.loc[k]):<22}" for k in order))
    tests = pd.DataFrame(ev.tests)
    if not tests.empty:
        alpha = cfg["alpha"]
        main = tests[tests["length"] == "all"]
        lines.append(f"paired tests per task (exact McNemar, Holm over the {len(main)} tests; difference with its "
                     f"{1 - 2 * alpha:.0%} Newcombe interval: TOST at ±{cfg['margin']:g}):")
        lines.append(f"  {'task':<10} {'pair':<8} {'difference':>10} {'interval':>18} {'discordant':>10} "
                     f"{'p (Holm)':>9}  verdict")
        for _, r in main.iterrows():
            lines.append(f"  {r['task']:<10} {r['a'] + '-' + r['b']:<8} {r['difference']:>+10.3f} "
                         f"{'[' + format(r['eq_low'], '+.3f') + ', ' + format(r['eq_high'], '+.3f') + ']':>18} "
                         f"{int(r['a_only']) + int(r['b_only']):>10} {r['p_holm']:>9.3g}  {r['verdict']}")
    acc = pd.DataFrame(ev.accuracy)
    lines.append("accuracy per task and length:")
    for (task, length), g in acc.groupby(["task", "length"], sort=False):
        g = g.set_index("side")
        lines.append(f"  {task:<10} {length:>6} " + " ".join(f"{k} {_cell(g.loc[k]):<22}" for k in order))
    lines += textwrap.wrap(
        "note: the needles of one prompt share its text (induction and lookup hold five per prompt), so the tests "
        "treat dependent trials as independent: their p-values describe these prompts; 'undecided' means neither "
        "a difference nor equivalence within the margin was shown", 112, subsequent_indent="  ")
    return "\n".join(lines)


def draw_heatmap(grid: pd.DataFrame, lengths: dict[str, list[int]], columns: list[tuple[str, str]], title: str):
    """A figure of accuracy over length × needle depth: one row of panels per task (``lengths``: task -> its
    lengths), one column per cache (``columns``: (the value of ``grid``'s ``column`` field, the panel title)).
    ``grid`` has ``task``, ``length``, ``depth``, ``column`` and ``accuracy``. Returns the matplotlib figure."""
    from kvstats.study import plots

    tasks = list(lengths)
    fig, axes = plots.panels(len(tasks), len(columns), title, width=2.1, height=1.9)
    im = None
    for i, task in enumerate(tasks):
        ls = sorted(lengths[task])
        for j, (column, label) in enumerate(columns):
            ax = axes[i, j]
            g = grid[(grid["task"] == task) & (grid["column"] == column)]
            m = g.pivot_table(index="length", columns="depth", values="accuracy").reindex(index=ls,
                                                                                           columns=list(DEPTHS))
            im = ax.imshow(m.to_numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
            ax.set_xticks(range(len(DEPTHS)), [f"{d:g}" for d in DEPTHS], fontsize=6)
            ax.set_yticks(range(len(ls)), [str(x) for x in ls], fontsize=6)
            ax.grid(False)
            if i == 0:
                ax.set_title(label, fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{task}\ntokens", fontsize=7)
            if i == len(tasks) - 1:
                ax.set_xlabel("needle depth", fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.6, label="accuracy")
    return fig


def figure(ev, path: str | os.PathLike, *, force: bool = False) -> Path:
    """:meth:`kvstats.evaluation.retrieval.RetrievalEvaluation.figure`."""
    import matplotlib.pyplot as plt

    from kvstats._files import check_output_path

    path = check_output_path(path, "path", force=force)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ValueError(f"path must end in .png, .pdf or .svg, got {str(path)!r}")
    cfg = ev.config
    grid = pd.DataFrame(cfg["grid"]).rename(columns={"side": "column"})
    columns = [(k, "fp" if k == "fp" else f"{k}: {v['label']} @ {v['bits']}") for k, v in cfg["sides"].items()]
    fig = draw_heatmap(grid, {t: cfg["lengths"] for t in cfg["tasks"]}, columns,
                       f"Retrieval accuracy over context length × needle depth ({cfg['model']})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
