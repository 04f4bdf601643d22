"""`sweep collect`: real attempt folders on disk → one runs.parquet row per attempt.

Every folder here is written with the project's own writers (RunConfig.to_json, atomic_write_json),
in the formats of the shared contracts (metrics.jsonl step/summary records, status.json).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

import sweep
from sweep.cli import main
from sweep.collect.attempts import collect_sweep, job_ids, read_runs
from sweep.core import catalog
from sweep.core.layout import Layout
from sweep.core.runconfig import RunConfig
from sweep.core.state import METRICS_FILE, RUN_FILE, STATUS_FILE, atomic_write_json
from sweep.core.units import GiB, MiB
from sweep.job import provenance
from sweep.models import flops

SHAPE = catalog.get_model("playbook-1b")
PEAK = 989.5e12  # catalog h100-sxm bf16


def make_config(dp: int = 8, mbs: int = 1, warmup: int = 3) -> RunConfig:
    layout = Layout(dp=dp, tp=1, pp=1, mbs=mbs, grad_acc=32 // (dp * mbs) or 1)
    return RunConfig(sweep="demo", framework="builtin", model=SHAPE, layout=layout, nodes=1,
                     gpus_per_node=8, gpu="h100-sxm", dtype="bf16", seq_len=4096,
                     global_batch_sequences=layout.sequences_per_step,
                     settings={"steps": 10, "warmup_steps": warmup}, spec_hash="spec123",
                     predicted={"mem_allocated_bytes": 2.9e10, "mem_reserved_bytes": 3.2e10,
                                "mem_total_bytes": 3.5e10, "mem_weights_bytes": 2.7e9})


def write_run(sweep_dir: Path, config: RunConfig) -> Path:
    run_dir = sweep_dir / "runs" / config.run_id
    atomic_write_json(run_dir / RUN_FILE, config.to_json())
    return run_dir


def step_record(step: int, step_time: float, tokens: int) -> dict[str, Any]:
    return {"kind": "step", "step": step, "time": 1000.0 + step, "step_time_s": step_time,
            "tokens": tokens, "tokens_per_sec": tokens / step_time,
            "tokens_per_sec_per_gpu": tokens / step_time / 8, "loss": 10.0 - step,
            "mem_allocated_bytes": 1e9 * step, "mem_reserved_bytes": 2e9 * step, "mem_source": "cuda"}


def write_attempt(run_dir: Path, number: int, *, times: list[float], tokens: int = 131072,
                  summary: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
                  env: dict[str, Any] | None = None, torn: bool = False) -> Path:
    attempt = run_dir / "attempts" / str(number)
    attempt.mkdir(parents=True)
    lines = [json.dumps(step_record(i + 1, t, tokens)) for i, t in enumerate(times)]
    if summary is not None:
        lines.append(json.dumps({"kind": "summary", **summary}))
    text = "\n".join(lines) + ("\n" if lines else "")
    if torn:
        text += '{"kind": "step", "step": 99, "step_ti'
    (attempt / METRICS_FILE).write_text(text)
    if status is not None:
        atomic_write_json(attempt / STATUS_FILE, status)
    if env is not None:
        atomic_write_json(attempt / "env.json", env)
    return attempt


def completed_status(run_id: str, attempt: int = 1) -> dict[str, Any]:
    return {"run_id": run_id, "attempt": attempt, "outcome": "completed", "reason": "step_budget",
            "rule": "exit0", "evidence": [], "last_step": 10, "exit_codes": {"node0": 0},
            "signals": [], "started_at": 1000.0, "ended_at": 1360.0, "node": "node1",
            "nodes": ["node1"], "slurm_job_id": "77_3", "hostname": "node1", "writer": "watchdog"}


SUMMARY = {"steps": 10, "warmup_steps_skipped": 3, "step_time_mean_s": 0.5, "step_time_std_s": 0.01,
           "step_time_n": 7, "tokens_per_sec": 262144.0, "tokens_per_sec_per_gpu": 32768.0,
           "mfu_pct": 100 * 32768.0 * 9664081920.0 / PEAK, "peak_flops": PEAK,
           "peak_flops_source": "catalog:h100-sxm:bf16", "mem_allocated_bytes": 3.0e10,
           "mem_reserved_bytes": 3.3e10, "mem_source": "cuda", "ended_by": "step_budget",
           "final_loss": 3.25, "device": "cuda", "world_size": 8, "torch_version": "2.13.0",
           "steady_state_policy": "skip first 3 steps; mean/std (ddof=1) over steps 4..10"}
# env.json as the job script writes it, by the real writer (this checkout's git state, packages)
ENV = provenance.collect(None, None, ["node1"], environ={
    "SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"})


def rows_by_dir(table) -> dict[str, dict[str, Any]]:
    return {row["attempt_dir"]: row for row in table.to_pylist()}


def test_completed_attempt_keeps_the_summary_and_recomputes_mfu_per_convention(tmp_path) -> None:
    config = make_config()
    run_dir = write_run(tmp_path, config)
    write_attempt(run_dir, 1, times=[0.5] * 10, summary=SUMMARY, status=completed_status(config.run_id),
                  env=ENV)
    result = collect_sweep(tmp_path)
    (row,) = result.table.to_pylist()
    assert row["outcome"] == "completed" and row["collect_issues"] == []
    assert row["run_id"] == config.run_id and row["dp"] == 8 and row["layout_label"].startswith("DP8")
    assert row["step_time_mean_s"] == 0.5 and row["step_time_n"] == 7
    assert row["metrics_source"] == "summary" and row["steps_recorded"] == 10
    for convention in flops.CONVENTIONS:
        per_token = flops.flops_per_token(SHAPE, 4096, convention)
        assert row[f"flops_per_token_{convention}"] == per_token
        assert row[f"mfu_{convention}"] == pytest.approx(32768.0 * per_token / PEAK, rel=1e-12)
    assert row["peak_flops_source"] == "catalog:h100-sxm:bf16"
    assert row["mfu_reported"] == pytest.approx(row["mfu_full_attention"], rel=1e-12)
    assert row["mem_reserved_bytes"] == 3.3e10 and row["mem_predicted_reserved_bytes"] == 3.2e10
    assert (row["mem_predicted_allocated_bytes"], row["mem_predicted_total_bytes"]) == (2.9e10, 3.5e10)
    assert json.loads(row["predicted_json"])["mem_weights_bytes"] == 2.7e9
    assert row["elapsed_s"] == 360.0 and row["gpu_hours"] == pytest.approx(360.0 * 8 / 3600)
    assert row["slurm_job_id"] == "77_3" and row["node_list"] == "node1"
    assert row["harness_version"] == sweep.__version__
    assert row["harness_git_sha"].startswith(ENV["harness"]["git"]["sha"])
    assert row["framework_version"] == f"llm-sweep {sweep.__version__}"
    assert row["torch_version"] == ENV["packages"]["torch"]  # the node's, not the summary's
    assert row["python_version"] == ENV["python"] and row["spec_hash"] == "spec123"


def test_truncated_metrics_without_status_are_recomputed_and_the_reason_recorded(tmp_path) -> None:
    run_dir = write_run(tmp_path, make_config())
    times = [2.0, 1.0, 0.9, 0.52, 0.48, 0.5]
    write_attempt(run_dir, 1, times=times, tokens=131072, torn=True)
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    assert row["outcome"] == "unknown" and row["status_source"] == "none"
    assert any("1 unreadable line" in issue for issue in row["collect_issues"])
    steady = times[3:]  # warm-up 3 skipped, by step number
    assert row["step_time_n"] == 3 and row["warmup_steps_skipped"] == 3
    assert row["step_time_mean_s"] == statistics.fmean(steady)
    assert row["step_time_std_s"] == statistics.stdev(steady)
    assert row["tokens_per_sec"] == 3 * 131072 / sum(steady)
    assert row["tokens_per_sec_per_gpu"] == row["tokens_per_sec"] / 8
    assert row["metrics_source"] == "steps" and row["last_step"] == 6
    assert row["mem_reserved_bytes"] == 12e9  # the largest step record
    assert "steps 4..6" in row["steady_state_policy"]


def test_a_corrupt_file_marks_its_row_and_the_other_attempts_still_collect(tmp_path) -> None:
    good = make_config(dp=8)
    bad = make_config(dp=4, mbs=2)
    write_attempt(write_run(tmp_path, good), 1, times=[0.5] * 10, summary=SUMMARY,
                  status=completed_status(good.run_id))
    bad_attempt = write_attempt(write_run(tmp_path, bad), 1, times=[0.5] * 2)
    (bad_attempt / STATUS_FILE).write_text('{"outcome": "comp')
    orphan = tmp_path / "runs" / "no-run-json" / "attempts" / "1"
    orphan.mkdir(parents=True)
    rows = rows_by_dir(collect_sweep(tmp_path).table)
    assert rows[f"runs/{good.run_id}/attempts/1"]["collect_issues"] == []
    broken = rows[f"runs/{bad.run_id}/attempts/1"]
    assert any(issue.startswith("status.json: unreadable") for issue in broken["collect_issues"])
    assert broken["outcome"] == "unknown"
    lost = rows["runs/no-run-json/attempts/1"]
    assert lost["run_id"] == "no-run-json" and lost["model"] is None
    assert any("run.json: missing" in issue for issue in lost["collect_issues"])


def test_a_killed_job_is_decided_by_slurm_accounting(tmp_path) -> None:
    config = make_config()
    run_dir = write_run(tmp_path, config)
    write_attempt(run_dir, 1, times=[0.5] * 5, env={"slurm_job_id": "501"})
    accounting = [{"JobID": "501", "State": "TIMEOUT", "NodeList": "node[1-2]", "ElapsedRaw": "1200",
                   "Start": "2026-01-01T10:00:00", "End": "2026-01-01T10:20:00"},
                  {"JobID": "501.batch", "State": "CANCELLED", "ElapsedRaw": "1201"}]
    (row,) = collect_sweep(tmp_path, accounting=accounting).table.to_pylist()
    assert row["outcome"] == "timeout"
    assert row["status_source"] == "sacct" and row["reason"] == "sacct:TIMEOUT (slurm_time_limit)"
    assert row["slurm_state"] == "TIMEOUT" and row["node_list"] == "node[1-2]"
    assert row["elapsed_s"] == 1200.0 and row["gpu_hours"] == pytest.approx(1200 * 8 / 3600)


def test_accounting_steps_count_an_oom_killed_step(tmp_path) -> None:
    run_dir = write_run(tmp_path, make_config())
    write_attempt(run_dir, 1, times=[0.5], env={"slurm_job_id": "9"})
    accounting = [{"JobID": "9", "State": "FAILED", "ExitCode": "1:0"},
                  {"JobID": "9.0", "State": "OUT_OF_MEMORY", "ExitCode": "0:125"}]
    (row,) = collect_sweep(tmp_path, accounting=accounting).table.to_pylist()
    assert row["outcome"] == "oom" and row["reason"].startswith("sacct:FAILED")


def test_node_files_decide_when_status_json_is_missing(tmp_path) -> None:
    run_dir = write_run(tmp_path, make_config())
    attempt = write_attempt(run_dir, 1, times=[0.5] * 2)
    atomic_write_json(attempt / "node0.json", {"outcome": "completed"})
    atomic_write_json(attempt / "node1.json", {"outcome": "oom", "reason": "cuda_oom",
                                               "evidence": ["torch.OutOfMemoryError: CUDA out of memory."]})
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    assert (row["outcome"], row["reason"], row["status_source"]) == ("oom", "cuda_oom", "node-files")
    assert row["evidence"] == ["torch.OutOfMemoryError: CUDA out of memory."]


LAUNCH_FAILED = "srun: error: Task launch for StepId=3131.0 failed on node node2: Communication connection failure"


def test_srun_blaming_a_node_beats_what_a_lone_watchdog_and_sacct_concluded(tmp_path) -> None:
    """As recorded on the local cluster: the step could not start on node2, node1's watchdog
    got the batch shell's USR1 and wrote only its own file, and sacct says FAILED 105:0."""
    run_dir = write_run(tmp_path, make_config())
    attempt = write_attempt(run_dir, 1, times=[], env={"slurm_job_id": "3131"})
    atomic_write_json(attempt / "node0.json", {"outcome": "timeout", "reason": "time_limit_signal",
                                               "hostname": "vm", "evidence": ["USR1"]})
    (attempt / "job.err").write_text(
        f"{LAUNCH_FAILED}\nsrun: error: Application launch failed: Communication connection failure\n"
        "slurmstepd-node1: error: *** STEP 3131.0 ON node1 CANCELLED AT 2026-11-23T23:27:42 ***\n")
    accounting = [{"JobID": "3131", "State": "FAILED", "ExitCode": "105:0", "DerivedExitCode": "0:105"},
                  {"JobID": "3131.0", "State": "CANCELLED by 0", "ExitCode": "0:105"}]
    (row,) = collect_sweep(tmp_path, accounting=accounting).table.to_pylist()
    assert (row["outcome"], row["reason"], row["status_source"]) == (
        "node_fail", "srun_step_launch_failed: node2", "srun")
    assert row["evidence"] == [LAUNCH_FAILED] and row["hostname"] == "vm"
    (attempt / "node0.json").unlink()  # no watchdog left a word at all: the same verdict
    (row,) = collect_sweep(tmp_path, accounting=accounting).table.to_pylist()
    assert (row["outcome"], row["status_source"]) == ("node_fail", "srun")
    # a merged verdict written before srun's line (a signal srun did not send) yields too ...
    atomic_write_json(attempt / "status.json", {"outcome": "cancelled", "reason": "sigterm_received"})
    (row,) = collect_sweep(tmp_path, accounting=accounting).table.to_pylist()
    assert (row["outcome"], row["status_source"]) == ("node_fail", "srun")
    # ... but a run that completed stays completed
    atomic_write_json(attempt / "status.json", completed_status(row["run_id"]))
    (row,) = collect_sweep(tmp_path, accounting=accounting).table.to_pylist()
    assert (row["outcome"], row["status_source"]) == ("completed", "status.json")


def test_collect_is_incremental_and_idempotent(tmp_path) -> None:
    configs = [make_config(dp=8), make_config(dp=4, mbs=2), make_config(dp=2, mbs=4)]
    attempts = []
    for config in configs:
        run_dir = write_run(tmp_path, config)
        attempts.append(write_attempt(run_dir, 1, times=[0.5] * 10, summary=SUMMARY,
                                      status=completed_status(config.run_id)))
    first = collect_sweep(tmp_path)
    assert (first.computed, first.reused) == (3, 0)
    second = collect_sweep(tmp_path, previous=first.table)
    assert (second.computed, second.reused) == (0, 3)
    assert second.table.equals(first.table)
    with open(attempts[1] / METRICS_FILE, "a") as handle:
        handle.write(json.dumps(step_record(11, 0.4, 131072)) + "\n")
    third = collect_sweep(tmp_path, previous=second.table)
    assert (third.computed, third.reused) == (1, 2)
    assert third.table.column("run_id").to_pylist() == sorted(c.run_id for c in configs)


def test_sweep_collect_command_writes_runs_parquet(tmp_path, capsys) -> None:
    config = make_config()
    write_attempt(write_run(tmp_path, config), 1, times=[0.5] * 10, summary=SUMMARY,
                  status=completed_status(config.run_id))
    assert main(["collect", str(tmp_path)]) == 0
    table = read_runs(tmp_path / "runs.parquet")
    assert table is not None and table.num_rows == 1
    assert "1 attempt" in capsys.readouterr().out
    assert main(["collect", str(tmp_path)]) == 0  # again: reused, same file content
    assert pq.read_table(tmp_path / "runs.parquet").equals(table)
    (tmp_path / "runs.parquet").write_bytes(b"PAR1 torn")  # a crash mid-write: start afresh
    assert main(["collect", str(tmp_path)]) == 0
    assert pq.read_table(tmp_path / "runs.parquet").num_rows == 1
    assert main(["collect", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def framework_config(framework: str, dp: int, world: int) -> RunConfig:
    layout = Layout(dp=dp, tp=world // dp, pp=1, mbs=1, grad_acc=1, zero_stage=1)
    return RunConfig(sweep="demo", framework=framework, model=SHAPE, layout=layout, nodes=1,
                     gpus_per_node=world, gpu="h100-sxm", dtype="bf16", seq_len=4096,
                     global_batch_sequences=layout.sequences_per_step,
                     settings={"steps": 30, "warmup_steps": 3})


def copy_log(refdata: Path, name: str, attempt: Path) -> None:
    """A real published log (its #SOURCE header kept) as the node-0 output of an attempt."""
    (attempt / "logs").mkdir(parents=True)
    (attempt / "logs" / "node0.out").write_bytes((refdata / "logs" / name).read_bytes())


def test_a_nanotron_attempt_is_measured_from_its_real_log(tmp_path, refdata) -> None:
    from sweep.frameworks import get_parser

    config = framework_config("nanotron", dp=2, world=2)
    attempt = write_run(tmp_path, config) / "attempts" / "1"
    copy_log(refdata, "nanotron_steps_1.log", attempt)
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    parsed = get_parser("nanotron").parse_file(attempt / "logs" / "node0.out")
    steady = [s.step_time_s for s in parsed.steps if s.step > 3]
    assert row["parser"] == f"log:nanotron@{parsed.format_version}" == "log:nanotron@nanotron-2024"
    assert row["step_time_n"] == len(steady) and row["step_time_mean_s"] == statistics.fmean(steady)
    assert row["step_time_std_s"] == statistics.stdev(steady)
    assert row["tokens_per_sec"] == 2 * 4096 / statistics.fmean(steady)
    assert row["mem_reserved_bytes"] == parsed.peak_mem_reserved_bytes and row["mem_source"] == "log"
    assert row["last_step"] == parsed.last_step
    # The log ran 4 sequences per step (its global_batch_size), run.json says 2: collect says so.
    assert parsed.steps[-1].global_batch_size == 4
    assert any("does the run's batch match run.json" in issue for issue in row["collect_issues"])


def test_a_torchtitan_attempt_keeps_its_logged_rates_and_mfu(tmp_path, refdata) -> None:
    from sweep.frameworks import get_parser

    config = framework_config("torchtitan", dp=8, world=8)
    attempt = write_run(tmp_path, config) / "attempts" / "1"
    copy_log(refdata, "torchtitan_steps_4.log", attempt)
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    parsed = get_parser("torchtitan").parse_file(attempt / "logs" / "node0.out")
    kept = [s for s in parsed.steps if s.step > 3]
    assert row["step_time_n"] == 0 and row["step_time_mean_s"] is None  # not logged
    assert row["tokens_per_sec_per_gpu"] == statistics.fmean(s.tokens_per_sec_per_gpu for s in kept)
    assert row["mfu_reported"] == statistics.fmean(s.mfu_pct for s in kept) / 100
    assert row["mfu_reported_convention"] == "torchtitan-log"
    assert row["mfu_full_attention"] == pytest.approx(
        row["tokens_per_sec_per_gpu"] * flops.flops_per_token(SHAPE, 4096, "full_attention") / PEAK)


@pytest.mark.slow
def test_collect_reads_what_the_real_job_writes(tmp_path, repo_root) -> None:
    """One run of examples/local-cpu.yaml through job.sbatch, watchdog and the built-in workload
    (2 ranks, gloo on CPU), then collect: the row must agree with the files the job wrote."""
    import pandas as pd

    from sweep.backends.local import backend
    from sweep.plan import space
    from sweep.plan.render import render_runs
    from sweep.plan.spec import load_spec

    spec = load_spec(repo_root / "examples" / "local-cpu.yaml")
    plan = space.plan(spec)
    pick = plan[(plan.nodes == 1) & (plan.dp == 2) & (plan.zero_stage == 0)
                & (plan.model == "tiny-4l")]
    (run_dir,) = render_runs(spec, pd.DataFrame(pick), tmp_path)
    (result,) = backend.run_local([run_dir], slots=2)
    assert result.state == "COMPLETED"
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    summary = [json.loads(line) for line in (result.attempt_dir / METRICS_FILE).read_text().splitlines()][-1]
    env = json.loads((result.attempt_dir / "env.json").read_text())
    assert row["outcome"] == "completed" and row["collect_issues"] == []
    assert row["metrics_source"] == "summary" and row["step_time_mean_s"] == summary["step_time_mean_s"]
    assert row["mfu_reported"] == summary["mfu_pct"] / 100
    assert row["mfu_full_attention"] == pytest.approx(summary["mfu"]["full_attention"], rel=1e-12)
    assert row["peak_flops_source"] == summary["peak_flops_source"]  # measured: no catalog peak on CPU
    assert row["slurm_state"] == "COMPLETED" and row["elapsed_s"] > 0 and row["gpu_hours"] > 0
    assert row["harness_git_sha"].startswith(env["harness"]["git"]["sha"])
    assert row["mem_predicted_total_bytes"] is not None and row["mem_reserved_bytes"] > 0


def test_sacct_entries_become_rows_that_decide_a_killed_attempt(tmp_path) -> None:
    from sweep.backends.slurm.client import SEP, parse_sacct
    from sweep.collect.folder import acct_rows

    run_dir = write_run(tmp_path, make_config())
    write_attempt(run_dir, 1, times=[0.5] * 3, env={"slurm_array": "300_2", "slurm_job_id": "302"})
    assert job_ids(tmp_path) == ["300_2"]
    fields = ["300_2", "302", "bench", "NODE_FAIL", "0:0", "0:0", "node[3-4]",
              "2026-01-01T10:00:00", "2026-01-01T10:05:00", "300", "cpu=8", "sbatch"]
    step = ["300_2.0", "302.0", "python", "CANCELLED", "0:15", "", "node[3-4]",
            "2026-01-01T10:00:01", "2026-01-01T10:05:00", "299", "", ""]
    entries = parse_sacct("\n".join(SEP.join(f) for f in (fields, step)))  # sacct -P output
    (row,) = collect_sweep(tmp_path, accounting=acct_rows(entries)).table.to_pylist()
    assert (row["outcome"], row["status_source"], row["node_list"]) == ("node_fail", "sacct", "node[3-4]")
    assert row["elapsed_s"] == 300.0


def test_a_multi_node_megatron_attempt_takes_steps_from_one_node_and_memory_from_all(
        tmp_path) -> None:
    """Megatron prints iteration lines on the last rank only and memory lines on DP-rank-0
    ranks of every stage: the most loaded GPU (here on node 0) decides the memory, the node with
    the step lines (node 1) decides the steps."""
    from sweep.frameworks import get_parser

    config = framework_config("megatron", dp=1, world=2)
    attempt = write_run(tmp_path, config) / "attempts" / "1"
    (attempt / "logs").mkdir(parents=True)
    fixture = Path(__file__).parents[1] / "fixtures" / "logs" / "megatron_steps_1.log"
    steps_only = [line for line in fixture.read_text().splitlines(keepends=True)
                  if "memory (MB)" not in line]
    (attempt / "logs" / "node1.out").write_text("".join(steps_only))
    (attempt / "logs" / "node0.out").write_text(
        "[Rank 0] (after 20 iterations) memory (MB) | allocated: 50000.0 | max allocated: 60000.0"
        " | reserved: 70000.0 | max reserved: 71000.0\n")
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    parsed = get_parser("megatron").parse_file(attempt / "logs" / "node1.out")
    assert parsed.steps and row["last_step"] == parsed.last_step
    assert row["mem_reserved_bytes"] == 71000 * MiB
    assert row["mem_allocated_bytes"] == 60000 * MiB


def test_an_array_task_sacct_still_shows_by_its_master_id_is_read_from_that_row(tmp_path) -> None:
    """sacct may list a one-task array as `88`, not `88_0`, for a while after it ends;
    `sweep status` reads that row, so collect reads it too, and they agree."""
    config = framework_config("megatron", dp=1, world=2)
    attempt = write_run(tmp_path, config) / "attempts" / "1"
    attempt.mkdir(parents=True)
    (attempt / "job.out").symlink_to(tmp_path / "batches" / "b1" / "0" / "slurm-88_0.out")
    rows = [{"JobID": "88", "State": "FAILED", "ExitCode": "2:0", "DerivedExitCode": "0:0"}]
    (row,) = collect_sweep(tmp_path, accounting=rows).table.to_pylist()
    assert (row["outcome"], row["status_source"]) == ("crashed", "sacct")
    assert row["slurm_job_id"] == "88_0"



def test_the_node_log_with_the_losses_speaks_for_a_pipeline_run(tmp_path) -> None:
    """Every torchtitan rank prints every step, and only the last stage's lines carry a real
    loss: collect takes that node's steps, even when the first node's log has more lines."""
    config = framework_config("torchtitan", dp=1, world=2)
    attempt = write_run(tmp_path, config) / "attempts" / "1"
    (attempt / "logs").mkdir(parents=True)

    def line(step: int, loss: str) -> str:
        return (f"[rank0]:[titan] 2026-01-01 00:00:{step:02d},000 - root - INFO - step: {step}  "
                f"loss: {loss}  grad_norm: 1.0  memory: 10.00GiB(12.00%)  tps: 1,000  "
                f"tflops: 100.00  mfu: 10.00%\n")

    (attempt / "logs" / "node0.out").write_text("".join(line(s, "-1.0000") for s in range(1, 9)))
    (attempt / "logs" / "node1.out").write_text("".join(line(s, "7.5000") for s in range(1, 7)))
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    assert row["last_step"] == 6


# PyTorch 2.11's message on an H200 (our own run; tests/collect/test_cuda_oom.py parses the wordings).
H200_OOM = (Path(__file__).parents[1] / "fixtures" / "cuda" / "h200_oom_messages.txt"
            ).read_text().splitlines()[0]


def test_collect_records_the_figures_of_an_oom_attempt(tmp_path: Path) -> None:
    config = make_config()
    status = {**completed_status(config.run_id), "outcome": "oom", "reason": "cuda_oom",
              "evidence": [H200_OOM, "sweep.workload: rank 0: CUDA out of memory: " + H200_OOM]}
    write_attempt(write_run(tmp_path, config), 1, times=[0.5], status=status)
    assert main(["collect", str(tmp_path)]) == 0
    row = pd.read_parquet(tmp_path / "runs.parquet").iloc[0]
    assert row["outcome"] == "oom"
    assert row["mem_oom_needed_bytes"] == round(131.85 * GiB) + 8 * GiB
    assert row["mem_outside_allocator_bytes"] == pytest.approx(1.29 * GiB, rel=0.01)



def completed_row(tmp_path: Path, **summary: object) -> dict[str, Any]:
    """The collected row of one completed attempt whose summary record adds `summary`."""
    config = make_config()
    run_dir = write_run(tmp_path, config)
    write_attempt(run_dir, 1, times=[0.5] * 10, status=completed_status(config.run_id),
                  summary={**SUMMARY, **summary})
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    return row


def test_a_completed_attempt_keeps_the_memory_it_measured_outside_the_allocator(tmp_path: Path) -> None:
    """The built-in workload samples it each step on CUDA; self-calibration learns the runtime
    overhead from completed runs, not only from OOMs."""
    row = completed_row(tmp_path, mem_outside_allocator_bytes=1_300_000_000)
    assert row["mem_outside_allocator_bytes"] == 1_300_000_000


def test_a_completed_attempt_says_how_often_the_allocator_flushed_its_cache_to_fit(tmp_path: Path) -> None:
    """A run that fitted only by releasing the allocator's cache has a reserved peak set by the
    device, not by its configuration: the memory fit must know which runs those are."""
    assert completed_row(tmp_path, mem_alloc_retries=3)["mem_alloc_retries"] == 3


def test_an_oom_attempt_keeps_the_larger_of_its_sampled_and_its_message_s_overhead(tmp_path: Path) -> None:
    config = make_config()
    status = {**completed_status(config.run_id), "outcome": "oom", "reason": "cuda_oom",
              "evidence": [H200_OOM]}
    write_attempt(write_run(tmp_path, config), 1, times=[0.5], status=status,
                  summary={**SUMMARY, "mem_outside_allocator_bytes": 2 * GiB})
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    assert row["mem_outside_allocator_bytes"] == 2 * GiB  # the message says 1.29 GiB


def test_a_runs_parquet_written_before_a_column_was_added_is_recomputed(tmp_path: Path) -> None:
    """After an upgrade adds a column, collect computes every row again instead of failing to
    reuse rows that lack it."""
    config = make_config()
    write_attempt(write_run(tmp_path, config), 1, times=[0.5] * 10, summary=SUMMARY,
                  status=completed_status(config.run_id))
    assert main(["collect", str(tmp_path)]) == 0
    path = tmp_path / "runs.parquet"
    older = pq.read_table(path)
    older = older.drop_columns(["mem_outside_allocator_bytes"]).replace_schema_metadata(
        older.schema.metadata)
    pq.write_table(older, path)
    assert read_runs(path) is None
    assert main(["collect", str(tmp_path)]) == 0
    assert "mem_outside_allocator_bytes" in pq.read_table(path).column_names
