"""What the node and Slurm know about the running job, read once or twice per run.

The cgroup's oom_kill counter tells a kernel OOM kill (Slurm's --mem is a memory cgroup) from
any other SIGKILL; the job's end time tells Slurm's time-limit TERM from a cancel.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path


def cgroup_oom_kills() -> int | None:
    """The oom_kill counter of our memory cgroup (v1 or v2); Slurm puts each step in one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"]
        elif controllers == "":
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"]
        else:
            continue
        for candidate in candidates:
            try:
                for entry in candidate.read_text().splitlines():
                    key, _, value = entry.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
            except OSError:
                continue
    return None


def job_end_time(job_id: str | None, environ: dict[str, str]) -> float | None:
    """When Slurm will end this job (unix seconds), so that a TERM at that time reads as the
    time limit, not a cancel. None outside Slurm or when squeue cannot say."""
    text = environ.get("SLURM_JOB_END_TIME", "")
    if text.isdigit():
        return float(text)
    squeue = shutil.which("squeue")
    if not job_id or squeue is None:
        return None
    try:
        out = subprocess.run([squeue, "-h", "-j", job_id, "-o", "%e|%N"], capture_output=True,
                             text=True, timeout=10, check=False).stdout.strip()
        end, _, nodelist = out.splitlines()[0].partition("|")
        if nodelist != environ.get("SLURM_JOB_NODELIST"):
            return None  # not our job: an emulated job id that a real cluster also has
        return time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
