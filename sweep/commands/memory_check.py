"""`sweep memory-check RUNS.csv --spec SPEC [--json]`: score the memory model and the prune rules.

Reads either runs format (see `sweep.memcheck`), judges every run as the planner would, and
prints the fields of `sweep.memcheck.FIELDS`; `--json` emits them as one JSON object, with
null where the file's format cannot give a field.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sweep import memcheck
from sweep.cli import UserError
from sweep.spec import load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, help="a runs CSV: the playbook charts' table or the "
                                                "sweep's full results table")
    parser.add_argument("--spec", type=Path, required=True,
                        help="the spec whose models, hardware and rules judge the runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    try:
        runs = memcheck.read_runs(args.runs, spec)
    except memcheck.RunsFileError as error:
        raise UserError(str(error)) from None
    result = memcheck.score(runs, spec).to_dict()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.runs} ({runs.format} format) against {args.spec} ({spec.framework}):")
    for name in memcheck.FIELDS:
        print(f"  {name:<28} {_show(result[name])}")
    return 0


def _show(value: object) -> str:
    if value is None:
        return "null (this format cannot give it)"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).lower() if isinstance(value, bool) else str(value)
