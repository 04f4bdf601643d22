"""What a tracker receives of an attempt, the same for every tracker: parameters, metrics, tags,
step series and files, and the fingerprint that lets a second export skip it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.export.mlflow_tracker import MAX_ENTRIES, MAX_METRICS, MAX_PARAMS, batches
from sweep.export.records import FINGERPRINT_TAG, AttemptRecord, attempt_record, tags_of

ROW = {"sweep": "s", "run_id": "m-n1-abc", "attempt": 2, "attempt_dir": "runs/m-n1-abc/attempts/2",
       "dp": 2, "tp": 1, "sp": False, "model": "tiny-4l", "outcome": "oom", "rule": "cuda-oom",
       "evidence": ["torch.OutOfMemoryError: CUDA out of memory", "exit code node0=1"],
       "tokens_per_sec": None, "mfu_6N": float("nan"), "mem_allocated_bytes": 7.5e9,
       "settings_json": json.dumps({"steps": 3, "mem": "800M", "env": {"A": "1"}}),
       "node_list": "gpu[01-02]", "started_at": 100.0, "ended_at": 160.0}


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "m-n1-abc"
    (run / "attempts" / "2" / "logs").mkdir(parents=True)
    (run / "job.sbatch").write_text("#!/bin/bash\n")
    (run / "run.json").write_text("{}")
    (run / "attempts" / "2" / "logs" / "node0.out").write_text("step 1\n")
    (run / "attempts" / "2" / ".status.json.lock").write_text("")
    (run / "attempts" / "2" / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"kind": "step", "step": s, "step_time_s": 0.5 / s, "loss": 7.0 - s}) for s in (1, 2)) + "\n")
    return tmp_path


def test_an_attempt_carries_its_layout_settings_figures_outcome_series_and_files(sweep_dir: Path) -> None:
    record = attempt_record(ROW, sweep_dir)
    assert record.key == "s/m-n1-abc/2" and record.name == "m-n1-abc #2"
    assert record.params["dp"] == "2" and record.params["sp"] == "False"
    assert record.params["settings.mem"] == "800M" and record.params["settings.env"] == '{"A": "1"}'
    assert record.metrics == {"mem_allocated_bytes": 7.5e9}  # a missing or NaN figure is left out
    assert record.tags["evidence"] == "torch.OutOfMemoryError: CUDA out of memory\nexit code node0=1"
    assert record.series["step_time_s"] == ((1, 0.5), (2, 0.25)) and record.series["loss"][1] == (2, 5.0)
    assert [a.name for a in record.artifacts] == [
        "run/job.sbatch", "run/run.json", "attempt/logs/node0.out", "attempt/metrics.jsonl"]


def test_the_fingerprint_changes_with_what_is_sent_and_only_then(sweep_dir: Path) -> None:
    first = attempt_record(ROW, sweep_dir).fingerprint
    assert attempt_record(ROW, sweep_dir).fingerprint == first
    assert attempt_record({**ROW, "rule": "another"}, sweep_dir).fingerprint != first
    (sweep_dir / "runs" / "m-n1-abc" / "attempts" / "2" / "logs" / "node0.out").write_text("step 1\nstep 2\n")
    assert attempt_record(ROW, sweep_dir).fingerprint != first


def test_a_table_without_attempt_folders_still_gives_every_figure() -> None:
    record = attempt_record({**ROW, "attempt_dir": None}, Path("/nonexistent"))
    assert record.artifacts == () and record.series == {} and record.metrics
    assert tags_of({"outcome": "completed", "collect_issues": []}) == {"outcome": "completed"}


def test_mlflow_batches_keep_its_limits_and_send_the_fingerprint_last() -> None:
    series = {"step_time_s": tuple((s, 1.0) for s in range(2500))}
    params = {f"p{i}": "x" for i in range(150)}
    record = AttemptRecord("s", "r", 1, "attempt", params=params, series=series,
                           tags={f"t{i}": "v" for i in range(120)})
    calls = list(batches(record, {"p0": "x"}, {**record.all_tags, FINGERPRINT_TAG: record.fingerprint}))
    assert all(len(m) <= MAX_METRICS and len(p) <= MAX_PARAMS and len(m) + len(p) + len(t) <= MAX_ENTRIES
               for m, p, t in calls)
    assert sum(len(m) for m, _, _ in calls) == 2500 and sum(len(p) for _, p, _ in calls) == 149
    assert calls[-1][2][-1].key == FINGERPRINT_TAG
    assert all(t.key != FINGERPRINT_TAG for _, _, tags in calls[:-1] for t in tags)
