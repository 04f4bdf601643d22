"""Process trees on one Linux node: who belongs to a run, and how to stop all of it.

A run's processes cannot be found by parentage alone: torchrun starts its workers in new
sessions, and a crashed launcher leaves them to init. So the watchdog tags the launcher's
environment (SWEEP_TAG, and SWEEP_WATCHDOG = "<pid>:<start ticks>" of the supervising
watchdog), every descendant inherits it, and `/proc/<pid>/environ` finds them wherever they
went. The start ticks guard against pid reuse. Everything here reads /proc directly: a
snapshot costs about 3 ms per 100 processes, and the watchdog takes one only when it stops.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

TAG_ENV = "SWEEP_TAG"
RUN_ID_ENV = "SWEEP_RUN_ID"
ATTEMPT_ENV = "SWEEP_ATTEMPT"
OWNER_ENV = "SWEEP_WATCHDOG"
_KEYS = (TAG_ENV, RUN_ID_ENV, ATTEMPT_ENV, OWNER_ENV, "SLURM_JOB_ID")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str  # one letter from /proc/<pid>/stat: R, S, D, Z, T, ...
    uid: int
    start_ticks: int
    comm: str
    env: dict[str, str] = field(default_factory=dict, hash=False)  # only the sweep keys

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")

    @property
    def tag(self) -> str | None:
        return self.env.get(TAG_ENV)

    @property
    def owner(self) -> str | None:
        return self.env.get(OWNER_ENV)


def read_proc(pid: int) -> ProcInfo | None:
    """One process, or None when it is gone (or its files cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    head, _, tail = raw.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    if len(fields) < 20:
        return None
    return ProcInfo(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]),
                    state=fields[0], uid=uid, start_ticks=int(fields[19]), comm=comm,
                    env=_sweep_env(pid))


def _sweep_env(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:  # another user's process, or gone
        return {}
    if b"SWEEP_" not in raw:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in _KEYS:
            env[key.decode()] = value.decode(errors="replace")
    return env


def snapshot() -> list[ProcInfo]:
    """Every process visible in /proc, this one included."""
    procs = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = read_proc(int(name))
            if info is not None:
                procs.append(info)
    return procs


def owner_marker(pid: int | None = None) -> str:
    """The value of SWEEP_WATCHDOG that names process `pid` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    info = read_proc(pid)
    if info is None:
        raise ProcessLookupError(pid)
    return f"{pid}:{info.start_ticks}"


def marker_alive(marker: str) -> bool:
    """Whether the watchdog a marker names is still running (same pid, same start time)."""
    pid_text, _, ticks_text = marker.partition(":")
    if not (pid_text.isdigit() and ticks_text.isdigit()):
        return False
    info = read_proc(int(pid_text))
    return info is not None and not info.zombie and info.start_ticks == int(ticks_text)


def alive(pid: int) -> bool:
    """Running or stopped; a zombie counts as dead (PID 1 here reaps orphans ~1 s late)."""
    info = read_proc(pid)
    return info is not None and not info.zombie


def run_members(procs: Iterable[ProcInfo], *, sid: int | None, owner: str,
                exclude: Iterable[int] = ()) -> list[ProcInfo]:
    """Processes of one supervised run: in the launcher's session, or carrying our owner marker."""
    skip = set(exclude) | {os.getpid()}
    return [p for p in procs if p.pid not in skip
            and ((sid is not None and p.sid == sid) or p.owner == owner)]


def become_subreaper() -> bool:
    """Orphans of our tree reparent to us instead of init, so we can reap them at once."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap() -> dict[int, int]:
    """Collect every exited child (zombies that reparented to us); returns pid -> wait status.

    The launcher is reaped here too when it has exited: callers look for its pid in the result.
    """
    statuses: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        statuses[pid] = status
    return statuses


@dataclass
class StopReport:
    """What stopping a run did, for watchdog.jsonl and the verdict."""

    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    escaped: list[int] = field(default_factory=list)  # ours by marker, outside the session
    reaped: dict[int, int] = field(default_factory=dict)
    survivors: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"terminated": self.terminated, "killed": self.killed, "escaped": self.escaped,
                "reaped": sorted(self.reaped), "survivors": self.survivors,
                "seconds": round(self.seconds, 3)}


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_run(*, sid: int | None, owner: str, grace_s: float, kill_wait_s: float = 5.0,
             poll_s: float = 0.05, reap_children: bool = True,
             on_reap: Callable[[dict[int, int]], None] | None = None) -> StopReport:
    """SIGTERM everything of the run, wait `grace_s`, SIGKILL what is left, verify.

    New processes that appear meanwhile (a launcher that respawns) are caught by rescanning
    on every poll. With `reap_children`, exited children of ours are collected (a caller that
    manages its own children, like a test, passes False); `on_reap` receives their wait
    statuses (the launcher's among them), which the caller would otherwise lose.
    """
    report = StopReport()
    started = time.monotonic()

    def collect() -> None:
        statuses = reap() if reap_children else {}
        if statuses:
            report.reaped.update(statuses)
            if on_reap is not None:
                on_reap(statuses)

    def living() -> list[ProcInfo]:
        collect()
        return [p for p in run_members(snapshot(), sid=sid, owner=owner) if not p.zombie]

    def note_escaped(procs: list[ProcInfo]) -> None:
        for p in procs:
            if (sid is None or p.sid != sid) and p.pid not in report.escaped:
                report.escaped.append(p.pid)

    termed: set[int] = set()
    deadline = started + grace_s
    while True:
        procs = living()
        note_escaped(procs)
        fresh = [p for p in procs if p.pid not in termed]
        for p in fresh:
            if _signal(p.pid, signal.SIGTERM):
                report.terminated.append(p.pid)
            termed.add(p.pid)
        if not procs or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)

    deadline = time.monotonic() + kill_wait_s
    while True:
        procs = living()
        if not procs:
            break
        note_escaped(procs)
        for p in procs:
            if _signal(p.pid, signal.SIGKILL) and p.pid not in report.killed:
                report.killed.append(p.pid)
        if time.monotonic() >= deadline:
            report.survivors = [p.pid for p in procs]
            break
        time.sleep(poll_s)
    collect()
    report.seconds = time.monotonic() - started
    return report
