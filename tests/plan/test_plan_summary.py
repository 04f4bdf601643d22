"""sweep.plan.plan_summary: what `sweep plan` tells its user about a plan, tested without the command
(tests/commands/test_plan.py runs the command and reads what it prints)."""

from __future__ import annotations

import pandas as pd
import pytest

from sweep.core.units import GiB
from sweep.plan import device_memory
from sweep.plan.plan_summary import memory_verdicts
from sweep.plan.spec import parse_spec


def test_plan_counts_the_memory_verdicts_against_the_models_uncertainty_band(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The band is the reserved peak's left-out error (−32 % .. +16 % of the prediction): a
    prediction a little over the budget may fit (a probe), one a little under it may not."""
    spec = parse_spec("name: band\nframework: builtin\ngpu: cpu\ngpu_memory_gb: 1\n"
                      "models: [tiny-4l]\nnodes: [1]\nseq_len: 64\nglobal_batch: {sequences: 4}\n")
    reserved = [0.5 * GiB, 0.9 * GiB, 1.1 * GiB, 1.3 * GiB, None]
    frame = pd.DataFrame({
        "status": ["kept", "kept", "kept", "pruned:memory", "pruned:tp_heads"],
        "mem_reserved_bytes": reserved, "mem_total_bytes": reserved,
        "mem_overhead_bytes": [0.0, 0.0, 0.0, 0.0, None]})
    verdicts = memory_verdicts(frame, spec)
    assert verdicts is not None
    assert (verdicts.kept_with_room, verdicts.kept_could_oom, verdicts.probes, verdicts.pruned,
            verdicts.pruned_could_fit) == (1, 1, 1, 1, 0)
    assert "1 kept that could run out, 1 probe(s)" in verdicts.describe()
    point_only = frame.assign(status=["kept", "kept", "pruned:memory", "pruned:memory", "x"])
    assert memory_verdicts(point_only, spec).pruned_could_fit == 1  # type: ignore[union-attr]
    no_ceiling = parse_spec("name: band\nframework: builtin\ngpu: cpu\nmodels: [tiny-4l]\n"
                            "nodes: [1]\nseq_len: 64\nglobal_batch: {sequences: 4}\n")
    # without gpu_memory_gb a CPU rank gets a share of Slurm's or the host's memory, judged on
    # its tensors without a band (tests/plan/test_device_memory.py); with no such figure, no rule
    monkeypatch.setattr(device_memory, "slurm_real_memory_mb", lambda partition: None)
    monkeypatch.setattr(device_memory, "host_memory_bytes", lambda: None)
    assert memory_verdicts(frame, no_ceiling) is None


def test_the_plan_and_its_explanations_say_when_the_spec_brings_its_own_allocator_constants() -> None:
    from sweep.models.memory_profiles import RESERVED_BAND, Allocator
    from sweep.plan import space
    from sweep.plan.plan_summary import allocator_notes, explain

    text = ("name: own\nframework: nanotron\nmodels: [playbook-1b]\nnodes: [1]\nseq_len: 4096\n"
            "global_batch: {sequences: 256}\n")
    assert allocator_notes(parse_spec(text)) == []
    spec = parse_spec(text + "constraints:\n  allocator: {sequential: 0.2, pipelined: 0.5, "
                             "logits: 0.25, floor_mib: 512}\n")
    [note] = allocator_notes(spec)
    assert note.startswith("memory: the spec's allocator constants (constraints.allocator: "
                           "sequential 0.2, pipelined 0.5, logits 0.25, floor 512 MiB) instead of "
                           f"the profile's fitted ones ({Allocator.of('nanotron').describe()}); ")
    low, high = RESERVED_BAND
    assert note.endswith(f"no band of their own: the probes use the shipped constants' left-out "
                         f"band {low:+.1%} .. {high:+.1%} (`sweep memory-check --write-constants "
                         "--cv model` measures theirs)")
    [banded] = allocator_notes(parse_spec(
        text + "constraints:\n  allocator: {sequential: 0.2, pipelined: 0.5, logits: 0.25, "
               "floor_mib: 512, band: [-0.25, 0.125]}\n"))
    assert banded.endswith("; their band -25.0% .. +12.5% (left out)")
    plan = space.plan(spec)
    row = plan[plan.status == "kept"].iloc[0]
    shown = explain(spec, plan, str(row.run_id))
    assert "framework profile: nanotron (the spec's allocator constants)" in shown
    assert f"{row.mem_reserved_bytes / GiB:.2f}" in shown  # the plan's own estimate, explained


def test_the_explanation_says_why_a_rank_holds_whole_gradients_under_zero() -> None:
    """A ZeRO-2 rank of dp 8 holding every gradient of its stage looks like a bug in the model;
    the explanation names the mechanism (FSDP's reduce-scatter deferred by the schedule)."""
    from sweep.plan import space
    from sweep.plan.plan_summary import explain

    text = ("name: titan\nframework: torchtitan\ngpu: h100-sxm\nmodels: [llama-3.1-405b]\n"
            "nodes: [64]\nseq_len: 8192\nglobal_batch: {sequences: 256}\n"
            "axes: {tp: [8], pp: [8], zero_stage: [2], recompute: [full], mbs: [4]}\n")
    spec = parse_spec(text)
    plan = space.plan(spec)
    shown = explain(spec, plan, str(plan[plan.status == "kept"].iloc[0].run_id))
    assert ("gradients: whole, not 1/8 of them: the pipeline schedule "
            "(torch.distributed.pipelining) defers FSDP's reduce-scatter") in shown
    # without a pipeline: torchtitan's own accumulation reduce-scatters every micro-batch, the
    # built-in workload's defers it
    accumulating = ("gpu: h100-sxm\nnodes: [1]\nseq_len: 4096\nglobal_batch: {sequences: 64}\n"
                    "axes: {tp: [1], pp: [1], zero_stage: [2], recompute: [full], mbs: [1]}\n")
    for framework, model, said in (("torchtitan", "llama-3.1-8b", None),
                                   ("builtin", "llama-3.2-1b", "the gradient accumulation defers")):
        spec = parse_spec(f"name: acc\nframework: {framework}\nmodels: [{model}]\n"
                          + accumulating)
        plan = space.plan(spec)
        [run_id] = plan.loc[plan.status == "kept", "run_id"]
        shown = explain(spec, plan, str(run_id))
        assert ("gradients: whole, not 1/8 of them" in shown) == (said is not None)
        assert said is None or said in shown


def test_the_explanation_of_a_torchtitan_03_run_names_its_chunked_loss_and_its_cuda_graph() -> None:
    """torchtitan 0.3's memory differs from 0.2's where its step is a CUDA graph (gradients zeroed,
    not freed) and its loss is chunked: the explanation says so for 0.3, not for 0.2."""
    from sweep.plan import space
    from sweep.plan.plan_summary import explain

    text = ("name: titan\nframework: torchtitan\ngpu: h100-sxm\nmodels: [llama-3.1-8b]\n"
            "nodes: [1]\nseq_len: 8192\nglobal_batch: {sequences: 8}\n"
            "axes: {tp: [1], pp: [1], zero_stage: [3], recompute: [full], mbs: [1]}\n"
            "run: {framework_version: VERSION}\n")
    said = {}
    for version in ("v0.2", "v0.3"):
        spec = parse_spec(text.replace("VERSION", version))
        plan = space.plan(spec)
        [run_id] = plan.loc[plan.status == "kept", "run_id"]
        said[version] = explain(spec, plan, str(run_id))
    assert "framework profile: torchtitan-0.3," in said["v0.3"]
    assert "framework profile: torchtitan," in said["v0.2"]
    graph = "gradients: held at the activation peak: the step is a CUDA graph"
    chunks = "logits: one of the loss's 8 chunks at a time"
    assert graph in said["v0.3"] and chunks in said["v0.3"]
    assert graph not in said["v0.2"] and chunks not in said["v0.2"]


def test_a_plan_that_keeps_nothing_points_to_the_rule_table_in_the_docs() -> None:
    """A rule without a hint of its own names the docs page with the rule table (it used to say
    "try see" a table of the README, which moved to docs/planning.md)."""
    from pathlib import Path

    from sweep.plan.plan_summary import RULE_HINTS, nothing_kept

    frame = pd.DataFrame({"prune_rule": pd.Categorical(["cp_seq"] * 3 + ["memory"])})
    text = nothing_kept(Path("spec.yaml"), frame)
    assert "  cp_seq: 3 candidates — see what the rule checks in docs/planning.md (\"The rules\")" \
        in text
    assert f"  memory: 1 candidates — try {RULE_HINTS['memory']}" in text
    assert "README" not in text and "try see" not in text
    assert "## The rules" in (Path(__file__).parents[2] / "docs" / "planning.md").read_text()
