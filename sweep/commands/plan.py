"""`sweep plan SPEC [--out DIR] [--explain RUN_ID]`: enumerate, prune, write plan.parquet.

Writes DIR/plan.parquet (every candidate with its status) and DIR/spec.yaml (the spec as
planned, headed by its hash); DIR defaults to results/<spec name>/. Nothing is written when the
spec is invalid or no plan can be made. `--explain RUN_ID` prints the memory breakdown of one
kept configuration and writes nothing.

`--calibrate-from RUNS` (a runs.parquet of this sweep's own attempts) corrects the memory model
and calibrates the throughput model on them, re-plans, and records both in DIR/calibration.json
and DIR/throughput.json (`sweep.calibration.plan_calibration`). What is printed about the plan comes from
`sweep.plan.plan_summary`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from sweep.calibration import memory_self_calibration
from sweep.calibration.plan_calibration import calibrate_plan
from sweep.calibration.throughput_coefficients import COEFFICIENTS_FILE
from sweep.commands._output import output_console, titled_table
from sweep.core.errors import UserError
from sweep.core.state import atomic_write_text
from sweep.plan import space
from sweep.plan.plan_file import PLAN_FILE, write_plan
from sweep.plan.plan_summary import (
    TextTable,
    allocator_notes,
    axes_beyond_constraints,
    candidates_table,
    explain,
    framework_prunes,
    memory_verdicts,
    nothing_kept,
    summary_table,
    unmatched_overrides,
)
from sweep.plan.spec import load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the sweep spec (YAML)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the sweep directory (default: results/<spec name>/)")
    parser.add_argument("--explain", metavar="RUN_ID", default=None,
                        help="print the memory breakdown of this kept configuration; "
                             "writes nothing")
    parser.add_argument("--candidates", action="store_true",
                        help="also print every kept candidate with its predicted tokens/s/GPU "
                             "and MFU, best first per (model, nodes)")
    parser.add_argument("--coefficients", type=Path, default=None,
                        help="throughput-model coefficients from `sweep calibrate` (default: the "
                             f"sweep folder's {COEFFICIENTS_FILE} if there, else the fit to "
                             "nanotron's published H100 runs for a nanotron sweep on h100-sxm, "
                             "else the physical prior)")
    parser.add_argument("--calibrate-from", metavar="RUNS", type=Path, default=None,
                        help="runs.parquet of this sweep's own attempts: correct the memory "
                             "model with their measured peaks and outcomes, calibrate the "
                             "throughput model on their step times, re-plan, and record both "
                             f"in <out>/{memory_self_calibration.CALIBRATION_FILE}")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    try:
        frame = space.plan(spec)
    except space.PlanError as error:
        raise UserError(f"{args.spec}: {error}") from None
    console = output_console(160)  # a pipe or a log file: not squeezed into 80 columns
    if args.explain is not None:
        console.print(explain(spec, frame, args.explain), highlight=False)
        return 0
    out = args.out if args.out is not None else Path("results") / spec.name
    planned = calibrate_plan(spec, frame, out, coefficients=args.coefficients,
                             runs=args.calibrate_from)
    frame, calibration_lines = planned.frame, list(planned.lines)
    write_plan(out, spec, args.spec, frame)
    for name, text in planned.files.items():
        atomic_write_text(out / name, text)
        calibration_lines.append(f"  → {out / name}")
    for line in calibration_lines:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    console.print(_drawn(summary_table(frame)))
    if args.candidates:
        console.print(_drawn(candidates_table(frame)))
    for line in framework_prunes(spec, frame):
        console.print(line, highlight=False, soft_wrap=True)
    verdicts = memory_verdicts(frame, spec)
    if verdicts is not None:
        console.print(verdicts.describe(), highlight=False, soft_wrap=True)
        for line in allocator_notes(spec):
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    kept = int((frame["status"] == space.KEPT).sum())
    console.print(f"{len(frame)} candidates, {kept} kept → {out / PLAN_FILE}", highlight=False,
                  soft_wrap=True)
    for warning in axes_beyond_constraints(spec) + unmatched_overrides(spec, frame):
        console.print(f"[yellow]warning:[/] {warning}")
    if kept == 0:
        raise UserError(nothing_kept(args.spec, frame))
    return 0


def _drawn(table: TextTable) -> Table:
    """A plan summary as a rich table: names and labels left-aligned, numbers right-aligned."""
    drawn = titled_table(table.title)
    for name in table.columns:
        drawn.add_column(name, justify="left" if name in table.text_columns else "right",
                         no_wrap=True)
    for row in table.rows:
        drawn.add_row(*row)
    return drawn
