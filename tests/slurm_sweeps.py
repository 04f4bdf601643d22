"""Helpers for the live submission tests: a PATH that reaches the venv's python from inside
jobs, a synthetic sweep folder, waiting on a sweep's runs, and the jobs Slurm holds for a
sweep (by comment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep.backends.slurm.observation import Observation
from sweep.backends.slurm.tracker import Tracker

VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture
def job_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch exports the submitter's environment: jobs find `python3` (the venv) on PATH."""
    monkeypatch.setenv("PATH", os.pathsep.join([VENV_BIN, os.environ["PATH"]]))


def synthetic_sweep(root: Path, name: str, count: int, shapes: int, body: str = "true\n") -> list[str]:
    """A sweep folder of `count` runs whose job.sbatch asks for `shapes` different time limits
    (so as many arrays) and runs `body` (a bash script's lines)."""
    ids = []
    for i in range(count):
        run_id = f"r{i:04d}"
        run_dir = root / "runs" / run_id
        (run_dir / "attempts").mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "sweep": name,
                                                      "nodes": 1, "model": {"name": "m"}}))
        (run_dir / "job.sbatch").write_text(
            f"#!/bin/bash\n#SBATCH --job-name={name}.{run_id}\n#SBATCH --nodes=1\n"
            f"#SBATCH --time={1 + i % shapes}\n#SBATCH --no-requeue\n{body}")
        ids.append(run_id)
    return ids


def wait_until_settled(sweep_dir: Path, timeout_s: float, every_s: float = 2.0) -> Observation:
    """Poll as `sweep status --watch` does until no run is in flight."""
    tracker = Tracker(sweep_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        observation = tracker.observe()
        if not any(s.in_flight for s in observation.states):
            return observation
        if time.monotonic() > deadline:
            raise AssertionError(f"still in flight after {timeout_s} s: "
                                 f"{[(s.run_id, s.state) for s in observation.states]}")
        time.sleep(every_s)


def _sweep_queue(sweep: str, field: str, every_state: bool) -> list[tuple[str, str]]:
    """(squeue `field`, comment) of each array task whose comment names this sweep: every job
    slurmctld holds, or (not `every_state`) those pending, running or completing."""
    states = ["-t", "all"] if every_state else []
    out = subprocess.run(["squeue", "-h", "-r", *states, "-o", f"{field}|%k"],
                         capture_output=True, text=True, check=True).stdout
    return [(value, comment) for value, _, comment in (line.partition("|") for line in out.splitlines())
            if f"sweep={sweep};" in comment]


def sweep_tasks(sweep: str) -> list[tuple[str, str]]:
    """(task id, comment) of every job slurmctld holds whose comment names this sweep."""
    return _sweep_queue(sweep, "%i", every_state=True)


def sweep_task_states(sweep: str) -> set[str]:
    """The states (RUNNING, COMPLETING, ...) of the sweep's tasks still in the queue."""
    return {state for state, _ in _sweep_queue(sweep, "%T", every_state=False)}


def cancel_sweep(sweep: str) -> None:
    """Test clean-up: cancel whatever the sweep left (by comment, whatever the ledger says):
    its arrays, its search driver and its report job (comments sweep-driver=, sweep-report=)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True,
                         check=False).stdout
    helpers = [job for job, _, comment in (line.partition("|") for line in out.splitlines())
               if comment in (f"sweep-driver={sweep}", f"sweep-report={sweep}")]
    masters = sorted({job.split("_")[0] for job, _ in sweep_tasks(sweep)})
    if helpers or masters:
        subprocess.run(["scancel", *helpers, *masters], check=False)


def wait_until_gone(job_id: str, timeout_s: float) -> None:
    """Poll squeue until the job has left the queue (ended, however)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True,
                                text=True, check=False).stdout.strip()
        if not listed:
            return
        time.sleep(1.0)
    raise AssertionError(f"job {job_id} still in the queue after {timeout_s} s")
