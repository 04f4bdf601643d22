"""The memory profiles: which one a run gets, and torchtitan 0.3's against 0.2's.

torchtitan 0.3's profile (`TORCHTITAN_03`) is read from 0.3.0's source; each test below states the
source line the difference comes from and computes the bytes it adds or removes by hand, so a
test fails if the model counts anything else. That the 0.2 figures did not move is what the
other tests of the memory model check (tests/models/test_memory.py, test_memory_reference.py),
unchanged.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.core.model import count_parameters
from sweep.models.memory import MemoryEstimate, estimate
from sweep.models.memory_profiles import (
    PROFILES,
    TORCHTITAN,
    TORCHTITAN_03,
    VERSION_PROFILES,
    Allocator,
    MemoryProfile,
    get_profile,
    profile_for,
    profile_with,
)
from sweep.models.pipeline_stages import stage_layer_counts

REPO = Path(__file__).resolve().parents[2]
LLAMA_8B = get_model("llama-3.1-8b")
MIXTRAL = get_model("mixtral-8x7b")
SEQ = 8192


def _both(layout: Layout, model=LLAMA_8B, seq: int = SEQ) -> tuple[MemoryEstimate, MemoryEstimate]:
    """The estimate under torchtitan 0.2's profile and under 0.3's."""
    return (estimate(model, layout, seq_len=seq, profile=TORCHTITAN),
            estimate(model, layout, seq_len=seq, profile=TORCHTITAN_03))


# ------------------------------------------------------------------ which profile a run gets

def test_a_version_with_a_profile_of_its_own_gets_it_and_every_other_version_the_frameworks():
    assert profile_for("torchtitan", "v0.3") is TORCHTITAN_03
    assert profile_for("torchtitan", "main") is TORCHTITAN_03  # main at the pinned b5bcd76
    for version in ("v0.2", "v0.2.0", ""):
        assert profile_for("torchtitan", version) is TORCHTITAN
    for framework in PROFILES:
        assert profile_for(framework, "v0.3") is PROFILES[framework] or framework == "torchtitan"
    assert VERSION_PROFILES[("torchtitan", "v0.3")].name == "torchtitan-0.3"


def test_the_specs_allocator_constants_apply_to_the_versions_profile_too():
    allocator = Allocator(sequential=0.01, pipelined=0.2, logits=0.3, floor_bytes=123)
    mine = profile_with("torchtitan", allocator, "v0.3")
    assert Allocator.of(mine) == allocator
    assert replace(mine, fragmentation_sequential=TORCHTITAN_03.fragmentation_sequential,
                   fragmentation_pipelined=TORCHTITAN_03.fragmentation_pipelined,
                   fragmentation_logits=TORCHTITAN_03.fragmentation_logits,
                   reserved_floor_bytes=TORCHTITAN_03.reserved_floor_bytes) == TORCHTITAN_03
    assert profile_with("torchtitan", None, "v0.3") is TORCHTITAN_03


def test_a_version_profile_is_found_by_its_name_and_an_unknown_name_lists_them():
    assert get_profile("torchtitan-0.3") is TORCHTITAN_03
    assert stage_layer_counts(LLAMA_8B, 4, "torchtitan-0.3") == stage_layer_counts(LLAMA_8B, 4, TORCHTITAN_03)
    with pytest.raises(ValueError, match="unknown memory profile 'torchtitan-0.4'.*torchtitan-0.3"):
        get_profile("torchtitan-0.4")


def test_a_profile_refuses_fields_it_does_not_have_and_a_loss_without_chunks():
    with pytest.raises(ValueError, match="unvalidated names.*'loss_chunk'"):
        replace(TORCHTITAN_03, unvalidated=("loss_chunk",))
    with pytest.raises(ValueError, match="selective_saves names.*'wqkv'"):
        replace(TORCHTITAN_03, moe_selective_saves=("wqkv",))
    with pytest.raises(ValueError, match="loss_chunks must be >= 1"):
        replace(TORCHTITAN_03, loss_chunks=0)


# ------------------------------------------------------------------ 0.3 against 0.2

def test_the_03_profile_differs_from_02s_only_in_fields_it_says_are_unvalidated_on_a_gpu():
    changed = {f.name for f in dataclasses.fields(MemoryProfile)
               if getattr(TORCHTITAN, f.name) != getattr(TORCHTITAN_03, f.name)}
    assert changed - {"name", "description", "unvalidated"} == set(TORCHTITAN_03.unvalidated)
    for name in TORCHTITAN_03.unvalidated:
        assert name in TORCHTITAN_03.description  # the profile's own words say so
    assert TORCHTITAN.unvalidated == ()


def test_what_03_does_as_02_is_kept_fsdp2_the_fused_adamw_and_the_stage_split():
    """fp32 sharded params, fp32 reduce, the fused AdamW (no step temporaries), reduce-scatter
    every micro-batch of its own accumulation, and `_generate_llm_fqn_per_model_part` with the
    embedding and the output weighing one layer each."""
    for field in ("weight_bytes", "grad_bytes", "optimizer_bytes", "weights_shard_from_zero",
                  "fsdp_unsharded_layers", "optimizer_step_temp_bytes", "stage_split",
                  "grad_acc_defers_fsdp_reduction", "pipeline_defers_fsdp_reduction",
                  "logits_bytes_per_element", "grads_freed_each_step"):
        assert getattr(TORCHTITAN_03, field) == getattr(TORCHTITAN, field), field
    assert TORCHTITAN_03.optimizer_step_temp_bytes == 0.0
    # 32 layers + 2 on 4 stages: 9, 9, 8, 8 "layers", the first and the last less one each
    for profile in (TORCHTITAN, TORCHTITAN_03):
        assert stage_layer_counts(LLAMA_8B, 4, profile) == (8, 9, 8, 7)


def test_the_chunked_loss_holds_one_chunks_logits_and_the_hidden_states_buffers():
    """ChunkedLossWrapper (num_chunks 8): each chunk's logits and loss (10 bytes per logit, the
    same cross-entropy as 0.2's) are freed by that chunk's backward; for the whole loop it holds
    an fp32 buffer of the hidden states' gradient and their bf16 chunks (6 bytes per token x
    hidden), and under FSDP the LM head's whole fp32 gradient (sync off until the last chunk)."""
    mbs, v, h = 2, LLAMA_8B.vocab_size, LLAMA_8B.hidden_size
    tokens = mbs * SEQ
    head_grad = 4 * v * h
    for zero, holds_head_grad in ((3, True), (2, True), (0, False)):
        old, new = _both(Layout(dp=8, tp=1, pp=1, mbs=mbs, grad_acc=2, zero_stage=zero,
                                recompute="full"))
        assert old.components["logits"] == 10 * tokens * v
        expected = 10 * tokens * v / 8 + 6 * tokens * h + (head_grad if holds_head_grad else 0)
        assert new.components["logits"] == pytest.approx(expected, abs=1)
        assert new.components["logits"] < old.components["logits"] / 3


def test_under_tp_the_chunks_logits_are_a_vocabulary_shard_but_the_hidden_states_are_whole():
    mbs, tp, v, h = 1, 4, LLAMA_8B.vocab_size, LLAMA_8B.hidden_size
    tokens = mbs * SEQ
    _, new = _both(Layout(dp=2, tp=tp, pp=1, mbs=mbs, grad_acc=4, zero_stage=3, sp=True,
                          recompute="full"))
    expected = 10 * tokens * v / 8 / tp + 6 * tokens * h + 4 * v * h / tp
    assert new.components["logits"] == pytest.approx(expected, abs=1)


def test_under_a_pipeline_the_deferred_reduction_already_holds_the_heads_gradient():
    """torch.distributed.pipelining defers FSDP's reduce-scatter for every parameter, so the
    chunked loss adds no gradient of its own on the last stage, only its buffers."""
    mbs, v, h = 1, LLAMA_8B.vocab_size, LLAMA_8B.hidden_size
    layout = Layout(dp=4, tp=1, pp=2, mbs=mbs, grad_acc=8, zero_stage=3, recompute="full")
    last = estimate(LLAMA_8B, layout, seq_len=SEQ, profile=TORCHTITAN_03, stage="last")
    assert last.components["logits"] == pytest.approx(10 * mbs * SEQ * v / 8 + 6 * mbs * SEQ * h,
                                                      abs=1)
    first = estimate(LLAMA_8B, layout, seq_len=SEQ, profile=TORCHTITAN_03, stage="first")
    assert first.components["logits"] == 0  # the head is on the last stage only


def test_selective_recomputation_keeps_the_fused_qkv_output_so_k_too():
    """0.3's llama3 has one wqkv linear (fuse_qkv=True), so SelectiveAC's every-other-mm policy
    keeps wqkv, w1 and w2 (the 1st, 3rd and 5th mm), where 0.2's kept wq, wv, w1 and w2: the
    difference is K's output, kv_dim wide in bf16, per layer and token."""
    mbs = 2
    tokens, layers, kv = mbs * SEQ, LLAMA_8B.num_layers, LLAMA_8B.kv_dim
    old, new = _both(Layout(dp=8, tp=1, pp=1, mbs=mbs, grad_acc=2, zero_stage=3,
                            recompute="selective"))
    assert new.components["activations"] - old.components["activations"] == 2 * kv * tokens * layers
    for recompute in ("none", "full"):  # what is saved without the selective policy is the same
        old, new = _both(Layout(dp=8, tp=1, pp=1, mbs=mbs, grad_acc=2, zero_stage=3,
                                recompute=recompute))
        assert new.components["activations"] == old.components["activations"]


def test_in_a_moe_layer_selective_recomputation_keeps_wqkv_and_under_ep_the_moved_tokens():
    """The experts' torch._grouped_mm is not among SelectiveAC's save ops and the router's gate
    is forced to recompute, so a Mixtral layer keeps wqkv's output (q, k, v) but neither w1's nor
    w2's, where 0.2's policy, read for dense layers, would keep wq, wv, w1 and w2; under EP the
    all-to-all's outputs (a communication op, saved) keep the k dispatched copies of each token
    and their combined results."""
    seq, mbs, layers = 4096, 1, MIXTRAL.num_layers
    h, kv, ffn, k = MIXTRAL.hidden_size, MIXTRAL.kv_dim, MIXTRAL.moe_ffn_hidden_size, MIXTRAL.experts_per_token
    tokens = mbs * seq
    for ep, tp in ((1, 1), (2, 2)):
        old, new = _both(Layout(dp=8 // (ep * tp), tp=tp, pp=1, ep=ep, mbs=mbs, grad_acc=8,
                                zero_stage=3, sp=True, recompute="selective"), MIXTRAL, seq)
        per_token = 2 * (kv / tp - k * ffn / tp - h / tp) + (2 * 2 * h * k / tp if ep > 1 else 0)
        difference = new.components["activations"] - old.components["activations"]
        assert difference == pytest.approx(per_token * tokens * layers, abs=layers), (ep, tp)


def test_a_cuda_graphed_step_zeroes_its_gradients_so_one_micro_batch_holds_them_at_the_peak():
    """With CUDA graphs (0.3's default) the step starts with zero_grad(set_to_none=False): a step
    of one micro-batch holds its sharded fp32 gradients at the activation peak, where 0.2 (set to
    None) made them after it. Pipelines and expert parallelism run without the graph."""
    p = count_parameters(LLAMA_8B).total
    old, new = _both(Layout(dp=8, tp=1, pp=1, mbs=1, grad_acc=1, zero_stage=3, recompute="full"))
    assert old.components["gradients"] == 0
    assert new.components["gradients"] == pytest.approx(4 * p / 8, rel=1e-9)
    assert new.step_allocated_bytes == old.step_allocated_bytes  # the optimizer step has them either way
    # no graph under PP or EP: their gradients are as 0.2's
    for model, layout in ((LLAMA_8B, Layout(dp=4, tp=1, pp=2, mbs=1, grad_acc=2, zero_stage=3)),
                          (MIXTRAL, Layout(dp=4, tp=1, pp=1, ep=2, mbs=1, grad_acc=1, zero_stage=3))):
        old, new = _both(layout, model, seq=4096)
        assert new.components["gradients"] == old.components["gradients"], layout


def test_under_expert_parallelism_the_experts_are_whole_on_each_tp_rank_while_they_compute():
    """0.3 shards experts over TP only without EP; with EP they go on the sparse mesh, and the TP
    ranks join the experts' FSDP group (efsdp = dp_shard·cp·tp/ep): the persistent state per rank
    is the same, the gathered copy of a layer's experts is tp times larger."""
    seq = 4096
    experts_per_layer = MIXTRAL.num_experts * 3 * MIXTRAL.hidden_size * MIXTRAL.moe_ffn_hidden_size
    tp, ep = 2, 2
    old, new = _both(Layout(dp=2, tp=tp, pp=1, ep=ep, mbs=1, grad_acc=4, zero_stage=3,
                            recompute="full"), MIXTRAL, seq)
    for state in ("weights", "gradients", "optimizer"):
        assert new.components[state] == pytest.approx(old.components[state], abs=8), state
    # FSDP gathers two layers at a time in bf16: each layer's experts 1/ep, no longer 1/(tp·ep)
    gathered_gain = 2 * 2 * experts_per_layer / ep * (1 - 1 / tp)
    assert new.components["buffers"] - old.components["buffers"] == pytest.approx(gathered_gain, abs=8)
    # without EP the experts are TP-sharded, as in 0.2
    old, new = _both(Layout(dp=4, tp=tp, pp=1, ep=1, mbs=1, grad_acc=4, zero_stage=3,
                            recompute="full"), MIXTRAL, seq)
    assert new.components["buffers"] == old.components["buffers"]


def _their_split(pipeline_parallel: Path):
    """torchtitan 0.3's own `_generate_llm_fqn_per_model_part`, executed from its source (a pure
    function: nothing else of torchtitan is imported)."""
    tree = ast.parse(pipeline_parallel.read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "_generate_llm_fqn_per_model_part")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(pipeline_parallel), "exec"), namespace)
    return namespace["_generate_llm_fqn_per_model_part"]


def _sources() -> list[tuple[str, Path | None]]:
    installed = REPO / ".contract" / "torchtitan-0.3.0"
    main = os.environ.get("SWEEP_TORCHTITAN_MAIN")
    return [("0.3.0", installed if (installed / ".installed").is_file() else None),
            ("main", Path(main) if main else None)]


@pytest.mark.contract
@pytest.mark.parametrize("release, root", _sources(), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_the_03_profile_puts_on_each_stage_the_layers_torchtitan_03_puts_there(
        release: str, root: Path | None) -> None:
    """`stage_layer_counts(..., "torchtitan-0.3")` against 0.3.0's (and main's) own split with
    its default first/last-stage weights of 1, for every stage count a 16-, 28- and 32-layer
    model can take."""
    if root is None:
        pytest.skip(f"torchtitan {release} is not installed: run scripts/contract/torchtitan.sh "
                    "(0.3.0), or set SWEEP_TORCHTITAN_MAIN to a checkout of main at b5bcd76c6")
    split = _their_split(root / "torchtitan" / "distributed" / "pipeline_parallel.py")
    shapes = [get_model("llama-3.2-1b"), get_model("llama-3.2-3b"), LLAMA_8B]
    checked = 0
    for shape in shapes:
        for stages in range(2, shape.num_layers + 3):
            try:
                parts = split(stages, shape.num_layers, 1, 1)
            except ValueError:  # torchtitan refuses it (a weight above a stage's share)
                continue
            built = tuple(sum(m.startswith("layers.") for m in part) for part in parts)
            assert built == stage_layer_counts(shape, stages, "torchtitan-0.3"), (shape.name, stages)
            checked += 1
    assert checked > 60
