"""The memory one rank may use, and where that figure comes from: what the memory rule prunes by.

A GPU has its memory: the spec's `gpu_memory_gb`, else the catalog's (sweep/core/catalog/gpus.yaml).
`gpu: cpu` has no memory of its own (the catalog leaves it null): a CPU rank holds its tensors in
host memory, and what it may use is, in this order,

1. the spec's `gpu_memory_gb` (GiB per rank, as for a GPU);
2. the Slurm memory the runs ask for, `run.mem` (per node, Slurm's `--mem` units; `0`, the
   node's whole memory, falls through to the next source), divided among the node's ranks;
3. the `RealMemory` of the partition's nodes (`scontrol show node`; the smallest of them; the
   partition is `run.partition`, else the cluster's default), divided among the node's ranks;
4. this host's total memory (`MemTotal` of /proc/meminfo), divided among the node's ranks.

Without any of them there is no memory rule, as before. The planner names the source it used in
`sweep plan`'s summary and in each memory prune's `prune_detail`.

Against a share of host memory (2-4) the rule compares the tensors a rank holds
(`mem_allocated_bytes`, as `sweep.plan.resources` sizes `--mem`): the memory model's CUDA context
and caching-allocator terms do not exist on a CPU, so there is no band and no probe. A spec's own
`gpu_memory_gb` on a CPU is judged as a GPU's memory is, as it always was.

Not pure: sources 3 and 4 ask Slurm and read /proc once per process (cached).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.core.units import GiB, MiB

if TYPE_CHECKING:
    from sweep.plan.spec import Spec

SCONTROL_TIMEOUT_S = 10
_SLURM_UNITS = {"K": 1024, "M": MiB, "G": GiB, "T": 1024 * GiB}


@dataclass(frozen=True)
class DeviceMemory:
    """What one rank may use (bytes, before the spec's headroom) and where the figure comes from."""

    bytes: int
    source: str
    host_share: bool = False  # a CPU rank's share of host memory (not the spec's gpu_memory_gb)

    def describe(self) -> str:
        return f"{self.bytes / GiB:.1f} GiB per rank ({self.source})"


def slurm_mem_bytes(value: str) -> int | None:
    """Bytes of a Slurm `--mem` value ("64G", "4096", "512M"; no suffix: MiB); None for "0" (the
    node's whole memory) or a value this cannot read."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTkmgt]?)[Bb]?\s*", str(value))
    if match is None:
        return None
    amount = float(match.group(1)) * _SLURM_UNITS[(match.group(2) or "M").upper()]
    return int(amount) if amount > 0 else None


@functools.cache
def slurm_real_memory_mb(partition: str | None) -> int | None:
    """The smallest `RealMemory` (MB) of the partition's nodes (None: the default partition), or
    None when Slurm is not here, does not answer, or reports none."""
    if shutil.which("scontrol") is None:
        return None
    try:
        if partition is None:
            partitions = _scontrol("show", "partition", "-o")
            default = re.search(r"PartitionName=(\S+)[^\n]*\bDefault=YES", partitions or "")
            partition = default.group(1) if default else None
        nodes = _scontrol("show", "node", "-o")
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = []
    for line in (nodes or "").splitlines():
        real = re.search(r"\bRealMemory=(\d+)", line)
        parts = re.search(r"\bPartitions=(\S+)", line)
        if real is None or int(real.group(1)) <= 0:
            continue
        if partition is not None and (parts is None or partition not in parts.group(1).split(",")):
            continue
        sizes.append(int(real.group(1)))
    return min(sizes) if sizes else None


def _scontrol(*args: str) -> str | None:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True,
                          timeout=SCONTROL_TIMEOUT_S, check=False)
    return done.stdout if done.returncode == 0 else None


@functools.cache
def host_memory_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """This host's total memory (MemTotal), or None where /proc/meminfo is not readable."""
    try:
        text = Path(meminfo).read_text(encoding="ascii")
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.M)
    return int(match.group(1)) * 1024 if match else None


def device_memory(spec: Spec) -> DeviceMemory | None:
    """The memory one rank of the spec's runs may use, with its source (module docstring);
    None: no figure, and no memory rule."""
    gpu = spec.gpu_spec
    if spec.gpu_memory_gb is not None:
        return DeviceMemory(int(spec.gpu_memory_gb * GiB), f"the spec's gpu_memory_gb: "
                            f"{spec.gpu_memory_gb:g} GiB")
    if gpu.memory_bytes is not None:
        return DeviceMemory(int(gpu.memory_bytes), f"the catalog's {gpu.name}")
    if gpu.name != "cpu":
        return None
    ranks = spec.gpus_per_node_resolved
    per = f"/ {ranks} rank(s) per node"
    if spec.run.mem is not None and (asked := slurm_mem_bytes(spec.run.mem)) is not None:
        return DeviceMemory(asked // ranks, f"run.mem: {spec.run.mem} per node {per}", True)
    real = slurm_real_memory_mb(spec.run.partition)
    if real is not None:
        where = f"partition {spec.run.partition}" if spec.run.partition else "default partition"
        return DeviceMemory(real * MiB // ranks,
                            f"Slurm RealMemory of the {where}'s nodes: {real} MB {per}", True)
    host = host_memory_bytes()
    if host is not None:
        return DeviceMemory(host // ranks, f"this host's memory (/proc/meminfo MemTotal): "
                            f"{host / GiB:.1f} GiB {per}", True)
    return None
