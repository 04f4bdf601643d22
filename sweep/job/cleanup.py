"""Pre-launch clean-up of a node: what earlier runs left behind.

The rule is attribution. A process is killed only when it carries a sweep tag, belongs to this
user, and the watchdog named in its SWEEP_WATCHDOG marker is dead: then no live job owns it.
A tagged process without a marker, or whose watchdog lives (another run on a shared node, or
another node's watchdog of this very run on a one-machine cluster), is left alone. Shared-memory
and torchelastic debris is removed only when it is ours, old, and opened by no live process.
GPU processes are only reported, never killed.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sweep.job import proctree
from sweep.job.proctree import ProcInfo

SHM_PATTERNS = ("nccl-*", "torch_*", "cuda.shm.*")
TMP_PATTERNS = ("torchelastic_*",)


@dataclass
class CleanReport:
    killed: list[dict[str, object]] = field(default_factory=list)
    left_alone: list[dict[str, object]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    gpu_processes: list[dict[str, object]] | None = None  # None: no nvidia-smi on this node

    def to_json(self) -> dict[str, object]:
        return {"killed": self.killed, "left_alone": self.left_alone, "removed": self.removed,
                "in_use": self.in_use, "survivors": self.survivors,
                "gpu_processes": self.gpu_processes}


def _describe(p: ProcInfo, why: str) -> dict[str, object]:
    return {"pid": p.pid, "comm": p.comm, "tag": p.tag, "owner": p.owner, "why": why}


def classify_tagged(procs: list[ProcInfo], *, me: str, uid: int,
                    ) -> tuple[list[ProcInfo], list[tuple[ProcInfo, str]]]:
    """Split tagged processes into stale ones and ones left alone (with the reason)."""
    stale: list[ProcInfo] = []
    keep: list[tuple[ProcInfo, str]] = []
    live_cache: dict[str, bool] = {}
    for p in procs:
        if p.tag is None or p.zombie or p.pid == os.getpid():
            continue
        if p.uid != uid:
            keep.append((p, "another user's process"))
        elif p.owner is None:
            keep.append((p, "no SWEEP_WATCHDOG marker: cannot tell whether its job lives"))
        elif p.owner == me:
            continue
        elif live_cache.setdefault(p.owner, proctree.marker_alive(p.owner)):
            keep.append((p, "its watchdog is alive"))
        else:
            stale.append(p)
    return stale, keep


def kill_stale(me: str, grace_s: float = 3.0) -> CleanReport:
    """Kill every tagged process of this user whose watchdog is dead."""
    report = CleanReport()
    stale, keep = classify_tagged(proctree.snapshot(), me=me, uid=os.getuid())
    report.left_alone = [_describe(p, why) for p, why in keep]
    report.killed = [_describe(p, "its watchdog is dead") for p in stale]
    for owner in sorted({p.owner for p in stale if p.owner}):
        stop = proctree.stop_run(sid=None, owner=owner, grace_s=grace_s, reap_children=False)
        report.survivors.extend(stop.survivors)
    return report


def _candidates(root: Path, patterns: tuple[str, ...], uid: int, min_age_s: float) -> list[Path]:
    try:
        names = os.listdir(root)
    except OSError:
        return []
    now = time.time()
    found = []
    for name in names:
        if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
            continue
        path = root / name
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_mtime >= min_age_s:
            found.append(path)
    return found


def paths_in_use(paths: list[Path]) -> set[Path]:
    """Which paths a live process has open, mapped, or names in its environment."""
    if not paths:
        return set()
    text = {str(p): p for p in paths}
    used: set[Path] = set()

    def mark(value: str) -> None:
        for prefix, path in text.items():
            if value == prefix or value.startswith(prefix + "/"):
                used.add(path)

    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        base = f"/proc/{name}"
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    mark(os.readlink(f"{base}/fd/{fd}"))
                except OSError:
                    pass
            with open(f"{base}/maps", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if "/" in line:
                        mark(line[line.index("/"):].rstrip("\n").removesuffix(" (deleted)"))
            with open(f"{base}/environ", "rb") as raw:
                for item in raw.read().split(b"\0"):
                    value = item.partition(b"=")[2].decode(errors="replace")
                    if value.startswith("/"):
                        mark(value)
        except OSError:
            continue
    return used


def remove_debris(*, shm_dir: Path, tmp_dir: Path, min_age_s: float = 60.0,
                  ) -> tuple[list[str], list[str]]:
    """Remove our old NCCL/torch shared-memory files and torchelastic folders; (removed, in use)."""
    uid = os.getuid()
    candidates = (_candidates(shm_dir, SHM_PATTERNS, uid, min_age_s)
                  + _candidates(tmp_dir, TMP_PATTERNS, uid, min_age_s))
    used = paths_in_use(candidates)
    removed = []
    for path in candidates:
        if path in used:
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(str(path))
        except OSError:
            continue
    return removed, sorted(str(p) for p in used)


def gpu_processes(timeout_s: float = 15.0) -> list[dict[str, object]] | None:
    """Compute processes nvidia-smi reports, each with its sweep tag if we can read it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [{"error": str(exc)}]
    if out.returncode != 0:
        return [{"error": (out.stderr or out.stdout).strip()[:500]}]
    found: list[dict[str, object]] = []
    for line in out.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        info = proctree.read_proc(int(parts[0]))
        found.append({"pid": int(parts[0]), "name": parts[1], "used_memory_mib": parts[2],
                      "tag": info.tag if info else None})
    return found


def prelaunch_clean(*, me: str, shm_dir: Path = Path("/dev/shm"), tmp_dir: Path = Path("/tmp"),
                    min_age_s: float = 60.0, grace_s: float = 3.0) -> CleanReport:
    report = kill_stale(me, grace_s=grace_s)
    report.removed, report.in_use = remove_debris(shm_dir=shm_dir, tmp_dir=tmp_dir,
                                                  min_age_s=min_age_s)
    report.gpu_processes = gpu_processes()
    return report
