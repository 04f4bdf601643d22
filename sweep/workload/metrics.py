"""metrics.jsonl records (the contract in DESIGN.md / contracts): pure builders and the writer.

FLOPs per token come from `sweep.models.flops` (one formula for the planner, the workload and collect).
The steady-state policy skips the warm-up steps and reports mean, sample std (ddof=1) and n of
the remaining step times. Nothing is rounded.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.core.model import ModelShape
from sweep.models.flops import DEFAULT_CONVENTION, flops_per_token_all, mfu


@dataclass(frozen=True)
class MemorySample:
    """One rank's memory after a step (sweep.workload.memory_tracking measures it).

    `outside_allocator_bytes`: what the device has in use beyond the caching allocator's reserve
    (CUDA context, NCCL's buffers, cuBLAS/cuDNN handles): the runtime overhead the memory model
    adds to the reserved peak. None where it is not measured (CPU).
    `alloc_retries`: how many times the caching allocator found no free block, released its whole
    cache (cudaFree of every unused segment) and retried cudaMalloc (`num_alloc_retries`, counted
    since start-up). A run with retries fitted only by flushing: its reserved peak is capped by
    the device, not set by the configuration, and each flush costs step time. None off CUDA.
    """

    allocated_bytes: int
    reserved_bytes: int
    outside_allocator_bytes: int | None = None
    alloc_retries: int | None = None


@dataclass(frozen=True)
class RunFacts:
    """What every record of a run shares."""

    shape: ModelShape
    seq_len: int
    tokens_per_step: int  # global
    world_size: int
    peak_flops: float  # dense peak of one device (one rank)
    peak_flops_source: str
    mem_source: str


def core_time_s(step_time_s: float, cpu_wait_s: float | None) -> float:
    """The part of a step's time that MFU counts: all of it on a GPU; on a CPU, the time less
    what the ranks waited for a core another process held (`sweep.workload.cpu_wait`). Linux
    books a waiting thread's delay when it next runs, so a count can include a little from before
    the step began; a wait as long as the whole step is such a count, and leaves the wall time."""
    if cpu_wait_s is None or cpu_wait_s >= step_time_s:
        return step_time_s
    return step_time_s - max(cpu_wait_s, 0.0)


def mfu_time_basis(cpu_wait_s: float | None) -> str:
    return ("wall" if cpu_wait_s is None else
            "on-core: the step time less its ranks' run-queue wait (the largest of any thread of "
            "any rank, from /proc schedstat)")


def _throughput(facts: RunFacts, step_time_s: float, cpu_wait_s: float | None = None) -> dict[str, Any]:
    """tokens/s over the wall time; MFU over the time MFU counts (`core_time_s`)."""
    flops = flops_per_token_all(facts.shape, facts.seq_len)
    tokens_per_sec = facts.tokens_per_step / step_time_s
    per_gpu = tokens_per_sec / facts.world_size
    on_core = facts.tokens_per_step / core_time_s(step_time_s, cpu_wait_s) / facts.world_size
    utilisation = {name: mfu(on_core, value, facts.peak_flops) for name, value in flops.items()}
    return {"tokens_per_sec": tokens_per_sec, "tokens_per_sec_per_gpu": per_gpu,
            "flops_per_token": flops, "mfu": utilisation,
            "mfu_pct": 100.0 * utilisation[DEFAULT_CONVENTION], "cpu_wait_s": cpu_wait_s,
            "mfu_time_basis": mfu_time_basis(cpu_wait_s),
            "peak_flops": facts.peak_flops, "peak_flops_source": facts.peak_flops_source}


def step_record(facts: RunFacts, step: int, step_time_s: float, loss: float,
                mem_per_rank: list[MemorySample], now: float | None = None,
                cpu_wait_s: float | None = None) -> dict[str, Any]:
    """One step; mem_per_rank[r] is rank r's memory. The run's figures are the max over ranks:
    the most loaded rank is the one that must fit. `cpu_wait_s`: on CPU, the largest run-queue
    wait of any rank in the step (None on GPUs)."""
    outside = [m.outside_allocator_bytes for m in mem_per_rank if m.outside_allocator_bytes is not None]
    retries = [m.alloc_retries for m in mem_per_rank if m.alloc_retries is not None]
    return {"kind": "step", "step": step, "time": time.time() if now is None else now,
            "step_time_s": step_time_s, "tokens": facts.tokens_per_step, "loss": loss,
            **_throughput(facts, step_time_s, cpu_wait_s),
            "mem_allocated_bytes": max(m.allocated_bytes for m in mem_per_rank),
            "mem_reserved_bytes": max(m.reserved_bytes for m in mem_per_rank),
            "mem_outside_allocator_bytes": max(outside, default=None),
            "mem_alloc_retries": max(retries, default=None),
            "mem_source": facts.mem_source,
            "mem_per_rank": [{"rank": rank, "allocated_bytes": m.allocated_bytes,
                              "reserved_bytes": m.reserved_bytes,
                              "outside_allocator_bytes": m.outside_allocator_bytes,
                              "alloc_retries": m.alloc_retries}
                             for rank, m in enumerate(mem_per_rank)]}


def summary_record(facts: RunFacts, steps: list[dict[str, Any]], warmup_steps: int, *,
                   ended_by: str, device: str, torch_version: str,
                   early_stop: dict[str, Any] | None = None) -> dict[str, Any]:
    """The steady-state summary of the step records `steps` (in order).

    `ended_by`: "step_budget", or "steady_state" when the early-stop rule ended the run;
    `early_stop`: the rule and the CV of its last window (None when the rule is off).
    """
    skipped = min(warmup_steps, len(steps))
    steady = [s["step_time_s"] for s in steps[skipped:]]
    mean = statistics.fmean(steady) if steady else math.nan
    std = statistics.stdev(steady) if len(steady) > 1 else math.nan
    waits = [float(s["cpu_wait_s"]) for s in steps[skipped:] if s.get("cpu_wait_s") is not None]
    wait = statistics.fmean(waits) if steady and len(waits) == len(steady) else None
    throughput = _throughput(facts, mean, wait) if steady else {}
    if steps:
        first, last = steps[skipped]["step"] if steady else None, steps[-1]["step"]
        policy = (f"skip first {skipped} steps; mean/std (ddof=1) over steps {first}..{last}"
                  if steady else f"skip first {skipped} steps; no steady-state steps left")
    else:
        policy = "no steps ran"
    record: dict[str, Any] = {
        "kind": "summary", "steps": len(steps), "warmup_steps_skipped": skipped,
        "step_time_mean_s": _finite(mean), "step_time_std_s": _finite(std), "step_time_n": len(steady),
        "tokens_per_sec": throughput.get("tokens_per_sec"),
        "tokens_per_sec_per_gpu": throughput.get("tokens_per_sec_per_gpu"),
        "flops_per_token": flops_per_token_all(facts.shape, facts.seq_len),
        "mfu": throughput.get("mfu"), "mfu_pct": throughput.get("mfu_pct"),
        "cpu_wait_mean_s": wait, "mfu_time_basis": throughput.get("mfu_time_basis"),
        "peak_flops": facts.peak_flops, "peak_flops_source": facts.peak_flops_source,
        "mem_allocated_bytes": max((s["mem_allocated_bytes"] for s in steps), default=None),
        "mem_reserved_bytes": max((s["mem_reserved_bytes"] for s in steps), default=None),
        "mem_outside_allocator_bytes": max((s["mem_outside_allocator_bytes"] for s in steps
                                            if s.get("mem_outside_allocator_bytes") is not None),
                                           default=None),
        "mem_alloc_retries": max((s["mem_alloc_retries"] for s in steps
                                  if s.get("mem_alloc_retries") is not None), default=None),
        "mem_source": facts.mem_source, "ended_by": ended_by, "early_stop": early_stop,
        "final_loss": steps[-1]["loss"] if steps else None,
        "device": device, "world_size": facts.world_size, "torch_version": torch_version,
        "steady_state_policy": policy,
    }
    return record


def _finite(value: float) -> float | None:
    """JSON has no NaN: an undefined statistic (n < 2 for std) is null."""
    return None if math.isnan(value) else value


class MetricsWriter:
    """Appends records to metrics.jsonl, one write(2) of one whole line each, and times itself.

    Each line reaches the kernel at once (no user-space buffer), so the watchdog on the node
    sees it immediately and a killed trainer leaves whole lines behind. Unlike
    `sweep.core.state.append_jsonl` it does not fsync every line: that costs milliseconds per step
    on a busy disk (more on NFS/Lustre); `close` fsyncs once, after the summary.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds = 0.0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        start = time.perf_counter()
        os.write(self._fd, (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode())
        self.seconds += time.perf_counter() - start

    def close(self) -> None:
        if self._fd < 0:
            return
        start = time.perf_counter()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        self.seconds += time.perf_counter() - start
