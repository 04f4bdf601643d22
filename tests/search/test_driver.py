"""Detached searches (`sweep submit --detach`): the one-driver guard as pure rules, and on the
real local cluster (scripts/local-slurm.sh start): a search whose submitter exits at once and
whose report is there at the end; a driver scancelled mid-round and replaced by `sweep resume`;
a driver requeued at its time limit; and a GPU-hour cap under which the search goes on.

Every sweep is the builtin tiny-4l on `gpu: cpu`, one rank per run, 3 steps: pruned over two
layouts (recompute none/full) × mbs 1, 2, i.e. two rounds of two runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest

from sweep.backends.slurm.submission import submissions
from sweep.backends.slurm.tracker import LEFT_OUT_FILE, Tracker
from sweep.cli import main
from sweep.commands.status import render_driver
from sweep.core.state import read_jsonl
from sweep.search.driver import (
    PROGRESS_FILE,
    DriverView,
    SearchDriver,
    collect_and_report,
    driver_state,
    is_the_sweeps_driver,
    may_start_driver,
    read_progress,
    read_record,
)
from sweep.search.live_search import SEARCH_RUNS_FILE
from tests.slurm_sweeps import job_path
from tests.specs import tiny_cpu_spec

__all__ = ["job_path"]  # a fixture


def write_spec(tmp_path: Path, name: str, limit: str = "00:10:00", signal: int = 60,
               **changes: Any) -> Path:
    """The tiny CPU sweep over two micro-batch sizes and two recomputation modes (4 runs), with
    a driver of `limit` that is signalled `signal` seconds before it."""
    return tiny_cpu_spec(tmp_path / "spec.yaml", name,
                         axes={"mbs": [1, 2], "recompute": ["none", "full"]},
                         driver={"time_limit": limit, "mem": "400M", "signal_before_s": signal},
                         **changes)

RUNS = 4
RUN_UPPER_GPU_HOURS = 180 / 3600  # one GPU × the 3-minute time limit


# -- the guard, pure ------------------------------------------------------------------------

@pytest.mark.parametrize(("queue", "acct", "state"), [
    ("RUNNING", None, "live"), ("PENDING", None, "live"), ("REQUEUED", None, "live"),
    ("COMPLETING", None, "live"),
    (None, "RUNNING", "live"),  # squeue missed it, sacct says it still runs: still live
    (None, "COMPLETED", "completed"), (None, "CANCELLED by 0", "dead"), (None, "FAILED", "dead"),
    (None, "TIMEOUT", "dead"), (None, "NODE_FAIL", "dead"), (None, "PREEMPTED", "dead"),
    (None, None, "lost"),
])
def test_the_driver_state_comes_from_squeue_then_sacct(queue: str | None, acct: str | None,
                                                        state: str) -> None:
    assert driver_state("77", queue, acct) == state


def test_a_new_driver_may_start_only_when_the_recorded_one_is_not_live() -> None:
    assert driver_state(None, None, None) == "none"
    assert may_start_driver("none") and may_start_driver("dead") and may_start_driver("lost")
    assert may_start_driver("completed")
    assert not may_start_driver("live")


def test_a_starting_driver_acts_only_when_driver_json_names_it() -> None:
    assert is_the_sweeps_driver("77", "77")
    assert not is_the_sweeps_driver("78", "77")  # an old driver, requeued after a new one began
    assert not is_the_sweeps_driver(None, "77") and not is_the_sweeps_driver("77", None)


def test_a_detached_dry_run_submits_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    spec = write_spec(tmp_path, "dry")
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--strategy", "pruned",
                 "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert f"worst case {RUNS * RUN_UPPER_GPU_HOURS:.2f}" in shown
    assert "would submit the pruned search driver" in shown
    assert not read_record(out) and not (out / "ledger.jsonl").exists()


def test_the_end_of_a_detached_sweep_collects_and_reports_as_the_two_commands_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """collect_and_report calls what `sweep collect DIR --sacct` and `sweep report DIR` call:
    the same files, the same lines, the same exit code (two copies of one sweep folder)."""
    import shutil

    from tests.collect.test_attempts import completed_status, make_config, write_attempt, write_run

    by_commands, by_driver = tmp_path / "commands", tmp_path / "driver"
    run_dir = write_run(by_commands, make_config())
    write_attempt(run_dir, 1, times=[0.5] * 5,  # no job id: --sacct has no job to ask about
                  status={**completed_status(run_dir.name), "slurm_job_id": None})
    shutil.copytree(by_commands, by_driver)
    assert main(["collect", str(by_commands), "--sacct"]) == 0
    assert main(["report", str(by_commands)]) == 0
    printed = capsys.readouterr()
    assert collect_and_report(by_driver) == 0
    assert capsys.readouterr() == (printed.out.replace(str(by_commands), str(by_driver)), printed.err)
    for folder in (by_commands, by_driver):
        assert (folder / "runs.parquet").is_file() and (folder / "report" / "index.html").is_file()
    assert sorted(p.name for p in (by_driver / "report").iterdir()) == \
        sorted(p.name for p in (by_commands / "report").iterdir())


def test_a_report_that_fails_ends_the_search_all_the_same_and_status_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    SearchDriver._report(tmp_path)  # not a sweep folder: collect refuses it
    progress = read_progress(tmp_path)
    assert "exit code 2" in progress["report_error"] and "sweep report" in progress["report_error"]
    view = DriverView(folder=tmp_path, job_id="7", state="completed", slurm_state="COMPLETED",
                      progress={**progress, "phase": "done"}, log_tail=[])
    assert "the search ended, but its report failed: exit code 2" in render_driver(view, 0.0)


def test_a_worst_case_above_the_threshold_needs_yes_without_a_terminal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal: a script, a cron job
    # 4 runs × 1 GPU × 13 days: 1,248 GPU-hours at worst
    spec = write_spec(tmp_path, "big", run={"time_limit": "13-00:00:00"})
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--strategy", "pruned"]) == 2
    err = capsys.readouterr().err
    assert "up to 1,248 GPU-hours" in err and "pass --yes" in err
    assert not read_record(out)  # nothing submitted, not even the preflight
    assert main(["submit", str(out), "--strategy", "pruned", "--max-gpu-hours", "900",
                 "--dry-run"]) == 0
    assert "capped at 900" in capsys.readouterr().out


# -- on the cluster -------------------------------------------------------------------------

def submit_detached(spec: Path, out: Path, *extra: str, strategy: str = "pruned") -> float:
    """`sweep submit --detach` as a user's shell runs it, in its own session (a login shell
    that then logs out); returns its wall time. Nothing of it may outlive it."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "sweep.cli", "submit", str(spec), "--out",
                             str(out), "--strategy", strategy, "--detach", "--poll-s", "1",
                             "--no-preflight", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stdout, stderr = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, stderr
    assert "search driver: job" in stdout and "sweep status" in stdout
    with pytest.raises(ProcessLookupError):  # no process of its session is left
        os.killpg(proc.pid, 0)
    return elapsed


def driver_job(out: Path) -> str:
    return str(read_record(out)["job_id"])


def squeue_state(job: str) -> tuple[str, str] | None:
    """(state, reason) of a job slurmctld holds as pending or running; None once it left."""
    line = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%r"], capture_output=True,
                          text=True, check=False).stdout.strip()
    if not line:
        return None
    state, _, reason = line.partition("|")
    return (state, reason) if state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING",
                                        "REQUEUED") else None


def wait_for_driver(out: Path, timeout_s: float, *, release_requeued: bool = False) -> dict:
    """Poll until the driver left the queue; returns driver_progress.json. With
    `release_requeued`, a requeued driver that Slurm holds back (it makes a requeued job
    eligible only after AuthInfo's cred_expire, 120 s) is made eligible at once, as a busy
    cluster's backfill would start it when it may."""
    deadline = time.monotonic() + timeout_s
    job = driver_job(out)
    while time.monotonic() < deadline:
        state = squeue_state(job)
        if state is None:
            return json.loads((out / PROGRESS_FILE).read_text())
        if release_requeued and state == ("PENDING", "BeginTime"):
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
        time.sleep(1.0)
    raise AssertionError(f"driver {job} still in the queue after {timeout_s} s: "
                         f"{(out / PROGRESS_FILE).read_text()}")


def assert_every_run_once(out: Path, expected_runs: int) -> None:
    """No run duplicated or lost: once in the ledger, one array task in sacct, one attempt in
    runs.parquet, and launched in search_runs.csv."""
    subs = submissions(read_jsonl(out / "ledger.jsonl"))
    ledger = Counter(run for s in subs if s.job_id for run in s.run_ids)
    assert len(ledger) == expected_runs and set(ledger.values()) == {1}, ledger
    masters = sorted({s.job_id for s in subs if s.job_id})
    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(masters)],
                          capture_output=True, text=True, check=True).stdout.split()
    assert len(acct) == expected_runs and all(row.endswith("|COMPLETED") for row in acct), acct
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted(r["run_id"] for r in rows) == sorted(ledger)
    assert {(r["attempt"], r["outcome"]) for r in rows} == {(1, "completed")}
    fates = (out / SEARCH_RUNS_FILE).read_text().splitlines()[1:]
    assert len(fates) == expected_runs and all(",launched," in f for f in fates)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_detached_search_outlives_its_submitter_and_ends_with_a_report(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    elapsed = submit_detached(write_spec(tmp_path, sweep_name), out)
    assert elapsed < 15, f"the submitter took {elapsed:.1f} s"

    progress = wait_for_driver(out, timeout_s=150)
    assert progress["phase"] == "done" and progress["round"] == 2, progress
    assert (out / "report" / "index.html").is_file()
    assert_every_run_once(out, RUNS)
    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"search driver: job {driver_job(out)}, completed" in shown
    assert "round 2 (cells: 0 open, 1 closed), runs launched 4, skipped 0" in shown


def driver_process(job: str) -> psutil.Process:
    """The driver's Python process (submitit's `_submit` under srun), found by its job id: the
    local cluster's nodes all run on this machine."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "submitit.core._submit" in " ".join(process.info["cmdline"] or ()) \
                    and process.environ().get("SLURM_JOB_ID") == job:
                return process
        except psutil.Error:
            continue
    raise AssertionError(f"no process of driver job {job} on this machine")


def kill_driver(job: str, how: str) -> None:
    """Kill the driver as a user (scancel) or a failing node (SIGKILL of its process) would."""
    if how == "scancel":
        subprocess.run(["scancel", job], check=True)
    else:
        driver_process(job).kill()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_detached_adaptive_search_runs_the_same_loop_and_reports(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path) -> None:
    """adaptive through the same driver. On this one tiny cell it closes after its first round
    (4 candidates, up to 4 a round); the multi-round path is the pruned tests' above."""
    out = tmp_path / "sweep"
    submit_detached(write_spec(tmp_path, sweep_name), out, strategy="adaptive")
    progress = wait_for_driver(out, timeout_s=150)
    assert progress["phase"] == "done", progress
    assert (out / "report" / "index.html").is_file()
    assert_every_run_once(out, progress["launched"])
    assert "adaptive: launched" in progress["summary"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_detached_shortlist_search_runs_its_length_and_skips_the_rest(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path) -> None:
    """`--top 1` reaches the driver through driver.json: the cell's fastest predicted run is
    submitted, once, and every other candidate is recorded as skipped by the shortlist."""
    out = tmp_path / "sweep"
    submit_detached(write_spec(tmp_path, sweep_name), out, "--top", "1", strategy="shortlist")
    assert read_record(out)["options"]["top"] == 1
    progress = wait_for_driver(out, timeout_s=150)
    assert progress["phase"] == "done", progress
    assert "shortlist: launched 1 of" in progress["summary"]
    ledger = [run for s in submissions(read_jsonl(out / "ledger.jsonl")) for run in s.run_ids]
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert [r["run_id"] for r in rows] == ledger and rows[0]["outcome"] == "completed"
    fates = (out / SEARCH_RUNS_FILE).read_text().splitlines()[1:]
    assert sum(",launched," in f for f in fates) == 1
    assert all("shortlist: 1 runs predicted faster" in f for f in fates if ",skipped," in f)
    assert len(fates) > 1


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("how", ["scancel", "sigkill"])
def test_a_driver_killed_mid_round_is_replaced_by_resume_and_no_run_is_lost_or_doubled(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], how: str) -> None:
    out = tmp_path / "sweep"
    submit_detached(write_spec(tmp_path, sweep_name), out)
    first = driver_job(out)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # round 1 submitted and still running
        states = [s.state for s in Tracker(out).observe().states]
        if any(s in ("pending", "running") for s in states):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("round 1 never started")
    kill_driver(first, how)
    while squeue_state(first) is not None:
        time.sleep(0.5)

    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"search driver: job {first}, dead" in shown and "`sweep resume" in shown
    # the round the driver was in when it died (round 1, or a later one if round 1's runs were
    # quick enough to finish before the kill): still open, as it left it
    reached = json.loads((out / PROGRESS_FILE).read_text())["round"]
    assert reached >= 1 and f"round {reached} (cells: 1 open, 0 closed)" in shown, shown
    assert main(["resume", str(out)]) == 0
    assert f"takes over from job {first}" in capsys.readouterr().out
    second = driver_job(out)
    assert second != first
    assert main(["resume", str(out)]) == 2  # never two drivers on one sweep
    assert "still live" in capsys.readouterr().err

    progress = wait_for_driver(out, timeout_s=150)
    assert progress["phase"] == "done", progress
    assert_every_run_once(out, RUNS)
    assert (out / "report" / "index.html").is_file()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_driver_at_its_time_limit_requeues_itself_and_goes_on(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path) -> None:
    # A 1-minute limit: Slurm sends the USR2 of `signal_before_s` up to 60 s early, at its next
    # periodic check, so each stint is cut short and requeued by submitit. Polling each round
    # every 35 s makes the search outlast one stint whenever that check comes.
    out = tmp_path / "sweep"
    submit_detached(write_spec(tmp_path, sweep_name, limit="1", signal=10), out, "--poll-s", "35")
    job = driver_job(out)
    progress = wait_for_driver(out, timeout_s=240, release_requeued=True)
    assert progress["phase"] == "done", progress
    assert progress["stints"] >= 2, progress  # started again after a requeue, same job id
    log = (out / "driver" / f"{job}_0_log.out").read_text()
    assert "requeueing" in log
    restarts = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                              check=False).stdout
    assert "Restarts=0" not in restarts
    assert_every_run_once(out, RUNS)


@pytest.mark.slurm
@pytest.mark.slow
def test_under_a_gpu_hour_cap_an_adaptive_search_goes_on_within_it(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The cap bites at once: the round asks for 4 runs and one fits (spent + in flight at its
    time limit + the next at its limit ≤ cap). The search does not stop there: once what fitted
    has ended, and counts at what it spent, the next run fits, and so on until the round has
    run; never two runs at once, never over the cap."""
    out = tmp_path / "sweep"
    cap = 1.5 * 600 / 3600  # 1.5 runs at their 10-minute limit; a run takes well under 100 s
    submit_detached(write_spec(tmp_path, sweep_name, run={"time_limit": "00:10:00"}), out,
                    "--max-gpu-hours", f"{cap:.4f}", strategy="adaptive")
    assert read_record(out)["options"]["max_gpu_hours"] == pytest.approx(cap, abs=1e-4)
    progress = wait_for_driver(out, timeout_s=300)
    assert progress["phase"] == "done" and progress["left_out"] == 0, progress
    assert not (out / LEFT_OUT_FILE).exists()  # what an earlier wave left out has run since
    subs = [s for s in submissions(read_jsonl(out / "ledger.jsonl")) if s.job_id]
    assert len(subs) == progress["launched"] == RUNS and {len(s.run_ids) for s in subs} == {1}
    assert_every_run_once(out, RUNS)
    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "Start,End", "-j",
                           ",".join(s.job_id for s in subs)], capture_output=True, text=True,
                          check=True).stdout.split()
    spans = sorted(tuple(row.split("|")) for row in acct)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), spans
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert sum(r["elapsed_s"] for r in rows) / 3600 <= cap
    assert (out / "report" / "index.html").is_file()

    assert main(["resume", str(out), "--no-preflight"]) == 0  # the cap it was submitted with
    assert "capped at" not in capsys.readouterr().out  # nothing left to run, nothing estimated
    assert len([s for s in submissions(read_jsonl(out / "ledger.jsonl")) if s.job_id]) == RUNS


def test_resume_has_the_budget_rule_of_submit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One estimate, one confirmation, one `--yes`: resume of a sweep whose runs were never
    submitted (a submit stopped midway) refuses a worst case above the threshold without a
    terminal, as submit does, and says the same."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal
    spec = write_spec(tmp_path, "big", run={"time_limit": "13-00:00:00"})
    out = tmp_path / "sweep"
    assert main(["render", str(spec), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["resume", str(out), "--no-preflight", "--no-calibrate"]) == 2
    printed = capsys.readouterr()
    assert "worst case 1,248.00 (every run at its time limit)" in printed.out
    assert "up to 1,248 GPU-hours" in printed.err and "pass --yes to resume anyway" in printed.err
    assert main(["resume", str(out), "--dry-run", "--max-gpu-hours", "900"]) == 0
    assert "capped at 900" in capsys.readouterr().out
    assert not (out / "ledger.jsonl").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_cancel_stops_the_driver_before_its_runs(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    submit_detached(write_spec(tmp_path, sweep_name), out)
    job = driver_job(out)
    deadline = time.monotonic() + 90
    while not (out / "ledger.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.5)  # round 1 submitted
    assert main(["cancel", str(out)]) == 0
    assert f"stopped the sweep's driver/report job(s): {job}" in capsys.readouterr().out
    assert squeue_state(job) is None  # gone before the arrays were cancelled
    states = {s.state for s in Tracker(out).observe().states}
    assert states <= {"cancelled", "completed", "unsubmitted"}, states
