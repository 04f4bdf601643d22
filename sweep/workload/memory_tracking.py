"""Per-rank memory: what a step used, a per-rank cap, and the tensor-level tracker.

- CUDA: `max_memory_allocated` / `max_memory_reserved` since start-up, and the memory the device
  has in use beyond the allocator's current reserve (`cudaMemGetInfo`'s used less
  `memory_reserved`): the CUDA context, NCCL's buffers and the libraries' handles, which the
  memory model adds as its overhead and self-calibration learns from (sweep.calibration.memory_self_calibration).
  cudaMemGetInfo counts the whole device, so another process on the same GPU would count too;
  `sweep run` and Slurm's GPU binding give each job GPUs of its own.
- CPU: growth of the anonymous RSS (heap and tensors, /proc/self/status RssAnon) over the
  baseline taken after the process group came up and the layout's modules were imported.
  "allocated" is the growth at the end of the step; "reserved" the peak growth, from the peak
  RSS (VmHWM, reset at the baseline) less the library pages mapped since (RssFile growth).
  Library pages are left out because how many of them a rank faults in after its baseline
  depends on how it was started (a forked rank inherits none, an exec'd one touched many while
  importing), not on the configuration. Anonymous RSS still includes allocator slack, so compare
  it only between runs of the same configuration (PyTorch-on-CPU measurements (torch 2.13) §8).
- The cap (`settings.rank_memory_limit_mb`) bounds the growth of the address space over the same
  baseline with RLIMIT_AS on CPU, and the CUDA caching allocator's share on GPU. Exceeding it
  raises the allocator's own error; `oom_message` recognises it.
"""

from __future__ import annotations

import resource
from collections.abc import Callable

import torch

from sweep.core.units import MiB as MIB
from sweep.workload.metrics import MemorySample

# The last one: a lazy import of a shared library under the RLIMIT_AS cap.
OOM_MARKERS = ("can't allocate memory", "Cannot allocate memory", "CUDA out of memory", "std::bad_alloc",
               "failed to map segment from shared object")


class MemoryProbe:
    """Measures one rank's memory; build it right after the process group is initialised."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.source = "cuda" if device.type == "cuda" else "cpu-rss-anon"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            _reset_peak_rss()
        self.baseline = _memory_kib()
        self.baseline_vms = 1024 * self.baseline["VmSize"]

    def sample(self) -> MemorySample:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
            return MemorySample(int(torch.cuda.max_memory_allocated(self.device)),
                                int(torch.cuda.max_memory_reserved(self.device)),
                                max(0, int(total - free - torch.cuda.memory_reserved(self.device))),
                                int(retries))
        now, base = _memory_kib(), self.baseline
        anon = now["RssAnon"] - base["RssAnon"]
        peak = now["VmHWM"] - base["VmRSS"] - max(0, now["RssFile"] - base["RssFile"])
        return MemorySample(1024 * max(0, anon), 1024 * max(0, anon, peak))

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


_STATUS_FIELDS = ("VmSize", "VmHWM", "VmRSS", "RssAnon", "RssFile")


def _memory_kib() -> dict[str, int]:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith(_STATUS_FIELDS))
    return {name: int(fields[name].split()[0]) for name in _STATUS_FIELDS}


def _reset_peak_rss() -> None:
    """VmHWM := VmRSS (Linux >= 4.0), so the peak is this run's, not the imports'."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass  # an older kernel: the peak then counts from the process start, an upper bound


def oom_message(error: BaseException) -> str | None:
    """The first line of an out-of-memory error, or None when `error` is something else."""
    text = str(error)
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MARKERS):
        return (text.strip().splitlines() or [type(error).__name__])[0]
    return None


def tracked_peak(run_step: Callable[[Callable[[], None]], object], modules: list[torch.nn.Module],
                 optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Run one step under MemTracker; this rank's peak bytes per category.

    `run_step(next_micro_batch)` runs the step and calls `next_micro_batch()` after each of its
    micro-batches but the last. MemTracker refuses a module's second forward within one tracked
    region, so a step with gradient accumulation resets its per-module statistics there; the
    step's peak, which is what is reported, survives the reset.

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
        run_step(tracker.reset_mod_stats)
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    result = {getattr(k, "value", str(k)): int(v) for k, v in peak.items()}
    after_forward = 0
    for stats in tracker.memory_tracking.values():
        for snapshot in stats.snapshots.get(_ModState.POST_FW, []):
            for per_device in snapshot.values():
                after_forward = max(after_forward, int(per_device.get(_MemRefType.ACT, 0)))
    result["activations_after_forward"] = after_forward
    return result
