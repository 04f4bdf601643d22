"""What `sweep compare` writes: compare.csv (per configuration), compare_cells.csv (per cell),
compare.md (both, with the rule and the test in words) and compare.png (what changed, per cell).

The CSV files keep full precision and every matching column; the Markdown shows what a person
reads in a pull request or a ticket: the statuses, the change in percent, the p-value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from analysis.compare import (
    MATCH_KEY,
    NEW,
    PICKED,
    REGRESSIONS,
    STATUSES,
    WITHIN_TOLERANCE,
    Comparison,
)
from analysis.style import DPI, SERIES, paper_style
from analysis.welch import TEST_NAME

RUNS_CSV: Final = "compare.csv"
MARKDOWN_ALL_ROWS: Final = 200  # above this, compare.md lists only what is not within tolerance
CELLS_CSV: Final = "compare_cells.csv"
MARKDOWN: Final = "compare.md"
FIGURE: Final = "compare.png"
# Okabe-Ito colours per status (analysis.style's palette): regressions in vermillion and
# reddish purple, the neutral ones grey, improvements green.
STATUS_COLOURS: Final = {
    "slower": "#D55E00", "newly failing": "#CC79A7", "missing": "#E69F00",
    "still failing": "#999999", "within noise": "#56B4E9", "within tolerance": "#0072B2",
    "faster": "#009E73", "now completing": "#009E73", "new": "#000000",
}
_NOT_PLOTTED_AT: Final = 1.08  # where rows without a change sit, as a fraction of the axis
_FLOOR: Final = 100.0  # a positive value changes by −100 % at the least


@dataclass(frozen=True)
class Written:
    """The files of a comparison."""

    runs_csv: Path
    cells_csv: Path
    markdown: Path
    figure: Path


def runs_frame(comparison: Comparison) -> pd.DataFrame:
    """The per-configuration table as compare.csv holds it."""
    frame = comparison.runs
    out = pd.DataFrame({"status": frame["status"]})
    for column in MATCH_KEY:
        out[column] = frame[column].replace("", pd.NA)
    out["layout_label"] = frame["ref_layout_label"].fillna(frame.get("cur_layout_label"))
    out["run_id"] = frame["ref_run_id"].fillna(frame["cur_run_id"])
    return pd.concat([out, _measures(frame)], axis=1)


def cells_frame(comparison: Comparison) -> pd.DataFrame:
    """The per-cell table as compare_cells.csv holds it: the cell's best configuration on each
    side compared, and how many of its configurations have each status."""
    frame = comparison.cells
    out = pd.DataFrame({"status": frame["status"], "model": frame["model"],
                        "nodes": frame["nodes"].replace("", pd.NA),
                        "baseline_best": frame["ref_layout_label"],
                        "current_best": frame.get("cur_layout_label")})
    counts = frame[[c for c in frame.columns if c.startswith("runs ")]].fillna(0).astype(int)
    return pd.concat([out, _measures(frame), counts], axis=1)


def _measures(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "metric": frame["ref_metric"].fillna("step_time_mean_s"),
        "baseline": frame["ref_measured"], "expected": frame["ref_value"],
        "current": frame["cur_value"],
        "change_pct": 100 * frame["change"], "lower_pct": 100 * frame["ref_lower"],
        "upper_pct": 100 * frame["ref_upper"], "p_value": frame["p_value"], "test": frame["test"],
        "baseline_outcome": frame["ref_outcome"], "current_outcome": frame.get("cur_outcome"),
        "baseline_attempt": frame["ref_attempt"], "current_attempt": frame.get("cur_attempt"),
    })


def summary_line(comparison: Comparison) -> str:
    """One line: the verdict and the counts per status."""
    counts = comparison.counts()
    said = ", ".join(f"{n} {status}" for status, n in counts.items()) or "nothing to compare"
    verdict = (f"REGRESSION ({comparison.regressions} row(s) slower or newly failing)"
               if comparison.regressions else "no regression")
    return f"{verdict}: {len(comparison.runs)} configuration(s): {said}"


def shift_line(comparison: Comparison) -> str:
    """What the sweep-wide normalisation did, in words."""
    if not comparison.normalized:
        return (f"Each configuration is judged on its own change; the current sweep's median "
                f"step time is {comparison.shift:.3g} × the baseline's (`--normalize median` "
                "would judge each configuration relative to it).")
    return (f"Relative to the sweep: the current sweep's median step time is "
            f"{comparison.shift:.3g} × the baseline's (the host's speed: on CPU every step time "
            "moves with the machine's load), so each configuration is judged against its "
            "baseline × that factor (`expected`); `--normalize none` judges the values as measured.")


def method_lines(comparison: Comparison) -> list[str]:
    """The rule in words: what is matched, which attempt, the tolerance and the test."""
    return [
        f"Baseline: {comparison.baseline}. Current: {comparison.current}.",
        "Configurations are matched on the cell, the sequence length, the global batch and the "
        f"layout; each side is represented by {PICKED}.",
        "A change counts only when it is beyond the tolerance (lower/upper, relative) and "
        f"significant by {TEST_NAME} at alpha = {comparison.alpha:g}; beyond the tolerance but "
        "not significant is `within noise`. Where the test cannot be made, the `test` column "
        "says why and the tolerance alone decides.",
        shift_line(comparison),
        f"Regressions (exit code 1): {', '.join(REGRESSIONS)}. `missing` (in the baseline, not "
        "in the current sweep) is reported, not a regression.",
    ]


def markdown(comparison: Comparison) -> str:
    """compare.md: the summary, the rule, the cells, then the configurations, worst first (above
    MARKDOWN_ALL_ROWS configurations, those within tolerance are left to compare.csv)."""
    cells = _display(cells_frame(comparison),
                     ["status", "model", "nodes", "baseline_best", "current_best"])
    frame = runs_frame(comparison)
    quiet = frame["status"] == WITHIN_TOLERANCE
    shown = frame[~quiet] if len(frame) > MARKDOWN_ALL_ROWS else frame
    note = (f"{int(quiet.sum())} configuration(s) within tolerance are in {RUNS_CSV}, not here."
            if len(shown) < len(frame) else "")
    runs = _display(shown, ["status", "model", "nodes", "layout_label"])
    return "\n".join([
        "# sweep compare", "", summary_line(comparison), "",
        *[f"- {line}" for line in method_lines(comparison)], "",
        "## Cells (each cell's best configuration)", "", _markdown_table(cells), "",
        "## Configurations", "", *([note, ""] if note else []), _markdown_table(runs), ""])


def _display(frame: pd.DataFrame, first: list[str]) -> pd.DataFrame:
    shown = frame[first].astype("string").fillna("")
    shown["baseline"] = frame["baseline"].map(_number)
    shown["expected"] = frame["expected"].map(_number)
    shown["current"] = frame["current"].map(_number)
    shown["change"] = frame["change_pct"].map(lambda v: "" if pd.isna(v) else f"{v:+.1f} %")
    shown["tolerance"] = [_band(lo, up) for lo, up in zip(frame["lower_pct"], frame["upper_pct"])]
    shown["p"] = frame["p_value"].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    shown["test"] = frame["test"].fillna("")
    shown["outcome (baseline → current)"] = [
        f"{'' if pd.isna(b) else b} → {'' if pd.isna(c) else c}"
        for b, c in zip(frame["baseline_outcome"], frame["current_outcome"])]
    return shown


def _band(lower: float, upper: float) -> str:
    def side(value: float) -> str:
        return "unbounded" if pd.isna(value) else f"{value:+.0f} %"
    return f"{side(lower)} / {side(upper)}"


def _number(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.4g}"


def _markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)"
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def write_comparison(comparison: Comparison, out_dir: Path) -> Written:
    """Write the tables and the figure into `out_dir` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = Written(out_dir / RUNS_CSV, out_dir / CELLS_CSV, out_dir / MARKDOWN,
                      out_dir / FIGURE)
    runs_frame(comparison).to_csv(written.runs_csv, index=False)
    cells_frame(comparison).to_csv(written.cells_csv, index=False)
    written.markdown.write_text(markdown(comparison), encoding="utf-8")
    draw_figure(comparison, written.figure)
    return written


def draw_figure(comparison: Comparison, path: Path) -> None:
    """compare.png: one row per cell, each configuration a dot at its change in percent,
    coloured by status; the tolerance band shaded where every row shares it; configurations
    without a change (missing, failing, new) as crosses at the right edge."""
    import matplotlib.pyplot as plt

    runs = runs_frame(comparison)
    ordered = runs.assign(_nodes=pd.to_numeric(runs["nodes"], errors="coerce")) \
        .sort_values(["model", "_nodes"], kind="stable")
    cells = list(dict.fromkeys(zip(ordered["model"].astype(str), ordered["nodes"].astype(str))))
    position = {cell: i for i, cell in enumerate(cells)}
    y = np.array([position[c] for c in zip(runs["model"].astype(str), runs["nodes"].astype(str))],
                 dtype=float)
    y += np.random.default_rng(0).uniform(-0.25, 0.25, len(y))  # jitter: the same every time
    change = runs["change_pct"].to_numpy(dtype=float)
    finite = np.isfinite(change)
    reach = max(float(np.nanmax(np.abs(change))) if finite.any() else 0.0,
                float(np.nanmax(np.abs(runs[["lower_pct", "upper_pct"]].to_numpy(dtype=float))))
                if runs[["lower_pct", "upper_pct"]].notna().any().any() else 0.0, 10.0) * 1.1
    with paper_style():
        # Constrained layout makes room for the legend outside the axes, so the PNG is drawn
        # once (a "tight" bounding box would draw the figure twice: most of the command's time).
        fig, ax = plt.subplots(figsize=(8.5, 1.2 + 0.32 * max(len(cells), 3)), layout="constrained")
        _tolerance_band(ax, runs)
        ax.axvline(0, color="#444444", linewidth=0.6)
        for rank, status in enumerate(STATUSES):
            chosen = (runs["status"] == status).to_numpy()
            if not chosen.any():
                continue
            at = np.where(finite[chosen], change[chosen], reach * _NOT_PLOTTED_AT)
            marker = "o" if finite[chosen].all() else "x"
            ax.scatter(at, y[chosen], s=14, marker=marker, color=STATUS_COLOURS.get(status, SERIES[0]),
                       label=f"{status} ({int(chosen.sum())})", linewidths=0.8,
                       zorder=3 + len(STATUSES) - rank)  # the worst on top
        ax.set_yticks(range(len(cells)))
        ax.set_yticklabels([f"{model} × {nodes} node(s)" for model, nodes in cells]
                           if len(cells) <= 60 else [""] * len(cells))
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_xlim(-min(reach, _FLOOR * 1.05), reach * (_NOT_PLOTTED_AT + 0.05))  # ≥ −100 %
        step_only = bool(runs["metric"].eq("step_time_mean_s").all())
        ax.set_xlabel(("Step-time change (%), + = slower" if step_only
                       else "Change of each reference's metric (%)")
                      + "; × at the right: missing, failing or new")
        ax.set_title(_title(comparison))
        fig.legend(loc="outside right upper", frameon=False)
        fig.savefig(path, dpi=DPI // 2, bbox_inches=None)
        plt.close(fig)


def _tolerance_band(ax: object, runs: pd.DataFrame) -> None:
    bands = runs[["lower_pct", "upper_pct"]].dropna(how="all").drop_duplicates()
    if len(bands) != 1:
        return
    lower, upper = bands.iloc[0]
    ax.axvspan(-_FLOOR if pd.isna(lower) else max(lower, -_FLOOR),  # type: ignore[attr-defined]
               1e9 if pd.isna(upper) else upper,
               color="#DDDDDD", zorder=0, label="tolerance")


def _title(comparison: Comparison) -> str:
    counts = comparison.counts()
    slower = sum(counts.get(s, 0) for s in REGRESSIONS)
    new = counts.get(NEW, 0)
    return (f"Current vs baseline: {slower} regression(s) in {len(comparison.runs) - new} "
            "configuration(s)" + (f", {new} new" if new else ""))
