"""The report's other figures: scaling curves, failure breakdown, distribution per cell.

Every figure has a title and labelled axes; counts get integer ticks; a log axis labels its
ticks in plain numbers (1, 2, 5 per decade) and a narrow range, where a log axis would label at
most one tick, is drawn linear.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

from analysis.best import ranking_column
from analysis.checks import check_failures
from analysis.labels import Labels, labels_of
from analysis.style import CHECK_COLOUR, OUTCOME_COLOURS, SERIES, paper_style, save
from sweep.collect.schema import OUTCOMES

if TYPE_CHECKING:
    from matplotlib.artist import Artist

MIN_BOX_POINTS = 5  # fewer runs in a cell: points alone; a box over 1-4 points suggests a spread
LOG_SUBS = (1.0, 2.0, 5.0)  # labelled ticks per decade on a log axis


def _plain(value: float, _: object = None) -> str:
    """A tick label in plain digits with thousands separators (no 10^k, no trailing .0)."""
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:.3g}"


def _nice_bounds(low: float, high: float) -> tuple[float, float]:
    """The 1-2-5 values of the decades just below `low` and just above `high`."""
    steps = [s * 10.0 ** k for k in range(int(np.floor(np.log10(low))) - 1,
                                          int(np.ceil(np.log10(high))) + 1) for s in LOG_SUBS]
    return max(s for s in steps if s <= low), min(s for s in steps if s >= high)


def value_axis(ax: plt.Axes, values: np.ndarray | pd.Series) -> None:
    """A y axis that spans `values` (positive) with at least three labelled plain-number ticks:
    logarithmic where they span a decade or more (models differ by orders of magnitude in
    tokens/s), linear from 0 otherwise."""
    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data) & (data > 0)]
    if data.size and data.max() / data.min() >= 10:
        ax.set_yscale("log")
        ax.set_ylim(*_nice_bounds(float(data.min()), float(data.max())))
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=LOG_SUBS))
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10))))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0, top=float(data.max()) * 1.08 if data.size else None)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, min_n_ticks=3))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))


def _node_axis(ax: plt.Axes, nodes: list[int], label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(nodes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(n) for n in nodes])
    ax.set_xlabel(label)


NOTHING = "No successful run: nothing to draw"


def _nothing(ax: plt.Axes, why: str = NOTHING) -> None:
    """An axis without data says so, and shows no value ticks a reader could take for a range."""
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=8,
            color="#555555")
    ax.yaxis.set_major_locator(NullLocator())
    ax.yaxis.set_minor_locator(NullLocator())


def plot_scaling(best: pd.DataFrame, stem: Path, labels: Labels | None = None) -> list[Path]:
    """MFU and tokens/s/GPU (per rank on CPU) of each cell's best run against nodes, one line per
    model."""
    labels = labels or labels_of(best)
    nodes = sorted(set(int(n) for n in best["nodes"]))
    done_any = bool(best["mfu_pct"].notna().any()) if "mfu_pct" in best.columns else False
    with paper_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.3))
        for index, (model, group) in enumerate(best.groupby("model", sort=False)):
            done = group[group["mfu_pct"].notna()].sort_values("nodes")
            style = {"color": SERIES[index % len(SERIES)], "marker": "o", "markersize": 4,
                     "linewidth": 1.5, "label": str(model)}
            left.plot(done["nodes"], done["mfu_pct"], **style)
            right.plot(done["nodes"], done["tokens_per_sec_per_gpu"], **style)
        for ax in (left, right):
            _node_axis(ax, nodes, labels.nodes_label())
            ax.grid(True, which="major", color="#DDDDDD", linewidth=0.6)
        left.set_ylabel(labels.value_label("mfu"))
        right.set_ylabel(labels.value_label("tokens_per_sec_per_gpu"))
        if done_any:
            left.set_ylim(bottom=0, top=float(best["mfu_pct"].max()) * 1.08)
            value_axis(right, best.loc[best["mfu_pct"].notna(), "tokens_per_sec_per_gpu"])
            left.legend(title="Model", frameon=False)
            title = f"Best configuration per cell against nodes{labels.on()}, ranked by "
        else:
            _nothing(left)
            _nothing(right)
            title = f"No successful run{labels.on()}: no best configuration to draw, by "
        fig.suptitle(title + labels.describe(), x=0.01, ha="left")
        fig.tight_layout()
        return save(fig, stem)


def outcome_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """Attempts per (model, nodes) cell by outcome class; columns in the schema's class order."""
    placed = runs.dropna(subset=["model_label", "nodes"]).astype({"nodes": "int64"})
    counts = placed.groupby(["model_label", "nodes", "outcome"]).size().unstack("outcome", fill_value=0)
    ordered = [o for o in OUTCOMES if o in counts.columns] + \
        sorted(c for c in counts.columns if c not in OUTCOMES)
    counts = counts[ordered]
    counts.columns.name = None
    return counts


def plot_failures(runs: pd.DataFrame, order: list[str], stem: Path,
                  labels: Labels | None = None) -> list[Path]:
    """Stacked bars: attempts per cell by outcome class, one panel per model."""
    labels = labels or Labels()
    counts = outcome_counts(runs)
    with paper_style():
        fig, axes = plt.subplots(1, len(order), figsize=(2.3 + 2.1 * len(order), 3.0),
                                 sharey=True, squeeze=False)
        for ax, model in zip(axes[0], order):
            if model not in counts.index.get_level_values(0):
                ax.set_visible(False)
                continue
            table = counts.loc[model]
            bottom = np.zeros(len(table))
            positions = np.arange(len(table))
            for outcome in table.columns:
                values = table[outcome].to_numpy()
                if values.any():
                    ax.bar(positions, values, bottom=bottom, color=OUTCOME_COLOURS.get(outcome, "#777777"),
                           label=outcome, width=0.75)
                bottom += values
            ax.set_xticks(positions, [str(n) for n in table.index])
            ax.set_xlabel(labels.nodes_label())
            ax.set_title(str(model), loc="left")
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # counts
            ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
            ax.set_axisbelow(True)
        axes[0][0].set_ylabel("Attempts")
        handles: dict[str, Artist] = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        fig.legend(handles.values(), handles.keys(), loc="center left", title="Outcome",
                   frameon=False, bbox_to_anchor=(1.0, 0.5))
        fig.suptitle(f"Attempts per cell by outcome class{labels.on()} "
                     f"({int(counts.to_numpy().sum())} attempts)", x=0.01, ha="left")
        fig.tight_layout()
        return save(fig, stem)


def plot_distribution(runs: pd.DataFrame, best: pd.DataFrame, stem: Path,
                      labels: Labels | None = None) -> list[Path]:
    """The ranked figure of every completed run per cell, with the cell's winner starred.

    Points for every run (jittered); a box only where a cell has MIN_BOX_POINTS runs or more.
    Runs that failed a check (analysis.checks) are not drawn, as their impossible figures would
    squash the axis: each panel's title counts them, and the flags name them."""
    labels = labels or labels_of(best)
    metric, convention = best["metric"].iloc[0], best["convention"].iloc[0]
    column = ranking_column(metric, convention)
    scale = 100.0 if metric == "mfu" else 1.0
    completed = runs[(runs["outcome"] == "completed") & runs[column].notna()]
    # bool dtype: an empty object Series would index columns, not rows
    failed = check_failures(completed).map(bool).astype(bool)
    done, left_out = completed[~failed], completed[failed]
    placed = best.dropna(subset=["run_id"])
    winners = set(zip(placed["run_id"], placed["attempt"].astype(int)))
    order = list(dict.fromkeys(best["model"]))
    rng = np.random.default_rng(0)  # fixed jitter: the figure is reproducible
    with paper_style():
        fig, axes = plt.subplots(1, len(order), figsize=(2.3 + 2.1 * len(order), 3.0),
                                 sharey=True, squeeze=False)
        for ax, model in zip(axes[0], order):
            group = done[done["model_label"] == model]
            nodes = sorted(int(n) for n in group["nodes"].unique())
            for position, node_count in enumerate(nodes):
                cell = group[group["nodes"] == node_count]
                data = scale * cell[column].to_numpy()
                if len(data) >= MIN_BOX_POINTS:
                    ax.boxplot([data], positions=[position], widths=0.6, showfliers=False,
                               medianprops={"color": "#D55E00"}, boxprops={"color": "#444444"},
                               whiskerprops={"color": "#444444"}, capprops={"color": "#444444"})
                spread = 0.18 if len(data) >= MIN_BOX_POINTS else 0.08
                xs = position + rng.uniform(-spread, spread, len(data))
                ax.scatter(xs, data,
                           s=4 if len(data) >= MIN_BOX_POINTS else 14, color="#0072B2",
                           alpha=0.35 if len(data) >= MIN_BOX_POINTS else 0.8, linewidths=0,
                           zorder=3, rasterized=True)  # one raster per panel keeps PDF/SVG small
                won = [(r, int(a)) in winners for r, a in zip(cell["run_id"], cell["attempt"])]
                ax.scatter(xs[won], data[won], marker="*", s=60, color="black", zorder=4)
            ax.set_xticks(range(len(nodes)), [str(n) for n in nodes])
            ax.set_xlim(-0.6, max(len(nodes), 1) - 0.4)
            ax.set_xlabel(labels.nodes_label())
            excluded = int((left_out["model_label"] == model).sum())
            if excluded:
                ax.set_title(f"{model}  (n = {len(group)})\n+{excluded} failed a check, not drawn",
                             loc="left", color=CHECK_COLOUR)
            else:
                ax.set_title(f"{model}  (n = {len(group)})", loc="left")
            ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        if done.empty:
            for ax in axes[0]:
                _nothing(ax, "No completed run to draw" if left_out.empty
                         else "No run passed the checks")
        elif metric == "tokens_per_sec_per_gpu":
            value_axis(axes[0][0], done[column])
        else:  # headroom above the highest point, so its marker is not cut by the frame
            axes[0][0].set_ylim(bottom=0, top=scale * float(done[column].max()) * 1.08)
        axes[0][0].set_ylabel(labels.value_label())
        fig.suptitle(f"{labels.describe()} of every completed run per cell{labels.on()} (★ best; "
                     f"boxes where ≥ {MIN_BOX_POINTS} runs)", x=0.01, ha="left")
        fig.tight_layout()
        return save(fig, stem)
