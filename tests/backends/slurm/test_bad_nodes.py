"""sweep.backends.slurm.bad_nodes: the sweep's record of failed nodes and its exclude list, in bad_nodes.json.
What `sweep nodes` shows and changes of it is in tests/commands/test_nodes.py; the rules (two
failures exclude a node, forgiving resets its count) in tests/backends/slurm/test_submission.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sweep.backends.slurm.bad_nodes import BAD_NODES_FILE, BadNodes
from sweep.backends.slurm.client import Slurm
from sweep.backends.slurm.submission import NodeFailure


def test_a_node_failure_slurm_pinned_on_no_node_blames_the_nodes_slurm_holds_down(tmp_path: Path) -> None:
    """A 4-node job whose batch host died: NODE_FAIL, and no srun line names a node. Stand-in
    for the cluster (labelled: this machine has no 4-node job to lose): sinfo's answer at the
    first poll that sees the failure, parsed by the real `Slurm.unhealthy_nodes`. The live sinfo
    call is tested in tests/backends/slurm/test_client.py."""
    sinfo = "gpu1|allocated\ngpu2|down*\ngpu3|allocated\ngpu4|idle\ngpu9|drained\n"
    calls: list[list[str]] = []

    def cluster(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, sinfo, "")

    bad = BadNodes(tmp_path)
    unhealthy = Slurm(runner=cluster).unhealthy_nodes
    job_nodes = ("gpu1", "gpu2", "gpu3", "gpu4")
    unpinned = NodeFailure("a", 1, "node_fail", job_nodes, exact=False)
    assert bad.merge([unpinned], unhealthy) == []
    assert bad.merge([unpinned], unhealthy) == []  # seen before: no second sinfo call
    assert [argv[0] for argv in calls] == ["sinfo"]
    [record] = json.loads((tmp_path / BAD_NODES_FILE).read_text())["failures"]
    assert (record["nodes"], record["blame"]) == (["gpu2"], "sinfo")

    sinfo = "gpu1|allocated\ngpu2|idle\ngpu3|idle\ngpu4|idle\n"  # back before the next poll saw it
    assert bad.merge([NodeFailure("b", 1, "node_fail", job_nodes, exact=False)], unhealthy) == ["gpu2"]
    records = json.loads((tmp_path / BAD_NODES_FILE).read_text())["failures"]
    assert (records[1]["nodes"], records[1]["blame"]) == (list(job_nodes), "every node of the job")
    assert [(r.node, r.failures, r.excluded_at is not None) for r in bad.records()] == [
        ("gpu1", 1, False), ("gpu2", 2, True), ("gpu3", 1, False), ("gpu4", 1, False)]


def test_a_failure_slurm_pinned_on_a_node_asks_no_one(tmp_path: Path) -> None:
    def no_sinfo() -> set[str]:
        raise AssertionError("sinfo asked for a failure that names its node")

    assert BadNodes(tmp_path).merge([NodeFailure("a", 1, "node_fail", ("gpu3",))], no_sinfo) == []
    assert BadNodes(tmp_path).merge([NodeFailure("b", 1, "nccl", ("gpu3",))], no_sinfo) == ["gpu3"]


def test_a_poll_that_saw_nothing_new_leaves_the_file_alone(tmp_path: Path) -> None:
    bad = BadNodes(tmp_path)
    assert bad.merge([]) == [] and not (tmp_path / BAD_NODES_FILE).exists()
    bad.merge([NodeFailure("a", 1, "node_fail", ("gpu3",)), NodeFailure("b", 2, "node_fail", ("gpu3",))])
    path = tmp_path / BAD_NODES_FILE
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    assert bad.merge([NodeFailure("a", 1, "node_fail", ("gpu3",))]) == ["gpu3"]
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_forgiving_and_excluding_by_hand_keep_the_failures_seen(tmp_path: Path) -> None:
    bad = BadNodes(tmp_path)
    bad.merge([NodeFailure("a", 1, "node_fail", ("gpu3",)), NodeFailure("b", 1, "node_fail", ("gpu3",))])
    assert bad.exclude() == ["gpu3"]
    changed = bad.change(forgive=["gpu3"], exclude=["gpu7"])
    assert changed.exclude == ("gpu7",) and bad.exclude() == ["gpu7"]
    assert len(json.loads((tmp_path / BAD_NODES_FILE).read_text())["failures"]) == 2


def _record_failures(folder: str, writer: int, count: int) -> None:
    """One writer process: `count` failures of its own, one merge each, and the suspects
    `sweep collect` would record in between (set_suspects reads and writes the whole file too)."""
    bad = BadNodes(Path(folder))
    for index in range(count):
        bad.merge([NodeFailure(f"w{writer}-r{index}", 1, "node_fail", (f"gpu{writer}",))])
        bad.set_suspects({f"gpu{writer}": {"straggler_runs": index + 1, "runs": []}})


def test_writers_in_several_processes_lose_none_of_each_others_failures(tmp_path: Path) -> None:
    """Status polls, the search driver, `sweep nodes` and `sweep collect` each read the file,
    change it and write it back, from processes of their own. Four real processes doing so at
    once: every failure each one merged is in the file at the end."""
    import multiprocessing

    writers, count = 4, 25
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_record_failures, args=(str(tmp_path), writer, count))
                 for writer in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    recorded = json.loads((tmp_path / BAD_NODES_FILE).read_text())
    assert {f["run_id"] for f in recorded["failures"]} == {
        f"w{w}-r{i}" for w in range(writers) for i in range(count)}
    assert sorted(recorded["exclude"]) == [f"gpu{w}" for w in range(writers)]
