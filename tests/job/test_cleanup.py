"""Pre-launch clean-up: only what can be attributed to a dead sweep job goes."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.job import cleanup, proctree
from sweep.job.proctree import ProcInfo


def proc(pid: int, *, tag: str | None = "run/1", owner: str | None = None, uid: int | None = None,
         state: str = "S") -> ProcInfo:
    env = {k: v for k, v in ((proctree.TAG_ENV, tag), (proctree.OWNER_ENV, owner)) if v is not None}
    return ProcInfo(pid=pid, ppid=1, pgid=pid, sid=pid, state=state,
                    uid=os.getuid() if uid is None else uid, start_ticks=1, comm="python", env=env)


def test_only_tagged_processes_of_a_dead_watchdog_are_stale() -> None:
    me = proctree.owner_marker()
    other_live = proctree.owner_marker(os.getppid())
    dead = "999999999:1"  # no such pid
    procs = [proc(10, owner=dead), proc(11, owner=other_live), proc(12, owner=None),
             proc(13, owner=dead, uid=os.getuid() + 1), proc(14, owner=me),
             proc(15, tag=None, owner=dead),
             proc(16, owner=dead, state="Z")]
    stale, keep = cleanup.classify_tagged(procs, me=me, uid=os.getuid())
    assert [p.pid for p in stale] == [10]
    reasons = {p.pid: why for p, why in keep}
    assert set(reasons) == {11, 12, 13}
    assert "alive" in reasons[11] and "marker" in reasons[12] and "another user" in reasons[13]


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _old(path: Path, age_s: float = 3600) -> Path:
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_debris_goes_when_ours_old_and_unused(tmp_path: Path,
                                              holder: list[subprocess.Popen[bytes]]) -> None:
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    stale_shm = shm / "nccl-abc123"
    stale_shm.write_bytes(b"x")
    _old(stale_shm)
    fresh_shm = shm / "torch_77_1"
    fresh_shm.write_bytes(b"x")
    open_shm = shm / "nccl-inuse"
    open_shm.write_bytes(b"x")
    _old(open_shm)
    foreign = shm / "postgres-segment"
    foreign.write_bytes(b"x")
    _old(foreign)
    stale_dir = tmp / "torchelastic_old"
    (stale_dir / "none_x" / "attempt_0").mkdir(parents=True)
    _old(stale_dir)
    live_dir = tmp / "torchelastic_live"
    live_dir.mkdir()
    _old(live_dir)
    with open(open_shm, "rb") as handle:
        holder.append(subprocess.Popen(["sleep", "60"], stdin=handle))
    holder.append(subprocess.Popen(["sleep", "60"], env={
        **os.environ, "TORCHELASTIC_ERROR_FILE": str(live_dir / "none_y" / "error.json")}))
    time.sleep(0.1)

    removed, in_use = cleanup.remove_debris(shm_dir=shm, tmp_dir=tmp, min_age_s=60)

    assert sorted(removed) == sorted([str(stale_shm), str(stale_dir)])
    assert sorted(in_use) == sorted([str(open_shm), str(live_dir)])
    assert fresh_shm.exists() and foreign.exists() and open_shm.exists() and live_dir.exists()
    assert not stale_shm.exists() and not stale_dir.exists()


def test_no_nvidia_smi_means_no_gpu_report() -> None:
    if subprocess.run(["which", "nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("this machine has nvidia-smi; the GPU path is checked on a GPU node")
    assert cleanup.gpu_processes() is None
