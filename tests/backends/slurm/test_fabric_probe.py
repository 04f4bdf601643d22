"""The fabric check's program on the compute nodes: the figures the nccl-tests way, the sizes,
waiting for its turn, and a real gloo all-reduce of two ranks on this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.backends.slurm.fabric_probe import bus_factor, size_figures, sizes_between, wait_for_turn

REPO = Path(__file__).resolve().parents[3]


def test_busbw_is_algbw_times_2_n_minus_1_over_n_as_in_nccl_tests() -> None:
    assert bus_factor(2) == 1.0 and bus_factor(8) == 1.75
    row = size_figures(8_000_000, [0.004, 0.002, 0.003], ranks=8)
    assert row["best_s"] == 0.002 and row["median_s"] == 0.003
    assert row["algbw_gbps"] == pytest.approx(4.0)  # 8 MB in 2 ms
    assert row["busbw_gbps"] == pytest.approx(7.0)


def test_the_sizes_grow_fourfold_up_to_the_largest() -> None:
    assert sizes_between(64 * 1024, 16 * 1024 * 1024) == [64 * 1024 * 4 ** i for i in range(5)]
    assert sizes_between(1000, 5000) == [1000, 4000, 5000]


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
