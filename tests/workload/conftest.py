"""Shared, expensive fixtures of the workload tests: each launch pays 3-5 s of torch start-up.

- `reference`: the single process, through the real CLI (`python -m sweep.workload`).
- `two_rank` / `four_rank`: one torchrun each that trains every 2-rank / 4-rank layout of the
  golden test in one process group (tests/workload/layouts_worker.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # `pytest` run outside the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.workload.runs import REPO, launch, run_config, workload_env, write_run_dir

# Every layout trains the same global batch of 4 sequences of 64 tokens for 5 steps in fp32.
TWO_RANK_LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"dp": 2},
    "ddp-grad_acc2": {"dp": 2, "grad_acc": 2},
    "zero1": {"dp": 2, "zero_stage": 1},
    "fsdp2-zero2": {"dp": 2, "zero_stage": 2},
    "fsdp2-zero3": {"dp": 2, "zero_stage": 3},
    "fsdp2-zero3-grad_acc2": {"dp": 2, "zero_stage": 3, "grad_acc": 2},
    "tp": {"tp": 2},
    "tp-sp": {"tp": 2, "sp": True},
    "pp-1f1b": {"pp": 2, "grad_acc": 2},
    "pp-gpipe": {"pp": 2, "grad_acc": 2, "pp_schedule": "gpipe"},
    "pp-interleaved_1f1b": {"pp": 2, "grad_acc": 2, "pp_schedule": "interleaved_1f1b", "vpp": 2},
    "cp": {"cp": 2},
    "ddp-recompute_selective": {"dp": 2, "recompute": "selective"},
    "ddp-recompute_full": {"dp": 2, "recompute": "full"},
}
# Same global batch, first step only: every parameter's full gradient norm (no optimizer step).
GRADIENT_LAYOUTS: dict[str, dict[str, Any]] = {
    "grad-ddp-grad_acc2": {"dp": 2, "grad_acc": 2},
    "grad-fsdp2-zero3": {"dp": 2, "zero_stage": 3},
    "grad-tp-sp": {"tp": 2, "sp": True},
    "grad-cp": {"cp": 2},
    "grad-gqa-tied-tp-sp": {"model": "tiny-gqa-4l", "tp": 2, "sp": True},
    "grad-gqa-tied-fsdp2-zero2": {"model": "tiny-gqa-4l", "dp": 2, "zero_stage": 2},
}
MEMTRACK_LAYOUTS = ("ddp", "fsdp2-zero3", "fsdp2-zero3-grad_acc2", "ddp-recompute_selective",
                    "ddp-recompute_full")
NEGATIVE_CONTROL = "ddp-UNSYNCED"  # DDP that never reduces gradients: must NOT match
FOUR_RANK_LAYOUTS: dict[str, dict[str, Any]] = {
    "dp2xtp2": {"dp": 2, "tp": 2, "zero_stage": 3},
    "dp2xpp2": {"dp": 2, "pp": 2, "grad_acc": 2, "zero_stage": 2},
    "tp2xpp2": {"tp": 2, "pp": 2, "grad_acc": 2, "sp": True},
    "dp2xpp2-ddp": {"dp": 2, "pp": 2, "grad_acc": 2},  # DDP cannot run under PP: all-reduce path
    "tp2xcp2": {"tp": 2, "cp": 2, "sp": True},
    "pp2xcp2": {"pp": 2, "cp": 2, "grad_acc": 2},  # CP gathers on meta tensors at stage set-up
}
EIGHT_RANK_LAYOUTS: dict[str, dict[str, Any]] = {
    "dp2xtp2xpp2": {"dp": 2, "tp": 2, "pp": 2, "grad_acc": 2, "zero_stage": 3, "sp": True},
}


@dataclass(frozen=True)
class LayoutRun:
    losses: list[float]
    memtrack: list[dict[str, int]] | None
    error: str | None
    grad_norms: dict[str, float] | None = None


def run_layouts(root: Path, nproc: int, layouts: dict[str, dict[str, Any]],
                timeout: float = 300) -> dict[str, LayoutRun]:
    dirs = {name: write_run_dir(root / name, run_config(**kw)) for name, kw in layouts.items()}
    out = root / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(REPO / "tests" / "workload" / "layouts_worker.py"), str(out), *map(str, dirs.values())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=workload_env(), cwd=REPO)
    assert proc.returncode == 0 and out.exists(), f"torchrun failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    raw = json.loads(out.read_text())
    return {name: LayoutRun(**raw[str(d)]) if str(d) in raw else LayoutRun([], None, "not run")
            for name, d in dirs.items()}


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The single-process run through the CLI: (run dir, finished process)."""
    run_dir = write_run_dir(tmp_path_factory.mktemp("reference"), run_config())
    return run_dir, launch(run_dir, 0)


@pytest.fixture(scope="session")
def reference_losses(reference: tuple[Path, subprocess.CompletedProcess[str]]) -> list[float]:
    run_dir, proc = reference
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "step"]


@pytest.fixture(scope="session")
def two_rank(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LayoutRun]:
    layouts = {name: dict(kw) for name, kw in TWO_RANK_LAYOUTS.items()}
    for name in MEMTRACK_LAYOUTS:
        layouts[name]["settings"] = {"test_memtrack": True}
    layouts[NEGATIVE_CONTROL] = {"dp": 2, "settings": {"test_unsynced_ddp": True}}
    for name, kw in GRADIENT_LAYOUTS.items():
        layouts[name] = kw | {"settings": {"test_grad_norms": True}}
    return run_layouts(tmp_path_factory.mktemp("two_rank"), 2, layouts)


@pytest.fixture(scope="session")
def four_rank(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LayoutRun]:
    return run_layouts(tmp_path_factory.mktemp("four_rank"), 4, FOUR_RANK_LAYOUTS)
