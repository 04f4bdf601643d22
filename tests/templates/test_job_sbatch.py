"""job.sbatch's environment contract, run for real under bash as a job-array task would run it.

In most tests `srun` is a recording stand-in (a shell script that writes its arguments and
environment and exits), because the subject is the job script's own logic: attempt folders,
the node list, MASTER_ADDR/MASTER_PORT, the exports, and the exact watchdog command line. The
last test submits the same script to the real local Slurm cluster; tests/backends/local/test_backend.py runs it
with the emulated srun, the watchdog and the workload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sweep.backends.local.backend import write_shims
from sweep.plan.render import render_runs
from sweep.plan.spec import parse_spec

SPEC = """
name: jobtest
framework: builtin
gpu: cpu
gpus_per_node: 2
models: [tiny-4l]
nodes: [2]
seq_len: 64
global_batch: {sequences: 8}
run: {steps: 4, warmup_steps: 1, env: {MY_SETTING: "a b $(c)"}}
"""
ROW = {"model": "tiny-4l", "nodes": 2, "dp": 2, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "mbs": 1,
       "grad_acc": 4, "zero_stage": 0, "vpp": 1, "recompute": "none", "sp": False,
       "pp_schedule": "1f1b"}
RECORDING_SRUN = """#!/bin/bash
{ printf '%s\\n' "$@"; } > "$SWEEP_ATTEMPT_DIR/srun.args"
env > "$SWEEP_ATTEMPT_DIR/srun.env"
exit "${FAKE_SRUN_EXIT:-0}"
"""


@pytest.fixture()
def job(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    [run_dir] = render_runs(parse_spec(SPEC), pd.DataFrame([ROW]), tmp_path / "sweep")
    bin_dir = write_shims(tmp_path / "bin")
    (bin_dir / "srun").write_text(RECORDING_SRUN)
    env = {"PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                    os.environ["PATH"]]),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[7-8]", "SLURM_NNODES": "2",
           "SWEEP_RUN_DIR": str(run_dir), "HOME": os.environ.get("HOME", "/root")}
    return run_dir, env


def run_script(run_dir: Path, env: dict[str, str], out: Path) -> subprocess.CompletedProcess:
    with open(out, "w") as handle:
        return subprocess.run(["bash", str(run_dir / "job.sbatch")], env=env, stdout=handle,
                              stderr=subprocess.STDOUT, timeout=120, cwd=run_dir.parent)


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_an_array_task_gets_the_next_attempt_and_the_watchdog_command(
        job: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    run_dir, env = job
    done = run_script(run_dir, env, tmp_path / "task.out")
    assert done.returncode == 0, (tmp_path / "task.out").read_text()
    attempt = run_dir / "attempts" / "1"
    args = (attempt / "srun.args").read_text().splitlines()
    python = os.path.abspath(sys.executable)  # the interpreter that rendered it
    assert args == ["--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=1", python, "-m",
                    "sweep.job.watchdog", "--run-dir", str(run_dir), "--attempt-dir", str(attempt),
                    "--", "bash", f"{run_dir}/launch/builtin.sh"]
    seen = env_file(attempt / "srun.env")
    assert seen["MASTER_ADDR"] == "node7"
    assert seen["MASTER_PORT"] == str(20000 + 4242 % 10000)
    assert (seen["SWEEP_RUN_ID"], seen["SWEEP_ATTEMPT"]) == (run_dir.name, "1")
    assert seen["SWEEP_ATTEMPT_DIR"] == str(attempt)
    assert seen["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # tp 2
    assert seen["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and seen["NCCL_DEBUG"] == "WARN"
    assert seen["MY_SETTING"] == "a b $(c)"
    assert os.readlink(attempt / "job.out") == str(tmp_path / "task.out")
    assert (attempt / "env.json").is_file()
    run_script(run_dir, env, tmp_path / "again.out")
    assert (run_dir / "attempts" / "2" / "srun.args").is_file()


def test_concurrent_starts_never_share_an_attempt_folder(job: tuple[Path, dict[str, str]],
                                                          tmp_path: Path) -> None:
    run_dir, env = job
    procs = [subprocess.Popen(["bash", str(run_dir / "job.sbatch")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    attempts = sorted(p.name for p in (run_dir / "attempts").iterdir() if p.is_dir())
    assert attempts == ["1", "2", "3", "4"]
    assert all((run_dir / "attempts" / a / "srun.args").is_file() for a in attempts)


def test_a_given_attempt_is_used_and_srun_failure_is_the_job_status(
        job: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    run_dir, env = job
    env = {**env, "SWEEP_ATTEMPT": "7", "FAKE_SRUN_EXIT": "3"}
    assert run_script(run_dir, env, tmp_path / "o").returncode == 3
    assert (run_dir / "attempts" / "7" / "srun.args").is_file()


def test_outside_slurm_the_script_says_how_to_run_it(job: tuple[Path, dict[str, str]],
                                                     tmp_path: Path) -> None:
    run_dir, env = job
    env = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}
    done = run_script(run_dir, env, tmp_path / "o")
    assert done.returncode == 2
    assert "submit with sbatch" in (tmp_path / "o").read_text()
    assert not list((run_dir / "attempts").iterdir())


@pytest.mark.slurm
@pytest.mark.slow
def test_the_same_script_runs_a_two_node_job_under_real_slurm(
        slurm_cluster: None, tmp_path: Path, repo_root: Path) -> None:
    """sbatch on the local cluster (scripts/local-slurm.sh start): real srun, two nodes, two
    watchdogs, torchrun rendezvous at the first node, the built-in workload. --mem on the command
    line only because the local cluster gives 1 GiB per CPU by default."""
    from sweep.plan import space
    from sweep.plan.spec import load_spec

    spec = load_spec(repo_root / "examples" / "local-cpu.yaml")
    plan = space.plan(spec)
    row = plan[(plan.nodes == 2) & (plan.dp == 4) & (plan.model == "tiny-4l")]
    [run_dir] = render_runs(spec, row, tmp_path / "sweep")
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ["PATH"]])}
    done = subprocess.run(["sbatch", "--parsable", "--wait", "--mem=3G",
                           str(run_dir / "job.sbatch")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    attempt = run_dir / "attempts" / "1"
    status = json.loads((attempt / "status.json").read_text())
    assert status["outcome"] == "completed" and status["slurm_job_id"] == job_id, status
    provenance = json.loads((attempt / "env.json").read_text())
    assert len(provenance["nodes"]) == 2
    assert provenance["env"]["MASTER_ADDR"] == provenance["nodes"][0]
    assert os.readlink(attempt / "job.out") == str(run_dir / "attempts" / f"slurm-{job_id}.out")
