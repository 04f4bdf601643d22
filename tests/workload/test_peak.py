"""The CPU peak: measured with the run's ranks and threads, the best of several trials, once per
host and shape per sweep, and shared by its runs, so the MFU of two runs divides by the same
number. Real worker processes and real runs (torchrun), real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sweep.core.state import read_jsonl
from sweep.workload.peak import (
    cpu_threads_per_rank,
    ensure_cpu_peak,
    measure_cpu_peak,
    peak_file,
    read_stored_peak,
    store_peak,
)
from sweep.workload.train import sweep_dir_of
from tests.workload.runs import launch, run_config, write_run_dir


def test_the_peak_is_measured_by_one_process_per_rank_with_its_threads_and_is_the_best_trial() -> None:
    peak = measure_cpu_peak("fp32", ranks=2, threads=1, trials=3, trial_s=0.05)
    assert len(peak.trials) == 3 and all(value > 0 for value in peak.trials)
    assert peak.per_rank == max(peak.trials)  # the best trial, not the mean
    assert len(set(peak.worker_pids)) == 2 and os.getpid() not in peak.worker_pids
    assert peak.worker_threads == [1, 1]
    source = peak.source()
    assert source.startswith("measured:cpu-matmul-fp32 best of 3 trials, 2 ranks × 1 threads at once")
    assert "a measured CPU peak, not a datasheet figure" in source


def test_a_sweep_measures_a_shape_once_and_records_how(tmp_path: Path) -> None:
    value, source = ensure_cpu_peak(tmp_path, "fp32", 1, 2, measured_by="test", trials=2, trial_s=0.05)
    path = peak_file(tmp_path, "fp32", 1, 2)
    stored = json.loads(path.read_text())
    assert (stored["ranks_per_node"], stored["threads_per_rank"]) == (1, 2)
    assert stored["worker_threads"] == [2] and len(stored["trials_flops_per_rank"]) == 2
    assert value == max(stored["trials_flops_per_rank"]) and source.startswith("measured:")
    assert path.name in source and stored["measured_by"] == "test"
    # asked again (another run of the sweep): the stored peak, not a new measurement
    assert ensure_cpu_peak(tmp_path, "fp32", 1, 2, measured_by="again") == (value, source)
    assert json.loads(path.read_text())["measured_at"] == stored["measured_at"]


def test_the_first_stored_peak_wins_and_every_later_run_reads_it(tmp_path: Path) -> None:
    path = peak_file(tmp_path, "fp32", 2, 1)
    first = store_peak(path, 3.0e10, "measured:cpu-matmul-fp32")
    second = store_peak(path, 7.0e10, "measured:cpu-matmul-fp32")  # a later, noisier measure
    assert first == second == read_stored_peak(path)
    assert first[0] == 3.0e10
    assert list(path.parent.iterdir()) == [path]  # no temp files left


def test_a_peak_is_kept_per_dtype_and_shape(tmp_path: Path) -> None:
    assert peak_file(tmp_path, "fp32", 2, 1) != peak_file(tmp_path, "bf16", 2, 1)
    assert peak_file(tmp_path, "fp32", 2, 1) != peak_file(tmp_path, "fp32", 1, 2)


def test_the_sweep_folder_is_found_from_an_attempt_folder(tmp_path: Path) -> None:
    attempt = tmp_path / "sweep" / "runs" / "r1" / "attempts" / "3"
    attempt.mkdir(parents=True)
    assert sweep_dir_of(attempt) == (tmp_path / "sweep").resolve()
    elsewhere = tmp_path / "by-hand"
    elsewhere.mkdir()
    assert sweep_dir_of(elsewhere) == elsewhere.resolve()


def test_a_two_rank_run_measures_with_two_ranks_and_a_later_run_reuses_the_stored_peak(
        tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    summaries = []
    for layout in ({"dp": 2}, {"tp": 2}):
        run_dir = write_run_dir(sweep / "runs", run_config(steps=2, warmup_steps=1, **layout))
        attempt = run_dir / "attempts" / "1"
        proc = launch(run_dir, 2, env={"SWEEP_ATTEMPT_DIR": str(attempt)})
        assert proc.returncode == 0, proc.stderr[-4000:]
        summaries.append(list(read_jsonl(attempt / "metrics.jsonl"))[-1])
    (path,) = (sweep / "peaks").glob("*.json")
    stored = json.loads(path.read_text())
    assert stored["ranks_per_node"] == 2 and stored["threads_per_rank"] == cpu_threads_per_rank(2)
    assert len(stored["worker_pids"]) == 2 and stored["worker_threads"] == [cpu_threads_per_rank(2)] * 2
    assert stored["peak_flops"] == max(stored["trials_flops_per_rank"])
    first = run_config(steps=2, warmup_steps=1, dp=2).run_id
    assert stored["measured_by"] == f"run {first}, before its first step"
    for summary in summaries:  # the second run divided by the peak the first stored
        assert (summary["peak_flops"], summary["peak_flops_source"]) == (stored["peak_flops"],
                                                                         stored["source"])
    assert "2 ranks × " in stored["source"] and "measured CPU peak" in stored["source"]

