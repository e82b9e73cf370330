"""kvstats.study.plots.label_points: labels of crowded points placed without overlapping one another."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvstats.study import plots


def test_crowded_labels_do_not_overlap_and_each_names_its_point():
    """Six points within a few pixels of each other (the formats' Pareto figure around 4.5-5 bits): every label is
    placed at an offset where its box overlaps no earlier one, the boxes measured by the renderer itself, and each
    label is anchored at its own point."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    points = [(4.5, 0.40, "int_token@4"), (4.52, 0.29, "nvfp4@4"), (4.75, 0.39, "kqv@4"),
              (5.0, 0.40, "transformers quanto int4"), (5.0, 0.07, "kivi@4"), (4.55, 0.41, "x@4")]
    ax.set_xlim(2, 9)
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 10)
    texts = plots.label_points(ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert [t.get_text() for t in texts] == [p[2] for p in points]
    assert [t.xy for t in texts] == [(x, y) for x, y, _ in points]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # the plain placement (every label at the first offset) does overlap here: the test is not vacuous
    plain = [ax.annotate(text, (x, y), xytext=(4, 2), textcoords="offset points", fontsize=6) for x, y, text in points]
    plain_boxes = [t.get_window_extent(renderer) for t in plain]
    assert any(a.overlaps(b) for i, a in enumerate(plain_boxes) for b in plain_boxes[i + 1:])
    plt.close(fig)
