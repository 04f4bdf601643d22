"""The time a CPU rank spent waiting for a core that another process held.

On a GPU the device is the run's own; on a CPU host the ranks share the cores with whatever else
runs there, and a step's wall time grows with the neighbours' load while the work done does
not. Linux counts, per thread, the time it was runnable but not running (the run-queue delay,
the second field of `/proc/<pid>/task/<tid>/schedstat`, in nanoseconds). Over an interval, the
largest increase among a process's threads is time that process lost to others, and a lower
bound of it: a thread can only wait while it is runnable, so the count never includes the time
a rank blocks on its own communication, and taking the largest thread's delay, not the sum, never
counts two threads' overlapping waits twice.

MFU on CPU is computed on the step time less this wait (`sweep.workload.metrics`), and the CPU
peak the same way (`sweep.workload.peak`), so a run's MFU does not change with a neighbour's load:
both sides of the ratio count the time the ranks had a core. Where the kernel keeps no such
count, `thread_waits` returns None and MFU falls back to the wall time, which the records say.
"""

from __future__ import annotations

import os
from typing import Final

TASKS: Final = "/proc/self/task"


def thread_waits() -> dict[int, int] | None:
    """Each thread of this process: its run-queue delay so far, in ns. None where Linux keeps no
    schedstat (another OS, or a kernel without CONFIG_SCHED_INFO)."""
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    waits: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"{TASKS}/{tid}/schedstat", encoding="ascii") as handle:
                fields = handle.read().split()
            waits[int(tid)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended since the listing
    return waits or None


def waited_s(before: dict[int, int] | None, after: dict[int, int] | None) -> float | None:
    """The largest run-queue delay any thread accrued between two `thread_waits()` readings, in
    seconds; a thread born in between counts from zero. None if either reading is missing."""
    if before is None or after is None:
        return None
    return max((wait - before.get(tid, 0) for tid, wait in after.items()), default=0) / 1e9

