"""Which runs' numbers fail a check, and why. A run that fails one never wins a cell.

The report must never present an impossible figure as a result, and a figure is only as good as
the run that produced it. Two checks, on runs.parquet columns only:

- an MFU above 1 under any convention. Every convention divides the same tokens/s by the same
  peak, so one impossible MFU means the run's tokens/s, peak FLOP/s or FLOPs per token is wrong
  (a peak measured too low on a CPU, global tokens/s taken as per GPU, a sparse peak), and its
  other figures cannot be trusted either;
- a collect issue saying that two sources of the run's numbers disagree (the log's tokens/s vs
  global batch tokens over the mean step time, "does the run's batch match run.json?"; the
  trainer's peak or FLOPs per token vs ours). Which source is right is unknown, so the run does
  not compete.

Other collect issues (a torn line skipped, a summary recomputed from step records) leave the
numbers standing; the flags list them all the same (analysis.flags.collect_issue_flags).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np
import pandas as pd

from sweep.collect.schema import CONVENTIONS

MFU_COLUMNS: Final = ("mfu_reported", *(f"mfu_{c}" for c in CONVENTIONS))
# Collect writes "differs" exactly where two sources of one number disagree (sweep.collect.attempts:
# _check_logged_rate, _apply_mfu); the batch question closes the tokens/s one.
DISAGREEMENT_MARKERS: Final = ("differs", "does the run's batch match")
MARK: Final = "!"  # beside a value in the heatmap and the tables: the cell has a run that failed
MARK_NOTE: Final = (f"{MARK} a completed run of this cell failed a check (MFU above 100 %, or "
                    "collect found its numbers disagree) and was left out of the ranking; see "
                    "the failed-check flags.")


def issues_of(value: object) -> list[str]:
    """The `collect_issues` cell as a list (Parquet gives arrays, hand-built tables lists or None)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]  # type: ignore[attr-defined]


def disagreeing(issues: Iterable[str]) -> list[str]:
    """The collect issues that say the run's numbers disagree."""
    return [issue for issue in issues if any(marker in issue for marker in DISAGREEMENT_MARKERS)]


def check_failures(runs: pd.DataFrame) -> pd.Series:
    """Per row of `runs` (same index, by position), the reasons its numbers fail a check;
    [] = passes. Column-wise first, so a 4,000-row table only builds text for the rows that
    fail."""
    high: list[list[str]] = [[] for _ in range(len(runs))]
    for column in MFU_COLUMNS:
        values = runs[column].to_numpy(dtype=float, na_value=np.nan)
        for position in np.flatnonzero(values > 1.0):
            high[position].append(f"{column} {values[position]:.4g}")
    reasons = [[(f"MFU above 1 ({', '.join(columns)}): impossible, so its tokens/s, peak FLOP/s "
                 "or FLOPs per token is wrong")] if columns else [] for columns in high]
    for row, value in enumerate(runs["collect_issues"].to_numpy()):
        issues = issues_of(value)
        if issues:
            reasons[row].extend(f"collect: {issue}" for issue in disagreeing(issues))
    return pd.Series(reasons, index=runs.index, dtype=object)


def run_name(row: pd.Series) -> str:
    """`run_id#attempt`, the name every flag and footnote gives a run."""
    attempt = row.get("attempt")
    return f"{row.get('run_id')}#{int(attempt) if pd.notna(attempt) else '?'}"
