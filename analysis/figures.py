"""The report's other figures: scaling curves, failure breakdown, MFU distribution per cell."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from analysis.best import describe, mfu_column
from analysis.style import OUTCOME_COLOURS, SERIES, paper_style, save
from sweep.schema import OUTCOMES


def _node_axis(ax: plt.Axes, nodes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(nodes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(n) for n in nodes])
    ax.set_xlabel("Nodes")


def plot_scaling(best: pd.DataFrame, stem: Path) -> list[Path]:
    """Best MFU and best tokens/s/GPU against nodes, one line per model."""
    nodes = sorted(set(int(n) for n in best["nodes"]))
    convention = best["convention"].iloc[0]
    with paper_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.3))
        for index, (model, group) in enumerate(best.groupby("model", sort=False)):
            done = group[group["mfu_pct"].notna()].sort_values("nodes")
            style = {"color": SERIES[index % len(SERIES)], "marker": "o", "markersize": 4,
                     "linewidth": 1.5, "label": str(model)}
            left.plot(done["nodes"], done["mfu_pct"], **style)
            right.plot(done["nodes"], done["tokens_per_sec_per_gpu"], **style)
        for ax in (left, right):
            _node_axis(ax, nodes)
            ax.grid(True, which="major", color="#DDDDDD", linewidth=0.6)
        left.set_ylabel(f"Best MFU (%), {convention}")
        left.set_ylim(bottom=0)
        right.set_ylabel("Tokens/s per GPU of that run")
        right.set_yscale("log")  # models differ by orders of magnitude in tokens/s
        right.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        right.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        right.yaxis.set_minor_formatter(NullFormatter())
        left.legend(title="Model", frameon=False)
        fig.suptitle("Best configuration per cell against nodes, ranked by "
                     f"{describe(best['metric'].iloc[0], convention)}", x=0.01, ha="left")
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


def plot_failures(runs: pd.DataFrame, order: list[str], stem: Path) -> list[Path]:
    """Stacked bars: attempts per cell by outcome class, one panel per model."""
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
            ax.set_xlabel("Nodes")
            ax.set_title(str(model), loc="left")
        axes[0][0].set_ylabel("Attempts")
        handles = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles),
                   frameon=False, bbox_to_anchor=(0.5, 1.08))
        fig.tight_layout()
        return save(fig, stem)


def plot_distribution(runs: pd.DataFrame, order: list[str], convention: str, stem: Path) -> list[Path]:
    """MFU of every completed run per cell (box plot), with the best run marked."""
    column = mfu_column(convention)
    done = runs[(runs["outcome"] == "completed") & runs[column].notna()]
    with paper_style():
        fig, axes = plt.subplots(1, len(order), figsize=(2.3 + 2.1 * len(order), 3.0),
                                 sharey=True, squeeze=False)
        for ax, model in zip(axes[0], order):
            group = done[done["model_label"] == model]
            nodes = sorted(group["nodes"].unique())
            data = [100.0 * group.loc[group["nodes"] == n, column].to_numpy() for n in nodes]
            if data:
                ax.boxplot(data, positions=range(len(nodes)), widths=0.6, showfliers=False,
                           medianprops={"color": "#D55E00"}, boxprops={"color": "#444444"},
                           whiskerprops={"color": "#444444"}, capprops={"color": "#444444"})
                rng = np.random.default_rng(0)  # fixed jitter: the figure is reproducible
                xs = np.concatenate([i + rng.uniform(-0.18, 0.18, len(v)) for i, v in enumerate(data)])
                ax.scatter(xs, np.concatenate(data), s=4, color="#0072B2", alpha=0.35, linewidths=0,
                           zorder=3, rasterized=True)  # one raster per panel keeps PDF/SVG small
                ax.scatter(range(len(data)), [v.max() for v in data], marker="*", s=50,
                           color="black", zorder=4)
                ax.set_xticks(range(len(nodes)), [str(int(n)) for n in nodes])
            ax.set_xlabel("Nodes")
            ax.set_title(f"{model}  (n = {len(group)})", loc="left")
            ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        axes[0][0].set_ylabel(f"MFU (%), {convention}")
        fig.suptitle("MFU of every completed run per cell (★ best)", x=0.01, ha="left")
        fig.tight_layout()
        return save(fig, stem)
