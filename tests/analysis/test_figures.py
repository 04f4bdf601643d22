"""Failure breakdown counts: one row per placed cell, outcome classes in the schema's order; and
the figures read: titles, whole counts, plain tick labels, boxes only where there are enough runs."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from analysis.best import best_configs
from analysis.figures import outcome_counts, plot_distribution, plot_failures, value_axis
from sweep.collect.schema import to_table


def test_counts_per_cell_by_class_leave_out_attempts_without_a_configuration() -> None:
    rows = [{"model_label": "1B", "nodes": 2, "outcome": o} for o in ("oom", "completed", "oom")]
    rows += [{"model_label": "1B", "nodes": 1, "outcome": "timeout"},
             {"model_label": None, "nodes": None, "outcome": "crashed"}]  # no run.json
    counts = outcome_counts(to_table(rows).to_pandas())
    assert list(counts.columns) == ["completed", "oom", "timeout"]  # schema order, no `crashed`
    assert counts.loc[("1B", 2)].to_dict() == {"completed": 1, "oom": 2, "timeout": 0}
    assert list(counts.index) == [("1B", 1), ("1B", 2)]


def _labels(ax: plt.Axes) -> list[str]:
    """The y tick labels drawn inside the axis' limits."""
    ax.figure.canvas.draw()
    low, high = sorted(ax.get_ylim())
    return [tick.get_text() for tick, loc in zip(ax.get_yticklabels(), ax.get_yticks())
            if low <= loc <= high and tick.get_text()]


def test_a_value_axis_labels_three_plain_ticks_or_more() -> None:
    """A log axis over 1,100-1,800 tokens/s labelled only "1,000" (the issue): a narrow range is
    linear, a wide one log with 1-2-5 ticks, all in plain digits."""
    fig, (narrow, wide) = plt.subplots(1, 2)
    value_axis(narrow, [1100.0, 1800.0])
    value_axis(wide, [800.0, 45000.0])
    assert narrow.get_yscale() == "linear" and len(_labels(narrow)) >= 3
    assert all(label.replace(",", "").isdigit() for label in _labels(narrow))
    assert wide.get_yscale() == "log"
    assert _labels(wide) == ["500", "1,000", "2,000", "5,000", "10,000", "20,000", "50,000"]
    plt.close(fig)


def test_failures_has_a_title_and_whole_attempt_counts(tmp_path: Path, cpu_runs) -> None:
    plot_failures(cpu_runs, ["tiny-4l"], tmp_path / "failures")
    svg = (tmp_path / "failures.svg").read_text()
    assert "Attempts per cell by outcome class (5 attempts)" in svg
    ticks = re.findall(r">\s*(\d+(?:\.\d+)?)\s*</text>", svg)
    assert ticks and not [t for t in ticks if "." in t]  # no 0.5, 1.5: counts are whole


def test_the_distribution_draws_boxes_only_over_five_points_or_more(
        tmp_path: Path, cpu_runs, run_row, make_runs, monkeypatch) -> None:
    boxes: list[int] = []
    draw = plt.Axes.boxplot

    def counting(self: plt.Axes, data: list, *args: object, **kwargs: object) -> object:
        boxes.extend(len(d) for d in data)
        return draw(self, data, *args, **kwargs)

    monkeypatch.setattr(plt.Axes, "boxplot", counting)
    many = make_runs([run_row(f"r{i}", 300.0 + 10 * i, nodes=2, tp=2) for i in range(6)])
    runs = pd.concat([cpu_runs, many], ignore_index=True)
    best = best_configs(runs, "tokens_per_sec_per_gpu", "full_attention")
    plot_distribution(runs, best, tmp_path / "dist")
    assert boxes == [7]  # two nodes: 6 + the clean two-node run; one node: 1 trusted run, no box
    svg = (tmp_path / "dist.svg").read_text()
    assert "tokens/s per GPU of every completed run per cell" in svg
    assert "+2 failed a check, not drawn" in svg and "Tokens/s per GPU" in svg
