"""`sweep nodes`: the bad-node list of a sweep folder, read and changed without Slurm. The
failures are merged by the same code `sweep status` runs (sweep.backends.slurm.bad_nodes.BadNodes.merge); the
live path, a node really killed under Slurm, is in tests/commands/test_resume.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from sweep.backends.slurm.bad_nodes import BAD_NODES_FILE, BadNodes
from sweep.backends.slurm.submission import NodeFailure
from sweep.backends.slurm.tracker import Tracker
from sweep.cli import main


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    (tmp_path / "nodes-sweep" / "runs").mkdir(parents=True)
    return tmp_path / "nodes-sweep"


def fail(sweep_dir: Path, *failures: tuple[str, str]) -> list[str]:
    """Record failed attempts (run id, node) as a status poll would; returns the exclude list."""
    time.sleep(0.01)  # a failure seen strictly after any earlier forgiving
    return BadNodes(sweep_dir).merge(
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
