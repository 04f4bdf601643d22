"""The raise rule (sweep.collect.cpu_peaks): a run faster than its host's measured CPU peak raises
the sweep's peak for every run on that host and shape, at collect, so no MFU in runs.parquet
exceeds 1; what was raised and why is in the rows and in <sweep>/peaks/raised.json, and the
host record rises with it (in the test's own folder, tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sweep.collect.attempts import update_runs
from sweep.collect.schema import CONVENTIONS
from sweep.core import catalog
from sweep.core.layout import Layout
from sweep.core.runconfig import RunConfig
from sweep.core.state import METRICS_FILE, RUN_FILE, STATUS_FILE, atomic_write_json
from sweep.models import flops
from sweep.workload.peak import host_record_file, raise_host_record, read_host_record

SHAPE = catalog.get_model("tiny-4l")
MEASURED = 2.0e10
SOURCE = ("measured:cpu-matmul-fp32 best of 5 trials, 2 ranks × 1 threads at once on host "
          "(a measured CPU peak, not a datasheet figure; peaks/host-fp32-2x1.json)")


def mfu_columns(row: dict[str, Any]) -> list[float]:
    return [row[f"mfu_{c}"] for c in CONVENTIONS] + [row["mfu_reported"]]


def write_cpu_run(sweep_dir: Path, tp: int, mfu: float) -> str:
    """A completed 2-rank CPU run whose summary says MFU `mfu` against the measured peak."""
    layout = Layout(dp=2 // tp, tp=tp, pp=1, mbs=2, grad_acc=1, sp=tp > 1)
    config = RunConfig(sweep="cpu", framework="builtin", model=SHAPE, layout=layout, nodes=1,
                       gpus_per_node=2, gpu="cpu", dtype="fp32", seq_len=128,
                       global_batch_sequences=layout.sequences_per_step,
                       settings={"steps": 4, "warmup_steps": 1})
    run_dir = sweep_dir / "runs" / config.run_id
    atomic_write_json(run_dir / RUN_FILE, config.to_json())
    attempt = run_dir / "attempts" / "1"
    attempt.mkdir(parents=True)
    per_token = flops.flops_per_token(SHAPE, 128)
    per_gpu = mfu * MEASURED / per_token
    tokens = config.global_batch_sequences * 128
    step_time = tokens / (per_gpu * 2)
    summary = {"kind": "summary", "steps": 4, "warmup_steps_skipped": 1,
               "step_time_mean_s": step_time, "step_time_std_s": 0.0, "step_time_n": 3,
               "tokens_per_sec": per_gpu * 2, "tokens_per_sec_per_gpu": per_gpu,
               "mfu_pct": 100 * mfu, "peak_flops": MEASURED, "peak_flops_source": SOURCE,
               "mem_allocated_bytes": 1e8, "mem_reserved_bytes": 1e8, "mem_source": "cpu-rss-anon",
               "ended_by": "step_budget", "final_loss": 5.0, "device": "cpu", "world_size": 2}
    steps = [{"kind": "step", "step": i, "time": 1000.0 + i, "step_time_s": step_time,
              "tokens": tokens, "loss": 6.0 - i, "mfu_pct": 100 * mfu} for i in range(1, 5)]
    (attempt / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in [*steps, summary]))
    atomic_write_json(attempt / STATUS_FILE, {"outcome": "completed", "reason": "step_budget",
                                              "rule": "exit0", "started_at": 1000.0,
                                              "ended_at": 1010.0, "hostname": "host"})
    return f"runs/{config.run_id}/attempts/1"


def test_a_run_faster_than_the_measured_peak_raises_it_for_every_run_of_the_sweep(tmp_path: Path) -> None:
    fast = write_cpu_run(tmp_path, tp=1, mfu=1.6)  # the "impossible" run
    slow = write_cpu_run(tmp_path, tp=2, mfu=0.4)
    result, out = update_runs(tmp_path)
    rows = {row["attempt_dir"]: row for row in pq.read_table(out).to_pylist()}
    raised = max(flops.flops_per_token_all(SHAPE, 128).values()) / flops.flops_per_token(SHAPE, 128) \
        * 1.6 * MEASURED  # the largest convention's achieved FLOP/s of the fast run
    for row in rows.values():
        assert row["peak_flops"] == pytest.approx(raised, rel=1e-12)
        assert row["peak_flops_raised_from"] == MEASURED
        assert row["peak_flops_source"].startswith(SOURCE + " | raised at collect to ")
        assert fast in row["peak_flops_source"] and "measured" in row["peak_flops_source"]
        assert max(mfu_columns(row)) <= 1.0
    assert rows[fast]["peak_exceeded"] is True and rows[slow]["peak_exceeded"] is False
    assert max(mfu_columns(rows[fast])) == 1.0
    assert rows[slow]["mfu_full_attention"] == pytest.approx(0.4 * MEASURED / raised, rel=1e-12)
    assert rows[slow]["mfu_reported"] == pytest.approx(0.4 * MEASURED / raised, rel=1e-9)
    record = json.loads((tmp_path / "peaks" / "raised.json").read_text())
    (peak,) = record["peaks"]
    assert peak["raised"] and peak["raised_by"] == fast and peak["exceeded_by"] == [fast]
    assert peak["measured_peak_flops"] == MEASURED and "above the measured peak" in peak["why"]
    assert result.raised_peaks == record["peaks"]
    # a run proved the host can do that much: the host record of that host and shape rose to it
    host = read_host_record(host_record_file("host-fp32-2x1.json"))
    assert host is not None and host["peak_flops"] == pytest.approx(raised, rel=1e-12)
    assert fast in host["source"] and host["source"].startswith("achieved at collect by ")
    assert peak["host_record"] == {"file": str(host_record_file("host-fp32-2x1.json")),
                                   "peak_flops_before": None, "peak_flops_after": host["peak_flops"]}
    # collecting again reuses the rows and applies the rule from the measured peak: the same table
    again, _ = update_runs(tmp_path)
    assert again.reused == 2
    assert {r["attempt_dir"]: r for r in pq.read_table(out).to_pylist()} == rows
    assert read_host_record(host_record_file("host-fp32-2x1.json")) == host  # it only rises


def test_a_raise_below_the_host_record_leaves_it(tmp_path: Path) -> None:
    path = host_record_file("host-fp32-2x1.json")
    raise_host_record(path, 1.0e15, "an earlier sweep")
    write_cpu_run(tmp_path, tp=1, mfu=1.6)
    result, _ = update_runs(tmp_path)
    (peak,) = result.raised_peaks
    assert peak["raised"] and peak["host_record"]["peak_flops_before"] == 1.0e15
    assert read_host_record(path)["peak_flops"] == peak["host_record"]["peak_flops_after"] == 1.0e15


def test_a_measured_peak_no_run_beat_stands(tmp_path: Path) -> None:
    write_cpu_run(tmp_path, tp=1, mfu=0.5)
    update_runs(tmp_path)
    (row,) = pq.read_table(tmp_path / "runs.parquet").to_pylist()
    assert row["peak_flops"] == MEASURED and row["peak_flops_source"] == SOURCE
    assert row["peak_flops_raised_from"] is None and row["peak_exceeded"] is False
    assert row["mfu_full_attention"] == pytest.approx(0.5, rel=1e-12)
    assert json.loads((tmp_path / "peaks" / "raised.json").read_text())["peaks"][0]["raised"] is False


def test_real_runs_beating_a_stored_peak_raise_it_and_no_mfu_exceeds_one(tmp_path: Path,
                                                                        repo_root: Path) -> None:
    """Two real runs of the demo (2 ranks, gloo on CPU) through the local backend, in a sweep
    whose stored peak is far below what the host does; then `sweep collect`."""
    import pandas as pd

    from sweep.backends.local import backend
    from sweep.cli import main
    from sweep.plan import space
    from sweep.plan.render import render_runs
    from sweep.plan.spec import load_spec
    from sweep.workload.peak import cpu_threads_per_rank, peak_file, store_peak

    spec = load_spec(repo_root / "examples" / "local-cpu.yaml")
    plan = space.plan(spec)
    pick = plan[(plan.nodes == 1) & (plan.model == "tiny-4l") & (plan.pp == 1)]
    run_dirs = render_runs(spec, pd.DataFrame(pick), tmp_path)
    assert len(run_dirs) == 2  # DP2 and TP2
    path = peak_file(tmp_path, "fp32", 2, cpu_threads_per_rank(2))
    low = store_peak(path, 1.0e6, f"measured:cpu-matmul-fp32 (stored low by the test; peaks/{path.name})")
    results = backend.run_local(run_dirs, slots=2)
    assert [r.state for r in results] == ["COMPLETED", "COMPLETED"]
    assert main(["collect", str(tmp_path)]) == 0
    rows = pq.read_table(tmp_path / "runs.parquet").to_pylist()
    assert len(rows) == 2
    peaks = {row["peak_flops"] for row in rows}
    assert len(peaks) == 1 and peaks.pop() > low[0]  # one raised peak for the sweep
    for row in rows:
        assert row["peak_flops_raised_from"] == low[0] and row["peak_exceeded"] is True
        assert row["peak_flops_source"].startswith("measured:cpu-matmul-fp32")
        assert "raised at collect" in row["peak_flops_source"]
        assert max(mfu_columns(row)) <= 1.0
    assert max(max(mfu_columns(row)) for row in rows) == 1.0  # the fastest run set the peak
    assert (tmp_path / "peaks" / "raised.json").exists()
    host = read_host_record(host_record_file(path.name))  # the host record rose to the fastest run
    assert host is not None and host["peak_flops"] == rows[0]["peak_flops"]
