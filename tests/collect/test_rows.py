"""Pure row builders: steady-state statistics and MFU columns, nothing rounded."""

from __future__ import annotations

import statistics

import pytest

from sweep.collect.rows import dense_peak, mfu_columns, mfu_rate_per_gpu, provenance_columns, step_statistics
from sweep.core import catalog
from sweep.models import flops


def steps(times: list[float], **extra: float) -> list[dict]:
    return [{"step": i + 1, "step_time_s": t, **extra} for i, t in enumerate(times)]


def test_warm_up_is_skipped_by_step_number_and_std_is_the_sample_std() -> None:
    records = steps([9.0, 5.0, 1.0, 1.2, 0.8])[::-1]  # order on disk does not matter
    row = step_statistics(records, warmup=2, global_batch_tokens=4096, world_size=4)
    assert row["step_time_n"] == 3 and row["step_time_mean_s"] == statistics.fmean([1.0, 1.2, 0.8])
    assert row["step_time_std_s"] == statistics.stdev([1.0, 1.2, 0.8])
    assert row["tokens_per_sec"] == 4096 / row["step_time_mean_s"]
    assert row["tokens_per_sec_per_gpu"] == row["tokens_per_sec"] / 4
    assert row["steady_state_policy"] == "skip the first 2 steps; mean and std (ddof=1) over steps 3..5"


def test_one_steady_step_has_no_std_and_none_has_no_figures() -> None:
    one = step_statistics(steps([3.0, 1.0]), warmup=1, global_batch_tokens=10, world_size=1)
    assert one["step_time_n"] == 1 and one["step_time_std_s"] is None
    none = step_statistics(steps([3.0, 1.0]), warmup=5, global_batch_tokens=10, world_size=1)
    assert none["step_time_n"] == 0 and "step_time_mean_s" not in none and "tokens_per_sec" not in none


def test_frameworks_that_log_only_rates_keep_their_mean_rate() -> None:
    records = [{"step": s, "tokens_per_sec_per_gpu": v} for s, v in ((1, 10.0), (2, 100.0), (3, 110.0))]
    row = step_statistics(records, warmup=1, global_batch_tokens=None, world_size=8)
    assert row["tokens_per_sec_per_gpu"] == 105.0 and row["tokens_per_sec"] == 840.0


def test_mfu_divides_by_the_dense_catalog_peak_under_every_convention() -> None:
    shape = catalog.get_model("playbook-8b")
    peak = dense_peak("H100", "bf16")
    assert peak == (989.5e12, "catalog:h100-sxm:bf16")  # dense, not the 1979 sparse figure
    row = mfu_columns(shape, 4096, 7503.28, peak)
    for convention in flops.CONVENTIONS:
        assert row[f"mfu_{convention}"] == 7503.28 * flops.flops_per_token(shape, 4096, convention) / 989.5e12
    assert dense_peak("cpu", "fp32") is None  # no catalog peak: the workload measures one
    assert "mfu_6N" not in mfu_columns(shape, 4096, None, peak)


def test_provenance_from_env_json_marks_a_dirty_checkout() -> None:
    env = {"harness": {"version": "0.1.0", "git": {"sha": "abc", "dirty": True}},
           "framework": {"git": {"sha": "def", "dirty": False}},
           "packages": {"torch": "2.6.0", "nanotron": "0.4"},
           "python": "3.11.7", "hostname": "gpu01"}
    assert provenance_columns(env, "nanotron") == {
        "harness_version": "0.1.0", "harness_git_sha": "abc-dirty", "framework_version": "0.4 @ def",
        "torch_version": "2.6.0", "python_version": "3.11.7", "hostname": "gpu01"}
    assert provenance_columns({}, "builtin")["harness_git_sha"] is None


def test_cpu_steps_that_waited_for_a_core_give_mfu_over_their_on_core_time() -> None:
    steps = [{"step": s, "step_time_s": t, "tokens": 100, "cpu_wait_s": w}
             for s, t, w in [(1, 9.0, 0.0), (2, 0.3, 0.1), (3, 0.5, 0.3)]]
    row = step_statistics(steps, warmup=1, global_batch_tokens=100, world_size=2)
    assert row["cpu_wait_mean_s"] == pytest.approx(0.2)
    assert row["mfu_time_basis"].startswith("on-core")
    assert row["tokens_per_sec_per_gpu"] == pytest.approx(200 / 0.8 / 2)  # wall clock
    assert mfu_rate_per_gpu(row) == pytest.approx(200 / 0.4 / 2)  # on-core


def test_steps_without_a_wait_count_keep_the_wall_clock_rate_for_mfu() -> None:
    steps = [{"step": s, "step_time_s": 0.5, "tokens": 100} for s in (1, 2, 3)]
    row = step_statistics(steps, warmup=1, global_batch_tokens=100, world_size=1)
    assert "cpu_wait_mean_s" not in row
    assert mfu_rate_per_gpu(row) == row["tokens_per_sec_per_gpu"] == pytest.approx(200)
