"""The fabric check on Slurm: the job script and its options, the reason bad_nodes.json keeps,
what `sweep nodes` shows, and, live, a node throttled for real (a CPU quota on its slurmd: a
simulation of a slow link) found, measured again and excluded by `sweep submit --fabric-check`,
and a node slow only in the first measurement kept."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.backends.slurm.client import Slurm
from sweep.backends.slurm.fabric_check import (
    CPU_SIZES,
    FABRIC_FILE,
    Measured,
    better_of,
    run_check,
    sbatch_options,
    script_text,
)
from sweep.backends.slurm.fabric_decision import probes_for
from sweep.backends.slurm.preflight import target_of
from sweep.backends.slurm.tracker import Tracker
from sweep.cli import main
from tests.slurm_sweeps import job_path
from tests.specs import tiny_cpu_spec

__all__ = ["job_path"]  # a fixture

REPO = Path(__file__).resolve().parents[3]


# The job ------------------------------------------------------------------------------------------

RUN_JSON = {"framework": "builtin", "gpu": "cpu", "gpus_per_node": 1,
            "settings": {"python": "/opt/venv bench/bin/python", "partition": "debug",
                         "setup": ["module load gcc"]}}


def test_the_job_script_runs_the_setup_then_the_probe_with_every_value_quoted(tmp_path: Path) -> None:
    folder = tmp_path / "sweep dir" / "fabric" / "t"
    text = script_text(target_of(RUN_JSON), folder, CPU_SIZES)
    assert text.index("module load gcc") < text.index("exec srun")
    assert "'/opt/venv bench/bin/python' -m sweep.backends.slurm.fabric_probe --dir " \
           f"'{folder}'" in text
    assert 'MASTER_PORT=$((30000 + SLURM_JOB_ID % 10000))' in text and text.rstrip().endswith('"$@"')
    script = tmp_path / "probe.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    [pair] = [p for p in probes_for(["a", "b"], None) if p.kind == "pair"]
    options = sbatch_options(pair, target_of(RUN_JSON), folder, "sweep-fabric=s")
    assert {"--nodes=2", "--ntasks-per-node=1", "--nodelist=a,b", "--partition=debug",
            "--comment=sweep-fabric=s"} <= set(options)


# The record and `sweep nodes` -----------------------------------------------------------------

def test_a_reason_stays_while_the_node_is_excluded_and_goes_when_it_is_forgiven(tmp_path: Path) -> None:
    bad = BadNodes(tmp_path)
    bad.change(exclude=["n3"], reasons={"n3": "fabric check: 1 GB/s"})
    [record] = bad.records()
    assert record.node == "n3" and record.reason == "fabric check: 1 GB/s"
    bad.merge([])  # a status poll keeps it
    assert bad.records()[0].reason == "fabric check: 1 GB/s"
    bad.change(forgive=["n3"])
    assert bad.exclude() == [] and bad.records()[0].reason is None
    assert "reasons" not in json.loads(bad.path.read_text())


def rendered_sweep(tmp_path: Path, name: str) -> Path:
    """A tiny CPU sweep, rendered (the check takes the runs' interpreter and partition)."""
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", name, global_batch={"sequences": 2},
                         run={"time_limit": "00:02:00", "mem": "1000M"})
    out = tmp_path / "sweep"
    assert main(["render", str(spec), "--out", str(out)]) == 0
    return out


def plain(text: str) -> str:
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def test_sweep_nodes_lists_the_last_checks_figures_and_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "s"
    (folder / "runs").mkdir(parents=True)
    reason = "fabric check: all-reduce busbw 0.2 GB/s within the node < 0.7 x the median 1 GB/s"
    BadNodes(folder).change(exclude=["n2"], reasons={"n2": reason})
    (folder / FABRIC_FILE).write_text(json.dumps({
        "time": 0, "backend": "gloo", "fraction": 0.7, "node_median_gbps": 1.0,
        "pair_median_gbps": 0.9,
        "nodes": [{"node": "n1", "busbw_gbps": 1.1, "pairs": {"n1-n2": 0.5}, "excluded": False},
                  {"node": "n2", "busbw_gbps": 0.2, "pairs": {"n1-n2": 0.5}, "excluded": True,
                   "reason": reason}]}))
    assert main(["nodes", str(folder)]) == 0
    out = plain(capsys.readouterr().out)
    assert "n1 1.1 n1-n2 0.5 ok" in out and "n2 0.2 n1-n2 0.5 excluded" in out
    assert "node median 1; pair median 0.9" in out and reason in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--check", "--fraction", "1.5"], "--fraction 1.5: the share of the median"),
    (["--check", "--check-timeout", "0"], "--check-timeout 0: must be a positive number"),
    (["--check", "--check-nodes", "n[1-"], "--check-nodes 'n[1-'"),
    (["--check", "--forgive", "n1"], "--check runs the fabric check; run --forgive"),
])
def test_bad_check_options_are_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    folder = tmp_path / "s"
    (folder / "runs").mkdir(parents=True)
    assert main(["nodes", str(folder), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_without_rendered_runs_says_to_render_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "s"
    (folder / "runs").mkdir(parents=True)
    assert main(["nodes", str(folder), "--check"]) == 2
    assert "render the sweep first" in capsys.readouterr().err


def test_a_probe_measured_twice_counts_with_its_better_figure() -> None:
    """Interference only makes a link look slower: the better of two figures is the truer."""
    node_a, node_b, pair = probes_for(["a", "b"], gpus_per_node=None)
    first = [Measured(node_a, "1", {"busbw_gbps": 0.2}), Measured(node_b, "2", {"busbw_gbps": 1.0}),
             Measured(pair, "3", {"busbw_gbps": 0.5})]
    again = [Measured(replace(node_a, round=0), "4", {"busbw_gbps": 0.9}),
             Measured(replace(pair, round=1), "5", None, "no result")]
    chosen = better_of(first, again)
    assert [(m.job_id, m.busbw_gbps) for m in chosen] == [("4", 0.9), ("2", 1.0), ("3", 0.5)]
    assert [m.probe for m in chosen] == [node_a, node_b, pair]  # as the first measurement had them


# Live: a node throttled for real ------------------------------------------------------------------

@pytest.fixture
def slow_node(slurm_cluster: None) -> Iterator[tuple[str, list[str]]]:
    """A simulation of a slow link: one node of the local cluster gets 25 % of one CPU (a cgroup
    quota on its slurmd, which its job steps inherit), undone whatever the test does, since
    other tests share the cluster. Yields the node and the usable nodes."""
    if os.geteuid() != 0:
        pytest.skip("throttling a node (scripts/local-slurm.sh throttle-node) needs root")
    nodes = Slurm().usable_nodes()
    if len(nodes) < 3:
        pytest.skip(f"the check compares nodes: only {nodes} usable now")
    node = nodes[1]
    script = str(REPO / "scripts" / "local-slurm.sh")
    subprocess.run(["bash", script, "throttle-node", node, "25"], check=True)
    try:
        yield node, nodes
    finally:
        subprocess.run(["bash", script, "unthrottle-node", node], check=True)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.alone  # it tells a throttled node by its speed, which another test's load would blur
def test_a_node_slow_only_in_the_first_measurement_is_measured_again_and_kept(
        slow_node: tuple[str, list[str]], job_path: None, sweep_name: str, tmp_path: Path) -> None:
    """A transient slowdown, for real: the node is throttled while the first measurement runs
    and set free when the check says it measures again, so its second figure is a healthy
    node's. It is not excluded; fabric.json keeps both measurements."""
    node, nodes = slow_node
    out = rendered_sweep(tmp_path, sweep_name)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "measuring again" in line:
            subprocess.run(["bash", str(REPO / "scripts" / "local-slurm.sh"), "unthrottle-node",
                            node], check=True)

    report = run_check(Tracker(out), nodes=nodes, say=say)
    assert any(f"{node} below 0.7 x the median; measuring again" in line for line in said), said
    assert f"fabric check: {node} measured again is within the line: not excluded" in said
    assert report.decision.excluded == [] and BadNodes(out).exclude() == []
    fabric = json.loads((out / FABRIC_FILE).read_text())
    assert fabric["excluded"] == []
    again = {tuple(p["nodes"]): p["busbw_gbps"] for p in fabric["again"]}
    assert (node,) in again and all(node in pair for pair in again), again
    first = {tuple(p["nodes"]): p["busbw_gbps"] for p in fabric["probes"]}
    assert first[(node,)] == again[(node,)]  # the better figure counts: the second one


@pytest.mark.slurm
@pytest.mark.parametrize(("run", "options", "problem"), [
    ({"python": "/nonexistent/venv/bin/python3"}, [], "ended without a result; its output: "),
    ({}, ["--check-timeout", "0.1"], "did not finish within 0 s (queued behind other jobs?); "
                                     "cancelled"),
])
def test_probes_that_give_no_figure_are_named_with_why_and_nothing_is_excluded(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], run: dict[str, str], options: list[str],
        problem: str) -> None:
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", sweep_name, global_batch={"sequences": 2},
                         run={"time_limit": "00:05:00", "mem": "1000M", **run})
    out = tmp_path / "sweep"
    assert main(["render", str(spec), "--out", str(out)]) == 0
    nodes = Slurm().usable_nodes()[:2]
    assert main(["nodes", str(out), "--check", "--check-nodes", ",".join(nodes), *options]) == 2
    error = capsys.readouterr().err
    assert "fabric check: no probe gave a figure" in error
    assert error.count(problem) == 3, error  # two node probes and their pair
    assert BadNodes(out).exclude() == [] and not (out / FABRIC_FILE).exists()
    queued = subprocess.run(["squeue", "-h", "-t", "PD,R", "-o", "%k"], capture_output=True,
                            text=True, check=True).stdout
    assert f"sweep-fabric={sweep_name}" not in queued


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.alone  # it tells a throttled node by its speed, which another test's load would blur
def test_submit_with_fabric_check_finds_the_throttled_node_and_keeps_it_out_of_the_first_array(
        slow_node: tuple[str, list[str]], job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """One live check (about 100 s with the slow node measured twice) serves both ends: what the
    check finds and records, and what the submission does with it. `sweep nodes --check` runs
    the same check (`check_fabric`); the live test of probes that give no figure runs it
    through that command."""
    node, nodes = slow_node
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", sweep_name, global_batch={"sequences": 2},
                         run={"time_limit": "00:02:00", "mem": "1000M"})
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--fabric-check", "--fabric-check-nodes",
                 ",".join(nodes), "--hold", "--no-report"]) == 0
    printed = plain(capsys.readouterr().out)
    # what the check found: slow in the first measurement, measured again, slow again
    fabric = json.loads((out / FABRIC_FILE).read_text())
    assert fabric["excluded"] == [node], fabric["nodes"]
    assert all(p["busbw_gbps"] for p in fabric["probes"]), fabric["probes"]
    assert f"{node} below 0.7 x the median; measuring again" in printed
    assert (node,) in {tuple(p["nodes"]) for p in fabric["again"]}
    [row] = [r for r in fabric["nodes"] if r["node"] == node]
    figure = f"all-reduce busbw {row['busbw_gbps']:.3g} GB/s within the node"
    [record] = BadNodes(out).records()
    assert record.node == node and figure in (record.reason or "")
    # what the submission did with it: the check ran first, and the array keeps the node out
    assert printed.index("fabric check:") < printed.index("job array")
    assert f"fabric check: excluding {node}" in printed
    [array] = re.findall(r"job array (\d+)", printed)
    shown = subprocess.run(["scontrol", "show", "job", array], capture_output=True, text=True,
                           check=True).stdout
    assert re.search(rf"ExcNodeList={node}\b", shown), shown
    # what `sweep nodes` shows of it, and forgiving it
    assert main(["nodes", str(out)]) == 0
    listed = plain(capsys.readouterr().out)
    assert "excluded since" in listed and figure in listed
    assert main(["nodes", str(out), "--forgive", node]) == 0
    assert BadNodes(out).exclude() == []
