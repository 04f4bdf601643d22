"""`sweep report SWEEP_DIR|RUNS.parquet [--out DIR]`: heatmaps, best-config tables, index.html."""

from __future__ import annotations

import argparse
from pathlib import Path

from sweep.collect import RUNS_FILE
from sweep.errors import UserError

_PRINTED = ("failed-check", "best-config-changes", "basis", "mfu-above-1", "convention-mismatch",
            "not-ranked")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from analysis.best import CONVENTIONS, DEFAULT_CONVENTION, DEFAULT_METRIC, METRICS

    parser.add_argument("source", type=Path, help="a sweep directory (its runs.parquet) or a runs.parquet")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: report/ beside runs.parquet)")
    parser.add_argument("--metric", choices=METRICS, default=DEFAULT_METRIC,
                        help="what ranks the configurations of a cell (default %(default)s)")
    parser.add_argument("--convention", choices=CONVENTIONS, default=DEFAULT_CONVENTION,
                        help="FLOPs convention of the MFU shown and ranked; `reported` = as the "
                             "trainer or the publication reported it (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    source: Path = args.source
    path = source / RUNS_FILE if source.is_dir() else source
    if not path.is_file():
        hint = "run `sweep collect` first" if source.is_dir() else "pass a sweep directory or a runs.parquet"
        raise UserError(f"{path}: no such file; {hint}")
    from analysis.sweep_report import report_sweep

    report = report_sweep(path, args.out, args.metric, args.convention)
    out = report.out_dir
    winners = int(report.best["run_id"].notna().sum())
    print(f"{report.attempts} attempt(s), {winners}/{len(report.best)} cells with a best "
          f"configuration, {len(report.flags)} flag(s) → {out / 'index.html'}")
    for note in report.notes:
        print(f"  note: {note}")
    for flag in report.flags:
        if flag.kind in _PRINTED:
            where = flag.model + (f" × {flag.nodes} nodes" if flag.nodes is not None else "")
            print(f"  {flag.kind} ({where}): {flag.message[:160]}{'…' if len(flag.message) > 160 else ''}")
    return 0
