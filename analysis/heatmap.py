"""The playbook-style heatmap: models × nodes, each cell the best run's figure, layout and memory.

Colour and the first line are the ranked figure of the best configuration (`--metric`: MFU under
the chosen convention, or tokens/s per GPU); the annotation reads like the playbook's (DP/TP/PP,
GAS/MBS/ZeRO); an empty cell is grey and says why it is empty. A dagger marks cells whose best
configuration changes with the convention or the metric; a red "!" badge marks cells where a
completed run failed a check and was left out of the ranking (analysis.checks), so a reader sees
that the cell's figure is the best *trusted* one.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import Colormap, Normalize
from matplotlib.patches import Rectangle

from analysis.best import format_value, value_column
from analysis.cells import BUDGET_REASON
from analysis.checks import MARK, MARK_NOTE
from analysis.labels import Labels, labels_of
from analysis.style import CHECK_COLOUR, EMPTY_CELL, HEATMAP_CMAP, paper_style, save, text_colour

STRAGGLER_MARK: Final = "⚠"  # a cell whose best run had a straggler node


def _layout_lines(cell: pd.Series) -> list[str]:
    first = f"DP{int(cell['dp'])} TP{int(cell['tp'])} PP{int(cell['pp'])}"
    extra = [f"CP{int(cell['cp'])}" for _ in [0] if pd.notna(cell.get("cp")) and cell["cp"] > 1]
    extra += [f"EP{int(cell['ep'])}" for _ in [0] if pd.notna(cell.get("ep")) and cell["ep"] > 1]
    second = f"GAS{int(cell['grad_acc'])} MBS{int(cell['mbs'])} ZeRO-{int(cell['zero_stage'])}"
    lines = [" ".join([first, *extra]), second]
    if isinstance(cell.get("recompute"), str) and cell["recompute"] != "none":
        lines.append(f"recompute {cell['recompute']}")
    return lines


def _model_tick(best: pd.DataFrame, label: str) -> str:
    params = best.loc[best["model"] == label, "model_params"].dropna()
    if params.empty:
        return label
    count = float(params.iloc[0])
    size = f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.1f} M"
    return f"{label}\n({size} params)"


def plot_heatmap(best: pd.DataFrame, stem: Path, flagged: Collection[tuple[str, int]] = (),
                 title: str | None = None, labels: Labels | None = None,
                 stragglers: Mapping[tuple[str, int], str] | None = None) -> list[Path]:
    """Draw `best` (analysis.best.best_configs output); write stem.{png,pdf,svg}. `labels`
    (analysis.labels.labels_for the runs) name the hardware, the unit and the convention; without
    them the figure speaks of GPUs and the frame's convention. `stragglers`: the cells whose best
    run had a straggler node, and the node (analysis.flags.straggler_cells), marked in the cell."""
    stragglers = stragglers or {}
    labels = labels or labels_of(best)
    models = list(dict.fromkeys(best["model"]))
    nodes = sorted(set(int(n) for n in best["nodes"]))
    metric = best["metric"].iloc[0]
    shown = value_column(metric)
    values = np.full((len(models), len(nodes)), np.nan)
    for _, cell in best.iterrows():
        if pd.notna(cell.get("run_id")) and pd.notna(cell.get(shown)):
            values[models.index(cell["model"]), nodes.index(int(cell["nodes"]))] = cell[shown]
    finite = values[np.isfinite(values)]
    norm = Normalize(vmin=0.0, vmax=max(float(finite.max()) if finite.size else 1.0, 1e-9))
    cmap = plt.get_cmap(HEATMAP_CMAP)
    with paper_style():
        fig, ax = plt.subplots(figsize=(1.05 + 1.62 * len(nodes), 0.9 + 1.2 * len(models)))
        edges_x, edges_y = np.arange(len(nodes) + 1) - 0.5, np.arange(len(models) + 1) - 0.5
        image = ax.pcolormesh(edges_x, edges_y, np.ma.masked_invalid(values), cmap=cmap, norm=norm,
                              edgecolors="white", linewidth=2)  # vector cells: no resampling
        ax.set_xlim(edges_x[0], edges_x[-1])
        ax.set_ylim(edges_y[-1], edges_y[0])  # first model on top
        for _, cell in best.iterrows():
            row, col = models.index(cell["model"]), nodes.index(int(cell["nodes"]))
            _annotate(ax, cell, row, col, (cmap, norm, metric),
                      (cell["model"], int(cell["nodes"])) in flagged,
                      stragglers.get((cell["model"], int(cell["nodes"]))))
        ax.set_xticks(range(len(nodes)), [str(n) for n in nodes])
        ax.set_yticks(range(len(models)), [_model_tick(best, m) for m in models])
        ax.set_xlabel(labels.nodes_label())
        ax.set_ylabel("Model")
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ranked = labels.describe()
        if finite.size:  # no value, no scale: a 0-1 bar would read as a range of MFU
            bar = fig.colorbar(image, ax=ax, fraction=0.035, pad=0.015)
            # one line per 2.1 characters of 9 pt per point of bar height: the label stays beside it
            bar.set_label("\n".join(textwrap.wrap(labels.value_label(),
                                                  max(16, int(fig.get_figheight() * 72 / 6.5)))))
            heading = f"Best configuration per cell{labels.on()}, ranked by {ranked}"
            notes = [f"Cell: {ranked} of the best run; DP TP PP; GAS MBS ZeRO; peak memory "
                     "reserved (GiB)."]
        else:
            heading = f"No successful run{labels.on()}: no cell to rank by {ranked}"
            notes = []
        # characters of 10 pt across the axes and the colour bar: the title stays in the figure
        ax.set_title("\n".join(textwrap.wrap(title or heading,
                                             max(30, int((fig.get_figwidth() - 0.9) * 72 / 6.2)))),
                     loc="left")
        notes += _empty_notes(best)
        if labels.peak_note() and finite.size:
            notes.append(str(labels.peak_note(most=2)))
        if flagged:
            notes.append("† the best configuration changes with the FLOPs convention or the "
                         "metric; see the flags in the report.")
        if stragglers:
            notes.append(f"{STRAGGLER_MARK} slow node: the cell's best run had a straggler node "
                         "(its step time beyond the run's factor × the nodes' median); see the "
                         "flags in the report.")
        if (best.get("n_failed_checks", pd.Series(dtype=float)).fillna(0) > 0).any():
            notes.append(MARK_NOTE)
        width = int(fig.get_figwidth() * 16)  # characters of 7.5 pt per line: notes stay in the figure
        # Under the axis label, wherever it ends up: x in the figure, y below the label's box.
        ax.annotate("\n".join(line for note in notes for line in textwrap.wrap(note, width)),
                    xy=(0.01, 0.0), xycoords=("figure fraction", ax.xaxis.label),
                    xytext=(0, -6), textcoords="offset points", ha="left", va="top",
                    fontsize=7.5, color="#444444", annotation_clip=False)
        return save(fig, stem)


def _empty_notes(best: pd.DataFrame) -> list[str]:
    """One line on what the empty cells' reasons mean, for the kinds of reason the figure has."""
    reasons = [str(r) for r in best.loc[best["run_id"].isna(), "empty_reason"].fillna("")]
    notes = []
    if any(BUDGET_REASON in r for r in reasons):
        notes.append(f"Hatched cells: {BUDGET_REASON}: the sweep's GPU-hour cap kept their runs "
                     "from being launched.")
    if any(r.startswith("no successful run") for r in reasons):
        notes.append("No successful run: every attempt of the cell failed; the outcomes are counted.")
    return notes


def _annotate(ax: plt.Axes, cell: pd.Series, row: int, col: int,
              scale: tuple[Colormap, Normalize, str], flagged: bool,
              straggler: str | None = None) -> None:
    """One cell's text; `scale` is the colour map, its norm and the metric shown; `straggler`:
    the slow node of the cell's best run, if it had one."""
    cmap, norm, metric = scale
    failed_checks = cell.get("n_failed_checks")
    if pd.notna(failed_checks) and failed_checks > 0:  # a badge reads on filled and empty cells
        ax.text(col + 0.41, row - 0.36, MARK, ha="center", va="center", fontsize=8,
                fontweight="bold", color="white", zorder=4,
                bbox={"boxstyle": "circle,pad=0.18", "facecolor": CHECK_COLOUR, "edgecolor": "white",
                      "linewidth": 0.8})
    value = cell.get(value_column(metric))
    if pd.isna(cell.get("run_id")) or pd.isna(value):
        ax.add_patch(Rectangle((col - 0.5 + 0.012, row - 0.5 + 0.02), 0.976, 0.96,
                               facecolor=EMPTY_CELL, edgecolor="#CCCCCC", hatch="///",
                               linewidth=0, zorder=1))
        reason = cell.get("empty_reason") or "no value"
        head, _, tail = str(reason).partition(": ")
        lines = textwrap.wrap(head + (":" if tail else ""), 22) + textwrap.wrap(tail, 22)
        ax.text(col, row, "\n".join(lines), ha="center", va="center",
                fontsize=6.5, color="#333333", zorder=2,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": EMPTY_CELL, "edgecolor": "none"})
        return
    colour = text_colour(cmap(norm(value)))
    mark = " †" if flagged else ""
    ax.text(col, row - 0.27, f"{format_value(metric, value)}{mark}", ha="center", va="center",
            fontsize=9, fontweight="bold", color=colour)
    lines = _layout_lines(cell)
    memory = cell.get("gpu_memory_GB")
    if pd.notna(memory):
        lines.append(f"{memory:.2f} GiB")
    if straggler:
        lines.append(f"{STRAGGLER_MARK} slow node: {straggler}")
    ax.text(col, row + 0.12, "\n".join(lines), ha="center", va="center", fontsize=6.6,
            color=colour, linespacing=1.25)
