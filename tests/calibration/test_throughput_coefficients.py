"""The throughput coefficients files: what `sweep plan --calibrate-from` calibrates from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.calibration.throughput_coefficients import load_coefficients, load_prior
from sweep.core.errors import UserError
from sweep.models.throughput import Coefficients

FITTED = Coefficients(compute=2.2, layer_passes=3e-4)
PRIOR = Coefficients(compute=1.9)


def test_a_sweep_calibrate_fit_is_its_own_prior(tmp_path: Path) -> None:
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({"coefficients": FITTED.to_dict(), "provenance": {}}))
    assert load_prior(path) == load_coefficients(path) == FITTED


def test_calibrating_again_starts_from_the_recorded_prior_not_from_its_own_output(
        tmp_path: Path) -> None:
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({"coefficients": FITTED.to_dict(),
                                "self_calibration": {"method": "scaled",
                                                     "prior": PRIOR.to_dict()}}))
    assert load_coefficients(path) == FITTED  # what the plan predicts with
    assert load_prior(path) == PRIOR  # what a new first round calibrates


def test_a_file_that_is_not_a_coefficients_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "throughput.json"
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="not a `sweep calibrate` file"):
        load_prior(path)
