"""A straggler named for real: a two-node built-in run on the local Slurm cluster with its second
node made slow (SWEEP_TEST_STRAGGLER, a simulated straggler honoured only for tests: that node's
ranks sleep twice their own step time at the end of each step's local work). Collect names that
node in runs.parquet, `sweep nodes` lists it as a suspect without excluding it, and the report
marks the cell."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.cli import main
from sweep.search.driver import read_record
from tests.slurm_sweeps import job_path, wait_until_gone, wait_until_settled
from tests.specs import tiny_cpu_spec

__all__ = ["job_path"]  # a fixture


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.alone  # it tells a throttled node by its speed, which another test's load would blur
def test_a_slow_node_of_a_two_node_run_is_named_listed_as_a_suspect_and_marked(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", sweep_name, nodes=[2],
                         run={"steps": 6, "warmup_steps": 1, "mem": "1500M",
                              "env": {"SWEEP_TEST_STRAGGLER": "#1:2"}})
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out)]) == 0
    report_job = str(read_record(out)["report_job"])
    observation = wait_until_settled(out, timeout_s=420)
    assert [s.state for s in observation.states] == ["completed"], observation.states
    wait_until_gone(report_job, timeout_s=180)
    run = observation.states[0]
    attempt = out / "runs" / run.run_id / "attempts" / str(run.attempt)
    slow_node = json.loads((attempt / "env.json").read_text())["nodes"][1]  # the job's node #1

    capsys.readouterr()
    assert main(["collect", str(out), "--sacct"]) == 0
    assert f"straggler: {slow_node} was the slowest node" in capsys.readouterr().out
    row = pq.read_table(out / "runs.parquet").to_pylist()[0]
    assert row["outcome"] == "completed" and row["straggler_node"] == slow_node
    times = json.loads(row["node_step_time_json"])
    assert len(times) == 2 and max(times, key=times.get) == slow_node
    assert row["straggler_ratio"] > row["straggler_factor"] == 1.2

    assert main(["nodes", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "straggler suspects" in shown and slow_node in shown
    assert BadNodes(out).suspects()[slow_node]["count"] == 1
    assert slow_node not in BadNodes(out).exclude()  # listed, never excluded

    assert main(["report", str(out)]) == 0
    assert f"{slow_node} took" in (out / "report" / "flags.md").read_text()
    assert f"slow node: {slow_node}" in (out / "report" / "heatmap_best.svg").read_text()
