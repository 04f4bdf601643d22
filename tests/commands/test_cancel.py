"""`sweep cancel` against the real local cluster: what a cancelled sweep's status says while
Slurm is still tearing its jobs down."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sweep.backends.slurm.tracker import Tracker
from sweep.cli import main
from tests.slurm_sweeps import cancel_sweep, sweep_task_states, sweep_tasks, synthetic_sweep

# A job that, like the watchdog, takes its time over SIGTERM: Slurm keeps it COMPLETING until
# KillWait (5 s on the local cluster) sends SIGKILL.
SLOW_TO_DIE = "trap 'sleep 30' TERM\nsleep 300 &\nwait\n"


def _cancel_while_running(root: Path, name: str) -> tuple[set[str], set[str]]:
    """Submit two slow-to-die tasks, cancel them once they run, and read at once what Slurm's
    queue and the sweep's status say of them."""
    synthetic_sweep(root, name, count=2, shapes=1, body=SLOW_TO_DIE)
    assert main(["submit", str(root)]) == 0
    deadline = time.monotonic() + 60
    while sweep_task_states(name) != {"RUNNING"} and time.monotonic() < deadline:
        time.sleep(0.3)
    assert sweep_task_states(name) == {"RUNNING"}
    assert main(["cancel", str(root)]) == 0
    states = {s.state for s in Tracker(root).observe().states}
    queue = sweep_task_states(name)
    assert len(sweep_tasks(name)) <= 2
    return queue, states


@pytest.mark.slurm
def test_a_cancelled_task_is_cancelled_while_slurm_still_completes_it(
        slurm_cluster: None, sweep_name: str, tmp_path: Path) -> None:
    """Slurm keeps a cancelled task COMPLETING until KillWait (5 s here) ends it; status must
    already say it was cancelled. `sweep cancel` waits for the accounting to record the cancels,
    which on a loaded machine can outlast that window: then the scenario is tried again, with a
    new sweep, at most three times (status must say cancelled every time)."""
    for attempt in range(3):
        name = f"{sweep_name}-{attempt}"
        try:
            queue, states = _cancel_while_running(tmp_path / name, name)
        finally:
            cancel_sweep(name)
        assert states == {"cancelled"}  # they have ended, and status says how ...
        if queue:
            assert queue == {"COMPLETING"}  # ... while Slurm is still killing them
            return
    pytest.fail("in three sweeps, Slurm had ended every cancelled task before `sweep cancel` "
                "returned: the COMPLETING window was never seen")


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
