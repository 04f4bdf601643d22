"""`sweep calibrate RUNS --spec SPEC [--out FILE]`: fit the throughput model to completed runs.

RUNS is runs.parquet (written by `sweep collect` or `sweep import-playbook`) or a published CSV
(the playbook's runs table or nanotron's results table). The coefficients go to FILE, by default
results/<spec name>/throughput.json, beside the sweep's plan; `sweep replay --coefficients` and
the planner read them back. With more than one model, each model is also scored by a fit to the
others only (held out), so the printed error is not just the fit's own; both go into FILE with
the table's sha256 and how the fit was made (`provenance`). Given nanotron's results table, the
pipeline runs it flags as made before nanotron's 1F1B fix (`after_pp_fix = False`; 2-10x slower
than the same layouts after it) are left out and counted. The figures are in docs/validation.md
("The throughput model").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sweep.calibration import runs_table
from sweep.calibration.throughput_coefficients import COEFFICIENTS_FILE, coefficients_payload
from sweep.calibration.throughput_fit import error_summary, fit, relative_errors
from sweep.core.errors import UserError
from sweep.core.state import atomic_write_text
from sweep.plan.spec import load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, help="runs.parquet, or a published runs CSV")
    parser.add_argument("--spec", type=Path, required=True,
                        help="the sweep spec: models, GPU, sequence length")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the coefficients (default: results/<spec name>/"
                             f"{COEFFICIENTS_FILE})")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    groups = runs_table.completed_groups(args.runs, spec, on_left_out=print)
    try:
        result = fit([(frame, work) for _, frame, work in groups])
    except ValueError as error:
        raise UserError(f"{args.runs}: {error}") from None
    for name, value in result.coefficients.to_dict().items():
        print(f"{name:>18} = {value:.6g}")
    print(f"fitted on {result.rows} completed runs: median |error| of tokens/s/GPU "
          f"{result.median_abs_error:.1%}, 90th percentile {result.p90_abs_error:.1%}")
    held_out: dict[str, dict[str, float]] = {}
    for name, frame, work in groups if len(groups) > 1 else []:
        others = [(f, w) for n, f, w in groups if n != name]
        held = fit(others).coefficients
        held_out[name] = error_summary(relative_errors(frame, work, held))
        print(f"held out {name}: fitted on the other models, median |error| "
              f"{held_out[name]['median_abs_error']:.1%}, 90th percentile "
              f"{held_out[name]['p90_abs_error']:.1%} over {len(frame)} runs")
    out = args.out if args.out is not None else Path("results") / spec.name / COEFFICIENTS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = coefficients_payload(result, args.runs, spec, held_out)
    atomic_write_text(out, json.dumps(payload, indent=2, sort_keys=True) + "\n")
    print(f"→ {out}")
    return 0
