"""The memory rule on `gpu: cpu` (sweep.plan.device_memory): a rank's share of the spec's
`gpu_memory_gb`, else of `run.mem`, else of the partition's RealMemory, else of this host's
memory; the prune reason and the plan summary name the figure and its source."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sweep.core.units import GiB, MiB
from sweep.plan import device_memory, space
from sweep.plan.plan_summary import memory_verdicts
from sweep.plan.spec import Spec
from tests.specs import TINY_CPU


def cpu_spec(**changes: Any) -> Spec:
    data = copy.deepcopy(TINY_CPU)
    data["name"] = "cpu-memory"
    data["run"].pop("mem")
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    return Spec.model_validate(data)


@pytest.fixture
def sources(monkeypatch: pytest.MonkeyPatch) -> dict[str, int | None]:
    """Slurm's RealMemory (MB) and the host's memory (bytes), as the test sets them."""
    found: dict[str, int | None] = {"real_mb": 64_000, "host": 256 * GiB}
    monkeypatch.setattr(device_memory, "slurm_real_memory_mb", lambda partition: found["real_mb"])
    monkeypatch.setattr(device_memory, "host_memory_bytes", lambda: found["host"])
    return found


def test_405b_on_a_cpu_spec_is_pruned_naming_the_memory_and_its_source(sources: Any) -> None:
    spec = cpu_spec(models=["llama-3.1-405b"], gpus_per_node=2, run={"mem": "64G"},
                    axes={"tp": [1, 2]})
    frame = space.plan(spec)
    assert set(frame["status"]) == {"pruned:memory"}
    details = set(frame["prune_detail"].astype(str))
    assert details == {"memory: the predicted peak per rank is over 32.0 GiB per rank "
                       "(run.mem: 64G per node / 2 rank(s) per node)"}
    verdicts = memory_verdicts(frame, spec)
    assert verdicts is not None and verdicts.pruned == len(frame) and verdicts.kept_with_room == 0
    assert "limit 32.0 GiB per rank (run.mem: 64G per node / 2 rank(s) per node)" \
        in verdicts.describe()


@pytest.mark.parametrize("example", ["examples/local-cpu.yaml", "examples/local-slurm.yaml"])
def test_the_tiny_demo_models_still_fit(example: str) -> None:
    """With whatever source this machine gives (the local cluster's 4096 MB nodes, or the
    host's memory), and with the tiny test spec's own 800M."""
    from sweep.plan.spec import load_spec

    spec = load_spec(example)
    assert space.memory_limit(spec) is not None
    assert "pruned:memory" not in set(space.plan(spec)["status"])
    tiny = cpu_spec(run={"mem": "800M"})
    assert set(space.plan(tiny)["status"]) == {"kept"}


def test_precedence_gpu_memory_gb_then_run_mem_then_slurm_then_host(
        sources: dict[str, int | None]) -> None:
    def source(spec: Spec) -> tuple[int, str] | None:
        found = device_memory.device_memory(spec)
        return None if found is None else (found.bytes, found.source)

    both = {"mem": "16G", "partition": "cpus"}
    assert source(cpu_spec(gpu_memory_gb=3, gpus_per_node=2, run=both)) == (
        3 * GiB, "the spec's gpu_memory_gb: 3 GiB")
    assert source(cpu_spec(gpus_per_node=2, run=both)) == (
        8 * GiB, "run.mem: 16G per node / 2 rank(s) per node")
    # --mem=0 is the node's whole memory: the next source says how much that is
    assert source(cpu_spec(gpus_per_node=2, run={**both, "mem": "0"})) == (
        32_000 * MiB, "Slurm RealMemory of the partition cpus's nodes: 64000 MB / 2 rank(s) "
                      "per node")
    assert source(cpu_spec(gpus_per_node=4)) == (
        16_000 * MiB, "Slurm RealMemory of the default partition's nodes: 64000 MB / 4 rank(s) "
                      "per node")
    sources["real_mb"] = None
    assert source(cpu_spec(gpus_per_node=4)) == (
        64 * GiB, "this host's memory (/proc/meminfo MemTotal): 256.0 GiB / 4 rank(s) per node")
    sources["host"] = None
    assert source(cpu_spec()) is None
    assert space.memory_limit(cpu_spec()) is None
    # a GPU keeps its own: the spec's, else the catalog's
    gpu = cpu_spec(gpu="h100-sxm", dtype="bf16")
    assert source(gpu) == (gpu.gpu_spec.memory_bytes, "the catalog's h100-sxm")


def test_headroom_applies_to_a_cpu_rank_too(sources: Any) -> None:
    limit = space.memory_limit(cpu_spec(run={"mem": "10G"}, constraints={"memory_headroom": 0.1}))
    assert limit is not None and limit.budget_bytes == int(10 * GiB * 0.9)


def test_slurm_mem_values() -> None:
    assert device_memory.slurm_mem_bytes("4096") == 4096 * MiB
    assert device_memory.slurm_mem_bytes("64G") == 64 * GiB
    assert device_memory.slurm_mem_bytes("1.5T") == int(1.5 * 1024 * GiB)
    assert device_memory.slurm_mem_bytes("0") is None
    assert device_memory.slurm_mem_bytes("lots") is None


def test_real_memory_of_the_partition_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {
        ("show", "partition", "-o"): "PartitionName=big Default=NO\nPartitionName=debug "
                                     "AllowGroups=ALL Default=YES MaxTime=UNLIMITED\n",
        ("show", "node", "-o"): "NodeName=a RealMemory=4096 Partitions=debug\n"
                                "NodeName=b RealMemory=2048 Partitions=debug,big\n"
                                "NodeName=c RealMemory=9000 Partitions=big\n",
    }
    monkeypatch.setattr(device_memory.shutil, "which", lambda name: "/usr/bin/scontrol")
    monkeypatch.setattr(device_memory, "_scontrol", lambda *args: outputs[args])
    device_memory.slurm_real_memory_mb.cache_clear()
    try:
        assert device_memory.slurm_real_memory_mb(None) == 2048
        assert device_memory.slurm_real_memory_mb("big") == 2048
        outputs[("show", "node", "-o")] = "NodeName=c RealMemory=9000 Partitions=big\n"
        device_memory.slurm_real_memory_mb.cache_clear()
        assert device_memory.slurm_real_memory_mb("big") == 9000
        assert device_memory.slurm_real_memory_mb("debug") is None
    finally:
        device_memory.slurm_real_memory_mb.cache_clear()


def test_host_memory_reads_meminfo(tmp_path: Any) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16318508 kB\nMemFree: 1 kB\n")
    assert device_memory.host_memory_bytes(str(meminfo)) == 16318508 * 1024
    assert device_memory.host_memory_bytes(str(tmp_path / "none")) is None


def test_explain_names_the_limit_source_and_judges_the_tensors(sources: Any) -> None:
    from sweep.plan.plan_summary import explain

    spec = cpu_spec(run={"mem": "800M"})
    frame = space.plan(spec)
    shown = explain(spec, frame, str(frame["run_id"].dropna().iloc[0]))
    assert "budget: 0.78 GiB (run.mem: 800M per node / 1 rank(s) per node, headroom 0%)" in shown
    assert shown.endswith("(the live tensors against a rank's share)")
