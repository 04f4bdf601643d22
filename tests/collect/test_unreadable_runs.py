"""A runs.parquet that cannot be read (cut short by a crash or a copy): every command that reads
it says so and names the fix, `sweep collect` rebuilding it; and collect does rebuild it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.collect.attempts import RUNS_FILE, read_runs, unreadable_runs
from sweep.core.errors import UserError

FIX = "--full` rebuilds it from the attempt folders (add --sacct for a Slurm sweep's accounting)"


def corrupt(folder: Path) -> Path:
    path = folder / RUNS_FILE
    path.write_bytes(b"PAR1 cut short")
    return path


def test_the_message_names_the_sweep_folder_to_collect_again(tmp_path: Path) -> None:
    path = corrupt(tmp_path)
    text = unreadable_runs(path, "bad magic")
    assert text.startswith(f"{path}: cannot read it as parquet (bad magic); ")
    assert f"`sweep collect {tmp_path} --full` rebuilds it" in text
    assert "`sweep collect SWEEP_DIR --full`" in unreadable_runs(tmp_path / "other.parquet", "x")


def test_readers_of_runs_parquet_name_the_fix(tmp_path: Path) -> None:
    from sweep.calibration.memory_self_calibration import CalibrationError, read_attempts
    from sweep.calibration.runs_table import read_runs_frame

    path = corrupt(tmp_path)
    with pytest.raises(UserError) as frame_error:
        read_runs_frame(path)
    with pytest.raises(CalibrationError) as calibration_error:
        read_attempts(path)
    for error in (frame_error.value, calibration_error.value):
        assert f"sweep collect {tmp_path}" in str(error) and FIX in str(error)


def test_collect_rebuilds_an_unreadable_runs_parquet(tmp_path: Path) -> None:
    """What the message promises: collect does not reuse the unreadable file, it recomputes."""
    assert read_runs(corrupt(tmp_path)) is None
