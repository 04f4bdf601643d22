"""The CPU peak: measured with the run's ranks and threads, the best of several trials, once per
host and shape per sweep, and shared by its runs, so the MFU of two runs divides by the same
number; the sweep uses the larger of its measurement and the host record, which only ever rises.
Real worker processes, real load, real runs (torchrun), real files. The host records go to a
folder of each test (tests/conftest.py, `cpu_peak_cache`), never to ~/.cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep.core.state import read_jsonl
from sweep.workload.peak import (
    HOST_CACHE_ENV,
    cpu_threads_per_rank,
    ensure_cpu_peak,
    host_peak_cache,
    host_record_file,
    measure_cpu_peak,
    peak_file,
    raise_host_record,
    read_host_record,
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
    assert "the best of this sweep's trials" in source and "no host record yet" in source
    assert "a measured CPU peak, not a datasheet figure" in source
    assert "this sweep's trials used" in source
    assert "the host record used" in peak.source(host_record=2 * peak.per_rank)


def test_a_sweep_measures_a_shape_once_and_records_how(tmp_path: Path) -> None:
    value, source = ensure_cpu_peak(tmp_path, "fp32", 1, 2, measured_by="test", trials=2, trial_s=0.05)
    path = peak_file(tmp_path, "fp32", 1, 2)
    stored = json.loads(path.read_text())
    assert (stored["ranks_per_node"], stored["threads_per_rank"]) == (1, 2)
    assert stored["worker_threads"] == [2] and len(stored["trials_flops_per_rank"]) == 2
    assert value == max(stored["trials_flops_per_rank"]) and source.startswith("measured:")
    assert path.name in source and stored["measured_by"] == "test"
    # the first sweep on this host: no host record before, the measurement becomes it
    assert stored["host_record_before"] is None and stored["peak_from"] == "this sweep's measurement"
    assert read_host_record(host_record_file(path.name))["peak_flops"] == value
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



def test_the_host_records_live_in_the_test_s_folder_and_default_to_the_user_cache(
        cpu_peak_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert host_peak_cache() == cpu_peak_cache  # never the real ~/.cache in tests
    monkeypatch.delenv(HOST_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert host_peak_cache() == tmp_path / "xdg" / "llm-sweep" / "cpu-peaks"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert host_peak_cache() == tmp_path / "home" / ".cache" / "llm-sweep" / "cpu-peaks"


def test_the_host_record_rises_and_never_falls(tmp_path: Path) -> None:
    path = host_record_file(peak_file(tmp_path, "fp32", 2, 1).name)
    assert raise_host_record(path, 3.0e10, "first") == (None, read_host_record(path))
    before, after = raise_host_record(path, 5.0e10, "higher")
    assert before is not None and before["peak_flops"] == 3.0e10 and after["peak_flops"] == 5.0e10
    before, after = raise_host_record(path, 4.0e10, "lower")  # a sweep under load
    assert before == after and after["peak_flops"] == 5.0e10 and after["source"] == "higher"
    assert [h["peak_flops"] for h in after["history"]] == [3.0e10, 5.0e10]
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, f".{path.name}.lock"])
    # and through sweeps: a later sweep's lower measurement leaves the record as it was
    sweep_dir = tmp_path / "sweep"
    high = 1.0e15  # no CPU of today does this per rank
    record = host_record_file(peak_file(sweep_dir, "fp32", 1, 1).name)
    raise_host_record(record, high, "an earlier sweep")
    value, _ = ensure_cpu_peak(sweep_dir, "fp32", 1, 1, measured_by="test", trials=2, trial_s=0.05)
    assert value == high and read_host_record(record)["peak_flops"] == high


BUSY = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end:\n    pass\n"


def test_a_sweep_under_load_uses_the_host_s_earlier_higher_peak(tmp_path: Path) -> None:
    """A quiet sweep measures; a second sweep starts beside two busy processes (one per core of
    the shape) and measures less, but uses the host record the first set, and says so."""
    threads = cpu_threads_per_rank(1)
    quiet_value, _ = ensure_cpu_peak(tmp_path / "quiet", "fp32", 1, threads, measured_by="quiet",
                                     trials=3, trial_s=0.1)
    load = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(max(2, threads))]
    try:
        time.sleep(0.3)
        loaded_value, source = ensure_cpu_peak(tmp_path / "loaded", "fp32", 1, threads,
                                               measured_by="loaded", trials=3, trial_s=0.1)
    finally:
        for process in load:
            process.kill()
        for process in load:
            process.wait()
    stored = json.loads(peak_file(tmp_path / "loaded", "fp32", 1, threads).read_text())
    measured = stored["measured_peak_flops"]
    assert measured == max(stored["trials_flops_per_rank"])
    assert stored["host_record_before"]["peak_flops"] == quiet_value
    assert loaded_value == stored["peak_flops"] == max(quiet_value, measured) >= quiet_value
    if measured < quiet_value:  # the load slowed the trials, as it does on a shared machine
        assert stored["peak_from"] == "the host record" and "the host record used" in source
    record = read_host_record(host_record_file(peak_file(tmp_path, "fp32", 1, threads).name))
    assert record is not None and record["peak_flops"] == loaded_value


WRITER = """
import sys
import time
from pathlib import Path
from sweep.workload.peak import raise_host_record
path, values = Path(sys.argv[1]), [float(v) for v in sys.argv[2].split(",")]
time.sleep(max(0.0, float(sys.argv[4]) - time.time()))  # both writers start together
for value in values:
    raise_host_record(path, value, f"writer {sys.argv[3]}: {value}")
"""


def test_two_concurrent_writers_keep_the_max(tmp_path: Path, repo_root: Path) -> None:
    path = host_record_file("host-fp32-2x1.json")
    # interleaved, each rising and falling; writer b holds the largest value, in the middle
    a = [1e9 * (v + i) for i in range(30) for v in (5, 1, 9, 2, 40, 3, 17, 8, 30, 6)]
    b = [1e9 * (v + i) for i in range(30) for v in (7, 2, 11, 1, 41, 4, 16, 9, 29, 5)]
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    start = repr(time.time() + 3.0)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path),
                                 ",".join(map(repr, values)), name, start], env=env, cwd=repo_root)
               for name, values in (("a", a), ("b", b))]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    record = read_host_record(path)
    assert record is not None and record["peak_flops"] == 70e9 and record["source"] == "writer b: 70000000000.0"
    history = [h["peak_flops"] for h in record["history"]]
    assert history == sorted(history) and len(set(history)) == len(history)  # only ever rose
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_sweep_folder_records_the_used_value_and_both_sources(tmp_path: Path) -> None:
    path = peak_file(tmp_path, "fp32", 2, 1)
    record_path = host_record_file(path.name)
    raise_host_record(record_path, 1.0e15, "an earlier sweep on this host, by the test")
    value, source = ensure_cpu_peak(tmp_path, "fp32", 2, 1, measured_by="test", trials=2, trial_s=0.05)
    stored = json.loads(path.read_text())
    assert (value, source) == (stored["peak_flops"], stored["source"]) == (1.0e15, source)
    assert stored["peak_from"] == "the host record" and "larger" in stored["rule"]
    assert 0 < stored["measured_peak_flops"] == max(stored["trials_flops_per_rank"]) < value
    assert stored["host_record_file"] == str(record_path)
    assert stored["host_record_before"]["peak_flops"] == 1.0e15
    assert stored["host_record_before"]["source"] == "an earlier sweep on this host, by the test"
    assert stored["host_record_after"] == stored["host_record_before"]
    assert "host record 1e+06 GFLOP/s per rank" in source and "the host record used" in source
    assert "a measured CPU peak, not a datasheet figure" in source and path.name in source
    assert f"{stored['measured_peak_flops'] / 1e9:.4g} GFLOP/s per rank" in source
