"""report_sweep(runs.parquet): the report of a sweep folder, with what its folder says beside it.

`analysis.report.write_report` draws from a runs table and the frames it is given; this reads
them where a sweep keeps them: runs.parquet, and beside it the plan (why cells never ran) and a
search's per-cell progress, when there. `sweep report` and `sweep run` (after collecting) both
make a sweep's report this way, so it lives here rather than in one of those commands.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.best import DEFAULT_CONVENTION, DEFAULT_METRIC
from analysis.report import Report, write_report
from sweep.errors import UserError
from sweep.live_search import SEARCH_PROGRESS_FILE
from sweep.plan_file import PLAN_FILE


def report_sweep(path: Path, out: Path | None = None, metric: str | None = None,
                 convention: str | None = None) -> Report:
    """The report of a runs.parquet; the plan (why cells never ran) and a search's per-cell
    progress are read from beside it when there."""
    try:
        runs = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a readable Parquet file ({error})") from None
    plan_path = path.parent / PLAN_FILE
    plan = pd.read_parquet(plan_path) if plan_path.is_file() else None
    search_path = path.parent / SEARCH_PROGRESS_FILE
    search = pd.read_csv(search_path) if search_path.is_file() else None
    try:
        return write_report(runs, out or path.parent / "report", metric=metric or DEFAULT_METRIC,
                            convention=convention or DEFAULT_CONVENTION, plan=plan,
                            search=search)
    except ValueError as error:
        raise UserError(f"{path}: {error}") from None
