"""The watchdog under the local Slurm cluster (scripts/local-slurm.sh start): the time limit."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.watchdog_runs import REPO, Run, kill_leftovers

JOB = """#!/bin/bash
#SBATCH --nodes=1 --time={minutes} --no-requeue {signal}
srun --nodes=1 --ntasks-per-node=1 {python} -m sweep.job.watchdog --run-dir {run_dir} \\
  --attempt-dir {attempt} --poll-s 0.2 --node-wait-s 0 -- {python} {launcher} &
SRUN_PID=$!
forward() {{ kill -s "$1" "$SRUN_PID" 2>/dev/null || true; }}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
while true; do
  wait "$SRUN_PID" && status=0 || status=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done
exit "$status"
"""


@dataclass(frozen=True)
class Job:
    run: Run
    job_id: str

    def wait(self, timeout: float) -> str:
        """Slurm's final state of the job, once the watchdog has written its verdict."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", self.job_id, "-o", "State"],
                                 capture_output=True, text=True, check=False).stdout.split()
            state = out[0] if out else ""
            if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"):
                # slurmctld records TIMEOUT when it decides, before the step's TERM reaches the
                # watchdog; the watchdog's status.json follows within Slurm's KillWait
                while (not (self.run.attempt / "status.json").exists()
                       and time.monotonic() < deadline + 30):
                    time.sleep(0.2)
                return state
            time.sleep(1)
        subprocess.run(["scancel", self.job_id], check=False)
        raise AssertionError(f"job {self.job_id} still {state or 'unknown'} after {timeout} s")


def sbatch(root: Path, signal_option: str, minutes: int) -> Job:
    root.mkdir(parents=True)
    run = Run(root)
    launcher = run.python("steps(100000, gap=0.5)")
    script = run.root / "job.sbatch"
    script.write_text(JOB.format(minutes=minutes, signal=signal_option, python=sys.executable,
                                 run_dir=run.run_dir, attempt=run.attempt, launcher=launcher[1]))
    command = ["sbatch", "--parsable", f"--chdir={REPO}", f"--output={run.root}/job.out",
               str(script)]
    job_id = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    return Job(run, job_id)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None) -> Iterator[dict[str, Job]]:
    """Both jobs at once (each takes one to two minutes of waiting for Slurm's clock)."""
    root = tmp_path_factory.mktemp("watchdog_slurm")
    # slurmctld checks time limits every 30 s and sends --signal when the warning time falls
    # before its next check, so up to 60 s early ("man sbatch"): with 1 minute and @30 the USR1
    # could come before the first step; with 2 minutes it comes 30 to 90 s in
    made = {"usr1": sbatch(root / "usr1", "--signal=B:USR1@30", minutes=2),
            "limit": sbatch(root / "limit", "", minutes=1)}
    yield made
    for job in made.values():
        subprocess.run(["scancel", job.job_id], capture_output=True, check=False)
        kill_leftovers(job.run)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_the_usr1_before_the_time_limit_is_a_timeout(jobs: dict[str, Job]) -> None:
    run = jobs["usr1"].run
    state = jobs["usr1"].wait(timeout=210)
    status = run.status
    assert (status["outcome"], status["signals"]) == ("timeout", ["USR1"]), status
    assert status["slurm_job_id"] and status["last_step"] >= 1
    # the job ended by itself, before the limit
    assert state == "COMPLETED" or state.startswith("FAILED")
    assert run.survivors() == []


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_a_time_limit_without_signal_is_a_timeout_from_the_job_end_time(
        jobs: dict[str, Job]) -> None:
    from sweep.job.classify import Evidence, classify

    run = jobs["limit"].run
    state = jobs["limit"].wait(timeout=200)
    assert state == "TIMEOUT"
    status = run.status  # the TERM came at the job's end time (squeue %e): Slurm's limit
    assert (status["outcome"], status["signals"]) == ("timeout", ["TERM"]), status
    assert run.events("launch")[0]["job_end"] is not None
    # and when a watchdog cannot tell (or wrote nothing), sacct decides
    verdict = classify(Evidence(exit_codes={"node0": -15}, signals=("TERM",), slurm_state=state,
                                slurm_exit_code="0:15"))
    assert verdict.outcome == "timeout"
    assert run.survivors() == []
