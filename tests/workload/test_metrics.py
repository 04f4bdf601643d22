"""metrics.jsonl records: the contract's fields, FLOPs from sweep.models.flops, the steady-state summary."""

from __future__ import annotations

import json
import statistics

import pytest

from sweep.core.catalog import get_model
from sweep.models.flops import flops_per_token_all
from sweep.workload.metrics import (
    MemorySample,
    MetricsWriter,
    RunFacts,
    core_time_s,
    step_record,
    summary_record,
)

FACTS = RunFacts(shape=get_model("tiny-4l"), seq_len=64, tokens_per_step=256, world_size=2,
                 peak_flops=1e11, peak_flops_source="measured:cpu-matmul-fp32", mem_source="cpu-rss-anon")
TIMES = [0.9, 0.21, 0.2, 0.23, 0.19]


def steps() -> list[dict]:
    return [step_record(FACTS, i + 1, t, 7.0 - 0.1 * i,
                        [MemorySample(100 + i, 200 + i), MemorySample(150, 90)], now=1000.0 + i)
            for i, t in enumerate(TIMES)]


def test_a_step_record_derives_throughput_and_mfu_from_one_formula() -> None:
    record = steps()[1]
    flops = flops_per_token_all(FACTS.shape, 64)
    assert record["flops_per_token"] == flops
    assert record["tokens_per_sec"] == 256 / 0.21
    assert record["tokens_per_sec_per_gpu"] == 256 / 0.21 / 2
    for name, value in flops.items():
        assert record["mfu"][name] == pytest.approx(256 / 0.21 / 2 * value / 1e11, rel=1e-12)
    assert record["mfu_pct"] == 100 * record["mfu"]["full_attention"]


def test_a_step_record_reports_the_max_over_ranks_and_each_rank() -> None:
    record = steps()[1]
    assert record["mem_allocated_bytes"] == 150 and record["mem_reserved_bytes"] == 201
    assert record["mem_per_rank"] == [
        {"rank": 0, "allocated_bytes": 101, "reserved_bytes": 201, "outside_allocator_bytes": None,
         "alloc_retries": None},
        {"rank": 1, "allocated_bytes": 150, "reserved_bytes": 90, "outside_allocator_bytes": None,
         "alloc_retries": None}]
    assert record["mem_outside_allocator_bytes"] is None  # not measured (CPU)


def test_memory_outside_the_allocator_is_the_max_over_the_ranks_that_measured_it() -> None:
    ranks = [MemorySample(1, 2, 1_300_000_000), MemorySample(1, 2, None), MemorySample(1, 2, 1_250_000_000)]
    record = step_record(FACTS, 1, 0.5, 7.0, ranks, now=0.0)
    assert record["mem_outside_allocator_bytes"] == 1_300_000_000
    later = step_record(FACTS, 2, 0.5, 7.0, [MemorySample(1, 2, 1_400_000_000)], now=1.0)
    summary = summary_record(FACTS, [record, later], 1, ended_by="step_budget", device="cuda:0",
                             torch_version="x")
    assert summary["mem_outside_allocator_bytes"] == 1_400_000_000


def test_the_allocator_s_retries_are_the_max_over_ranks_and_steps() -> None:
    """The count is cumulative per rank: the run's figure is the largest any rank reached."""
    first = step_record(FACTS, 1, 0.5, 7.0, [MemorySample(1, 2, None, 0), MemorySample(1, 2, None, 2)], now=0.0)
    later = step_record(FACTS, 2, 0.5, 7.0, [MemorySample(1, 2, None, 1), MemorySample(1, 2, None, 2)], now=1.0)
    assert first["mem_alloc_retries"] == 2
    summary = summary_record(FACTS, [first, later], 1, ended_by="step_budget", device="cuda:0",
                             torch_version="x")
    assert summary["mem_alloc_retries"] == 2


def test_the_summary_skips_warmup_and_uses_the_sample_std() -> None:
    summary = summary_record(FACTS, steps(), 1, ended_by="step_budget", device="cpu", torch_version="x")
    steady = TIMES[1:]
    assert summary["step_time_mean_s"] == statistics.fmean(steady)
    assert summary["step_time_std_s"] == statistics.stdev(steady)  # ddof=1
    assert summary["step_time_n"] == 4 and summary["warmup_steps_skipped"] == 1
    assert summary["tokens_per_sec"] == 256 / statistics.fmean(steady)
    assert summary["steady_state_policy"] == "skip first 1 steps; mean/std (ddof=1) over steps 2..5"
    assert summary["final_loss"] == steps()[-1]["loss"]
    assert summary["mem_reserved_bytes"] == 204


def test_a_single_steady_step_has_no_std() -> None:
    summary = summary_record(FACTS, steps()[:2], 1, ended_by="step_budget", device="cpu", torch_version="x")
    assert summary["step_time_n"] == 1 and summary["step_time_std_s"] is None
    json.dumps(summary, allow_nan=False)  # valid JSON, no NaN


def test_the_writer_appends_whole_lines_readable_at_once(tmp_path) -> None:
    writer = MetricsWriter(tmp_path / "attempt" / "metrics.jsonl")
    for count, record in enumerate(steps(), start=1):
        writer.write(record)
        lines = (tmp_path / "attempt" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == count and json.loads(lines[-1])["step"] == count
    writer.close()
    assert writer.seconds > 0


def test_on_cpu_mfu_counts_the_step_time_less_the_wait_for_a_core_and_tokens_per_sec_the_wall() -> None:
    """A neighbour that holds a core for 0.1 s of a 0.3 s step slows the run, not its use of the
    cores it had: tokens/s falls with the wall time, MFU does not."""
    flops = flops_per_token_all(FACTS.shape, 64)["full_attention"]
    loaded = step_record(FACTS, 1, 0.3, 7.0, [MemorySample(1, 2)], now=0.0, cpu_wait_s=0.1)
    quiet = step_record(FACTS, 1, 0.2, 7.0, [MemorySample(1, 2)], now=0.0, cpu_wait_s=0.0)
    assert loaded["tokens_per_sec"] == 256 / 0.3
    assert loaded["mfu"]["full_attention"] == pytest.approx(256 / 0.2 / 2 * flops / 1e11, rel=1e-12)
    assert loaded["mfu"] == pytest.approx(quiet["mfu"], rel=1e-12)
    assert loaded["mfu_time_basis"].startswith("on-core")
    summary = summary_record(FACTS, [quiet, loaded, loaded], 1, ended_by="step_budget", device="cpu",
                             torch_version="x")
    assert summary["cpu_wait_mean_s"] == pytest.approx(0.1)
    assert summary["mfu"]["full_attention"] == pytest.approx(loaded["mfu"]["full_attention"], rel=1e-12)


def test_without_a_wait_count_mfu_is_over_the_wall_time_and_says_so() -> None:
    record = steps()[1]
    assert record["cpu_wait_s"] is None and record["mfu_time_basis"] == "wall"
    summary = summary_record(FACTS, steps(), 1, ended_by="step_budget", device="cpu", torch_version="x")
    assert summary["cpu_wait_mean_s"] is None and summary["mfu_time_basis"] == "wall"


def test_a_wait_as_long_as_the_step_is_a_count_that_straddled_it_and_leaves_the_wall_time() -> None:
    assert core_time_s(0.3, 0.3) == core_time_s(0.3, 0.5) == 0.3
    assert core_time_s(0.3, 0.1) == pytest.approx(0.2) and core_time_s(0.3, None) == 0.3
