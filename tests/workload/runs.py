"""Helpers for the workload tests: run directories with a real run.json, and torchrun launches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.core.runconfig import RunConfig
from sweep.core.state import atomic_write_json

REPO = Path(__file__).resolve().parents[2]


def run_config(model: str = "tiny-4l", *, seq_len: int = 64, global_batch: int = 4, steps: int = 5,
               warmup_steps: int = 1, dtype: str = "fp32", settings: dict[str, Any] | None = None,
               **layout: Any) -> RunConfig:
    full_layout = {"dp": 1, "tp": 1, "pp": 1} | layout
    full_layout.setdefault("mbs", global_batch // (full_layout["dp"] * full_layout.get("grad_acc", 1)))
    shape = get_model(model)
    lay = Layout(**full_layout)
    return RunConfig(sweep="test", framework="builtin", model=shape, layout=lay, nodes=1,
                     gpus_per_node=lay.world_size, gpu="cpu", dtype=dtype, seq_len=seq_len,
                     global_batch_sequences=global_batch,
                     settings={"steps": steps, "warmup_steps": warmup_steps, "seed": 1234,
                               "hang_timeout_s": 120} | (settings or {}))


def write_run_dir(root: Path, cfg: RunConfig) -> Path:
    run_dir = root / cfg.run_id
    atomic_write_json(run_dir / "run.json", cfg.to_json())
    return run_dir


def workload_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SWEEP_ATTEMPT_DIR", None)
    # each run folder measures its own CPU peak (sweep.workload.peak): short trials suffice here,
    # where the tests are of training, not of the peak (tests/workload/test_peak.py)
    env.setdefault("SWEEP_CPU_PEAK_TRIALS", "2")
    env.setdefault("SWEEP_CPU_PEAK_TRIAL_S", "0.05")
    return env | extra


def launch(run_dir: Path, nproc: int, *extra: str, timeout: float = 180,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m sweep.workload` alone (nproc 0) or under torchrun --standalone."""
    if nproc == 0:
        cmd = [sys.executable, "-m", "sweep.workload", "--run-dir", str(run_dir), *extra]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "sweep.workload", "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=workload_env(**(env or {})),
                          cwd=REPO)


def forked_launch_cmd(run_dir: Path, nproc: int, *extra: str) -> list[str]:
    """The built-in launcher (sweep.workload.launch), as launch/builtin.sh runs it on one node."""
    return [sys.executable, "-m", "sweep.workload", "--run-dir", str(run_dir), f"--nproc-per-node={nproc}", *extra]
