"""`sweep compare BASELINE CURRENT [--out DIR]`: a performance-regression gate between two sweeps.

BASELINE is a runs.parquet, a sweep folder holding one, or a references file (YAML or CSV);
CURRENT is a runs.parquet or a sweep folder. Writes compare.csv, compare_cells.csv, compare.md
and compare.png into DIR (default: compare/ beside CURRENT's runs.parquet), prints the cells and
the regressions, and exits 1 when any configuration or cell is slower or newly failing, 0
otherwise (2 on a user error), so a script can gate a cluster upgrade on it.

`sweep compare --write-references FILE RUNS` turns a good sweep into a references file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.compare import (
    DEFAULT_ALPHA,
    NORMALIZE,
    REGRESSIONS,
    SLOWER,
    STEP_TIME,
    compare,
    expected_from_runs,
    missing_columns,
)
from sweep.core.errors import UserError

if TYPE_CHECKING:
    from analysis.compare import Comparison

MAX_PRINTED = 20  # regressions printed one by one; compare.md and compare.csv have them all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("sweep compare BASELINE CURRENT [--out DIR] [--tolerance T] [--alpha A]\n"
                    "                     [--normalize auto|none|median]\n"
                    "       sweep compare --write-references FILE RUNS [--tolerance T]")
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="BASELINE: a sweep folder, a runs.parquet or a references file "
                             "(.yaml, .csv); CURRENT: a sweep folder or a runs.parquet. With "
                             "--write-references: one sweep folder or runs.parquet")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: compare/ beside CURRENT's runs.parquet)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="relative tolerance either side of a runs.parquet baseline, e.g. "
                             "0.05 for 5 percent (default: 0.05 on GPUs, 4.0 on CPU; a "
                             "references file carries its own)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="significance level of the one-sided Welch t-test on the step "
                             "times (default 0.05)")
    parser.add_argument("--normalize", choices=NORMALIZE, default="auto",
                        help="median: judge each configuration relative to the sweep's median "
                             "step-time change (the host's speed); none: as measured; auto "
                             "(default): median on CPU, none on GPUs")
    parser.add_argument("--write-references", type=Path, default=None, metavar="FILE",
                        help="write the completed configurations of one sweep as a references "
                             "file (.yaml or .csv) and exit")


def run(args: argparse.Namespace) -> int:
    alpha = DEFAULT_ALPHA if args.alpha is None else args.alpha
    if not 0 < alpha < 1:
        raise UserError(f"--alpha {alpha}: a significance level is between 0 and 1, e.g. 0.05")
    if args.tolerance is not None and args.tolerance < 0:
        raise UserError(f"--tolerance {args.tolerance}: a relative tolerance is ≥ 0, e.g. 0.05")
    if args.write_references is not None:
        if len(args.paths) != 1:
            raise UserError("sweep compare --write-references FILE RUNS takes one sweep folder "
                            f"or runs.parquet, not {len(args.paths)}")
        return _write_references(args.write_references, args.paths[0], args.tolerance)
    if len(args.paths) != 2:
        raise UserError(f"sweep compare takes BASELINE and CURRENT, not {len(args.paths)} path(s); "
                        "or --write-references FILE RUNS")
    return _compare(args.paths[0], args.paths[1], args.out, args.tolerance, alpha, args.normalize)


def _compare(baseline: Path, current: Path, out: Path | None, tolerance: float | None,
             alpha: float, normalize: str) -> int:
    from analysis.compare_output import write_comparison  # matplotlib: only where it draws
    from analysis.references import is_references_file, read_references

    if is_references_file(baseline):
        expected = read_references(baseline)
    else:
        expected = expected_from_runs(_read_runs(_runs_path(baseline)), tolerance)
    current_path = _runs_path(current)
    comparison = compare(expected, _read_runs(current_path), alpha,
                         baseline_name=str(baseline), current_name=str(current),
                         normalize=normalize)
    written = write_comparison(comparison, out or current_path.parent / "compare")
    _print(comparison, written.markdown)
    return 1 if comparison.regressions else 0


def _write_references(path: Path, source: Path, tolerance: float | None) -> int:
    from analysis.references import write_references

    runs_path = _runs_path(source)
    count = write_references(_read_runs(runs_path), path, tolerance, source=str(runs_path))
    print(f"{count} reference(s) from {runs_path} → {path}")
    return 0


def _runs_path(source: Path) -> Path:
    """A sweep folder's runs.parquet, or the file given (as `sweep report` finds it; not
    imported from analysis.sweep_report, which would import the whole report)."""
    from sweep.collect.attempts import RUNS_FILE

    path = source / RUNS_FILE if source.is_dir() else source
    if not path.is_file():
        hint = "run `sweep collect` first" if source.is_dir() else "pass a sweep folder or a runs.parquet"
        raise UserError(f"{path}: no such file; {hint}")
    return path


def _read_runs(path: Path) -> pd.DataFrame:
    try:
        runs = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a readable Parquet file ({error})") from None
    absent = missing_columns(runs)
    if absent:
        raise UserError(f"{path}: no column {absent[0]!r}: not a runs table of this llm-sweep; "
                        "run `sweep collect` on its sweep folder to rewrite it")
    return runs


def _print(comparison: Comparison, markdown: Path) -> None:
    from analysis.compare_output import cells_frame, method_lines, runs_frame, summary_line
    from sweep.commands._output import output_console, titled_table

    console = output_console()
    cells = cells_frame(comparison)
    table = titled_table("cells: each cell's best configuration, baseline → current")
    for column in ("status", "model", "nodes", "baseline", "current", "change", "p"):
        table.add_column(column, justify="right" if column in ("nodes", "baseline", "current",
                                                               "change", "p") else "left")
    for row in cells.itertuples(index=False):
        table.add_row(row.status, str(row.model), _text(row.nodes), _text(row.baseline),
                      _text(row.current), _pct(row.change_pct), _text(row.p_value))
    console.print(table)
    runs = runs_frame(comparison)
    bad = runs[runs["status"].isin(REGRESSIONS)]
    for row in bad.head(MAX_PRINTED).itertuples(index=False):
        console.print(f"  {row.status:<14} {row.model} × {row.nodes} node(s)  "
                      f"{_text(row.layout_label)}  {_change(row)}", highlight=False, markup=False)
    if len(bad) > MAX_PRINTED:
        console.print(f"  … {len(bad) - MAX_PRINTED} more in {markdown}", highlight=False)
    for line in method_lines(comparison)[2:4]:
        console.print(f"  {line}", highlight=False, markup=False)
    console.print(f"{summary_line(comparison)} → {markdown}", highlight=False, markup=False)


def _change(row: Any) -> str:
    """What changed, in words: the values, the change and the p-value, or the outcomes."""
    if row.status != SLOWER:
        return f"{_text(row.baseline_outcome)} → {_text(row.current_outcome)}"
    unit = " s" if row.metric == STEP_TIME else f" {row.metric}"
    p_value = f", p = {_text(row.p_value)}" if pd.notna(row.p_value) else ", tolerance only"
    return f"{_text(row.baseline)} → {_text(row.current)}{unit} ({_pct(row.change_pct)}{p_value})"


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _pct(value: object) -> str:
    return "" if not isinstance(value, float) or pd.isna(value) else f"{value:+.1f} %"
