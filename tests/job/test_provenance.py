"""env.json records what ran: versions, commits (dirty or not), nodes and the Slurm job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sweep.job import provenance


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_git_state_names_the_commit_and_sees_local_changes(tmp_path: Path) -> None:
    repo = tmp_path / "framework"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    git(repo, "add", "train.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    state = provenance.git_state(repo / ".")
    assert state is not None
    assert state["sha"] == git(repo, "rev-parse", "HEAD") and state["dirty"] is False
    assert state["path"] == str(repo)
    (repo / "train.py").write_text("print(2)\n")
    assert provenance.git_state(repo)["dirty"] is True
    assert provenance.git_state(tmp_path / "nowhere") is None


def test_env_json_holds_versions_nodes_and_the_job(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    environ = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node1", "NCCL_DEBUG": "WARN",
               "HOME": "/root", "SWEEP_RUN_ID": "r1"}
    record = provenance.collect(tmp_path, None, ["node1", "node2"], environ)
    assert record["nodes"] == ["node1", "node2"] and record["slurm_job_id"] == "77"
    assert record["env"] == {"NCCL_DEBUG": "WARN", "SLURMD_NODENAME": "node1",
                             "SLURM_JOB_ID": "77", "SWEEP_RUN_ID": "r1"}  # no HOME
    assert record["packages"]["torch"].startswith("2.")
    assert record["harness"]["git"]["sha"]  # the checkout these tests run from
    assert provenance.main(["--out", str(out), "--nodes", "a", "b"]) == 0
    assert json.loads(out.read_text())["nodes"] == ["a", "b"]
