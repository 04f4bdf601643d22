"""Host memory for Slurm: a run whose spec names no --mem asks for what its plan needs."""

from __future__ import annotations

from pathlib import Path

from sweep.plan import render, space
from sweep.plan.resources import CPU_RANK_BASELINE_BYTES, MiB, job_memory
from sweep.plan.spec import load_spec


def megabytes(value: str) -> int:
    assert value.endswith("M")
    return int(value[:-1])


def test_a_cpu_run_asks_for_its_ranks_tensors_with_a_margin_and_their_interpreters() -> None:
    small = megabytes(job_memory("cpu", 2, False, {"mem_allocated_bytes": 100 * MiB}))
    large = megabytes(job_memory("cpu", 2, False, {"mem_allocated_bytes": 1000 * MiB}))
    assert small >= 2 * (100 * 1.5 + CPU_RANK_BASELINE_BYTES // MiB)
    assert large >= small + 2 * 900 * 1.5 - 1024  # the margin applies to the tensors
    assert megabytes(job_memory("cpu", 4, False, {"mem_allocated_bytes": 100 * MiB})) > small


def test_sizes_are_whole_gib_so_that_similar_runs_share_an_array() -> None:
    sizes = {job_memory("cpu", 2, False, {"mem_allocated_bytes": b * MiB}) for b in range(150, 300, 7)}
    assert len(sizes) == 1 and megabytes(sizes.pop()) % 1024 == 0


def test_gpu_runs_take_the_whole_node_when_exclusive_and_a_budget_per_rank_when_not() -> None:
    assert job_memory("h100-sxm", 8, True, {"mem_allocated_bytes": 70e9}) == "0"
    assert megabytes(job_memory("h100-sxm", 8, False, {})) > 8 * 16 * 1024


def test_the_local_cluster_example_fits_the_local_cluster_nodes(repo_root: Path,
                                                                tmp_path: Path) -> None:
    """examples/local-slurm.yaml runs on scripts/local-slurm.sh's nodes (4096 MB each) as is."""
    spec = load_spec(repo_root / "examples" / "local-slurm.yaml")
    assert spec.run.mem is None  # derived, not hand-set
    run_dirs = render.render_runs(spec, space.plan(spec), tmp_path)
    assert run_dirs
    for run_dir in run_dirs:
        line = next(ln for ln in (run_dir / "job.sbatch").read_text().splitlines()
                    if ln.startswith("#SBATCH --mem="))
        assert 0 < megabytes(line.removeprefix("#SBATCH --mem=")) <= 4096, line


def test_a_cpu_run_on_a_shared_node_asks_for_one_cpu_per_rank() -> None:
    from sweep.plan.resources import job_cpus

    assert job_cpus("cpu", 2, exclusive=False) == 2
    assert job_cpus("cpu", 2, exclusive=True) is None  # the node's CPUs are the job's
    assert job_cpus("h100-sxm", 8, exclusive=False) is None
