"""report_sweep(runs.parquet): the report of a sweep folder, with what its folder says beside it.

`analysis.report.write_report` draws from a runs table and the frames it is given; this reads
them where a sweep keeps them: runs.parquet, and beside it the plan (why cells never ran) and a
search's per-cell progress, when there. `sweep report`, `sweep run` (after collecting) and the
end of a detached sweep on the cluster (`sweep.search.driver.collect_and_report`) all make a sweep's
report this way, so it lives here rather than in one of those commands; `sweep report` and the
detached sweep's end also find the runs.parquet and say what the report holds in the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pandas as pd

from analysis.best import DEFAULT_CONVENTION, DEFAULT_METRIC
from analysis.report import Report, write_report
from sweep.collect.attempts import RUNS_FILE
from sweep.core.errors import UserError
from sweep.core.state import BUDGET_LEFT_OUT_FILE, SEARCH_PROGRESS_FILE
from sweep.plan.plan_file import PLAN_FILE

# The flag kinds a report's summary prints one by one; every flag is in index.html.
PRINTED_FLAGS: Final = ("failed-check", "best-config-changes", "basis", "mfu-above-1",
                        "convention-mismatch", "not-ranked", "straggler")


def runs_file(source: Path) -> Path:
    """The runs.parquet to report on: a sweep directory's own, or the file given; a UserError
    that says what to do when there is none."""
    path = source / RUNS_FILE if source.is_dir() else source
    if not path.is_file():
        hint = "run `sweep collect` first" if source.is_dir() else "pass a sweep directory or a runs.parquet"
        raise UserError(f"{path}: no such file; {hint}")
    return path


def report_sweep(path: Path, out: Path | None = None, metric: str | None = None,
                 convention: str | None = None) -> Report:
    """The report of a runs.parquet; the plan (why cells never ran), a search's per-cell
    progress and the runs a GPU-hour cap left out are read from beside it when there."""
    try:
        runs = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a readable Parquet file ({error})") from None
    plan_path = path.parent / PLAN_FILE
    plan = pd.read_parquet(plan_path) if plan_path.is_file() else None
    search_path = path.parent / SEARCH_PROGRESS_FILE
    search = pd.read_csv(search_path) if search_path.is_file() else None
    left_out_path = path.parent / BUDGET_LEFT_OUT_FILE
    left_out = left_out_path.read_text(encoding="utf-8").split() if left_out_path.is_file() else []
    try:
        return write_report(runs, out or path.parent / "report", metric=metric or DEFAULT_METRIC,
                            convention=convention or DEFAULT_CONVENTION, plan=plan,
                            search=search, budget_left_out=left_out)
    except ValueError as error:
        raise UserError(f"{path}: {error}") from None


def report_summary(report: Report) -> list[str]:
    """What a report holds, for the user: attempts, cells with a best configuration, flags and
    where index.html is; then its notes, and the PRINTED_FLAGS with their messages cut to one
    line."""
    winners = int(report.best["run_id"].notna().sum())
    lines = [f"{report.attempts} attempt(s), {winners}/{len(report.best)} cells with a best "
             f"configuration, {len(report.flags)} flag(s) → {report.out_dir / 'index.html'}"]
    lines += [f"  note: {note}" for note in report.notes]
    for flag in report.flags:
        if flag.kind in PRINTED_FLAGS:
            where = flag.model + (f" × {flag.nodes} nodes" if flag.nodes is not None else "")
            lines.append(f"  {flag.kind} ({where}): "
                         f"{flag.message[:160]}{'…' if len(flag.message) > 160 else ''}")
    return lines
