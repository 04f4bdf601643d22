"""The built-in launcher (`python -m sweep.workload --nproc-per-node N`): it forks the ranks of
one node, they train exactly what torchrun's ranks train, and a failure, a signal or the
launcher's own death leaves no rank behind and a report in torchrun's words.

Real processes throughout: forked ranks on gloo, real signals. The pure parts (the rendezvous
arithmetic, the report) are tested first, without processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sweep.core.state import read_jsonl
from sweep.job.classify import Evidence, classify
from sweep.workload.launch import Failure, Rendezvous, parse_master
from tests.workload.runs import (
    REPO,
    forked_launch_cmd,
    launch,
    run_config,
    workload_env,
    write_run_dir,
)

LONG_RUN = {"steps": 100000, "warmup_steps": 1}


# --- the rendezvous and the report, as plain values ----------------------------------------------

def test_global_ranks_follow_the_node_rank_like_torchruns_static_rendezvous() -> None:
    node1 = Rendezvous(nnodes=2, node_rank=1, nproc_per_node=4, master_addr="node1", master_port=29500)
    env = node1.rank_env(local_rank=2)
    assert env == {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                   "GROUP_RANK": "1", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"node_rank": 2}, r"--node-rank: 2 is not in 0\.\.1"),
    ({"nproc_per_node": 0}, r"--nproc-per-node \(0\) must be at least 1"),
    ({"master_port": 70000}, r"port 70000 is not in 1\.\.65535"),
])
def test_an_impossible_rendezvous_names_the_option(kwargs: dict, message: str) -> None:
    fields = {"nnodes": 2, "node_rank": 0, "nproc_per_node": 2, "master_addr": "h", "master_port": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        Rendezvous(**fields)


def test_the_master_is_host_and_port_and_only_one_node_may_leave_it_out() -> None:
    assert parse_master("node7:29511", nnodes=2) == ("node7", 29511)
    assert parse_master("[::1]:29511", nnodes=1) == ("::1", 29511)
    host, port = parse_master(None, nnodes=1)
    assert host == "127.0.0.1" and 0 < port < 65536
    with pytest.raises(ValueError, match=r"--master: required with --nnodes 2"):
        parse_master(None, nnodes=2)
    with pytest.raises(ValueError, match=r"--master: 'node7' is not HOST:PORT"):
        parse_master("node7", nnodes=2)


def test_the_report_of_a_killed_rank_reads_like_torchruns_and_classifies_as_sigkill() -> None:
    failure = Failure(rank=3, local_rank=1, pid=4242, exit_code=-9, at=0.0)
    text = "\n".join(failure.lines("node2")) + "\n"
    assert "  rank      : 3 (local_rank: 1)" in text and "Signal 9 (SIGKILL) received by PID 4242" in text
    assert failure.launcher_exit_code == 137
    verdict = classify(Evidence(log_text=text, exit_codes={"node0": failure.launcher_exit_code}, last_step=5))
    assert (verdict.outcome, verdict.reason) == ("crashed", "sigkill")
    assert Failure(rank=0, local_rank=0, pid=1, exit_code=2, at=0.0).launcher_exit_code == 2


# --- real forked ranks ------------------------------------------------------------------------------

def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=workload_env(), cwd=REPO, check=False)


def losses(metrics: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(metrics) if r["kind"] == "step"]


def test_two_forked_ranks_train_the_single_process_losses(tmp_path: Path, reference_losses: list[float]) -> None:
    run_dir = write_run_dir(tmp_path, run_config(dp=2))
    proc = run(forked_launch_cmd(run_dir, 2))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert losses(run_dir / "metrics.jsonl") == pytest.approx(reference_losses, abs=1e-4)
    first = next(iter(read_jsonl(run_dir / "metrics.jsonl")))
    assert [m["rank"] for m in first["mem_per_rank"]] == [0, 1]
    assert re.search(r"node 0 of 1: rank 0 pid \d+, rank 1 pid \d+; rendezvous at 127\.0\.0\.1:\d+", proc.stderr)
    startup = float(re.search(r"startup_s=(\S+)", proc.stdout)[1])
    assert 0 < startup < 60  # counted from the launcher's start, not the fork


def test_the_memory_a_run_reports_does_not_depend_on_its_launcher(tmp_path: Path) -> None:
    forked = write_run_dir(tmp_path / "forked", run_config(dp=2, seq_len=256))
    under_torchrun = write_run_dir(tmp_path / "torchrun", run_config(dp=2, seq_len=256))
    assert run(forked_launch_cmd(forked, 2)).returncode == 0
    assert launch(under_torchrun, 2).returncode == 0
    peaks = [list(read_jsonl(d / "metrics.jsonl"))[-1]["mem_reserved_bytes"] for d in (forked, under_torchrun)]
    assert min(peaks) > 0
    assert abs(peaks[0] - peaks[1]) < 0.05 * max(peaks), peaks  # library pages are not counted


def test_two_launchers_meet_through_the_static_rendezvous_as_two_nodes(
        tmp_path: Path, reference_losses: list[float]) -> None:
    from sweep.workload.launch import free_port

    run_dir = write_run_dir(tmp_path, run_config(dp=2))
    master = f"--master=127.0.0.1:{free_port()}"
    nodes = [subprocess.Popen(forked_launch_cmd(run_dir, 1, "--nnodes=2", f"--node-rank={k}", master),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=workload_env(),
                              cwd=REPO) for k in (1, 0)]
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert losses(run_dir / "metrics.jsonl") == pytest.approx(reference_losses, abs=1e-4)
    assert "node 1 of 2: rank 1 pid" in outputs[0][1] and "node 0 of 2: rank 0 pid" in outputs[1][1]


def test_a_rank_that_cannot_run_passes_its_exit_code_and_message_up(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, run_config(dp=2))
    proc = run(forked_launch_cmd(run_dir, 1))
    assert proc.returncode == 2
    assert "WORLD_SIZE is 1; launch it with --nproc-per-node 2" in proc.stderr
    assert "failed (exitcode: 2) local_rank: 0" in proc.stderr and "Root Cause (first observed failure)" in proc.stderr


@pytest.mark.parametrize(("options", "message"), [
    (["--nnodes=2"], "--master: required with --nnodes 2"),
    (["--master=localhost"], "--master: 'localhost' is not HOST:PORT"),
    (["--nnodes=2", "--node-rank=2", "--master=h:1"], "--node-rank: 2 is not in 0..1"),
])
def test_bad_launcher_options_are_named_before_anything_starts(tmp_path: Path, options: list[str],
                                                                message: str) -> None:
    run_dir = write_run_dir(tmp_path, run_config(dp=2))
    proc = run(forked_launch_cmd(run_dir, 2, *options))
    assert proc.returncode == 2 and message in proc.stderr
    assert "Traceback" not in proc.stderr and "rendezvous at" not in proc.stderr


class Launched:
    """A long run under the launcher, started in the background; its rank pids from its first line."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.run_dir = write_run_dir(tmp_path, run_config(dp=2, settings=LONG_RUN))
        self.stderr_path = tmp_path / "stderr.txt"
        with self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(forked_launch_cmd(self.run_dir, 2, *extra), stdout=subprocess.DEVNULL,
                                         stderr=stderr, env=workload_env(), cwd=REPO)
        self.ranks = self._wait_for_steps()

    def _wait_for_steps(self) -> dict[int, int]:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stderr
            if (self.run_dir / "metrics.jsonl").exists() and (self.run_dir / "metrics.jsonl").stat().st_size:
                return {int(r): int(p) for r, p in re.findall(r"rank (\d+) pid (\d+)", self.stderr)}
            time.sleep(0.1)
        raise AssertionError(f"no step within 90 s:\n{self.stderr}")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def alive_ranks(self, within_s: float = 5.0) -> list[int]:
        """Rank pids still running (zombies count as gone) after waiting up to `within_s` for them to go."""
        deadline = time.monotonic() + within_s
        while True:
            alive = [pid for pid in self.ranks.values() if _running(pid)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)

    def kill_all(self) -> None:
        for pid in [self.proc.pid, *self.ranks.values()]:
            if _running(pid):
                psutil.Process(pid).kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_sigkilled_rank_is_the_root_cause_and_a_stopped_peer_is_still_ended(tmp_path: Path) -> None:
    job = Launched(tmp_path, "--grace-s=3")
    try:
        assert sorted(job.ranks) == [0, 1]
        psutil.Process(job.ranks[0]).suspend()  # a peer that would never see a plain SIGTERM
        psutil.Process(job.ranks[1]).kill()
        assert job.wait() == 128 + signal.SIGKILL
        assert job.alive_ranks() == []
        log = job.stderr
        assert f"failed (exitcode: -9) local_rank: 1 (pid: {job.ranks[1]})" in log
        assert re.search(r"Root Cause \(first observed failure\):\n(.*\n)*?  rank      : 1 \(local_rank: 1\)", log)
        assert f"Signal 9 (SIGKILL) received by PID {job.ranks[1]}" in log
        verdict = classify(Evidence(log_text=log, exit_codes={"node0": job.proc.returncode}, last_step=1))
        assert (verdict.outcome, verdict.reason) == ("crashed", "sigkill")
    finally:
        job.kill_all()


def test_sigterm_to_the_launcher_ends_every_rank_and_the_launcher_dies_of_it(tmp_path: Path) -> None:
    job = Launched(tmp_path)
    try:
        job.proc.send_signal(signal.SIGTERM)
        assert job.wait() == -signal.SIGTERM
        assert job.alive_ranks() == []
    finally:
        job.kill_all()


def test_ranks_do_not_outlive_a_sigkilled_launcher(tmp_path: Path) -> None:
    job = Launched(tmp_path)
    try:
        job.proc.kill()
        assert job.wait() == -signal.SIGKILL
        assert job.alive_ranks() == []  # PR_SET_PDEATHSIG
    finally:
        job.kill_all()
