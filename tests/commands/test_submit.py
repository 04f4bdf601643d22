"""`sweep submit` against the real local cluster (scripts/local-slurm.sh start): a tiny builtin
sweep of two-node runs through job arrays, collected with sacct; a submitter SIGKILLed halfway
through a large held submission, then `sweep resume`; a crash between sbatch and the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweep.backends.slurm.client import Slurm
from sweep.backends.slurm.submission import job_comment, submissions
from sweep.backends.slurm.tracker import TASKS_FILE, Tracker
from sweep.cli import main
from sweep.core.state import read_jsonl
from sweep.search.driver import read_record
from tests.slurm_sweeps import (
    job_path,
    sweep_tasks,
    synthetic_sweep,
    wait_until_gone,
    wait_until_settled,
)
from tests.specs import tiny_cpu_spec

__all__ = ["job_path"]  # a fixture



@pytest.fixture
def spec(sweep_name: str, tmp_path: Path) -> Path:
    """The tiny CPU sweep of two-node runs, with and without a pipeline, named after the test
    (the sweep folder goes to tmp_path / "sweep")."""
    path = tiny_cpu_spec(tmp_path / "spec.yaml", sweep_name, nodes=[2],
                         axes={"pp": [1, 2]}, run={"steps": 4, "mem": "1500M"})
    return path


@pytest.mark.slurm
@pytest.mark.slow
def test_a_builtin_sweep_of_two_node_runs_completes_and_collects(
        slurm_cluster: None, job_path: None, spec: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "sbatch --parsable --array=0-1 " in dry and "--nodes=2" in dry and "--mem=1500M" in dry
    assert not (out / "ledger.jsonl").exists()  # a dry run submits nothing

    assert main(["submit", str(spec), "--out", str(out), "--max-running", "2"]) == 0
    report_job = str(read_record(out)["report_job"])
    assert f"report job {report_job} collects and reports after the arrays end" in \
        capsys.readouterr().out
    observation = wait_until_settled(out, timeout_s=240)
    assert [s.state for s in observation.states] == ["completed", "completed"], observation.states
    wait_until_gone(report_job, timeout_s=120)  # afterany: it starts once both tasks ended
    assert (out / "report" / "index.html").is_file()  # the results wait for the user
    assert len(pq.read_table(out / "runs.parquet")) == 2
    for state in observation.states:  # Slurm's own output landed in the run folder, linked
        attempt = out / "runs" / state.run_id / "attempts" / str(state.attempt)
        master, _, index = (state.task or "").partition("_")
        assert os.readlink(attempt / "job.out") == str(
            out / "runs" / state.run_id / "attempts" / f"slurm-{master}_{index}.out")
        assert len(json.loads((attempt / "status.json").read_text())["nodes"]) == 2

    assert main(["collect", str(out), "--sacct"]) == 0
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted(r["run_id"] for r in rows) == sorted(s.run_id for s in observation.states)
    assert {(r["outcome"], r["slurm_state"]) for r in rows} == {("completed", "COMPLETED")}
    assert all("_" in r["slurm_job_id"] for r in rows)  # array task ids, as sacct names them

    capsys.readouterr()
    assert main(["submit", str(out)]) == 0  # nothing is submitted twice
    assert "submitted 0 run(s)" in capsys.readouterr().out
    assert main(["resume", str(out)]) == 0  # completed runs are never resubmitted
    assert "resubmitted 0 run(s)" in capsys.readouterr().out
    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "completed" in shown and "bad nodes excluded from later submissions: none" in shown


def submitted_runs(root: Path, sweep: str) -> list[str]:
    """The run of every array task Slurm holds for this sweep (via the batch task lists)."""
    runs = []
    for task, comment in sweep_tasks(sweep):
        batch = comment.split("batch=")[1]
        master, _, index = task.partition("_")
        lines = (root / "batches" / batch / TASKS_FILE).read_text().splitlines()
        runs.append(lines[int(index)])
    return runs


@pytest.mark.slurm
def test_submit_killed_midway_then_resume_submits_every_run_exactly_once(
        slurm_cluster: None, sweep_name: str, tmp_path: Path) -> None:
    root = tmp_path / "big"
    ids = synthetic_sweep(root, sweep_name, count=600, shapes=60)  # 60 arrays of 10
    proc = subprocess.Popen([sys.executable, "-m", "sweep.cli", "submit", str(root), "--hold"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ledger = root / "ledger.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if ledger.exists() and ledger.read_bytes().count(b'"intent"') >= 20:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "submit finished before it could be killed"
    before = submissions(read_jsonl(ledger))
    assert 20 <= len(before) < 60  # killed halfway

    assert main(["resume", str(root), "--hold"]) == 0
    runs = submitted_runs(root, sweep_name)
    assert sorted(runs) == ids  # every run once: none lost, none twice
    after = submissions(read_jsonl(ledger))
    assert all(s.job_id or s.failed for s in after)  # every intent settled

    assert main(["resume", str(root), "--hold"]) == 0  # twice in a row: nothing more
    assert sorted(submitted_runs(root, sweep_name)) == ids
    assert main(["cancel", str(root)]) == 0
    time.sleep(0.5)
    states = {s.state for s in Tracker(root).observe().states}
    assert states == {"cancelled"}, states


@pytest.mark.slurm
def test_a_crash_between_sbatch_and_the_ledger_is_reconciled_from_the_job_comment(
        slurm_cluster: None, sweep_name: str, tmp_path: Path) -> None:
    """What a submitter killed right after sbatch leaves: the intent, a job, no job id."""
    root = tmp_path / "crash"
    synthetic_sweep(root, sweep_name, count=4, shapes=1)
    tracker = Tracker(root)
    [batch], _ = tracker.plan(["r0000", "r0001"], capacity=100, max_array_size=1001)
    tracker._write_batch_files(batch)
    options, script = tracker.sbatch_command(batch, max_running=None, hold=True, exclude=[])
    assert f"--comment={job_comment(sweep_name, batch.batch_id)}" in options
    from sweep.core.state import append_jsonl

    append_jsonl(root / "ledger.jsonl", {"event": "intent", "batch": batch.batch_id,
                                         "run_ids": list(batch.run_ids), "time": time.time()})
    job_id = Slurm().submit(script[0], options, script[1:])  # ... and the submitter dies here

    assert main(["resume", str(root), "--hold"]) == 0
    settled = submissions(read_jsonl(root / "ledger.jsonl"))
    assert settled[0].job_id == job_id  # found by its comment, not submitted again
    assert sorted(submitted_runs(root, sweep_name)) == ["r0000", "r0001", "r0002", "r0003"]
    assert main(["cancel", str(root)]) == 0


@pytest.mark.slurm
@pytest.mark.slow
def test_a_search_strategy_submits_round_by_round_and_records_every_runs_fate(
        slurm_cluster: None, job_path: None, spec: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    from sweep.core.state import SEARCH_PROGRESS_FILE
    from sweep.search.live_search import SEARCH_RUNS_FILE

    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--strategy", "pruned",
                 "--foreground", "--poll-s", "1"]) == 0
    assert "pruned: launched 2 of 2 run(s) in 1 round(s)" in capsys.readouterr().out
    fates = pd.read_csv(out / SEARCH_RUNS_FILE)
    assert list(fates["fate"]) == ["launched", "launched"]
    assert list(fates["status"]) == ["completed", "completed"]
    assert (out / SEARCH_PROGRESS_FILE).is_file()
    observation = Tracker(out).observe()
    assert [s.state for s in observation.states] == ["completed", "completed"]
    # Started again, the search finds every run decided and submits nothing.
    assert main(["submit", str(out), "--strategy", "pruned", "--foreground", "--poll-s", "1"]) == 0
    assert [s.attempt for s in Tracker(out).observe().states] == [1, 1]


def test_a_strategy_cannot_be_dry_or_held(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", str(tmp_path), "--strategy", "adaptive", "--hold"]) == 2
    assert "--strategy adaptive waits" in capsys.readouterr().err
