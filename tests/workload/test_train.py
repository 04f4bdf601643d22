"""What the trainer refuses before it starts, with the field and the fix in the message."""

from __future__ import annotations

import dataclasses

import pytest

from sweep.workload.train import WorkloadError, config_problems, device_for
from tests.workload.runs import run_config


def test_a_runnable_config_has_no_problems() -> None:
    assert config_problems(run_config(dp=2, tp=2, sp=True), 4) == []


@pytest.mark.parametrize(("kwargs", "world", "message"), [
    ({"tp": 2}, 1, "WORLD_SIZE is 1; launch it with --nproc-per-node 2"),
    ({"dp": 1, "ep": 2, "mbs": 2}, 2, "layout.ep"),
    ({"tp": 3, "global_batch": 4}, 3, "layout.tp: 3 must divide num_kv_heads"),
    ({"sp": True}, 1, "layout.sp: sequence parallelism needs tp > 1"),
    ({"dtype": "fp8"}, 1, "dtype: 'fp8' is not supported"),
    ({"cp": 2, "seq_len": 63}, 2, "seq_len: 63 must be divisible by cp"),
    ({"dp": 2, "tp": 2, "zero_stage": 1}, 4, "layout.zero_stage: 1 with tp > 1 is not supported"),
    ({"pp": 2, "grad_acc": 2, "mbs": 2}, 2, ""),
])
def test_problems_name_the_field_and_the_fix(kwargs: dict, world: int, message: str) -> None:
    problems = config_problems(run_config(**kwargs), world)
    if message:
        assert any(message in p for p in problems), problems
    else:
        assert problems == []


def test_a_batch_that_does_not_match_the_layout_is_refused() -> None:
    cfg = dataclasses.replace(run_config(dp=2), global_batch_sequences=6)
    assert any("global_batch_sequences: 6 != dp·mbs·grad_acc = 4" in p for p in config_problems(cfg, 2))


def test_a_gpu_run_needs_cuda() -> None:  # this machine has no GPU: the CUDA path itself is untested here
    cfg = dataclasses.replace(run_config(), gpu="h100-sxm")
    with pytest.raises(WorkloadError, match="needs CUDA"):
        device_for(cfg)
