"""throughput.json: the throughput model's coefficients as a file, and where they came from.

`sweep calibrate` writes one (a fit to a runs table), and so does `sweep plan --calibrate-from`
(a self-calibration of a prior on the sweep's own runs), by default into the sweep folder; the
planner, `sweep render`, `sweep replay --coefficients`, the search driver and the round-by-round
re-plan read it back. Its format (coefficients, rows, errors, provenance) and its reading, with
errors that name the file, live here so that none of those readers imports a command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sweep.core.errors import UserError
from sweep.core.state import file_sha256
from sweep.models.throughput import Coefficients
from sweep.plan.predictions import default_prior
from sweep.plan.spec import Spec

if TYPE_CHECKING:
    from sweep.calibration.throughput_fit import Fit
    from sweep.calibration.throughput_self_calibration import SelfCalibration

COEFFICIENTS_FILE: Final = "throughput.json"


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
    from sweep.calibration.throughput_fit import FIT_DESCRIPTION, INTER_SCALING_GRID, OVERLAP_POWER_GRID

    payload = _payload(result, source, spec, f"sweep calibrate {source} --spec <{spec.name}>",
                       "sweep.calibration.throughput_fit.fit")
    payload["provenance"].update({
        "left_out": "nanotron's pre-fix pipeline runs (after_pp_fix = False) and runs "
                    "on a node whose NVLink all-reduce measured under half the median",
        "objective": FIT_DESCRIPTION,
        "inter_scaling_grid": list(INTER_SCALING_GRID),
        "overlap_power_grid": list(OVERLAP_POWER_GRID),
        "held_out": held_out or {},
    })
    return payload


def self_calibration_payload(result: SelfCalibration, source: Path, spec: Spec) -> dict:
    """throughput.json as `sweep plan --calibrate-from` writes it: the calibrated coefficients,
    the prior they came from and how (`load_prior` reads the prior back, so calibrating again
    does not compound), and the runs file (path and sha256)."""
    return {**_payload(result, source, spec,
                       f"sweep plan <{spec.name}> --calibrate-from {source}",
                       "sweep.calibration.throughput_self_calibration.self_calibrate"),
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
