"""Per-rank memory: what a step used, a per-rank cap, and the tensor-level tracker.

- CUDA: `max_memory_allocated` / `max_memory_reserved` since start-up.
- CPU: RSS growth over the baseline taken after the process group came up (torch and gloo
  already loaded). "allocated" is the current RSS growth at the end of the step, "reserved" the
  peak RSS growth (`ru_maxrss`). RSS includes allocator slack and library pages, so compare it
  only between runs of the same configuration (../shared/notes/torch-cpu.md §8).
- The cap (`settings.rank_memory_limit_mb`) bounds the growth of the address space over the same
  baseline with RLIMIT_AS on CPU, and the CUDA caching allocator's share on GPU. Exceeding it
  raises the allocator's own error; `oom_message` recognises it.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

import psutil
import torch

MIB = 1024 * 1024
# The last one: a lazy import of a shared library under the RLIMIT_AS cap.
OOM_MARKERS = ("can't allocate memory", "Cannot allocate memory", "CUDA out of memory", "std::bad_alloc",
               "failed to map segment from shared object")


@dataclass(frozen=True)
class MemorySample:
    allocated_bytes: int
    reserved_bytes: int


class MemoryProbe:
    """Measures one rank's memory; build it right after the process group is initialised."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.source = "cuda" if device.type == "cuda" else "cpu-rss"
        self._process = psutil.Process()
        self.baseline_rss = self._process.memory_info().rss
        self.baseline_vms = self._process.memory_info().vms
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def sample(self) -> MemorySample:
        if self.device.type == "cuda":
            return MemorySample(int(torch.cuda.max_memory_allocated(self.device)),
                                int(torch.cuda.max_memory_reserved(self.device)))
        rss = self._process.memory_info().rss
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return MemorySample(max(0, rss - self.baseline_rss), max(0, peak - self.baseline_rss))

    def cap(self, limit_mb: int | None) -> None:
        """Limit this rank to `limit_mb` MiB more than it holds now (see the module docstring)."""
        if not limit_mb:
            return
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb * MIB / total), self.device)
            return
        limit = self.baseline_vms + limit_mb * MIB
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def oom_message(error: BaseException) -> str | None:
    """The first line of an out-of-memory error, or None when `error` is something else."""
    text = str(error)
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MARKERS):
        return (text.strip().splitlines() or [type(error).__name__])[0]
    return None


def tracked_peak(run_step: Any, modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Run one step under MemTracker; this rank's peak bytes per category.

    Keys: Parameter, Buffer, Gradient, Activation, Temp, Optstate, Other, Total (the breakdown at
    the moment of the step's peak), and `activations_after_forward`: the activation bytes held
    for backward when the forward pass ends, which is what recomputation reduces (at the step's
    peak, usually inside the optimizer step, activations are already freed).

    MemTracker is the CPU analogue of CUDA `max_memory_allocated` and works with DDP, ZeRO-1,
    FSDP2 and TP, but not with pipeline parallelism (the caller checks).
    """
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

    tracker = MemTracker()
    tracker.track_external(*modules, optimizer)
    with tracker:
        run_step()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    result = {getattr(k, "value", str(k)): int(v) for k, v in peak.items()}
    after_forward = 0
    for stats in tracker.memory_tracking.values():
        for snapshot in stats.snapshots.get(_ModState.POST_FW, []):
            for per_device in snapshot.values():
                after_forward = max(after_forward, int(per_device.get(_MemRefType.ACT, 0)))
    result["activations_after_forward"] = after_forward
    return result
