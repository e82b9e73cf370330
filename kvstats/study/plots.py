"""Figure helpers for the studies: one look for every figure, PNG + CSV side by side, no LaTeX.

    from kvstats.study import plots
    plots.setup()                                   # Agg backend, sizes, grid
    fig, axes = plots.panels(2, 3, "Title")         # a grid of axes with a suptitle
    ...
    plots.save(fig, "budget_sweep_kl")              # figures/budget_sweep_kl.png (dpi 110), closes fig
    plots.write_csv("budget_sweep_kl", table)       # figures/data/budget_sweep_kl.csv

Colours and markers of the schemes are fixed here (:data:`SCHEME_STYLE`) so every figure agrees.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kvstats.study.paths import data_path, figure_path  # noqa: E402

__all__ = ["DPI", "SCHEME_STYLE", "boxplot", "label_points", "panels", "save", "setup", "sphere_histogram", "style",
           "write_csv"]

DPI = 110

#: colour, marker and label of each scheme (and of the two TurboQuant quantizers).
SCHEME_STYLE: dict[str, dict[str, str]] = {
    "kv": {"color": "#7f7f7f", "marker": "s", "label": "KV (Lloyd–Max, no rotation)"},
    "kqv": {"color": "#1f77b4", "marker": "o", "label": "KQV (K: MSE n bits)"},
    "qkqv": {"color": "#d62728", "marker": "^", "label": "QKQV (K: MSE n−1 + QJL 1)"},
    "minmax": {"color": "#2ca02c", "marker": "D", "label": "min-max (KIVI-style)"},
    "turbo_mse": {"color": "#1f77b4", "marker": "o", "label": "TurboQuant_mse"},
    "turbo_prod": {"color": "#d62728", "marker": "^", "label": "TurboQuant_prod"},
}


def style(name: str) -> dict[str, str]:
    """Colour/marker/label of a scheme (a neutral default for unknown names)."""
    return SCHEME_STYLE.get(name, {"color": "#9467bd", "marker": "x", "label": name})


def setup() -> None:
    """Agg backend and the shared look (sizes readable at dpi 110, light grid, no LaTeX)."""
    matplotlib.use("Agg")
    plt.rcParams.update({
        "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8, "xtick.labelsize": 8,
        "ytick.labelsize": 8, "figure.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3, "text.usetex": False,
    })


def panels(rows: int, cols: int, title: str | None = None, *, width: float = 4.0, height: float = 3.2,
           sharex: bool = False, sharey: bool = False):
    """A grid of axes (always a 2-D array) under a suptitle, with constrained layout (no overlaps)."""
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharex=sharex,
                             sharey=sharey, constrained_layout=True)
    if title:
        fig.suptitle(title)
    return fig, axes


def save(fig, name: str, figures_dir: str | os.PathLike | None = None) -> Path:
    """Write ``<figures>/<name>.png`` at :data:`DPI` and close the figure."""
    path = figure_path(name, figures_dir)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def write_csv(name: str, data, figures_dir: str | os.PathLike | None = None) -> Path:
    """Write a DataFrame or a list of dicts to ``<figures>/data/<name>.csv``."""
    frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(list(data))
    path = data_path(name, figures_dir)
    frame.to_csv(path, index=False, float_format="%.6g")
    return path


def boxplot(ax, groups: Mapping[str, Sequence[float]], *, colors: Sequence[str] | None = None,
            ylabel: str = "", log: bool = False, rotate: int = 0) -> None:
    """Boxes of several samples side by side; whiskers at 1.5 IQR, outliers as open circles (as in the source)."""
    labels = list(groups)
    data = [np.asarray(groups[k], dtype=float) for k in labels]
    box = ax.boxplot(data, patch_artist=True, widths=0.6, flierprops={"marker": "o", "markerfacecolor": "none",
                                                                      "markersize": 4, "alpha": 0.7})
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=rotate, ha="right" if rotate else "center")
    for patch, color in zip(box["boxes"], colors or ["#9ecae1"] * len(labels)):
        patch.set_facecolor(color)
        patch.set_alpha(0.6)
    for median in box["medians"]:
        median.set_color("black")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)


def sphere_histogram(ax, x, d: int, *, label: str, color: str = "#3182bd", bins: int = 60,
                     show_law: bool = True) -> None:
    """Density histogram of coordinates ``x`` with the sphere law f_d on top (range ±1, or ±5/√d for large d)."""
    from kvstats.quant.sphere import coordinate_law

    x = np.asarray(x, dtype=float).ravel()
    half = 1.0 if d <= 16 else min(1.0, 5.0 / math.sqrt(d))
    edges = np.linspace(-half, half, bins + 1)
    ax.hist(np.clip(x, -half, half), bins=edges, density=True, histtype="stepfilled", alpha=0.35, color=color,
            edgecolor=color, label=label)
    if show_law:
        t = np.linspace(-half, half, 801)[1:-1]
        ax.plot(t, coordinate_law(d).pdf(t), color="#d62728", lw=1.5, label=f"sphere law f_{d}")
    ax.set_xlabel("coordinate after rotation (unit vector)")
    ax.set_ylabel("density")


#: where :func:`label_points` tries a label, in points from its point (dx, dy, horizontal alignment), in order
LABEL_OFFSETS = ((4, 2, "left"), (4, -9, "left"), (-4, 2, "right"), (-4, -9, "right"), (4, 10, "left"),
                 (-4, 10, "right"), (4, -17, "left"), (-4, -17, "right"), (0, 16, "center"), (0, -24, "center"))


def label_points(ax, points: Sequence[tuple[float, float, str]], *, fontsize: float = 6) -> list:
    """Annotate each (x, y, text) of ``points`` at the first offset of :data:`LABEL_OFFSETS` whose text box overlaps
    no label placed before it (in the order given), else at the first offset; returns the texts. The figure is
    drawn once to measure the boxes, so call it after the axes' limits and scales are set."""
    renderer = ax.figure.canvas.get_renderer()
    placed, texts = [], []
    for x, y, text in points:
        chosen = None
        for dx, dy, ha in LABEL_OFFSETS:
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize, ha=ha)
            box = t.get_window_extent(renderer).expanded(1.02, 1.05)
            if not any(box.overlaps(other) for other in placed):
                chosen = (t, box)
                break
            t.remove()
        if chosen is None:
            dx, dy, ha = LABEL_OFFSETS[0]
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize, ha=ha)
            chosen = (t, t.get_window_extent(renderer))
        placed.append(chosen[1])
        texts.append(chosen[0])
    return texts
