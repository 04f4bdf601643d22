"""The memory model's optimizer step for the built-in workload is what PyTorch's AdamW allocates.

The workload builds `torch.optim.AdamW` with PyTorch's defaults, which pick the foreach
implementation on CUDA: it takes sqrt(exp_avg_sq) of every parameter at once, an fp32 copy of the
parameters beside the weights, the gradients and both moments (20 bytes per parameter). On an H200
that was the peak of every run with full recomputation (tests/models/test_memory_on_cuda.py). PyTorch's
MemTracker measures the step here on CPU with foreach forced on, as CUDA would run it; the
per-tensor implementation, CPU's default, holds one tensor's temporary instead.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.core.model import count_parameters
from sweep.models.memory import estimate
from sweep.models.memory_profiles import BUILTIN
from sweep.workload.memory_tracking import tracked_peak
from sweep.workload.model import build, cross_entropy

SHAPE = dataclasses.replace(get_model("tiny-4l"), ffn_hidden_size=2048)


def step_peak(foreach: bool) -> int:
    """MemTracker's peak of one AdamW step (the first: the moments are created in it)."""
    model = build(SHAPE, 1)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=foreach)
    tokens = torch.randint(0, SHAPE.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    cross_entropy(model(tokens), tokens).backward()
    return tracked_peak(lambda _: optimizer.step(), [model], optimizer)["Total"]


def predicted_step_peak() -> float:
    """The model's optimizer-step peak, less the fixed workspaces a bare step does not touch."""
    layout = Layout(dp=1, tp=1, pp=1, mbs=2, grad_acc=1)
    est = estimate(SHAPE, layout, seq_len=64, dtype="bf16", profile="builtin")
    return float(est.step_allocated_bytes - BUILTIN.workspace_bytes)


def test_the_step_peak_is_the_foreach_implementation_s_twenty_bytes_per_parameter() -> None:
    parameters = count_parameters(SHAPE).total
    assert predicted_step_peak() == pytest.approx(20 * parameters, rel=1e-6)
    assert step_peak(foreach=True) == pytest.approx(predicted_step_peak(), rel=0.001)


def test_the_per_tensor_implementation_holds_less_so_a_cpu_run_is_over_counted() -> None:
    assert step_peak(foreach=False) < 0.9 * predicted_step_peak()
