"""The fabric check's program on the compute nodes: an all-reduce of growing sizes, timed the
nccl-tests way.

`sweep nodes DIR --check` (sweep.backends.slurm.fabric_check) starts it with `srun` in one job
per node and one per pair of nodes: every task is one rank (`SLURM_PROCID` of `SLURM_NTASKS`),
MASTER_ADDR and MASTER_PORT come from the job script. NCCL on GPUs, gloo on CPU.

The probes of one check run in rounds (each node in at most one probe per round), so that
they do not share a node's links while they measure: a probe waits until the probes it names
as peers are up (`NAME.ready` in the check's folder) and those of the earlier rounds have ended
(`NAME.json`, or `NAME.failed`, which the login side writes for a job that ended without a
result), at most `--wait-s`.

For each size, after warm-up iterations, every timed iteration is a barrier and one all-reduce;
an iteration's time is the slowest rank's (a MAX all-reduce of the times, not timed), and a
size's figures come from the best iteration (the median is recorded too). As nccl-tests:
algbw = bytes / time and busbw = algbw · 2(n-1)/n for an all-reduce of n ranks, which makes
busbw comparable across rank counts. The job's figure is the best busbw of the two largest
sizes it measured (one size hit by a hiccup does not decide). Sizes stop growing when the time budget is spent (all ranks agree), so a very slow
node ends in bounded time with the figures of the sizes it reached.

Rank 0 writes the result JSON before the process group is torn down, then every rank leaves
with `os._exit` (a gloo teardown can abort at exit; the result is already on disk).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

SIZE_FACTOR: Final = 4
DEFAULT_WARMUP: Final = 5  # nccl-tests: -w 5
DEFAULT_ITERS: Final = 20  # nccl-tests: -n 20
INIT_TIMEOUT_S: Final = 120
WAIT_POLL_S: Final = 0.1
LARGEST_SIZES: Final = 2  # the job's figure: the best busbw of this many largest sizes


def bus_factor(ranks: int) -> float:
    """busbw / algbw for an all-reduce over `ranks` ranks (nccl-tests' 2(n-1)/n)."""
    return 2.0 * (ranks - 1) / ranks


def sizes_between(min_bytes: int, max_bytes: int) -> list[int]:
    """The message sizes measured: min_bytes, ×4, … up to max_bytes (included)."""
    sizes, size = [], min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= SIZE_FACTOR
    return [*sizes, max_bytes]


def size_figures(size: int, times_s: Sequence[float], ranks: int) -> dict[str, float]:
    """One size's row: best and median time, and algbw/busbw (GB/s) of the best iteration."""
    best = min(times_s)
    algbw = size / best / 1e9
    return {"bytes": size, "best_s": best, "median_s": statistics.median(times_s),
            "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(ranks),
            "iterations": len(times_s)}


def measure(min_bytes: int, max_bytes: int, warmup: int, iters: int,
            budget_s: float) -> dict[str, Any]:
    """Run the all-reduces in the process group already set up; every rank returns the same
    figures (times are MAX-reduced over ranks)."""
    import torch
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    ranks = dist.get_world_size()
    started = time.perf_counter()
    rows: list[dict[str, float]] = []
    stopped_early = False

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for size in sizes_between(min_bytes, max_bytes):
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buffer)
        sync()
        times = []
        for _ in range(iters):
            dist.barrier()
            begin = time.perf_counter()
            dist.all_reduce(buffer)
            sync()
            slowest = torch.tensor([time.perf_counter() - begin], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times.append(float(slowest.item()))
        rows.append(size_figures(size, times, ranks))
        spent = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
        if float(spent.item()) > budget_s and size != max_bytes:
            stopped_early = True
            break
    largest = max(rows[-LARGEST_SIZES:], key=lambda row: row["busbw_gbps"])
    return {"sizes": rows, "busbw_gbps": largest["busbw_gbps"], "bytes": largest["bytes"],
            "stopped_early": stopped_early, "measure_s": time.perf_counter() - started}


def finished(folder: Path, name: str) -> bool:
    """A probe has ended: its result is there, or the login side marked it failed."""
    return (folder / f"{name}.json").exists() or (folder / f"{name}.failed").exists()


def wait_for_turn(folder: Path, peers: Sequence[str], after: Sequence[str], wait_s: float) -> bool:
    """Wait until every peer is up (its `.ready` file; or it ended) and every probe of an earlier
    round has ended, so that no other probe of the check imports torch or moves data while this
    one measures. False when `wait_s` ran out first (the probe then measures anyway)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if (all((folder / f"{n}.ready").exists() or finished(folder, n) for n in peers)
                and all(finished(folder, n) for n in after)):
            return True
        time.sleep(WAIT_POLL_S)
    return False


def names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.backends.slurm.fabric_probe",
                                     description="the compute-node half of `sweep nodes --check`")
    parser.add_argument("--dir", type=Path, required=True, help="the check's folder")
    parser.add_argument("--name", required=True, help="this probe's name: DIR/NAME.json")
    parser.add_argument("--peers", type=names, default=[],
                        help="probes to wait for until they are up (comma-separated)")
    parser.add_argument("--after", type=names, default=[],
                        help="probes to wait for until they have ended (comma-separated)")
    parser.add_argument("--wait-s", type=float, default=300.0)
    parser.add_argument("--min-bytes", type=int, required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    parser.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    parser.add_argument("--budget-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    begun = time.perf_counter()
    import torch
    import torch.distributed as dist

    rank, ranks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("SLURM_LOCALID", "0")) % torch.cuda.device_count())
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    # The other ranks sit in a barrier while rank 0 waits for its turn: the timeout covers both.
    dist.init_process_group("nccl" if cuda else "gloo", init_method=address, rank=rank,
                            world_size=ranks,
                            timeout=timedelta(seconds=INIT_TIMEOUT_S + args.wait_s))
    hosts: list[Any] = [None] * ranks
    dist.all_gather_object(hosts, os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    ready_s = time.perf_counter() - begun
    on_time = True
    if rank == 0:
        (args.dir / f"{args.name}.ready").touch()
        on_time = wait_for_turn(args.dir, args.peers, args.after, args.wait_s)
    dist.barrier()
    result = measure(args.min_bytes, args.max_bytes, args.warmup, args.iters, args.budget_s)
    if rank == 0:
        result.update({"ranks": ranks, "backend": dist.get_backend(), "hosts": hosts,
                       "job_id": os.environ.get("SLURM_JOB_ID"), "ready_s": ready_s,
                       "waited_for_turn": on_time, "seconds": time.perf_counter() - begun,
                       "time": time.time()})
        out = args.dir / f"{args.name}.json"
        temporary = out.with_name(f".{out.name}.tmp")
        temporary.write_text(json.dumps(result, indent=1), encoding="utf-8")
        temporary.replace(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
