"""The watchdog around real torch.distributed ranks (gloo on CPU) under torchrun."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.core.state import read_json, read_jsonl
from sweep.job import proctree
from tests.watchdog_runs import Run, kill_leftovers, wait_for_step

RANK = """
import json, os, resource, sys, time
import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = os.environ["SWEEP_ATTEMPT_DIR"]
with open(os.path.join(attempt, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
x = torch.ones(4)
for step in range(1, 100000):
    if step == 3 and rank == 1:
        if mode == "hang":    # stops calling collectives; rank 0 waits in all_reduce
            time.sleep(3600)
        if mode == "oom":     # a per-rank address-space limit, as rank_memory_limit_mb sets
            with open("/proc/self/status") as status:
                vm = next(int(l.split()[1]) for l in status if l.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), vm + (256 << 20)))
            torch.empty(4 << 30, dtype=torch.uint8)
        if mode == "raise":
            raise RuntimeError("rank 1 lost its shard at step 3")
    dist.all_reduce(x)
    if rank == 0:
        with open(os.path.join(attempt, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"kind": "step", "step": step, "time": time.time()}) + "\\n")
    time.sleep(0.2)
"""


def torchrun(run: Run, mode: str) -> list[str]:
    script = run.root / "rank.py"
    script.write_text(RANK)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--monitor-interval", "0.2", str(script), mode]


def rank_pids(run: Run) -> list[int]:
    return [int((run.attempt / f"rank{r}.pid").read_text()) for r in (0, 1)]


@pytest.fixture
def gloo_run(tmp_path: Path) -> Iterator[Run]:
    made = Run(tmp_path, startup_timeout_s=60, hang_timeout_s=3)
    yield made
    kill_leftovers(made)


@pytest.mark.slow
def test_gloo_a_rank_that_stops_calling_collectives_is_a_hang_and_nothing_survives(
        gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "hang"))
    proc.communicate(timeout=120)
    status = run.status
    assert (status["outcome"], status["last_step"]) == ("hang", 2)
    hang = run.events("hang")[0]
    last_step_at = max(r["time"] for r in read_jsonl(run.attempt / "metrics.jsonl"))
    assert hang["time"] - last_step_at <= 3 + 10
    assert run.survivors() == []
    assert not any(proctree.alive(pid) for pid in rank_pids(run))
    stop = read_json(run.attempt / "node0.json")["observed"]["stop"]
    assert set(rank_pids(run)) <= set(stop["escaped"])  # torchrun puts ranks in new sessions


@pytest.mark.slow
def test_gloo_a_rank_past_its_address_space_limit_is_oom_with_the_allocator_line(
        gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "oom"))
    proc.communicate(timeout=120)
    status = run.status
    assert status["outcome"] == "oom", status
    assert any("DefaultCPUAllocator: can't allocate memory" in line for line in status["evidence"])
    assert run.survivors() == []


@pytest.mark.slow
def test_gloo_a_rank_that_raises_is_crashed_with_its_traceback_line(gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "raise"))
    proc.communicate(timeout=120)
    status = run.status
    assert status["outcome"] == "crashed", status
    assert status["evidence"] == ["[rank1]: RuntimeError: rank 1 lost its shard at step 3"]
    assert status["exit_codes"] == {"node0": 1}
    assert run.survivors() == []


@pytest.mark.slow
def test_gloo_when_torchrun_is_sigkilled_its_workers_are_found_by_tag_and_killed(
        gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "train"))
    wait_for_step(run, timeout=60)
    launcher = run.events("launch")[0]["pid"]
    workers = rank_pids(run)
    assert all(proctree.alive(pid) for pid in workers)
    os.kill(launcher, signal.SIGKILL)
    proc.communicate(timeout=60)
    status = run.status
    assert status["exit_codes"] == {"node0": -signal.SIGKILL}
    assert status["outcome"] == "crashed", status
    assert not any(proctree.alive(pid) for pid in workers)
    assert set(workers) <= set(read_json(run.attempt / "node0.json")["observed"]["stop"]["escaped"])
    assert run.survivors() == []
