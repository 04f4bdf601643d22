"""Pipeline parallelism with torch.distributed.pipelining: stage placement and schedule.

A layout's pp ranks hold pp·vpp stages. Single-stage schedules (1F1B, GPipe) give rank r stage r;
interleaved 1F1B gives rank r the stages r, r+pp, r+2·pp, ... (looped placement). Micro-batches
per step = grad_acc, each of mbs sequences; the schedule divides gradients by their number, so the
step's gradient is the mean over the whole local batch, as without PP. What a stage holds is
sweep.workload.model.keep_stage, which needs no pipelining import.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _PipelineSchedule,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from sweep.core.layout import Layout

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "interleaved_1f1b": ScheduleInterleaved1F1B}


def pipeline_problems(layout: Layout, num_layers: int, tied: bool) -> list[str]:
    """Why this layout cannot be pipelined, as `field: fix` sentences (empty when it can)."""
    if layout.pp == 1:
        return []
    problems = []
    if layout.pp_schedule not in SCHEDULES:
        problems.append(f"layout.pp_schedule: {layout.pp_schedule!r} is not one of {', '.join(SCHEDULES)}")
    elif layout.vpp > 1 and layout.pp_schedule != "interleaved_1f1b":
        problems.append(f"layout.vpp: {layout.vpp} virtual stages need pp_schedule interleaved_1f1b")
    stages = layout.pp * layout.vpp
    if num_layers < stages:
        problems.append(f"layout.pp: {stages} pipeline stages need at least as many layers (model has {num_layers})")
    if layout.pp_schedule == "interleaved_1f1b" and layout.grad_acc % layout.pp:
        problems.append(f"layout.grad_acc: interleaved 1F1B needs micro-batches ({layout.grad_acc}) "
                        f"to be a multiple of pp ({layout.pp})")
    elif layout.pp_schedule == "1f1b" and layout.grad_acc < layout.pp:
        problems.append(f"layout.grad_acc: 1F1B needs at least pp={layout.pp} micro-batches per step, "
                        f"got {layout.grad_acc}")
    if tied:
        problems.append("model.tie_word_embeddings: a tied embedding cannot be split across pipeline "
                        "stages; use an untied model or pp 1")
    return problems


def stage_indices(layout: Layout, pp_rank: int) -> list[int]:
    return [pp_rank + k * layout.pp for k in range(layout.vpp)]


def build_schedule(modules: list[torch.nn.Module], stages: list[int], layout: Layout,
                   pp_mesh: DeviceMesh, device: torch.device,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> _PipelineSchedule:
    num_stages = layout.pp * layout.vpp
    pipeline_stages: list[_PipelineStageBase] = [  # the schedules take a list of the base class
        PipelineStage(module, index, num_stages, device, group=pp_mesh.get_group())
        for module, index in zip(modules, stages, strict=True)]
    schedule_class = SCHEDULES[layout.pp_schedule]
    if schedule_class is ScheduleInterleaved1F1B:
        return schedule_class(pipeline_stages, n_microbatches=layout.grad_acc, loss_fn=loss_fn)
    return schedule_class(pipeline_stages[0], n_microbatches=layout.grad_acc, loss_fn=loss_fn)
