"""`sweep collect SWEEP_DIR`: attempt folders → SWEEP_DIR/runs.parquet (incremental)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sweep.collect import job_ids, update_runs
from sweep.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", type=Path, help="the sweep directory (holds runs/)")
    parser.add_argument("--out", type=Path, default=None, help="output file (default SWEEP_DIR/runs.parquet)")
    parser.add_argument("--accounting", type=Path, default=None,
                        help="Slurm accounting rows as JSON (a list of sacct rows with JobID, "
                             "State, NodeList, Start, End, ElapsedRaw) or JSON lines")
    parser.add_argument("--sacct", action="store_true",
                        help="ask Slurm's accounting (sacct) about the jobs the attempts ran under: "
                             "it decides attempts that a time limit, node failure or cancel killed "
                             "before they wrote status.json, and adds elapsed time")
    parser.add_argument("--full", action="store_true", help="recompute every row, reuse nothing")


def _accounting(path: Path | None) -> list[dict[str, Any]]:
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
    """sweep.slurm.AcctEntry objects (jobs with their steps) → plain sacct rows for collect."""
    rows = []
    for entry in entries:
        for item in (entry, *entry.steps):
            rows.append({"JobID": item.job_id, "State": item.state, "ExitCode": item.exit_code,
                         "DerivedExitCode": item.derived_exit_code, "NodeList": item.nodes,
                         "Start": item.start, "End": item.end, "ElapsedRaw": item.elapsed_s})
    return rows


def _sacct(sweep_dir: Path) -> list[dict[str, Any]]:
    from sweep.slurm import Slurm, SlurmError

    # Asked by array master, as `sweep status` asks: the same query gives the same verdict.
    ids = sorted({job.split("_")[0] for job in job_ids(sweep_dir)})
    if not ids:
        return []
    try:
        return acct_rows(Slurm().accounting(ids))
    except (SlurmError, OSError) as error:
        raise UserError(f"--sacct: {error}; run without --sacct, or pass rows with --accounting") from None


def run(args: argparse.Namespace) -> int:
    sweep_dir: Path = args.sweep_dir
    if not (sweep_dir / "runs").is_dir():
        raise UserError(f"{sweep_dir}: no runs/ folder here; pass the sweep directory "
                        "(results/<sweep>) that `sweep render` wrote")
    accounting = _accounting(args.accounting) + (_sacct(sweep_dir) if args.sacct else [])
    result, out = update_runs(sweep_dir, args.out, accounting, full=args.full)
    outcomes = result.table.column("outcome").value_counts().to_pylist()
    counts = ", ".join(f"{item['counts']} {item['values']}" for item in outcomes)
    print(f"{result.table.num_rows} attempt(s) ({counts}): {result.computed} computed, "
          f"{result.reused} reused → {out}")
    for attempt_dir in result.with_issues[:20]:
        print(f"  issues: {attempt_dir}")
    if len(result.with_issues) > 20:
        print(f"  … and {len(result.with_issues) - 20} more attempts with issues (column collect_issues)")
    return 0
