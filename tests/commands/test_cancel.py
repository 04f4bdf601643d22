"""`sweep cancel` against the real local cluster: what a cancelled sweep's status says while
Slurm is still tearing its jobs down."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sweep.cli import main
from sweep.tracker import Tracker
from tests.slurm_sweeps import sweep_task_states, sweep_tasks, synthetic_sweep

# A job that, like the watchdog, takes its time over SIGTERM: Slurm keeps it COMPLETING until
# KillWait (5 s on the local cluster) sends SIGKILL.
SLOW_TO_DIE = "trap 'sleep 30' TERM\nsleep 300 &\nwait\n"


@pytest.mark.slurm
def test_a_cancelled_task_is_cancelled_while_slurm_still_completes_it(
        slurm_cluster: None, sweep_name: str, tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    synthetic_sweep(root, sweep_name, count=2, shapes=1, body=SLOW_TO_DIE)
    assert main(["submit", str(root)]) == 0
    deadline = time.monotonic() + 60
    while sweep_task_states(sweep_name) != {"RUNNING"} and time.monotonic() < deadline:
        time.sleep(0.3)
    assert sweep_task_states(sweep_name) == {"RUNNING"}
    assert main(["cancel", str(root)]) == 0
    states = {s.state for s in Tracker(root).observe().states}
    assert sweep_task_states(sweep_name) == {"COMPLETING"}  # Slurm is still killing them ...
    assert states == {"cancelled"}  # ... but they have ended, and status says how
    assert len(sweep_tasks(sweep_name)) <= 2


@pytest.mark.slurm
def test_cancels_are_made_and_reported_where_accounting_cannot_answer(
        slurm_cluster: None, sweep_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster without accounting (AccountingStorageType=none), stood in for by a `sacct` on
    PATH that fails as that one does; squeue and scancel are the real ones."""
    root = tmp_path / "sweep"
    synthetic_sweep(root, sweep_name, count=2, shapes=1)
    assert main(["submit", str(root), "--hold", "--no-report"]) == 0
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text(
        "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    (fake / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    capsys.readouterr()
    assert main(["cancel", str(root)]) == 0
    printed = capsys.readouterr().out
    assert "cancelled 1 job array(s)" in printed
    assert "could not confirm the cancels in Slurm's accounting" in printed
    assert "accounting storage is disabled" in printed
    deadline = time.monotonic() + 30
    while sweep_task_states(sweep_name) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert sweep_task_states(sweep_name) == set()  # the arrays really were cancelled
