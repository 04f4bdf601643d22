"""Why an empty cell is empty, where a sweep folder knows more than the runs table.

analysis.best says why from the attempts (no successful run: the outcomes counted) and from the
plan (not run, pruned). A GPU-hour cap (the spec's max_gpu_hours) keeps some planned runs from
being launched, and the sweep folder lists them by run id (sweep.core.state.BUDGET_LEFT_OUT_FILE);
through plan.parquet's run_id column they fall into cells, which then say that the budget left
them out rather than "not run".
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import pandas as pd

BUDGET_REASON: Final = "left out by the budget"


def budget_reasons(best: pd.DataFrame, plan: pd.DataFrame | None,
                   left_out: Collection[str]) -> pd.DataFrame:
    """`best` with the empty cells whose planned runs the budget left out saying so: a cell
    without attempts reads "left out by the budget: N run(s) …", one whose attempts all failed
    adds how many more the budget left out. Other cells are unchanged."""
    if plan is None or not left_out or "run_id" not in plan.columns:
        return best
    dropped = plan[plan["run_id"].astype("string").isin(set(left_out))]
    counts = dropped.groupby(["model", "nodes"]).size().to_dict()
    best = best.copy()
    for index, cell in best.iterrows():
        count = counts.get((cell.get("model_name", cell["model"]), int(cell["nodes"])), 0)
        if not count or pd.notna(cell.get("run_id")):
            continue
        if int(cell.get("n_attempts") or 0) == 0:
            planned = int(((plan["model"] == cell.get("model_name", cell["model"]))
                           & (plan["nodes"] == int(cell["nodes"]))
                           & (plan["status"] == "kept")).sum()) if "status" in plan.columns else count
            rest = planned - count
            best.at[index, "empty_reason"] = (
                f"{BUDGET_REASON}: {count} planned run(s) over the GPU-hour cap"
                + (f", {rest} not run" if rest > 0 else ""))
        else:
            best.at[index, "empty_reason"] = (f"{cell['empty_reason']}; {count} more "
                                              f"{BUDGET_REASON}")
    return best


def unplaced_note(plan: pd.DataFrame | None, left_out: Collection[str]) -> list[str]:
    """A note when the budget left runs out but the report cannot put them in cells."""
    if not left_out or (plan is not None and "run_id" in plan.columns):
        return []
    return [f"{len(left_out)} planned run(s) were {BUDGET_REASON} (the GPU-hour cap); without "
            "the plan's run ids the report cannot say which cells they belong to."]
