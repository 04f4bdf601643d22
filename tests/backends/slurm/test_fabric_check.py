"""The fabric check: the all-reduce figures the nccl-tests way, the pairs and rounds, which
nodes the figures exclude (pure), the probe measuring a real gloo all-reduce on this machine,
and, live, a node throttled for real (a CPU quota on its slurmd: a simulation of a slow link)
found and excluded by `sweep nodes --check` and by `sweep submit --fabric-check`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.backends.slurm.client import Slurm, parse_usable_nodes
from sweep.backends.slurm.fabric_check import (
    CPU_SIZES,
    FABRIC_FILE,
    decide,
    probe_arguments,
    probes_for,
    ring_pairs,
    sbatch_options,
    script_text,
)
from sweep.backends.slurm.fabric_probe import (
    bus_factor,
    size_figures,
    sizes_between,
    wait_for_turn,
)
from sweep.backends.slurm.preflight import target_of
from sweep.cli import main
from tests.slurm_sweeps import job_path
from tests.specs import tiny_cpu_spec

__all__ = ["job_path"]  # a fixture

REPO = Path(__file__).resolve().parents[3]
HEALTHY = {"n1": 10.0, "n2": 10.5, "n3": 9.8, "n4": 10.2}


# The figures ------------------------------------------------------------------------------------

def test_busbw_is_algbw_times_2_n_minus_1_over_n_as_in_nccl_tests() -> None:
    assert bus_factor(2) == 1.0 and bus_factor(8) == 1.75
    row = size_figures(8_000_000, [0.004, 0.002, 0.003], ranks=8)
    assert row["best_s"] == 0.002 and row["median_s"] == 0.003
    assert row["algbw_gbps"] == pytest.approx(4.0)  # 8 MB in 2 ms
    assert row["busbw_gbps"] == pytest.approx(7.0)


def test_the_sizes_grow_fourfold_up_to_the_largest() -> None:
    assert sizes_between(64 * 1024, 16 * 1024 * 1024) == [64 * 1024 * 4 ** i for i in range(5)]
    assert sizes_between(1000, 5000) == [1000, 4000, 5000]


def test_every_node_is_in_two_pairs_and_in_one_probe_per_round() -> None:
    nodes = [f"n{i}" for i in range(5)]
    probes = probes_for(nodes, gpus_per_node=None)
    singles = [p for p in probes if p.kind == "node"]
    pairs = [p for p in probes if p.kind == "pair"]
    assert [p.nodes for p in singles] == [(n,) for n in nodes] and {p.round for p in singles} == {0}
    assert all(sum(n in p.nodes for p in pairs) == 2 for n in nodes)
    for number in {p.round for p in probes}:
        members = [n for p in probes if p.round == number for n in p.nodes]
        assert len(members) == len(set(members)), number
    assert {p.round for p in pairs} == {1, 2, 3}  # an odd ring needs a third round
    assert ring_pairs(["a", "b"]) == [("a", "b")] and ring_pairs(["a"]) == []


def test_on_cpu_a_node_is_two_gloo_ranks_and_a_pair_one_rank_per_node_on_gpus_all_its_gpus() -> None:
    cpu = probes_for(["a", "b", "c"], gpus_per_node=None)
    assert {(p.kind, p.ranks_per_node) for p in cpu} == {("node", 2), ("pair", 1)}
    gpu = probes_for(["a", "b", "c"], gpus_per_node=8)
    assert {(p.kind, p.ranks_per_node) for p in gpu} == {("node", 8), ("pair", 8)}
    one_gpu = probes_for(["a", "b", "c"], gpus_per_node=1)
    assert {p.kind for p in one_gpu} == {"pair"}  # one rank moves no data within a node


def test_on_gpus_a_probe_waits_for_its_round_to_be_up_on_cpu_for_every_probe() -> None:
    """On GPUs the probes of different rounds cannot run at once on a node (each asks for all
    its GPUs), so waiting for a later round to be up would wait for nothing."""
    probes = probes_for(["a", "b", "c", "d"], gpus_per_node=8)
    pair = next(p for p in probes if p.kind == "pair" and p.round == 2)

    def argument(arguments: list[str], flag: str) -> set[str]:
        return set(filter(None, arguments[arguments.index(flag) + 1].split(",")))

    on_gpus = probe_arguments(pair, probes, all_up=False)
    assert argument(on_gpus, "--peers") == {p.name for p in probes if p.round == 2} - {pair.name}
    assert argument(on_gpus, "--after") == {p.name for p in probes if p.round < 2}
    on_cpu = probe_arguments(pair, probes, all_up=True)
    assert argument(on_cpu, "--peers") == {p.name for p in probes} - {pair.name}


# The decision -----------------------------------------------------------------------------------

def test_a_node_below_the_fraction_of_the_median_is_excluded_with_its_figure_as_the_reason() -> None:
    decision = decide({**HEALTHY, "n3": 2.5}, {}, fraction=0.7)
    assert decision.excluded == ["n3"]
    [slow] = [v for v in decision.verdicts if v.slow]
    assert slow.reason == ("fabric check: all-reduce busbw 2.5 GB/s within the node < 0.7 x the "
                           "median 10.1 GB/s")  # of 2.5, 10, 10.2, 10.5
    assert decision.node_median_gbps == pytest.approx(10.1)


def test_the_fraction_is_the_line_a_node_just_above_it_stays() -> None:
    median = 10.0
    assert decide({**HEALTHY, "n3": 0.71 * median}, {}, 0.7).excluded == []
    assert decide({**HEALTHY, "n3": 0.69 * median}, {}, 0.7).excluded == ["n3"]
    assert decide({**HEALTHY, "n3": 0.69 * median}, {}, 0.5).excluded == []


def test_a_node_whose_every_pair_is_slow_is_excluded_though_its_own_figure_is_fine() -> None:
    """NVLink fine, its InfiniBand link slow: only the pairs show it."""
    pairs: dict[tuple[str, str], float | None] = {
        ("n1", "n2"): 20.0, ("n2", "n3"): 5.0, ("n3", "n4"): 5.2, ("n4", "n1"): 19.0}
    decision = decide(HEALTHY, pairs, 0.7)
    assert decision.excluded == ["n3"]
    [slow] = [v for v in decision.verdicts if v.slow]
    assert "every pair with it (n2-n3 5 GB/s, n3-n4 5.2 GB/s)" in slow.reason


def test_a_neighbour_of_a_slow_node_with_one_noisy_pair_more_is_not_excluded() -> None:
    """n2 is slow, so n1-n2 is slow; n4-n1 is slow too by chance. n1's pairs are both slow,
    but the slowness follows n2 (its partner in n1-n2 has no good pair) and n4 (n4-n1's partner
    has a good pair, n3-n4, but the pair n1-n2 is not pinned on n1): n1 stays."""
    pairs: dict[tuple[str, str], float | None] = {
        ("n1", "n2"): 4.0, ("n2", "n3"): 4.0, ("n3", "n4"): 20.0, ("n4", "n1"): 5.0}
    decision = decide({**HEALTHY, "n2": 2.0}, pairs, 0.7)
    assert decision.excluded == ["n2"]


def test_a_slow_link_between_two_healthy_nodes_is_reported_not_pinned_on_either() -> None:
    pairs: dict[tuple[str, str], float | None] = {
        ("n1", "n2"): 20.0, ("n2", "n3"): 4.0, ("n3", "n4"): 20.0, ("n4", "n1"): 19.0}
    decision = decide(HEALTHY, pairs, 0.7)
    assert decision.excluded == [] and decision.slow_pairs == (("n2", "n3"),)


def test_nodes_without_figures_are_not_judged_and_one_figure_compares_with_nothing() -> None:
    decision = decide({"n1": 10.0, "n2": None, "n3": 1.0, "n4": 11.0}, {}, 0.7)
    assert decision.excluded == ["n3"] and decision.node_median_gbps == 10.0
    alone = decide({"n1": 10.0, "n2": None}, {}, 0.7)
    assert alone.excluded == [] and alone.node_median_gbps is None


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, -0.2])
def test_a_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        decide(HEALTHY, {}, fraction)


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


def test_sinfo_s_usable_nodes_leave_out_the_down_drained_and_silent_ones() -> None:
    text = "n1|idle\nn2|down*\nn3|mixed\nn4|drained\nn5|idle*\nn1|idle\nn6|allocated\n"
    assert parse_usable_nodes(text) == ["n1", "n3", "n6"]


def test_a_probe_waits_for_its_peers_to_be_up_and_the_earlier_rounds_to_end(tmp_path: Path) -> None:
    (tmp_path / "node-a.ready").touch()
    assert not wait_for_turn(tmp_path, ["node-a", "node-b"], [], wait_s=0.3)
    (tmp_path / "node-b.failed").touch()  # ended without a result: the login side marked it
    assert wait_for_turn(tmp_path, ["node-a", "node-b"], [], wait_s=0.3)
    assert not wait_for_turn(tmp_path, [], ["node-a"], wait_s=0.3)  # up, but not ended
    (tmp_path / "node-a.json").write_text("{}")
    assert wait_for_turn(tmp_path, [], ["node-a", "node-b"], wait_s=0.3)


def test_the_probe_measures_a_real_gloo_all_reduce_of_two_ranks(tmp_path: Path) -> None:
    """The program the jobs run, started here as Slurm would start its two tasks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "sweep.backends.slurm.fabric_probe", "--dir", str(tmp_path),
            "--name", "node-here", "--min-bytes", "65536", "--max-bytes", "1048576",
            "--iters", "3"]
    ranks = [subprocess.Popen(argv, cwd=REPO, env={
        **os.environ, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for rank in range(2)]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    result = json.loads((tmp_path / "node-here.json").read_text())
    assert result["backend"] == "gloo" and result["ranks"] == 2 and result["job_id"] == "7"
    assert [row["bytes"] for row in result["sizes"]] == [65536, 262144, 1048576]
    assert all(row["iterations"] == 3 and row["best_s"] <= row["median_s"] for row in result["sizes"])
    assert result["busbw_gbps"] == max(row["busbw_gbps"] for row in result["sizes"][-2:]) > 0
    assert (tmp_path / "node-here.ready").exists() and result["waited_for_turn"]


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
def test_the_fabric_check_finds_the_throttled_node_and_excludes_it_with_its_figure(
        slow_node: tuple[str, list[str]], job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    node, nodes = slow_node
    out = rendered_sweep(tmp_path, sweep_name)
    capsys.readouterr()
    assert main(["nodes", str(out), "--check", "--check-nodes", ",".join(nodes)]) == 0
    printed = plain(capsys.readouterr().out)
    fabric = json.loads((out / FABRIC_FILE).read_text())
    assert fabric["excluded"] == [node], fabric["nodes"]
    assert all(p["busbw_gbps"] for p in fabric["probes"]), fabric["probes"]
    [row] = [r for r in fabric["nodes"] if r["node"] == node]
    figure = f"all-reduce busbw {row['busbw_gbps']:.3g} GB/s within the node"
    [record] = BadNodes(out).records()
    assert record.node == node and figure in (record.reason or "")
    assert "excluded since" in printed and figure in printed
    assert main(["nodes", str(out), "--forgive", node]) == 0
    assert BadNodes(out).exclude() == []


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
def test_submit_with_fabric_check_excludes_the_throttled_node_from_the_first_array(
        slow_node: tuple[str, list[str]], job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    node, nodes = slow_node
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", sweep_name, global_batch={"sequences": 2},
                         run={"time_limit": "00:02:00", "mem": "1000M"})
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--fabric-check", "--fabric-check-nodes",
                 ",".join(nodes), "--hold", "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("fabric check:") < printed.index("job array")
    assert f"fabric check: excluding {node}" in printed
    [array] = re.findall(r"job array (\d+)", printed)
    shown = subprocess.run(["scontrol", "show", "job", array], capture_output=True, text=True,
                           check=True).stdout
    assert re.search(rf"ExcNodeList={node}\b", shown), shown
