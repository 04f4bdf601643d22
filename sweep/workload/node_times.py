"""Each rank's own step time and its node, gathered on rank 0 for the summary record, so that
collect can name a straggler node (sweep.collect.stragglers).

A synchronous step ends at the same moment on every rank (the step's closing all-reduce waits for
the last one), so the step time says nothing about which node held it up. A rank's *own* time is
its step until it reaches that closing all-reduce: a rank on a slow node arrives late, the others
wait for it there. Waits inside the step (DDP's gradient buckets, tensor-parallel collectives)
hold every rank alike, so the spread between nodes shows what a slow node adds after the step's
last inner collective: a node named is slow; a mildly slow node can go unnamed
(docs/runs-parquet.md, "Stragglers").

Each rank keeps its own times in memory; once, after the last step, rank 0 gathers every rank's
steady-state median (one step that the OS took the core away from does not name a node) and node
name (one all_gather_object: no collective in any timed step).

`SWEEP_TEST_STRAGGLER=NODE:SLOWDOWN` is for tests only: the ranks on NODE (a name, or `#i`: the
job's i-th node) sleep SLOWDOWN × their step's own time so far at the end of every step's local
work, so they arrive (1 + SLOWDOWN)× late however loaded the machine is (a simulated straggler;
the summary record says so).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import torch.distributed as dist

STRAGGLER_ENV: Final = "SWEEP_TEST_STRAGGLER"


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    """This rank's node as Slurm names it (multi-slurmd test nodes share one hostname), else the
    host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def simulated_slowdown(node: str, environ: Mapping[str, str] = os.environ) -> float:
    """The slowdown of this node's ranks under SWEEP_TEST_STRAGGLER (0: not this node, or
    unset). NODE is a node name, or `#i`, the job's i-th node (SLURM_NODEID), for a test that
    cannot know which nodes Slurm will give it. A malformed value is an error: a test that meant
    to slow a node must not pass unslowed."""
    value = environ.get(STRAGGLER_ENV, "").strip()
    if not value:
        return 0.0
    target, _, seconds = value.rpartition(":")
    try:
        slowdown = float(seconds)
    except ValueError:
        slowdown = -1.0
    if not target or not slowdown >= 0:
        raise ValueError(f"{STRAGGLER_ENV}={value!r}: write NODE:SLOWDOWN, e.g. node2:1.0 or #1:1.0 "
                         "(testing only: a simulated straggler)")
    index = environ.get("SLURM_NODEID")
    return slowdown if target == node or (index is not None and target == f"#{index}") else 0.0


def straggle(slowdown: float, elapsed_s: float) -> None:
    """Sleep `slowdown` × the step's own time so far (SWEEP_TEST_STRAGGLER only)."""
    if slowdown > 0:
        time.sleep(slowdown * elapsed_s)


def steady_median(own_times: Sequence[float], warmup: int) -> float | None:
    """The median of a rank's own times after the warm-up steps (the summary's steady state)."""
    steady = own_times[min(warmup, len(own_times)):]
    return statistics.median(steady) if steady else None


def gather(own_times: Sequence[float], warmup: int, node: str, slowdown: float) -> dict[str, Any]:
    """Every rank's steady-state median own time and node, for rank 0's summary record (a
    collective: every rank calls it; ranks other than 0 get {})."""
    mine = (node, steady_median(own_times, warmup), slowdown)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() != 0:
        return {}
    fields: dict[str, Any] = {"rank_nodes": [g[0] for g in gathered],
                              "rank_step_time_median_s": [g[1] for g in gathered]}
    simulated = sorted({g[0] for g in gathered if g[2] > 0})
    if simulated:
        fields["simulated_straggler"] = (f"{STRAGGLER_ENV}: ranks on {', '.join(simulated)} slept "
                                         f"{max(g[2] for g in gathered):g} × their own time per "
                                         "step (a test)")
    return fields
