"""launch/megatron.sh passes launch/megatron.args to pretrain_gpt.py exactly, line for line.

The launcher is run for real with a stand-in interpreter (run.python) that records its
arguments, so the test sees the argv torchrun would get, the version check's call included.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sweep.plan import space

RECORDER = """#!/bin/bash
printf '%s\\0' "$@" >> "$RECORD"
printf '\\n' >> "$RECORD"
"""


def write_run(tmp_path: Path, files: dict[str, str]) -> Path:
    run_dir = tmp_path / "run"
    for name, text in files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    return run_dir


def launch(run_dir: Path, framework: Path, record: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "SLURM_NODEID": "0",
           "SWEEP_RUN_DIR": str(run_dir), "SWEEP_ATTEMPT_DIR": str(run_dir),
           "MEGATRON_DIR": str(framework), "RECORD": str(record)}
    return subprocess.run(["bash", str(run_dir / "launch" / "megatron.sh")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture()
def recorder(tmp_path: Path) -> Path:
    path = tmp_path / "python"
    path.write_text(RECORDER)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def one_run(m: Any, recorder: Path, where: dict[str, Any], models: list[dict[str, Any]] | None = None,
            after_planning: dict[str, Any] | None = None,
            **settings: Any) -> tuple[Any, dict[str, str]]:
    """One rendered run; `after_planning` settings reach only the render (as an override added
    after `sweep plan` would), so the launcher's own refusals can be tested."""
    spec = m.family_spec("tpl", "bf16", models, nodes=(1,), python=str(recorder), **settings)
    plan = space.plan(spec)
    if after_planning:
        spec = m.family_spec("tpl", "bf16", models, nodes=(1,), python=str(recorder),
                             **settings, **after_planning)
    rows = plan[plan["status"] == space.KEPT]
    for column, value in where.items():
        rows = rows[rows[column] == value]
    (run,) = m.rendered(spec, rows.head(1))
    return run


def test_the_launcher_passes_the_args_file_line_for_line(tmp_path: Path, recorder: Path,
                                                         megatron_family: Any) -> None:
    _, files = one_run(megatron_family, recorder,
                       {"model": "moe-8e-8l", "tp": 2, "pp": 2, "ep": 2, "sp": True,
                        "zero_stage": 1, "pp_schedule": "interleaved_1f1b"})
    framework = tmp_path / "Megatron-LM"
    framework.mkdir()
    (framework / "pretrain_gpt.py").write_text("")
    record = tmp_path / "record"
    result = launch(write_run(tmp_path, files), framework, record)
    assert result.returncode == 0, result.stderr
    version_call, torchrun = (line.split("\0")[:-1] for line in record.read_text().splitlines())
    assert version_call[:4] == ["-m", "sweep.frameworks.versions", "--framework", "megatron"]
    script = torchrun.index(str(framework / "pretrain_gpt.py"))
    assert torchrun[:2] == ["-m", "torch.distributed.run"]
    assert torchrun[script + 1:] == megatron_family.argv(files["launch/megatron.args"])
    args = torchrun[script + 1:]
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
    assert {"--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
            "--overlap-param-gather", "--moe-grouped-gemm"} <= set(args)


def test_tp_comm_overlap_without_sp_refuses_to_launch(tmp_path: Path, recorder: Path,
                                                      megatron_family: Any) -> None:
    _, files = one_run(megatron_family, recorder, {"model": "dense-tied-8l", "tp": 2, "sp": False},
                       after_planning={"tp_comm_overlap": True})
    assert "--tp-comm-overlap" not in files["launch/megatron.args"]
    result = launch(write_run(tmp_path, files), tmp_path, tmp_path / "record")
    assert result.returncode == 3
    assert result.stderr.startswith("llm-sweep: cannot launch: run.tp_comm_overlap needs sequence")
    assert not (tmp_path / "record").exists()  # neither the version check nor torchrun ran


def test_uneven_layers_count_the_loss_then_the_embedding(megatron_family: Any,
                                                         recorder: Path) -> None:
    """Megatron splits layers evenly; the planner's pipeline_fits lets the loss, then the
    embedding too, count as a layer, so the arguments must say so."""
    seven = {**megatron_family.MODELS[1], "name": "dense-7l", "num_layers": 7}

    def split_flags(model: dict[str, Any] | None, where: dict[str, Any]) -> set[str]:
        _, files = one_run(megatron_family, recorder, where, [model] if model else None)
        return {a for a in megatron_family.argv(files["launch/megatron.args"]) if "split" in a}

    loss, embedding = ("--account-for-loss-in-pipeline-split",
                       "--account-for-embedding-in-pipeline-split")
    assert split_flags(seven, {"pp": 2}) == {loss}  # 7 + 1 = 8 over 2 stages
    assert split_flags(None, {"model": "dense-untied-6l", "pp": 4}) == {loss, embedding}  # 6 + 2
    assert split_flags(None, {"model": "dense-tied-8l", "pp": 4}) == set()
    assert split_flags(None, {"model": "dense-tied-8l", "pp": 2,
                              "pp_schedule": "interleaved_1f1b"}) == set()  # 8 over 2 × 2


def test_the_args_file_is_one_argument_per_line(megatron_family: Any, recorder: Path) -> None:
    _, files = one_run(megatron_family, recorder, {"model": "dense-tied-8l"})
    for line in files["launch/megatron.args"].splitlines():
        assert line == line.strip() and line, repr(line)
        assert line.startswith("#") or " " not in line, line


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_passes_the_launcher(tmp_path: Path, megatron_family: Any,
                                        recorder: Path) -> None:
    for settings in ({}, {"tp_comm_overlap": True}):
        _, files = one_run(megatron_family, recorder, {"tp": 2, "sp": False},
                           after_planning=settings)
        script = tmp_path / "megatron.sh"
        script.write_text(files["launch/megatron.sh"])
        result = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True,
                                text=True, check=False)
        assert result.returncode == 0, result.stdout + json.dumps(settings)
