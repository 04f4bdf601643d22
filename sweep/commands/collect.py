"""`sweep collect SWEEP_DIR`: attempt folders → SWEEP_DIR/runs.parquet (incremental)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sweep.cli import UserError
from sweep.collect import RUNS_FILE, collect_sweep, read_runs, write_runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", type=Path, help="the sweep directory (holds runs/)")
    parser.add_argument("--out", type=Path, default=None, help="output file (default SWEEP_DIR/runs.parquet)")
    parser.add_argument("--accounting", type=Path, default=None,
                        help="Slurm accounting rows as JSON (a list of sacct rows with JobID, "
                             "State, NodeList, Start, End, ElapsedRaw) or JSON lines")
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


def run(args: argparse.Namespace) -> int:
    sweep_dir: Path = args.sweep_dir
    if not (sweep_dir / "runs").is_dir():
        raise UserError(f"{sweep_dir}: no runs/ folder here; pass the sweep directory "
                        "(results/<sweep>) that `sweep render` wrote")
    out = args.out or sweep_dir / RUNS_FILE
    previous = None if args.full else read_runs(out)
    result = collect_sweep(sweep_dir, previous=previous, accounting=_accounting(args.accounting))
    write_runs(result.table, out)
    outcomes = result.table.column("outcome").value_counts().to_pylist()
    counts = ", ".join(f"{item['counts']} {item['values']}" for item in outcomes)
    print(f"{result.table.num_rows} attempt(s) ({counts}): {result.computed} computed, "
          f"{result.reused} reused → {out}")
    for attempt_dir in result.with_issues[:20]:
        print(f"  issues: {attempt_dir}")
    if len(result.with_issues) > 20:
        print(f"  … and {len(result.with_issues) - 20} more attempts with issues (column collect_issues)")
    return 0
