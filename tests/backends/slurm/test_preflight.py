"""The preflight: one tiny job that proves the runs can start on the target partition, before
anything else is submitted (and, live, that a bad interpreter is caught in seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sweep.backends.slurm.preflight import node_check, sbatch_options, script_text, target_of
from sweep.cli import main
from tests.slurm_sweeps import sweep_tasks, wait_until_settled
from tests.specs import tiny_cpu_spec

RUN_JSON = {"framework": "builtin", "gpu": "cpu", "gpus_per_node": 2,
            "settings": {"python": "/opt/venv bench/bin/python", "partition": "debug",
                         "account": "proj-1", "setup": ["module load cuda/12.4"]}}



def test_the_target_comes_from_the_run_and_its_key_from_every_setting() -> None:
    target = target_of(RUN_JSON)
    assert target.python == "/opt/venv bench/bin/python" and target.gpus_per_node is None
    assert dict(target.slurm) == {"partition": "debug", "account": "proj-1"}
    other = target_of({**RUN_JSON, "settings": {**RUN_JSON["settings"], "python": "/usr/bin/python3"}})
    assert target.key() != other.key()


def test_the_script_quotes_every_value_and_runs_the_setup_first(tmp_path: Path) -> None:
    text = script_text(target_of(RUN_JSON), tmp_path)
    assert "\nmodule load cuda/12.4\n" in text
    assert "exec '/opt/venv bench/bin/python' -m sweep.backends.slurm.preflight --node-check" in text
    assert text.index("module load") < text.index("exec ")
    path = tmp_path / "p.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    options = sbatch_options(target_of(RUN_JSON), tmp_path / "out")
    assert "--partition=debug" in options and "--wait" in options
    assert not any(o.startswith("--gpus") for o in options)


def test_the_node_check_finds_missing_gpus_and_a_wrong_framework_version() -> None:
    assert node_check("builtin", "bundled", None, None)["problems"] == []
    found = node_check("builtin", "bundled", None, 8)
    assert any("GPU(s) visible, the runs need 8" in p for p in found["problems"]) or \
        found["gpus_visible"] >= 8


def test_the_node_check_names_a_module_the_framework_imports_but_does_not_install() -> None:
    """nanotron main needs grouped_gemm on every node (tests/frameworks/nanotron/test_version.py
    has the job's own check); the preflight says so before the first array is submitted."""
    from sweep.frameworks.nanotron.config_schema import MAIN

    found = node_check("nanotron", MAIN, None, None)
    assert any("'grouped_gemm' is not installed" in p and "pip install" in p
               for p in found["problems"])


@pytest.mark.parametrize(("device", "problem"), [
    ("NVIDIA H100 80GB HBM3", None),
    ("NVIDIA A100-SXM4-80GB", "the spec says h100-sxm, but this node has NVIDIA A100-SXM4-80GB "
                              "(catalog a100-80gb)"),
    ("NVIDIA RTX 9000 Unknown", None),  # not in the catalog: nothing to compare
])
def test_the_node_check_refuses_a_gpu_type_other_than_the_specs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, problem: str | None) -> None:
    """MFU divides by the catalog peak of the spec's GPU, so a partition of other GPUs would
    publish wrong figures. A stand-in nvidia-smi (this machine has no GPU) names the devices."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/bash\nif [[ $1 == -L ]]; then echo 'GPU 0: {device} (UUID: GPU-0)';"
                   f" else echo '{device}'; fi\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = node_check("builtin", "bundled", None, 1, "h100-sxm")
    assert found["gpu_models"] == [device] and found["gpus_visible"] == 1
    if problem is None:
        assert found["problems"] == []
    else:
        [message] = found["problems"]
        assert problem in message and "Set gpu to the node's type" in message
    target = target_of({**RUN_JSON, "gpu": "h100-sxm"})
    assert "--gpu h100-sxm" in script_text(target, tmp_path)


def spec_file(tmp_path: Path, name: str, **run: Any) -> Path:
    """One tiny CPU run (two sequences a step), with `run` settings changed."""
    return tiny_cpu_spec(tmp_path / "spec.yaml", name, global_batch={"sequences": 2},
                         run={"time_limit": "00:02:00", "mem": "1000M", **run})


@pytest.mark.slurm
def test_a_bad_interpreter_is_caught_in_seconds_and_nothing_is_submitted(
        slurm_cluster: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_file(tmp_path, sweep_name, python="/nonexistent/venv/bin/python3")
    out = tmp_path / "sweep"
    started = time.monotonic()
    assert main(["submit", str(spec), "--out", str(out)]) == 2
    elapsed = time.monotonic() - started
    error = capsys.readouterr().err
    assert "preflight failed" in error and "/nonexistent/venv/bin/python3 is not there" in error
    assert elapsed < 60, elapsed
    assert not (out / "ledger.jsonl").exists() and sweep_tasks(sweep_name) == []


@pytest.mark.slurm
def test_a_good_preflight_passes_once_and_is_remembered(
        slurm_cluster: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert main(["submit", str(spec_file(tmp_path, sweep_name)), "--out", str(out), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "preflight passed on" in printed and "(llm-sweep" in printed
    record = json.loads((out / "preflight" / "passed.json").read_text())
    assert record["result"]["python"] == os.path.abspath(sys.executable)
    assert main(["resume", str(out)]) == 0
    assert "preflight" not in capsys.readouterr().out  # remembered: not run again
    wait_until_settled(out, timeout_s=180)


@pytest.mark.slurm
@pytest.mark.slow
def test_status_and_collect_agree_on_a_job_that_died_before_writing_anything(
        slurm_cluster: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_file(tmp_path, sweep_name, python="/nonexistent/venv/bin/python3")
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--no-preflight", "--no-report"]) == 0
    observation = wait_until_settled(out, timeout_s=120)
    [state] = observation.states
    assert state.state == "crashed", state
    assert main(["collect", str(out), "--sacct"]) == 0
    [row] = pq.read_table(out / "runs.parquet").to_pylist()
    assert row["outcome"] == state.state and row["status_source"] == "sacct", {k: row[k] for k in ("outcome", "status_source", "slurm_state", "slurm_job_id", "reason")}
    assert row["slurm_job_id"] == state.task
