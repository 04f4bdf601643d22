"""`sweep collect SWEEP_DIR`: attempt folders → SWEEP_DIR/runs.parquet (incremental)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sweep.collect.folder import collect_folder, collect_summary


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


def run(args: argparse.Namespace) -> int:
    result, out = collect_folder(args.sweep_dir, args.out, args.accounting, sacct=args.sacct,
                                 full=args.full)
    for line in collect_summary(result, out):
        print(line)
    return 0
