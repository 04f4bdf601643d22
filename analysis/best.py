"""The best configuration of each (model, nodes) cell, by a chosen metric and FLOPs convention.

Only completed attempts whose numbers pass the checks of analysis.checks compete (an MFU above 1,
or collect issues saying the run's numbers disagree, rule a run out); each cell counts and names
the runs so left out, for the marks of the heatmap and the tables. Ties break on tokens/s/GPU,
then run id and attempt, so the choice is deterministic. A cell with no winner says why (not
run, all OOM, …). Reads runs.parquet columns only (sweep.collect.schema); no Slurm, no rendering.
"""

from __future__ import annotations

from typing import Final

import pandas as pd

from analysis.checks import check_failures, run_name
from sweep.core.layout import LAYOUT_COLUMNS, LAYOUT_INT_COLUMNS, PIPELINE_SCHEDULE
from sweep.core.units import GiB

METRICS: Final = ("mfu", "tokens_per_sec_per_gpu")
CONVENTIONS: Final = ("reported", "megatron", "full_attention", "6N")
DEFAULT_METRIC: Final = "mfu"
# `reported`: the MFU the trainer or the publication reported. For the built-in workload that is
# full_attention; for imported playbook runs it is the published figure, so the published heatmap
# is reproduced by default and the flags say where a consistent basis would pick differently.
DEFAULT_CONVENTION: Final = "reported"
# The layout as best_configs.csv shows it: every column but sequence parallelism and the
# pipeline schedule.
SHOWN_LAYOUT_COLUMNS: Final = tuple(c for c in LAYOUT_COLUMNS if c not in ("sp", *PIPELINE_SCHEDULE))
BEST_CSV_COLUMNS: Final = ("model", "nodes", *SHOWN_LAYOUT_COLUMNS, "mfu_pct",
                           "tokens_per_sec_per_gpu", "gpu_memory_GB")


def mfu_column(convention: str) -> str:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {', '.join(CONVENTIONS)}")
    return f"mfu_{convention}"


def ranking_column(metric: str, convention: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    return mfu_column(convention) if metric == "mfu" else "tokens_per_sec_per_gpu"


def describe(metric: str, convention: str) -> str:
    if metric == "tokens_per_sec_per_gpu":
        return "tokens/s per GPU"
    return f"MFU ({convention})"


def value_column(metric: str) -> str:
    """The column of best_configs' frame that holds the ranked figure as shown (MFU in %)."""
    return "mfu_pct" if metric == "mfu" else "tokens_per_sec_per_gpu"


def value_label(metric: str, convention: str) -> str:
    """Axis and colour-bar label of the ranked figure, with its unit and convention."""
    if metric == "tokens_per_sec_per_gpu":
        return "Tokens/s per GPU"
    return f"MFU (%), {convention}" if convention != "reported" else "MFU (%), as reported"


def format_value(metric: str, value: float) -> str:
    """The ranked figure as a cell shows it: MFU to 2 decimals like the playbook, tokens/s whole
    (3 significant digits below 100, as tiny CPU runs have)."""
    if metric == "mfu":
        return f"{value:.2f}%"
    return f"{value:,.0f} tok/s" if abs(value) >= 100 else f"{value:.3g} tok/s"


def heatmap_axes(runs: pd.DataFrame, plan: pd.DataFrame | None = None) -> tuple[list[str], list[int]]:
    """Models ordered by size, then node counts ascending: the heatmap's rows and columns
    (with a plan, also the cells that were planned but never ran)."""
    sizes = runs.groupby("model", sort=False)["model_params"].max().fillna(0).to_dict()
    nodes = {int(n) for n in runs["nodes"].dropna().unique()}
    if plan is not None:
        sizes.update({m: float("inf") for m in plan["model"].dropna().unique() if m not in sizes})
        nodes |= {int(n) for n in plan["nodes"].dropna().unique()}
    return sorted(sizes, key=lambda m: (sizes[m], m)), sorted(nodes)


def plan_reason(planned: pd.DataFrame) -> str:
    """Why a cell without attempts is empty, from plan.parquet (status, prune_rule)."""
    if planned.empty:
        return "not run"
    kept = int((planned["status"] == "kept").sum())
    if kept:
        return f"not run: {kept} planned configuration(s) without an attempt"
    rules = planned["prune_rule"].fillna("unknown").value_counts()
    return (f"not run: all {len(planned)} configurations pruned ("
            + ", ".join(f"{rule} {count}" for rule, count in rules.items()) + ")")


def _labels(runs: pd.DataFrame) -> dict[str, str]:
    labels = runs.dropna(subset=["model_label"]).drop_duplicates("model")
    return {**{m: m for m in runs["model"].dropna().unique()},
            **dict(zip(labels["model"], labels["model_label"]))}


def empty_reason(cell: pd.DataFrame, column: str, failed_checks: int = 0) -> str:
    """Why a cell has no winner, from the outcomes of its attempts (`failed_checks`: completed
    attempts left out because their numbers failed a check)."""
    if cell.empty:
        return "not run"
    completed = cell[cell["outcome"] == "completed"]
    if failed_checks:
        without = int(completed[column].isna().sum())
        return (f"no trusted run: {failed_checks} completed run(s) failed a check"
                + (f", {without} without {column}" if without else ""))
    if not completed.empty:
        return f"{len(completed)} completed run(s) without {column}"
    counts = cell["outcome"].value_counts()
    parts = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    if len(counts) == 1:
        return f"no successful run: {'all ' if len(cell) > 1 else ''}{len(cell)} {counts.index[0]}"
    return f"no successful run: {parts}"


def best_configs(runs: pd.DataFrame, metric: str = DEFAULT_METRIC,
                 convention: str = DEFAULT_CONVENTION, plan: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cell of the models × nodes grid, winners and empty cells alike.

    `plan` (plan.parquet, optional) adds the cells that never ran and says why (pruned by which rule).
    """
    column = ranking_column(metric, convention)
    shown_mfu = mfu_column(convention)
    models, nodes = heatmap_axes(runs, plan)
    planned = dict(tuple(plan.groupby(["model", "nodes"], sort=False))) if plan is not None else {}
    labels = _labels(runs)
    sizes = runs.groupby("model")["model_params"].max().to_dict()
    runs = runs.reset_index(drop=True)  # a concatenation may repeat labels; cells select by them
    failures = check_failures(runs)
    failed = (runs["outcome"] == "completed") & failures.map(bool)
    eligible = runs[(runs["outcome"] == "completed") & runs[column].notna() & ~failed]
    ordered = eligible.sort_values([column, "tokens_per_sec_per_gpu", "run_id", "attempt"],
                                   ascending=[False, False, True, True], kind="mergesort")
    winners = ordered.drop_duplicates(["model", "nodes"], keep="first").set_index(["model", "nodes"])
    grouped = dict(tuple(runs.groupby(["model", "nodes"], sort=False)))
    rows = []
    for model in models:
        for node_count in nodes:
            cell = grouped.get((model, node_count), runs.iloc[0:0])
            left_out = cell[failed.loc[cell.index]]
            row = {"model": labels.get(model, model), "model_name": model, "nodes": node_count,
                   "model_params": sizes.get(model),
                   "n_attempts": len(cell), "n_completed": int((cell["outcome"] == "completed").sum()),
                   "metric": metric, "convention": convention, "n_failed_checks": len(left_out),
                   "failed_checks": "; ".join(f"{run_name(run)}: {', '.join(failures[index])}"
                                              for index, run in left_out.iterrows())}
            if (model, node_count) in winners.index:
                win = winners.loc[(model, node_count)]
                row.update({k: win[k] for k in (*SHOWN_LAYOUT_COLUMNS, "run_id", "attempt", "layout_label",
                                                 "world_size", "tokens_per_sec_per_gpu",
                                                 "mem_reserved_bytes", "mem_allocated_bytes",
                                                 "mem_source", "flops_per_token_reported")})
                row["mfu"] = win[shown_mfu]
                row["mfu_pct"] = 100.0 * win[shown_mfu] if pd.notna(win[shown_mfu]) else None
                row["gpu_memory_GB"] = (win["mem_reserved_bytes"] / GiB
                                        if pd.notna(win["mem_reserved_bytes"]) else None)
                row["empty_reason"] = ""
            elif cell.empty and (model, node_count) in planned:
                row["empty_reason"] = plan_reason(planned[(model, node_count)])
            else:
                row["empty_reason"] = empty_reason(cell, column, len(left_out))
            rows.append(row)
    frame = pd.DataFrame(rows)
    for name in (*BEST_CSV_COLUMNS, "run_id", "attempt", "layout_label", "mfu", "world_size"):
        if name not in frame.columns:
            frame[name] = None
    return frame


def best_csv_frame(best: pd.DataFrame) -> pd.DataFrame:
    """Exactly the columns of best_configs.csv (winners only), full precision."""
    winners = best[best["run_id"].notna()]
    frame = winners.loc[:, list(BEST_CSV_COLUMNS)].reset_index(drop=True)
    for name in ("nodes", *(c for c in SHOWN_LAYOUT_COLUMNS if c in LAYOUT_INT_COLUMNS)):
        frame[name] = frame[name].astype("int64")
    return frame
