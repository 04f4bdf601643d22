"""`python -m sweep.workload`: standalone and under torchrun, the metrics contract, failures."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sweep.core.model import count_parameters
from sweep.core.state import read_jsonl
from sweep.models.flops import flops_per_token_all
from sweep.workload.cpu_wait import thread_waits
from tests.workload.runs import launch, run_config, write_run_dir

SCHEDSTAT = thread_waits() is not None

STEP_KEYS = {"kind", "step", "time", "step_time_s", "tokens", "tokens_per_sec", "tokens_per_sec_per_gpu",
             "loss", "flops_per_token", "mfu", "mfu_pct", "peak_flops", "peak_flops_source",
             "mem_allocated_bytes", "mem_reserved_bytes", "mem_outside_allocator_bytes",
             "mem_alloc_retries", "mem_source", "mem_per_rank", "cpu_wait_s", "mfu_time_basis"}
SUMMARY_KEYS = {"kind", "steps", "warmup_steps_skipped", "step_time_mean_s", "step_time_std_s", "step_time_n",
                "tokens_per_sec", "tokens_per_sec_per_gpu", "flops_per_token", "mfu", "mfu_pct", "peak_flops",
                "peak_flops_source", "mem_allocated_bytes", "mem_reserved_bytes", "mem_outside_allocator_bytes",
                "mem_alloc_retries", "mem_source", "ended_by",
                "final_loss", "device", "world_size", "torch_version", "steady_state_policy", "early_stop",
                "cpu_wait_mean_s", "mfu_time_basis", "rank_nodes", "rank_step_time_median_s"}


def records(path: Path) -> list[dict]:
    return list(read_jsonl(path))


def test_standalone_run_writes_one_line_per_step_then_the_summary(
        reference: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, proc = reference
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = records(run_dir / "metrics.jsonl")
    steps, summary = lines[:-1], lines[-1]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for record in steps:
        assert set(record) == STEP_KEYS
        assert record["tokens"] == 4 * 64
        assert record["flops_per_token"] == flops_per_token_all(run_config().model, 64)
        assert record["mfu_pct"] == 100 * record["mfu"]["full_attention"]
        assert record["peak_flops_source"].startswith("measured:cpu-matmul-fp32 best of 2 trials, "
                                                      "1 ranks × ")
        assert record["peak_flops"] > 0
        assert record["mem_source"] == "cpu-rss-anon" and len(record["mem_per_rank"]) == 1
        assert record["mem_outside_allocator_bytes"] is None  # a CUDA figure
        assert record["mem_alloc_retries"] is None  # the CUDA caching allocator's count
        if SCHEDSTAT:  # the wait for a core, where Linux counts it (sweep.workload.cpu_wait)
            assert record["cpu_wait_s"] >= 0 and record["mfu_time_basis"].startswith("on-core")
    assert set(summary) == SUMMARY_KEYS and summary["kind"] == "summary"
    assert len(summary["rank_nodes"]) == 1
    assert summary["cpu_wait_mean_s"] >= 0 if SCHEDSTAT else summary["cpu_wait_mean_s"] is None
    assert summary["warmup_steps_skipped"] == 1 and summary["step_time_n"] == 4
    assert summary["final_loss"] == steps[-1]["loss"] and summary["world_size"] == 1
    assert "done run_id=" in proc.stdout


def test_torchrun_two_ranks_writes_to_the_attempt_dir_from_the_environment(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, run_config(dp=2, steps=3, warmup_steps=1))
    attempt = run_dir / "attempts" / "1"
    proc = launch(run_dir, 2, env={"SWEEP_ATTEMPT_DIR": str(attempt)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = records(attempt / "metrics.jsonl")
    assert [r["kind"] for r in lines] == ["step", "step", "step", "summary"]
    assert [m["rank"] for m in lines[0]["mem_per_rank"]] == [0, 1]
    assert lines[0]["tokens_per_sec_per_gpu"] == lines[0]["tokens_per_sec"] / 2
    assert lines[-1]["world_size"] == 2
    assert not (run_dir / "metrics.jsonl").exists()


def test_a_missing_run_json_is_a_clear_error(tmp_path: Path) -> None:
    proc = launch(tmp_path / "nowhere", 0)
    assert proc.returncode == 2
    assert "run.json not found" in proc.stderr and "Traceback" not in proc.stderr


def test_a_layout_for_more_ranks_than_launched_names_the_fix(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, run_config(tp=2))
    proc = launch(run_dir, 0)
    assert proc.returncode == 2
    assert "WORLD_SIZE is 1; launch it with --nproc-per-node 2 (or torchrun --nproc-per-node 2)" in proc.stderr


def test_the_rank_memory_limit_ends_the_run_with_a_recognisable_oom(tmp_path: Path) -> None:
    cfg = run_config(seq_len=256, settings={"rank_memory_limit_mb": 40})
    run_dir = write_run_dir(tmp_path, cfg)
    proc = launch(run_dir, 0)
    assert proc.returncode == 1
    assert "sweep.workload: rank 0: CPU out of memory: " in proc.stderr
    assert "DefaultCPUAllocator: can't allocate memory" in proc.stderr


def test_memtrack_measures_a_step_with_gradient_accumulation(tmp_path: Path) -> None:
    """MemTracker refuses a module's second forward in one tracked region; the step resets its
    per-module statistics between micro-batches, so the gradients that exist from the second
    micro-batch on are in the peak (they are what a single micro-batch's step never holds)."""
    run_dir = write_run_dir(tmp_path, run_config(steps=1, mbs=1, grad_acc=4))
    proc = launch(run_dir, 0, "--attempt-dir", str(tmp_path / "attempt"), "--memtrack")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (peak,) = json.loads((tmp_path / "attempt" / "memtrack.json").read_text())["peak_bytes_per_rank"]
    assert peak["Gradient"] == peak["Parameter"]  # fp32 gradients of every weight, alive at the peak


def test_a_generous_memory_limit_does_not_get_in_the_way_and_memtrack_reports(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, run_config(steps=2, settings={"rank_memory_limit_mb": 2000}))
    proc = launch(run_dir, 0, "--attempt-dir", str(tmp_path / "attempt"), "--memtrack")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert records(tmp_path / "attempt" / "metrics.jsonl")[-1]["kind"] == "summary"
    tracked = json.loads((tmp_path / "attempt" / "memtrack.json").read_text())
    assert tracked["step"] == 3  # one extra, untimed step after the 2 timed ones
    (peak,) = tracked["peak_bytes_per_rank"]
    assert peak["Parameter"] == 4 * count_parameters(run_config().model).total  # fp32 weights, exactly
    assert peak["Optstate"] >= 2 * peak["Parameter"]  # AdamW: two moments per weight
