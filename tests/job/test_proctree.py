"""Process discovery through /proc and stopping a run, with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sweep.job import proctree


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; whatever is left is killed and waited for."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def wait_until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_read_proc_sees_this_process_as_it_is() -> None:
    me = proctree.read_proc(os.getpid())
    assert me is not None
    assert (me.pid, me.ppid, me.sid, me.pgid, me.uid) == (os.getpid(), os.getppid(), os.getsid(0),
                                                          os.getpgrp(), os.getuid())
    assert me.start_ticks > 0 and not me.zombie


def test_read_proc_of_a_finished_process_is_none(started: list[subprocess.Popen[bytes]]) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert proctree.read_proc(proc.pid) is None


def test_the_sweep_tag_is_read_from_the_environment(started: list[subprocess.Popen[bytes]]) -> None:
    env = {**os.environ, proctree.TAG_ENV: "run-a/2", proctree.OWNER_ENV: "1:2", "OTHER": "x"}
    tagged = subprocess.Popen(["sleep", "30"], env=env)
    plain = subprocess.Popen(["sleep", "30"], env={k: v for k, v in os.environ.items()
                                                   if not k.startswith("SWEEP_")})
    started += [tagged, plain]
    info, other = proctree.read_proc(tagged.pid), proctree.read_proc(plain.pid)
    assert info is not None and other is not None
    assert (info.tag, info.owner) == ("run-a/2", "1:2") and "OTHER" not in info.env
    assert other.tag is None and other.env == {}


def test_a_marker_names_a_live_process_only_while_that_very_process_lives(
        started: list[subprocess.Popen[bytes]]) -> None:
    assert proctree.marker_alive(proctree.owner_marker())
    proc = subprocess.Popen(["sleep", "30"])
    started.append(proc)
    marker = proctree.owner_marker(proc.pid)
    pid, ticks = marker.split(":")
    assert proctree.marker_alive(marker)
    assert not proctree.marker_alive(f"{pid}:{int(ticks) + 1}")  # a reused pid starts later
    proc.kill()
    proc.wait()
    assert not proctree.marker_alive(marker)
    assert not proctree.marker_alive("garbage") and not proctree.marker_alive("12:")


def test_stop_run_kills_the_session_and_the_escaped_and_the_stubborn(
        started: list[subprocess.Popen[bytes]]) -> None:
    owner = "999999:1"  # a marker: what the watchdog puts in the launcher's environment
    env = {**os.environ, proctree.OWNER_ENV: owner}
    script = ("trap '' TERM; "                       # ignores SIGTERM: needs SIGKILL
              "sleep 300 & "                          # a child in the session
              "setsid sleep 301 & "                   # one that left the session
              "while true; do sleep 0.05; done")      # keeps forking
    leader = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    started.append(leader)
    wait_until(lambda: len(proctree.run_members(proctree.snapshot(), sid=None, owner=owner)) >= 3)
    def members() -> list[proctree.ProcInfo]:
        return proctree.run_members(proctree.snapshot(), sid=leader.pid, owner=owner)

    before = {p.pid for p in members()}

    report = proctree.stop_run(sid=leader.pid, owner=owner, grace_s=0.5, reap_children=False)

    assert report.survivors == []
    assert leader.pid in report.terminated and leader.pid in report.killed
    assert len(report.escaped) == 1
    assert not any(proctree.alive(pid) for pid in before | set(report.escaped))
    assert all(p.zombie for p in members())
    assert 0.5 <= report.seconds < 8


def test_stop_run_is_quick_when_the_tree_obeys_sigterm(
        started: list[subprocess.Popen[bytes]]) -> None:
    leader = subprocess.Popen(["sleep", "300"], start_new_session=True)
    started.append(leader)
    report = proctree.stop_run(sid=leader.pid, owner="0:0", grace_s=5, reap_children=False)
    assert report.terminated == [leader.pid] and report.killed == [] and report.survivors == []
    assert report.seconds < 2


def test_stop_run_leaves_other_processes_alone(started: list[subprocess.Popen[bytes]]) -> None:
    ours = subprocess.Popen(["sleep", "300"], start_new_session=True)
    theirs = subprocess.Popen(["sleep", "300"], start_new_session=True,
                              env={**os.environ, proctree.OWNER_ENV: "424242:7"})
    started += [ours, theirs]
    proctree.stop_run(sid=ours.pid, owner="1:1", grace_s=1, reap_children=False)
    assert not proctree.alive(ours.pid) and proctree.alive(theirs.pid)


def test_a_subreaper_inherits_the_orphans_of_its_tree() -> None:
    code = """
import os, subprocess, sys, time
from sweep.job import proctree
assert proctree.become_subreaper()
child = subprocess.Popen(["bash", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
child.wait()
time.sleep(0.1)
info = proctree.read_proc(grandchild)
print(info.ppid == os.getpid())
os.kill(grandchild, 9)
time.sleep(0.1)
print(grandchild in proctree.reap())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
