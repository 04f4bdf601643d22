"""`sweep report SWEEP_DIR|RUNS.parquet [--out DIR]`: heatmaps, best-config tables, index.html."""

from __future__ import annotations

import argparse
from pathlib import Path


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
    from analysis.sweep_report import report_summary, report_sweep, runs_file

    path = runs_file(args.source)
    report = report_sweep(path, args.out, args.metric, args.convention)
    for line in report_summary(report):
        print(line)
    return 0
