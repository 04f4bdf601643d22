"""What `sweep collect` does to a sweep folder: its attempts, with Slurm's accounting rows from a
file or from sacct, into runs.parquet, and the lines that say what came of it.

`sweep collect`, the search driver's last step and the report job after a one-round sweep's
arrays (`sweep.search.driver.collect_and_report`) all collect this way, so it lives here rather than in
the command, which no domain module may import. `sweep.collect.attempts` turns folders and rows into a
table and never raises; this module is where a sweep folder that is not one, an accounting file
that cannot be read or a sacct that does not answer becomes a `UserError` that says what to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from sweep.collect.attempts import CollectResult, job_ids, update_runs
from sweep.core.errors import UserError

# Attempt folders with collect issues named one per line; the rest are counted.
ISSUES_SHOWN: Final = 20


def collect_folder(sweep_dir: Path, out: Path | None = None, accounting_file: Path | None = None,
                   sacct: bool = False, full: bool = False) -> tuple[CollectResult, Path]:
    """Collect SWEEP_DIR's attempts into OUT (default SWEEP_DIR/runs.parquet), deciding killed
    attempts with the sacct rows of `accounting_file` and, with `sacct`, those Slurm's accounting
    gives now; `full` recomputes every row. Returns the result and the file written."""
    if not (sweep_dir / "runs").is_dir():
        raise UserError(f"{sweep_dir}: no runs/ folder here; pass the sweep directory "
                        "(results/<sweep>) that `sweep render` wrote")
    accounting = read_accounting_file(accounting_file) + (sacct_rows(sweep_dir) if sacct else [])
    return update_runs(sweep_dir, out, accounting, full=full)


def collect_summary(result: CollectResult, out: Path) -> list[str]:
    """What a collection found, for the user: attempts by outcome, rows computed and reused, and
    the attempts whose files had issues (the first ISSUES_SHOWN by name)."""
    outcomes = result.table.column("outcome").value_counts().to_pylist()
    counts = ", ".join(f"{item['counts']} {item['values']}" for item in outcomes)
    lines = [f"{result.table.num_rows} attempt(s) ({counts}): {result.computed} computed, "
             f"{result.reused} reused → {out}"]
    lines += [f"  CPU peak raised: {record['why']}" for record in result.raised_peaks
              if record.get("raised")]
    lines += [f"  straggler: {node} was the slowest node, beyond its run's factor × the nodes' "
              f"median step time, in {entry['count']} run(s): "
              + ", ".join(f"{r['run']} ({r['ratio']:.2f}×)" for r in entry["runs"][:3])
              + (" …" if entry["count"] > 3 else "") + " (a suspect in bad_nodes.json, not excluded)"
              for node, entry in result.suspects.items()]
    lines += [f"  issues: {attempt_dir}" for attempt_dir in result.with_issues[:ISSUES_SHOWN]]
    if len(result.with_issues) > ISSUES_SHOWN:
        lines.append(f"  … and {len(result.with_issues) - ISSUES_SHOWN} more attempts with issues "
                     "(column collect_issues)")
    return lines


def read_accounting_file(path: Path | None) -> list[dict[str, Any]]:
    """Slurm accounting rows written by hand or by another tool (`--accounting`): a JSON list of
    sacct rows, or JSON lines; none without a file."""
    if path is None:
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"--accounting {path}: cannot read it ({error.strerror})") from None
    try:
        data = json.loads(text) if text.lstrip().startswith("[") else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise UserError(f"--accounting {path}: not JSON or JSON lines (line {error.lineno}: "
                        f"{error.msg}); write a list of sacct rows") from None
    if not all(isinstance(row, dict) for row in data):
        raise UserError(f"--accounting {path}: every row must be an object with JobID and State")
    return data


def acct_rows(entries: Iterable[Any]) -> list[dict[str, Any]]:
    """sweep.backends.slurm.client.AcctEntry objects (jobs with their steps) → plain sacct rows for collect."""
    rows = []
    for entry in entries:
        for item in (entry, *entry.steps):
            rows.append({"JobID": item.job_id, "State": item.state, "ExitCode": item.exit_code,
                         "DerivedExitCode": item.derived_exit_code, "NodeList": item.nodes,
                         "Start": item.start, "End": item.end, "ElapsedRaw": item.elapsed_s})
    return rows


def sacct_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """What sacct says now of the jobs the sweep's attempts ran under: it decides attempts that
    a time limit, node failure or cancel killed before they wrote status.json."""
    from sweep.backends.slurm.client import Slurm, SlurmError

    # Asked by array master, as `sweep status` asks: the same query gives the same verdict.
    ids = sorted({job.split("_")[0] for job in job_ids(sweep_dir)})
    if not ids:
        return []
    try:
        return acct_rows(Slurm().accounting(ids))
    except (SlurmError, OSError) as error:
        raise UserError(f"--sacct: {error}; run without --sacct, or pass rows with --accounting") from None
