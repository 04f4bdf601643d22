"""The calibration a fresh plan gets before `sweep plan` writes it: the memory correction and the
throughput coefficients it predicts with, and the files that record them in the sweep folder.

With RUNS (`--calibrate-from`, a runs.parquet of this sweep's own attempts) the memory model is
corrected with the attempts' measured peaks and outcomes (`sweep.calibration.memory_self_calibration`), the plan is
re-planned, and the throughput model the plan predicts with (`--coefficients`, else the sweep
folder's throughput.json, else `sweep.plan.predictions.default_prior`) is calibrated on their step times
(`sweep.calibration.throughput_self_calibration`: scaled, or refitted where that cross-validates better);
what was used goes to calibration.json and throughput.json. Without RUNS, the memory correction
recorded in calibration.json is applied again, so a later `sweep plan` of the same spec keeps
the calibrated decisions, and calibrating again starts from the prior throughput.json records,
not from its own output.

Kept out of the command so that `sweep plan` is only its arguments, this call and printing; the
files are returned as text, for the command to write once the plan is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sweep.calibration import memory_self_calibration
from sweep.calibration.runs_table import completed_groups
from sweep.calibration.throughput_coefficients import (
    COEFFICIENTS_FILE,
    load_coefficients,
    load_prior,
    self_calibration_payload,
    sweep_coefficients,
)
from sweep.calibration.throughput_self_calibration import self_calibrate
from sweep.core.errors import UserError
from sweep.core.units import GiB
from sweep.models.throughput import Coefficients
from sweep.plan.predictions import describe_default_prior, with_predictions
from sweep.plan.spec import Spec


@dataclass(frozen=True)
class CalibratedPlan:
    """A plan calibrated and predicted, with what to write beside it and what to say."""

    frame: pd.DataFrame  # the plan, re-planned with any memory correction, with predictions
    files: dict[str, str]  # file name in the sweep folder → its text (calibration.json, ...)
    lines: list[str]  # what the calibration used, for the user


def calibrate_plan(spec: Spec, frame: pd.DataFrame, out: Path, coefficients: Path | None = None,
                   runs: Path | None = None) -> CalibratedPlan:
    """The plan of `spec` for the sweep folder OUT, calibrated with RUNS when given (else with
    OUT's recorded memory correction) and predicted with the throughput coefficients of the file
    `coefficients` (else OUT's throughput.json, else the default prior)."""
    coefficients_file = coefficients or out / COEFFICIENTS_FILE
    has_file = coefficients_file.is_file()
    # a file named with --coefficients must exist; the folder's own is optional
    throughput = (load_coefficients(coefficients) if coefficients
                  else sweep_coefficients(out, spec))
    files: dict[str, str] = {}  # written once the plan is
    if runs is not None:
        prior = load_prior(coefficients_file) if has_file else throughput
        frame, throughput, files, lines = calibrate_from(runs, spec, frame, prior)
    else:
        frame, lines = recorded_calibration(out, spec, frame)
        source = (f"coefficients from {coefficients_file}" if has_file
                  else describe_default_prior(spec))
        lines.append(f"throughput predictions: {source}")
    return CalibratedPlan(with_predictions(frame, spec, throughput), files, lines)


def calibrate_from(runs: Path, spec: Spec, frame: pd.DataFrame, prior: Coefficients
                   ) -> tuple[pd.DataFrame, Coefficients, dict[str, str], list[str]]:
    """Re-plan with the memory correction fitted on RUNS, and calibrate the throughput prior on
    their completed runs (`sweep.calibration.throughput_self_calibration`; the prior stays where none has a
    measured throughput). Returns the plan, the throughput coefficients to predict with, the
    files to write into the sweep folder (calibration.json, throughput.json) and the lines to
    print."""
    try:
        calibration = memory_self_calibration.calibrate(runs, spec)
    except memory_self_calibration.CalibrationError as error:
        raise UserError(str(error)) from None
    replanned = memory_self_calibration.replan(
        frame, spec, calibration.memory.factor, calibration.memory.overhead_delta_bytes,
        memory_self_calibration.completed_run_ids(calibration.residuals))
    changed = memory_self_calibration.changes(frame, replanned)
    lines = memory_self_calibration.describe(calibration, changed)
    record: dict[str, object] = {**calibration.to_dict(), "status_changes": changed}
    files: dict[str, str] = {}
    throughput = prior
    try:
        groups = completed_groups(runs, spec, on_left_out=print)
        result = self_calibrate([(group, work) for _, group, work in groups], prior)
    except ValueError as error:
        record["throughput"] = {"fitted": False, "reason": str(error)}
        lines.append(f"  throughput: not calibrated ({error}); predictions use the prior")
    else:
        payload = self_calibration_payload(result, runs, spec)
        record["throughput"] = {"fitted": True, "file": COEFFICIENTS_FILE, **payload}
        files[COEFFICIENTS_FILE] = json.dumps(payload, indent=2, sort_keys=True) + "\n"
        throughput = result.coefficients
        lines.append(f"  {result.describe()}")
    files[memory_self_calibration.CALIBRATION_FILE] = json.dumps(record, indent=2, sort_keys=True) + "\n"
    return replanned, throughput, files, lines


def recorded_calibration(out: Path, spec: Spec, frame: pd.DataFrame
                         ) -> tuple[pd.DataFrame, list[str]]:
    """The memory correction of out/calibration.json applied again (a plain `sweep plan` of a
    calibrated sweep keeps its decisions); ignored, with a warning, if made for another spec."""
    path = out / memory_self_calibration.CALIBRATION_FILE
    if not path.is_file():
        return frame, []
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        factor, made_for = float(record["memory"]["factor"]), str(record["spec_hash"])
        delta = float(record["memory"].get("overhead_delta_bytes") or 0.0)
        completed = memory_self_calibration.completed_run_ids(record.get("residuals") or [])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path}: not a calibration of `sweep plan --calibrate-from` ({error}); "
                        "remove it or write it again with --calibrate-from") from None
    if made_for != spec.spec_hash():
        return frame, [f"warning: {path} was made for another version of the spec "
                       f"(hash {made_for}); planned with the prior memory model. Run `sweep plan "
                       "--calibrate-from RUNS` again to recalibrate"]
    replanned = memory_self_calibration.replan(frame, spec, factor, delta, completed)
    changed = memory_self_calibration.changes(frame, replanned)
    raised = f", overhead + {delta / GiB:.2f} GiB" if delta else ""
    return replanned, [f"memory: reserved peak × {factor:.3f}{raised} from {path} (runs sha256 "
                       f"{str(record.get('source_sha256', ''))[:12]}…); "
                       f"{changed['pruned_to_kept']} pruned → kept, "
                       f"{changed['kept_to_pruned']} kept → pruned"]
