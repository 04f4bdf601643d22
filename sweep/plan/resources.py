"""Slurm resources a run asks for when its spec does not say: host memory per node.

A cluster whose `DefMemPerCPU` is small gives a job without `--mem` a cgroup too small for its
ranks, and the cgroup OOM killer then ends runs that fit on their devices. So the job asks for
what the plan says it needs:

- CPU runs (the built-in workload with gloo): each rank holds its tensors in host memory, which
  the memory model predicts (`mem_allocated_bytes` of the most loaded rank: weights, gradients,
  optimizer states, activations, logits, buffers; not the CUDA context and allocator terms, which
  a CPU rank does not have); each rank also carries the interpreter with torch imported, and the
  node runs the watchdog and the launcher. With a margin for what the model does not count.
- GPU runs on exclusive nodes: `--mem=0`, the node's whole memory: the benchmark owns the node.
- GPU runs sharing nodes: per rank, a budget for the CUDA context, pinned buffers, the framework
  and its data loader.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sweep.core.units import GiB, MiB

CPU_RANK_BASELINE_BYTES: Final = 768 * MiB  # python + torch + gloo, measured ~600 MiB RSS
NODE_BASELINE_BYTES: Final = 512 * MiB  # the watchdog, the launcher, bash and srun
CPU_MARGIN: Final = 1.5  # the memory model's device total is not all of a CPU rank's RSS
GPU_RANK_HOST_BYTES: Final = 16 * GiB  # CUDA context, pinned memory, framework, data loader


def job_memory(gpu: str, ranks_per_node: int, exclusive: bool,
               predicted: Mapping[str, Any]) -> str:
    """The `--mem` value (per node) for a run whose spec sets none."""
    if gpu != "cpu":
        if exclusive:
            return "0"
        return _megabytes(ranks_per_node * GPU_RANK_HOST_BYTES + NODE_BASELINE_BYTES)
    per_rank = float(predicted.get("mem_allocated_bytes") or 0.0)
    need = ranks_per_node * (per_rank * CPU_MARGIN + CPU_RANK_BASELINE_BYTES) + NODE_BASELINE_BYTES
    return _megabytes(need)


def job_cpus(gpu: str, ranks_per_node: int, exclusive: bool) -> int | None:
    """`--cpus-per-task` for a run whose spec sets none. The job runs one task per node (the
    watchdog) that forks the node's ranks; a shared CPU node gives that task one CPU by default,
    so the ranks of a CPU run would take turns on it: ask for one CPU per rank. GPU runs and
    exclusive nodes need nothing (the node's CPUs are the job's)."""
    if gpu == "cpu" and not exclusive:
        return ranks_per_node
    return None


def _megabytes(size: float) -> str:
    """Rounded up to whole GiB, in MiB (Slurm's `M`): runs of one sweep then ask for a few
    distinct sizes, and runs of one resource shape share a job array."""
    return f"{-(-int(size) // GiB) * 1024}M"
