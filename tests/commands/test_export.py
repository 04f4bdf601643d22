"""`sweep export`: how it refuses what it cannot do. A tracker that does not answer is said on
stderr with the command that retries it, and the exit code is 1; input errors exit 2. (The
exports themselves, to real trackers: tests/export/test_sweep_export.py.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweep.cli import main
from sweep.collect.schema import to_table
from tests.export.mlflow_server import closed_port


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """A sweep folder with a one-attempt runs.parquet in the real schema, and no spec."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    pq.write_table(to_table([{"schema_version": 1, "sweep": "tiny", "run_id": "tiny-4l-n1-abc",
                              "attempt": 1, "outcome": "completed", "dp": 1, "tokens_per_sec": 10.0}]),
                   folder / "runs.parquet")
    return folder


def test_a_tracker_that_does_not_answer_exits_1_and_says_how_to_retry(
        sweep_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"http://127.0.0.1:{closed_port()}"
    assert main(["export", str(sweep_dir), "--to", f"mlflow:{uri}"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert f"sweep export: mlflow:{uri}: export failed: mlflow at {uri} does not answer" in said
    assert f"run `sweep export {sweep_dir} --to mlflow:{uri}` again once the tracker answers" in said


def test_without_to_a_sweep_whose_spec_has_no_export_section_is_refused(
        sweep_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(sweep_dir)]) == 2
    assert "its spec has no export: section; name the trackers with --to" in capsys.readouterr().err


def test_a_folder_without_runs_parquet_names_the_fix(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path), "--to", "wandb:team/bench"]) == 2
    assert f"{tmp_path / 'runs.parquet'}: no such file; run `sweep collect {tmp_path}` first" in \
        capsys.readouterr().err


def test_a_target_of_no_known_form_is_a_usage_error(sweep_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", str(sweep_dir), "--to", "neptune"])
    assert exited.value.code == 2
    assert "'neptune' is not a tracker: write mlflow[:URI] or wandb[:ENTITY/PROJECT]" in \
        capsys.readouterr().err
