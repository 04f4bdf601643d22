"""`sweep calibrate RUNS --spec SPEC [--out FILE]`: fit the throughput model to completed runs.

RUNS is runs.parquet (written by `sweep collect` or `sweep import-playbook`) or a published CSV
(the playbook's runs table or nanotron's results table). The coefficients go to FILE, by default
results/<spec name>/throughput.json, beside the sweep's plan; `sweep replay --coefficients` and
the planner read them back. With more than one model, each model is also scored by a fit to the
others only (held out), so the printed error is not just the fit's own; both go into FILE with
the table's sha256 and how the fit was made (`provenance`). Given nanotron's results table, the
pipeline runs it flags as made before nanotron's 1F1B fix (`after_pp_fix = False`; 2-10x slower
than the same layouts after it) are left out and counted. The figures are in the README.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from sweep.calibrate import (
    Fit,
    default_prior,
    error_summary,
    fit,
    model_names_for,
    relative_errors,
    without_fit_exclusions,
    workloads_for,
)
from sweep.errors import UserError
from sweep.replay_tables import normalise_runs
from sweep.spec import Spec, load_spec
from sweep.state import atomic_write_text, file_sha256
from sweep.throughput import Coefficients, Workload
from sweep.throughput_self_calibration import SelfCalibration

COEFFICIENTS_FILE = "throughput.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, help="runs.parquet, or a published runs CSV")
    parser.add_argument("--spec", type=Path, required=True,
                        help="the sweep spec: models, GPU, sequence length")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the coefficients (default: results/<spec name>/"
                             f"{COEFFICIENTS_FILE})")


def read_runs_frame(path: Path) -> pd.DataFrame:
    """A runs table from parquet or CSV, or a UserError that names the file."""
    if not path.is_file():
        raise UserError(f"{path}: no such file; give runs.parquet or a runs CSV")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, comment=None)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read it as {path.suffix.lstrip('.') or 'CSV'}: "
                        f"{error}") from None


def completed_groups(path: Path, spec: Spec) -> list[tuple[str, pd.DataFrame, Workload]]:
    """(model name, completed runs, workload) per spec model that has runs in the table."""
    workloads = workloads_for(spec)
    table = read_runs_frame(path)
    table, left_out = without_fit_exclusions(table)  # the charts table flags neither
    for reason, count in left_out.items():
        print(f"left out {count} {reason}")
    try:
        rows = normalise_runs(table, str(path), workloads)
    except ValueError as error:
        raise UserError(str(error)) from None
    names = model_names_for(spec, sorted(set(rows.model.astype(str))))
    if not names:
        raise UserError(f"{path}: none of its models ({', '.join(sorted(set(rows.model)))}) is "
                        f"a model of {spec.name}; list them under `models:` in the spec")
    rows = rows.assign(model=rows.model.astype(str).map(names))
    rows = rows[rows.model.notna() & (rows.status == "completed")
                & (rows.tokens_per_s_per_gpu > 0)]
    return [(name, group, workloads[name]) for name, group in rows.groupby("model")]


def _payload(result: Fit | SelfCalibration, source: Path, spec: Spec, command: str,
             function: str) -> dict:
    """What every throughput.json holds: the coefficients, the rows they were fitted on and
    their in-sample error, the runs file (path and sha256) and the spec, and how it was made."""
    from sweep import __version__

    return {"coefficients": result.coefficients.to_dict(), "rows": result.rows,
            "median_abs_error": result.median_abs_error, "p90_abs_error": result.p90_abs_error,
            "source": str(source), "spec": spec.name, "spec_hash": spec.spec_hash(),
            "provenance": {"command": command, "function": function,
                           "source_sha256": file_sha256(source),
                           "llm_sweep_version": __version__}}


def coefficients_payload(result: Fit, source: Path, spec: Spec,
                         held_out: dict[str, dict[str, float]] | None = None) -> dict:
    """The coefficients and where they came from: the table (path and sha256), the rows fitted,
    how (loss, grid, iterations), the in-sample error and each model's held-out error, so a file
    found later says what it is worth and how to make it again."""
    from sweep.calibrate import INTER_SCALING_GRID

    payload = _payload(result, source, spec, f"sweep calibrate {source} --spec <{spec.name}>",
                       "sweep.calibrate.fit")
    payload["provenance"].update({
        "left_out": "nanotron's pre-fix pipeline runs (after_pp_fix = False) and runs "
                    "on a node whose NVLink all-reduce measured under half the median",
        "objective": "mean pseudo-Huber loss (delta 0.05) of log(predicted / measured) "
                     "step time, ridge 1e-4 towards the physical prior; inter_scaling "
                     "from a grid by the median error",
        "inter_scaling_grid": list(INTER_SCALING_GRID),
        "held_out": held_out or {},
    })
    return payload


def self_calibration_payload(result: SelfCalibration, source: Path, spec: Spec) -> dict:
    """throughput.json as `sweep plan --calibrate-from` writes it: the calibrated coefficients,
    the prior they came from and how (`load_prior` reads the prior back, so calibrating again
    does not compound), and the runs file (path and sha256)."""
    return {**_payload(result, source, spec,
                       f"sweep plan <{spec.name}> --calibrate-from {source}",
                       "sweep.throughput_self_calibration.self_calibrate"),
            "self_calibration": result.to_dict()}


def _coefficients_file(path: Path) -> dict:
    """A throughput.json's content, or a UserError that names the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"{path}: cannot read the coefficients: {error.strerror}") from None
    except ValueError as error:
        raise _not_a_coefficients_file(path, error) from None
    if not isinstance(data, dict):
        raise _not_a_coefficients_file(path, TypeError(f"a {type(data).__name__}, not an object"))
    return data


def _not_a_coefficients_file(path: Path, error: Exception) -> UserError:
    return UserError(f"{path}: not a `sweep calibrate` file ({error}); run `sweep calibrate` "
                     "to write one")


def _as_coefficients(values: object, key: str, path: Path) -> Coefficients:
    if not isinstance(values, dict):
        raise _not_a_coefficients_file(path, KeyError(key))
    try:
        return Coefficients.from_dict(values)
    except (ValueError, TypeError) as error:
        raise _not_a_coefficients_file(path, error) from None


def load_coefficients(path: Path) -> Coefficients:
    """Coefficients written by `sweep calibrate` (or by `sweep plan --calibrate-from`)."""
    return _as_coefficients(_coefficients_file(path).get("coefficients"), "coefficients", path)


def sweep_coefficients(folder: Path, spec: Spec) -> Coefficients:
    """The coefficients a plan of the sweep in `folder` predicts with unless `--coefficients`
    says otherwise: the folder's calibration (`throughput.json`), else the default prior."""
    path = folder / COEFFICIENTS_FILE
    return load_coefficients(path) if path.is_file() else default_prior(spec)


def load_prior(path: Path) -> Coefficients:
    """The prior to calibrate from a coefficients file: the prior a self-calibration recorded
    in it, else its coefficients (a `sweep calibrate` fit)."""
    data = _coefficients_file(path)
    recorded = data.get("self_calibration")
    if isinstance(recorded, dict) and "prior" in recorded:
        return _as_coefficients(recorded["prior"], "self_calibration.prior", path)
    return _as_coefficients(data.get("coefficients"), "coefficients", path)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    groups = completed_groups(args.runs, spec)
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
