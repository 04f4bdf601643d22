"""Job facts from the kernel and from Slurm: the cgroup OOM counter and the job's end time."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.core.state import read_json
from sweep.job import jobinfo
from tests.watchdog_runs import REPO, Run, kill_leftovers

MEMCG = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def memcg() -> Iterator[Path]:
    """A fresh v1 memory cgroup limited to 64 MiB (needs root and a writable cgroup fs)."""
    if os.getuid() != 0 or not os.access(MEMCG, os.W_OK):
        pytest.skip("needs root and a writable v1 memory cgroup hierarchy")
    group = MEMCG / f"sweep-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(64 << 20))
    yield group
    for pid in (group / "cgroup.procs").read_text().split():
        os.kill(int(pid), 9)
    group.rmdir()


def test_the_oom_counter_of_this_process_cgroup_is_readable() -> None:
    if not Path("/proc/self/cgroup").exists():
        pytest.skip("no /proc/self/cgroup")
    count = jobinfo.cgroup_oom_kills()
    assert count is None or count >= 0


def test_a_kernel_oom_kill_in_the_jobs_cgroup_is_oom(tmp_path: Path, memcg: Path) -> None:
    """As under Slurm --mem: the kernel SIGKILLs the rank; the log is silent, the counter is not."""
    run = Run(tmp_path)
    launcher = run.python("steps(1)\nhog = bytearray(512 << 20)\nsteps(1, start=2)")
    watchdog = " ".join(run.argv(launcher))
    try:
        done = subprocess.run(["sh", "-c", f"echo $$ > {memcg}/cgroup.procs && exec {watchdog}"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        kill_leftovers(run)
    assert done.returncode == 128 + 9, done.stderr
    status = read_json(run.attempt / "status.json")
    assert (status["outcome"], status["reason"]) == ("oom", "cgroup_oom_kill"), status
    assert status["exit_codes"] == {"node0": -9} and status["last_step"] == 1
    assert read_json(run.attempt / "node0.json")["observed"]["cgroup_oom_kills"] == 1


def test_no_job_end_time_outside_slurm() -> None:
    assert jobinfo.job_end_time(None, {}) is None
    assert jobinfo.job_end_time("1", {"SLURM_JOB_END_TIME": "1795334000"}) == 1795334000.0


def test_an_emulated_job_id_is_not_mistaken_for_a_real_clusters_job(slurm_cluster: None) -> None:
    job = subprocess.run(["sbatch", "--parsable", "--time=1", "--output=/dev/null",
                          "--wrap", "sleep 30"],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        nodelist = ""
        for _ in range(50):
            nodelist = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True,
                                      text=True).stdout.strip()
            if nodelist:
                break
            time.sleep(0.2)
        assert jobinfo.job_end_time(job, {"SLURM_JOB_NODELIST": nodelist}) is not None
        assert jobinfo.job_end_time(job, {"SLURM_JOB_NODELIST": "127.0.0.1"}) is None
    finally:
        subprocess.run(["scancel", job])
