"""Stragglers: each node's step time from what a run reports per node or per rank, the run
flagged when its slowest node is beyond the factor × the nodes' median, the node named in
runs.parquet and counted as a suspect in bad_nodes.json.

The attempt folders are written in the formats of the shared contracts: the built-in workload's
metrics.jsonl summary (`rank_nodes`, `rank_step_time_mean_s`, sweep.workload.node_times) and
torchtitan's per-rank step lines behind torchrun's `[rankN]:` prefix (tests/frameworks/
torchtitan/test_parser_ranks.py builds them with the format of torchtitan's MetricsProcessor).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.backends.slurm.submission import NodeFailure
from sweep.cli import main
from sweep.collect.attempts import collect_attempt
from sweep.collect.stragglers import (
    DEFAULT_FACTOR,
    MIN_STEPS,
    NodeTimes,
    from_builtin,
    judge,
    sightings,
    suspects,
)
from sweep.core.state import atomic_write_json
from tests.collect.test_attempts import completed_status, make_config, write_attempt, write_run
from tests.frameworks.torchtitan.test_parser_ranks import step_line

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]


def two_node_config(framework: str = "builtin", **settings: Any):
    config = make_config(dp=8)
    return replace(config, framework=framework, nodes=2, gpus_per_node=4,
                   settings={**config.settings, **settings})


def rank_summary(rank_times: list[float], steps: int = 7) -> dict[str, Any]:
    """The built-in workload's summary fields: 2 nodes × 4 ranks, rank r on NODES[r // 4]."""
    return {"steps": 10, "warmup_steps_skipped": 3, "step_time_n": steps,
            "step_time_mean_s": max(rank_times), "rank_nodes": [NODES[r // 4] for r in range(8)],
            "rank_step_time_median_s": rank_times}


def builtin_attempt(tmp_path: Path, rank_times: list[float], **settings: Any) -> dict[str, Any]:
    config = two_node_config(**settings)
    run_dir = write_run(tmp_path, config)
    write_attempt(run_dir, 1, times=[2.0] * 10, summary=rank_summary(rank_times),
                  status=completed_status(config.run_id),
                  env={"nodes": NODES[:2], "slurm_job_id": "77"})
    return collect_attempt(tmp_path, run_dir, run_dir / "attempts" / "1")


def test_a_run_whose_slowest_node_is_beyond_the_factor_of_the_median_names_that_node() -> None:
    times = {"gpu01": 1.0, "gpu02": 1.02, "gpu03": 0.99, "gpu04": 1.5}
    verdict = judge(NodeTimes(times, steps=7, source="test"))
    median = statistics.median(times.values())
    assert verdict is not None and verdict.straggler
    assert (verdict.slowest, verdict.ratio) == ("gpu04", pytest.approx(1.5 / median))


def test_a_node_within_the_factor_is_named_slowest_but_not_a_straggler() -> None:
    times = {"gpu01": 1.0, "gpu02": 1.1}
    verdict = judge(NodeTimes(times, steps=7, source="test"))
    assert verdict is not None and verdict.slowest == "gpu02" and not verdict.straggler
    assert judge(NodeTimes(times, steps=7, source="test"), factor=1.04).straggler


def test_one_node_or_too_few_steps_gives_no_verdict() -> None:
    assert judge(NodeTimes({"gpu01": 1.0}, steps=7, source="test")) is None
    assert judge(NodeTimes({"gpu01": 1.0, "gpu02": 9.0}, steps=MIN_STEPS - 1, source="test")) is None


def test_a_nodes_figure_is_its_slowest_rank() -> None:
    times = from_builtin(rank_summary([1.0, 1.0, 1.0, 1.3, 1.0, 1.1, 1.0, 1.0]), NODES, 4)
    assert times is not None and dict(times.times) == {"gpu01": 1.3, "gpu02": 1.1}


def test_ranks_without_node_names_are_placed_on_env_jsons_nodes_in_rank_order() -> None:
    summary = {"step_time_n": 4, "rank_step_time_median_s": [1.0, 1.5, 2.0, 1.0]}
    times = from_builtin(summary, ["a", "b"], 2)
    assert times is not None and dict(times.times) == {"a": 1.5, "b": 2.0} and times.steps == 4
    assert from_builtin(None, ["a", "b"], 2) is None  # killed before its summary: nothing gathered


def test_collect_records_a_builtin_runs_straggler_node_and_the_nodes_step_times(tmp_path: Path) -> None:
    rank_times = [1.0, 1.01, 0.99, 1.0, 1.0, 1.6, 1.02, 1.0]
    row = builtin_attempt(tmp_path, rank_times)
    assert row["straggler_node"] == "gpu02" and row["straggler_factor"] == DEFAULT_FACTOR
    assert json.loads(row["node_step_time_json"]) == {"gpu01": 1.01, "gpu02": 1.6}
    assert row["straggler_ratio"] == pytest.approx(1.6 / statistics.median([1.01, 1.6]))
    assert row["node_step_time_source"].startswith("builtin")
    assert row["collect_issues"] == []


def test_the_specs_straggler_factor_decides(tmp_path: Path) -> None:
    rank_times = [1.0] * 4 + [1.6] * 4  # 1.6 / median 1.3 = 1.23
    assert builtin_attempt(tmp_path / "a", rank_times)["straggler_node"] == "gpu02"
    row = builtin_attempt(tmp_path / "b", rank_times, straggler_factor=1.5)
    assert row["straggler_node"] is None and row["straggler_factor"] == 1.5
    assert row["straggler_ratio"] == pytest.approx(1.6 / 1.3)


def test_a_one_node_run_has_no_straggler_columns(tmp_path: Path) -> None:
    config = make_config()
    run_dir = write_run(tmp_path, config)
    write_attempt(run_dir, 1, times=[2.0] * 10, status=completed_status(config.run_id))
    row = collect_attempt(tmp_path, run_dir, run_dir / "attempts" / "1")
    assert "straggler_ratio" not in row and "node_step_time_json" not in row


def titan_node_log(attempt: Path, node: int, ranks: range, tps: float) -> None:
    """One node's log: every rank logs every step (torchtitan), at `tps` tokens/s per GPU."""
    lines = [step_line("0.2.2", rank, step, 6.0, 41.5, second=step).replace(
        "tps: 4,321", f"tps: {round(tps):,}") for step in range(1, 11) for rank in ranks]
    (attempt / "logs").mkdir(exist_ok=True)
    (attempt / "logs" / f"node{node}.out").write_text("".join(lines))


def test_torchtitan_node_logs_give_each_nodes_step_time_and_name_the_slow_node(tmp_path: Path) -> None:
    config = two_node_config("torchtitan")
    run_dir = write_run(tmp_path, config)
    attempt = run_dir / "attempts" / "1"
    attempt.mkdir(parents=True)
    atomic_write_json(attempt / "env.json", {"nodes": NODES[:2]})
    atomic_write_json(attempt / "status.json", completed_status(config.run_id))
    titan_node_log(attempt, 0, range(0, 4), tps=4000)
    titan_node_log(attempt, 1, range(4, 8), tps=2500)
    row = collect_attempt(tmp_path, run_dir, attempt)
    tokens = config.global_batch_sequences * config.seq_len
    expected = {"gpu01": tokens / (4000 * 8), "gpu02": tokens / (2500 * 8)}
    assert json.loads(row["node_step_time_json"]) == pytest.approx(expected)
    assert row["straggler_node"] == "gpu02"
    assert row["node_step_time_source"] == "log:torchtitan: each node's log"


def test_a_megatron_run_logs_steps_on_one_rank_so_nothing_is_compared(tmp_path: Path) -> None:
    config = two_node_config("megatron")
    run_dir = write_run(tmp_path, config)
    attempt = run_dir / "attempts" / "1"
    (attempt / "logs").mkdir(parents=True)
    atomic_write_json(attempt / "env.json", {"nodes": NODES[:2]})
    atomic_write_json(attempt / "status.json", completed_status(config.run_id))
    (attempt / "logs" / "node0.out").write_text("")
    (attempt / "logs" / "node1.out").write_text("".join(
        f" [2026-01-05 10:00:{s:02d}] iteration {s:8d}/      10 | consumed samples: {32 * s:12d} | "
        f"elapsed time per iteration (ms): 1500.0 | learning rate: 3.000000E-04 | global batch size: "
        f"   32 | lm loss: 6.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | "
        f"number of nan iterations:   0 |\n" for s in range(1, 11)))
    row = collect_attempt(tmp_path, run_dir, attempt)
    assert row["step_time_n"] == 7  # the last rank's steps were read ...
    assert row.get("node_step_time_json") is None and row.get("straggler_node") is None  # ... alone


def test_suspects_count_each_nodes_straggler_runs_with_the_runs_as_evidence() -> None:
    rows = [{"run_id": "a", "attempt": 1, "straggler_node": "gpu02", "straggler_ratio": 1.6,
             "straggler_factor": 1.2},
            {"run_id": "b", "attempt": 1, "straggler_node": None, "straggler_ratio": 1.0,
             "straggler_factor": 1.2},
            {"run_id": "c", "attempt": 2, "straggler_node": "gpu02", "straggler_ratio": 1.3,
             "straggler_factor": 1.2}]
    found = suspects(sightings(rows))
    assert list(found) == ["gpu02"] and found["gpu02"]["count"] == 2
    assert [r["run"] for r in found["gpu02"]["runs"]] == ["a#1", "c#2"]


def test_sweep_collect_counts_suspects_in_bad_nodes_json_and_never_excludes_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for index, slow in enumerate((1.7, 1.8)):
        config = replace(two_node_config(), seq_len=1024 * (index + 1))  # two runs
        run_dir = write_run(tmp_path, config)
        write_attempt(run_dir, 1, times=[2.0] * 10, summary=rank_summary([1.0] * 4 + [slow] * 4),
                      status=completed_status(config.run_id), env={"nodes": NODES[:2]})
    assert main(["collect", str(tmp_path)]) == 0
    assert "straggler: gpu02 was the slowest node" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "runs.parquet").to_pylist()
    assert [r["straggler_node"] for r in rows] == ["gpu02", "gpu02"]
    bad = BadNodes(tmp_path)
    assert bad.suspects()["gpu02"]["count"] == 2 and bad.exclude() == []
    # a status poll that records a node failure keeps the suspects as they are
    bad.merge([NodeFailure("r", 1, "node_fail", ("gpu03",))])
    assert bad.suspects()["gpu02"]["count"] == 2 and "gpu02" not in bad.exclude()

    assert main(["nodes", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    ratio = 1.8 / statistics.median([1.0, 1.8])
    assert "straggler suspects" in shown and f"gpu02 │ {2:>14} │" in shown and f"{ratio:.2f}×" in shown


def test_the_spec_states_the_factor_and_refuses_one_that_names_every_run(tmp_path: Path) -> None:
    from sweep.core.errors import SpecError
    from sweep.plan.spec import load_spec
    from tests.specs import tiny_cpu_spec

    spec = load_spec(tiny_cpu_spec(tmp_path / "a.yaml", "a", run={"straggler_factor": 1.5}))
    assert spec.run.model_dump(mode="json")["straggler_factor"] == 1.5
    unset = load_spec(tiny_cpu_spec(tmp_path / "b.yaml", "b")).run.model_dump(mode="json")
    assert "straggler_factor" not in unset  # a spec without it keeps its run.json as it was
    with pytest.raises(SpecError, match=r"c\.yaml:\d+: run\.straggler_factor: .*greater than 1"):
        load_spec(tiny_cpu_spec(tmp_path / "c.yaml", "c", run={"straggler_factor": 1.0}))
