"""The Slurm CLI client: parsing is pure; the live tests talk to the local cluster."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sweep.backends.slurm.client import (
    Slurm,
    SlurmError,
    chunks,
    limits_from_config,
    parse_config,
    parse_sacct,
    parse_squeue,
    parse_unhealthy_nodes,
    parse_usable_nodes,
)


def test_config_limits_are_read_from_scontrol_show_config() -> None:
    text = "Configuration data as of 2026-11-22T08:00:00\nMaxArraySize            = 5001\nMaxJobCount             = 20000\nMinJobAge               = 300 sec\n"
    limits = limits_from_config(parse_config(text))
    assert (limits.max_array_size, limits.max_job_count) == (5001, 20000)


def test_missing_limits_fall_back_to_slurm_defaults() -> None:
    limits = limits_from_config({})
    assert (limits.max_array_size, limits.max_job_count) == (1001, 10000)


def test_squeue_lines_keep_array_task_ids_and_comments() -> None:
    entries = parse_squeue("12_3|RUNNING|None|node1|sweep=a;batch=b\n12_[4-9]|PENDING|JobArrayTaskLimit||sweep=a;batch=b\n")
    assert [entry.job_id for entry in entries] == ["12_3", "12_[4-9]"]
    assert entries[1].reason == "JobArrayTaskLimit"
    assert entries[0].comment == "sweep=a;batch=b"


def test_sacct_steps_are_attached_to_their_job() -> None:
    text = (
        "7_1|8|x|FAILED|1:0|0:125|node1|t0|t1|12|cpu=1|sbatch --comment=a|b x.sbatch\n"
        "7_1.batch|8.batch|batch|FAILED|1:0||node1|t0|t1|12||\n"
        "7_1.0|8.0|python|OUT_OF_MEMORY|0:125||node1|t0|t1|11||\n"
        "9|9|y|CANCELLED by 0|0:15|0:0|node2|t0|t1|3||\n"
    )
    jobs = parse_sacct(text)
    assert [job.job_id for job in jobs] == ["7_1", "9"]
    assert [step.state for step in jobs[0].steps] == ["FAILED", "OUT_OF_MEMORY"]
    assert jobs[0].submit_line == "sbatch --comment=a|b x.sbatch"  # a separator inside the last field survives
    assert jobs[1].state == "CANCELLED"


def test_queries_are_chunked_per_thousand_ids() -> None:
    assert [len(chunk) for chunk in chunks([str(i) for i in range(2500)])] == [1000, 1000, 500]


def test_a_missing_command_says_where_to_run() -> None:
    client = Slurm()
    client._call = Slurm._call.__get__(client)  # the real path, with PATH emptied below
    import os

    saved = os.environ["PATH"]
    os.environ["PATH"] = "/nonexistent"
    try:
        with pytest.raises(SlurmError, match="login node"):
            client.limits()
    finally:
        os.environ["PATH"] = saved


@pytest.mark.slurm
def test_live_array_submit_queue_account_and_cancel(slurm_cluster: None, tmp_path: Path) -> None:
    client = Slurm()
    assert client.limits().max_array_size >= 1001
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 30\n")
    job_id = client.submit(str(script), ["--hold", "--array=0-4%2", "--comment=sweep=t;batch=live",
                                         f"--output={tmp_path}/%A_%a.out", "--job-name=t"])
    queued = client.queue([job_id])
    assert {entry.comment for entry in queued} == {"sweep=t;batch=live"}
    assert all(entry.state == "PENDING" for entry in queued)
    client.cancel([job_id])
    deadline = time.monotonic() + 10
    while client.queue([job_id]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.queue([job_id]) == []
    while time.monotonic() < deadline:
        rows = client.accounting([job_id])
        if rows and all(row.state == "CANCELLED" for row in rows):
            break
        time.sleep(0.3)
    assert rows and all(row.state == "CANCELLED" for row in rows)
    assert client.calls["sbatch"] == 1


@pytest.mark.slurm
def test_live_completed_job_reports_its_steps(slurm_cluster: None, tmp_path: Path) -> None:
    client = Slurm()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun true\n")
    job_id = client.submit(str(script), [f"--output={tmp_path}/%j.out", "--nodes=2"])
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline:
        # slurmdbd may first show a placeholder row (JobName `allocation`, one node) for a job
        # that is already COMPLETED: wait for the job's own record.
        rows = client.accounting([job_id])
        if rows and rows[0].state == "COMPLETED" and len(rows[0].steps) >= 2 \
                and rows[0].name == "job.sh":
            break
        time.sleep(0.3)
    assert rows[0].state == "COMPLETED"
    assert {step.job_id for step in rows[0].steps} >= {f"{job_id}.batch", f"{job_id}.0"}
    assert rows[0].nodes == "node[1-2]" or "," in rows[0].nodes or "[" in rows[0].nodes


def test_sbatch_rejection_is_a_clear_error(tmp_path: Path) -> None:
    def failing(argv):  # a runner standing in for sbatch's exit: the parsing of failures only
        return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Batch job submission failed: Invalid job array specification\n")

    with pytest.raises(SlurmError, match="Invalid job array specification"):
        Slurm(runner=failing).submit("x.sh", ["--array=0-9999"])


def test_unhealthy_nodes_are_down_drained_failing_or_not_responding() -> None:
    text = ("gpu01|idle\ngpu02|down*\ngpu03|drained\ngpu04|draining\ngpu05|mixed\ngpu06|allocated*\n"
            "gpu07|idle~\ngpu08|fail\ngpu09|allocated+\ngpu10|down$\ngpu11|reserved\ngpu02|down*\n")
    assert parse_unhealthy_nodes(text) == {"gpu02", "gpu03", "gpu04", "gpu06", "gpu08", "gpu10"}
    assert parse_unhealthy_nodes("") == set()


def test_usable_nodes_are_the_others_each_once() -> None:
    text = "n1|idle\nn2|down*\nn3|mixed\nn4|drained\nn5|idle*\nn1|idle\nn6|allocated\n"
    assert parse_usable_nodes(text) == ["n1", "n3", "n6"]


@pytest.mark.slurm
@pytest.mark.slow
def test_live_a_node_whose_slurmd_died_is_unhealthy_until_it_is_back(slurm_cluster: None) -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("killing a node's slurmd needs root (scripts/local-slurm.sh kill-node)")
    script = Path(__file__).resolve().parents[3] / "scripts" / "local-slurm.sh"
    slurm = Slurm()

    def unhealthy_within(seconds: float, until: Callable[[set[str]], bool]) -> set[str]:
        deadline = time.monotonic() + seconds  # slurmctld pings within SlurmdTimeout (10 s here)
        while not until(seen := slurm.unhealthy_nodes()) and time.monotonic() < deadline:
            time.sleep(1)
        return seen

    assert unhealthy_within(60, lambda seen: not seen) == set()  # an earlier test's node is back
    subprocess.run(["bash", str(script), "kill-node", "node3"], check=True, capture_output=True)
    try:
        assert unhealthy_within(60, lambda seen: "node3" in seen) == {"node3"}
    finally:
        subprocess.run(["bash", str(script), "restart-node", "node3"], check=True, capture_output=True)
    assert unhealthy_within(60, lambda seen: not seen) == set()
