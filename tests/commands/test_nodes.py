"""`sweep nodes`: the bad-node list of a sweep folder, read and changed without Slurm. The
failures are merged by the same code `sweep status` runs (Tracker._update_bad_nodes); the live
path, a node really killed under Slurm, is in tests/commands/test_resume.py."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from sweep.cli import main
from sweep.slurm import Slurm
from sweep.submission import NodeFailure
from sweep.tracker import BAD_NODES_FILE, Tracker


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    (tmp_path / "nodes-sweep" / "runs").mkdir(parents=True)
    return tmp_path / "nodes-sweep"


def fail(sweep_dir: Path, *failures: tuple[str, str]) -> list[str]:
    """Record failed attempts (run id, node) as a status poll would; returns the exclude list."""
    time.sleep(0.01)  # a failure seen strictly after any earlier forgiving
    return Tracker(sweep_dir)._update_bad_nodes(
        [NodeFailure(run, 1, "node_fail", (node,)) for run, node in failures])


def sweep_nodes(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["nodes", *argv])
    out, err = capsys.readouterr()
    return code, " ".join(re.sub("[\u2500-\u257f]", " ", out).split()), err  # without the table's lines


def test_a_sweep_without_failures_has_no_bad_nodes(sweep_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep_nodes(capsys, str(sweep_dir))[:2] == (0, "nodes-sweep: no node has failed, none is excluded")
    assert not (sweep_dir / BAD_NODES_FILE).exists()


def test_the_list_says_why_each_node_is_excluded_or_in_use(sweep_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert fail(sweep_dir, ("a", "node2"), ("b", "node2"), ("c", "node3")) == ["node2"]
    code, out, _ = sweep_nodes(capsys, str(sweep_dir))
    assert code == 0
    assert "node2 2 2 excluded after 2 failures since" in out
    assert "node3 1 1 in use" in out


def test_a_forgiven_node_is_back_in_use_until_two_new_failures(sweep_dir: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    old = (("a", "node2"), ("b", "node2"))
    assert fail(sweep_dir, *old) == ["node2"]
    code, out, _ = sweep_nodes(capsys, str(sweep_dir), "--forgive", "node2")
    assert (code, out) == (0, "nodes-sweep: forgave 1, excluded 0 node(s); later submissions exclude: none")
    assert Tracker(sweep_dir).excluded() == []
    assert fail(sweep_dir, *old) == []  # the next poll sees the same old failures: they no longer count
    assert "node2 2 0 in use, forgiven at" in sweep_nodes(capsys, str(sweep_dir))[1]

    assert fail(sweep_dir, ("c", "node2")) == []
    assert fail(sweep_dir, ("d", "node2")) == ["node2"]
    assert "node2 4 2 excluded after 2 failures since" in sweep_nodes(capsys, str(sweep_dir))[1]


def test_nodes_excluded_by_hand_stay_out_whatever_the_polls_see(sweep_dir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep_nodes(capsys, str(sweep_dir), "--exclude", "gpu[07-08]", "--exclude", "gpu11")[0] == 0
    assert fail(sweep_dir, ("a", "gpu01")) == ["gpu07", "gpu08", "gpu11"]
    out = sweep_nodes(capsys, str(sweep_dir))[1]
    assert "gpu07 0 0 excluded by hand since" in out and "gpu01 1 1 in use" in out
    assert sweep_nodes(capsys, str(sweep_dir), "--forgive", "gpu08")[0] == 0
    assert Tracker(sweep_dir).excluded() == ["gpu07", "gpu11"]


def test_a_node_failure_slurm_pinned_on_no_node_blames_the_nodes_slurm_holds_down(
        sweep_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 4-node job whose batch host died: NODE_FAIL, and no srun line names a node. Stand-in
    for the cluster (labelled: this machine has no 4-node job to lose): sinfo's answer at the
    first poll that sees the failure. The live sinfo call is tested in tests/test_slurm.py."""
    sinfo = "gpu1|allocated\ngpu2|down*\ngpu3|allocated\ngpu4|idle\ngpu9|drained\n"
    calls: list[list[str]] = []

    def cluster(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, sinfo, "")

    tracker = Tracker(sweep_dir, slurm=Slurm(runner=cluster))
    job_nodes = ("gpu1", "gpu2", "gpu3", "gpu4")
    unpinned = NodeFailure("a", 1, "node_fail", job_nodes, exact=False)
    assert tracker._update_bad_nodes([unpinned]) == []
    assert tracker._update_bad_nodes([unpinned]) == []  # seen before: no second sinfo call
    assert [argv[0] for argv in calls] == ["sinfo"]
    [record] = json.loads((sweep_dir / BAD_NODES_FILE).read_text())["failures"]
    assert (record["nodes"], record["blame"]) == (["gpu2"], "sinfo")

    sinfo = "gpu1|allocated\ngpu2|idle\ngpu3|idle\ngpu4|idle\n"  # back before the next poll saw it
    assert tracker._update_bad_nodes([NodeFailure("b", 1, "node_fail", job_nodes, exact=False)]) == ["gpu2"]
    records = json.loads((sweep_dir / BAD_NODES_FILE).read_text())["failures"]
    assert (records[1]["nodes"], records[1]["blame"]) == (list(job_nodes), "every node of the job")
    assert "gpu2 2 2 excluded after 2 failures" in sweep_nodes(capsys, str(sweep_dir))[1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--forgive", "node5"], "--forgive node5: not excluded by this sweep (excluded: node2)"),
    (["--exclude", "node1;reboot"], "--exclude 'node1;reboot': 'node1;reboot' is not a node name"),
    (["--exclude", "gpu[01-"], "--exclude 'gpu[01-': unbalanced brackets"),
    (["--forgive", "node2", "--exclude", "node2"], "node2: both in --forgive and --exclude; choose one"),
])
def test_bad_input_names_the_flag_and_changes_nothing(sweep_dir: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], message: str) -> None:
    fail(sweep_dir, ("a", "node2"), ("b", "node2"))
    before = (sweep_dir / BAD_NODES_FILE).read_bytes()
    code, _, err = sweep_nodes(capsys, str(sweep_dir), *argv)
    assert code == 2 and err.startswith(f"sweep nodes: error: {message}"), err
    assert (sweep_dir / BAD_NODES_FILE).read_bytes() == before
    assert json.loads(before)["exclude"] == ["node2"]


def test_a_folder_that_is_not_a_sweep_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = sweep_nodes(capsys, str(tmp_path))
    assert code == 2 and "no runs/ folder" in err
