"""The memory model: its mechanisms and its two code paths (scalar and columns) agree.

Its accuracy against runs that really happened is tests/models/test_memory_reference.py (published
runs and configurations) and tests/models/test_memory_on_cuda.py (our own runs on a GPU).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from sweep.core.catalog import get_model
from sweep.core.layout import PP_SCHEDULES, RECOMPUTE_MODES, Layout
from sweep.core.model import ModelShape, count_parameters
from sweep.core.units import GiB
from sweep.models.memory import (
    COMPONENTS,
    PROFILES,
    MemoryEstimate,
    estimate,
    estimate_columns,
)
from sweep.models.memory_profiles import TORCHTITAN, MemoryProfile
from sweep.validation.memory_reference import gpt_shape

ONE_B = get_model("playbook-1b")
EIGHT_B = get_model("playbook-8b")
MOE = ModelShape(name="tiny-moe", num_layers=8, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
                 ffn_hidden_size=2816, vocab_size=32000, tie_word_embeddings=False, num_experts=8,
                 experts_per_token=2, moe_ffn_hidden_size=1408)


def _columns(layouts: list[Layout]) -> dict[str, np.ndarray]:
    rows = [layout.to_dict() for layout in layouts]
    cols = {k: np.asarray([r[k] for r in rows]) for k in
            ("dp", "tp", "pp", "cp", "ep", "mbs", "grad_acc", "zero_stage", "vpp")}
    cols["sp"] = np.asarray([r["sp"] for r in rows], dtype=bool)
    cols["recompute"] = np.asarray([r["recompute"] for r in rows], dtype=object)
    cols["pp_schedule"] = np.asarray([r["pp_schedule"] for r in rows], dtype=object)
    return cols


# ------------------------------------------------------------------ the API

def test_profiles_and_components_are_the_published_vocabulary():
    assert set(PROFILES) == {"nanotron", "megatron", "torchtitan", "builtin"}
    assert COMPONENTS[:3] == ("weights", "gradients", "optimizer")
    assert {"activations", "logits", "fragmentation", "overhead"} <= set(COMPONENTS)


def test_estimate_totals_are_the_sums_of_their_components():
    est = estimate(EIGHT_B, Layout(dp=4, tp=2, pp=1, mbs=2, grad_acc=32, zero_stage=1, sp=True),
                   seq_len=4096, profile="nanotron")
    assert isinstance(est, MemoryEstimate)
    c = est.components
    assert set(c) == set(COMPONENTS) and all(isinstance(v, int) and v >= 0 for v in c.values())
    assert est.allocated_bytes == sum(c[n] for n in ("weights", "gradients", "optimizer", "activations",
                                                      "logits", "buffers"))
    assert est.reserved_bytes == est.allocated_bytes + c["fragmentation"]
    assert est.total_bytes == est.reserved_bytes + c["overhead"]
    assert est.step_allocated_bytes <= est.allocated_bytes


def test_explain_lists_every_component_and_the_totals():
    est = estimate(ONE_B, Layout(dp=8, tp=1, pp=1, mbs=1, grad_acc=32), seq_len=4096, profile="nanotron")
    text = est.explain()
    for name in (*COMPONENTS, "allocated", "reserved", "total"):
        assert name in text
    assert f"{est.total_bytes / GiB:.2f}" in text


def _grid() -> list[Layout]:
    layouts = []
    for tp, pp, cp, ep, zero, rc, sched, sp, mbs, ga in itertools.product(
            (1, 2), (1, 2, 4), (1, 2), (1, 2), (0, 1, 2, 3), RECOMPUTE_MODES, PP_SCHEDULES,
            (False, True), (1, 3), (1, 8)):
        vpp = 2 if sched == "interleaved_1f1b" else 1
        layouts.append(Layout(dp=2, tp=tp, pp=pp, cp=cp, ep=ep, mbs=mbs, grad_acc=ga, zero_stage=zero,
                              recompute=rc, sp=sp, pp_schedule=sched, vpp=vpp))
    return layouts


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("model", [ONE_B, EIGHT_B, MOE], ids=lambda m: m.name)
def test_columns_agree_exactly_with_the_scalar_estimate(profile, model):
    layouts = _grid()[::7]  # a spread of every axis, kept small for speed
    cols = estimate_columns(model, _columns(layouts), seq_len=4096, profile=profile)
    expected_keys = {f"mem_{c}_bytes" for c in COMPONENTS} | {
        "mem_allocated_bytes", "mem_reserved_bytes", "mem_total_bytes", "mem_step_allocated_bytes"}
    assert set(cols) == expected_keys
    assert all(v.dtype == np.int64 and len(v) == len(layouts) for v in cols.values())
    for i, layout in enumerate(layouts):
        est = estimate(model, layout, seq_len=4096, profile=profile)
        for name in COMPONENTS:
            assert cols[f"mem_{name}_bytes"][i] == est.components[name], (layout, name)
        assert cols["mem_allocated_bytes"][i] == est.allocated_bytes
        assert cols["mem_reserved_bytes"][i] == est.reserved_bytes
        assert cols["mem_total_bytes"][i] == est.total_bytes
        assert cols["mem_step_allocated_bytes"][i] == est.step_allocated_bytes


@pytest.mark.parametrize("bad, message", [
    ({"recompute": np.asarray(["sometimes"], dtype=object)}, "recompute"),
    ({"pp_schedule": np.asarray(["zigzag"], dtype=object)}, "pp_schedule"),
    ({"tp": np.asarray([0])}, "'tp' must be >= 1"),
    ({"mbs": np.asarray([1, 2])}, "'mbs' has length 2"),
])
def test_bad_columns_are_rejected_with_the_column_named(bad, message):
    cols = _columns([Layout(dp=1, tp=1, pp=1)])
    cols.update(bad)
    with pytest.raises(ValueError, match=message):
        estimate_columns(ONE_B, cols, seq_len=4096)


def test_unknown_profile_and_dtype_are_rejected():
    with pytest.raises(ValueError, match="unknown memory profile 'deepspeed'.*nanotron"):
        estimate(ONE_B, Layout(dp=1, tp=1, pp=1), seq_len=4096, profile="deepspeed")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        estimate(ONE_B, Layout(dp=1, tp=1, pp=1), seq_len=4096, dtype="int4")
    cols = _columns([Layout(dp=1, tp=1, pp=1)])
    del cols["vpp"]
    with pytest.raises(ValueError, match="missing columns.*vpp"):
        estimate_columns(ONE_B, cols, seq_len=4096)


# ------------------------------------------------------------------ mechanisms: state

def _state(model, layout, profile):
    c = estimate(model, layout, seq_len=4096, profile=profile).components
    return c["weights"], c["gradients"], c["optimizer"]


def test_nanotron_keeps_bf16_weights_ddp_buckets_fp32_grads_and_adam_state():
    p = count_parameters(ONE_B).total
    w, g, o = _state(ONE_B, Layout(dp=8, tp=1, pp=1, grad_acc=32), "nanotron")
    assert (w, g, o) == (2 * p, (2 + 4) * p, (4 + 8) * p)
    # no DDP wrapper at dp=1: no bf16 buckets
    assert _state(ONE_B, Layout(dp=1, tp=1, pp=1), "nanotron")[1] == 4 * p
    # ZeRO-1 shards the fp32 master copy and the Adam moments over dp, nothing else
    w1, g1, o1 = _state(ONE_B, Layout(dp=8, tp=1, pp=1, zero_stage=1), "nanotron")
    assert (w1, g1) == (w, g) and o1 == pytest.approx(o / 8, abs=1)


def test_megatron_distributed_optimizer_is_6_plus_12_over_dp_bytes_per_parameter():
    layout = Layout(dp=16, tp=1, pp=1, zero_stage=1)
    p = count_parameters(EIGHT_B).total
    w, g, o = _state(EIGHT_B, layout, "megatron")
    assert w + g == 6 * p and o == pytest.approx(12 * p / 16, abs=1)
    w0, g0, o0 = _state(EIGHT_B, Layout(dp=16, tp=1, pp=1, zero_stage=0), "megatron")
    assert w0 + g0 + o0 == 18 * p  # Megatron's theoretical memory without the distributed optimizer


def test_megatron_distributed_optimizer_shards_over_cp_and_nanotron_does_not():
    mega = _state(EIGHT_B, Layout(dp=4, tp=1, pp=1, cp=2, zero_stage=1), "megatron")[2]
    mega_nocp = _state(EIGHT_B, Layout(dp=4, tp=1, pp=1, cp=1, zero_stage=1), "megatron")[2]
    nano = _state(EIGHT_B, Layout(dp=4, tp=1, pp=1, cp=2, zero_stage=1), "nanotron")[2]
    nano_nocp = _state(EIGHT_B, Layout(dp=4, tp=1, pp=1, cp=1, zero_stage=1), "nanotron")[2]
    assert mega == pytest.approx(mega_nocp / 2, abs=1) and nano == nano_nocp


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_each_zero_stage_shards_one_more_kind_of_state(zero):
    layout = Layout(dp=8, tp=1, pp=1, zero_stage=zero)
    w, g, o = _state(EIGHT_B, layout, "megatron")
    w0, g0, o0 = _state(EIGHT_B, Layout(dp=8, tp=1, pp=1, zero_stage=0), "megatron")
    assert (o < o0) == (zero >= 1)
    assert (g < g0) == (zero >= 2)
    assert (w < w0) == (zero >= 3)


def test_fsdp_shards_its_fp32_params_and_keeps_bf16_compute_copies():
    """torchtitan: fp32 params are the master copy (16 B/param in all, sharded); ZeRO-2 (no reshard
    after forward) keeps every layer's gathered bf16 copy, ZeRO-3 only two layers at a time.
    Its train_step sets the grads to None first, so with one micro-batch the activation peak
    holds none: they count at the optimizer step."""
    p = count_parameters(EIGHT_B).total
    w2, g2, o2 = _state(EIGHT_B, Layout(dp=8, tp=1, pp=1, grad_acc=2, zero_stage=2), "torchtitan")
    assert w2 + g2 + o2 == pytest.approx(16 * p / 8, rel=1e-9)
    one = estimate(EIGHT_B, Layout(dp=8, tp=1, pp=1, zero_stage=2), seq_len=4096, profile="torchtitan")
    assert one.components["gradients"] == 0
    assert one.step_allocated_bytes >= round(16 * p / 8)
    buffers = {z: estimate(EIGHT_B, Layout(dp=8, tp=1, pp=1, zero_stage=z), seq_len=4096,
                           profile="torchtitan").components["buffers"] for z in (2, 3)}
    layer = count_parameters(EIGHT_B).per_layer
    assert buffers[2] - buffers[3] == pytest.approx(2 * p - 2 * 2 * layer, rel=1e-9)


def test_builtin_workload_keeps_fp32_params_grads_and_ddp_buckets_and_autocast_casts():
    """sweep.workload: fp32 params, param.grad and DDP's own buckets (ZeRO <= 1), AdamW moments;
    autocast's bf16 weight casts live until backward; FSDP2 gathers fp32 (no mixed-precision policy).
    param.grad is set to None after each step, so with one micro-batch the activation peak (the
    logits' backward) holds only DDP's buckets; the gradients count at the optimizer step."""
    p = count_parameters(EIGHT_B).total
    accumulating = estimate(EIGHT_B, Layout(dp=8, tp=1, pp=1, grad_acc=2), seq_len=4096,
                            profile="builtin")
    ddp = accumulating.components
    assert (ddp["weights"], ddp["gradients"], ddp["optimizer"]) == (4 * p, 8 * p, 8 * p)
    assert ddp["buffers"] >= 2 * p
    one = estimate(EIGHT_B, Layout(dp=8, tp=1, pp=1), seq_len=4096, profile="builtin")
    assert one.components["gradients"] == 4 * p  # the buckets only
    assert one.step_allocated_bytes == accumulating.step_allocated_bytes >= 16 * p
    assert one.allocated_bytes >= one.step_allocated_bytes
    fsdp = estimate(EIGHT_B, Layout(dp=8, tp=1, pp=1, zero_stage=2, grad_acc=2), seq_len=4096,
                    profile="builtin").components
    assert fsdp["weights"] + fsdp["optimizer"] == pytest.approx(12 * p / 8, rel=1e-9)
    assert fsdp["buffers"] - ddp["buffers"] == pytest.approx(4 * p, rel=1e-9)  # the fp32 gathers


def test_fsdp_that_defers_its_reduction_holds_whole_gradients_until_the_last_micro_batch():
    """FSDP2 with `set_requires_gradient_sync(False)` keeps each parameter's unsharded gradient
    (in the reduce dtype) until the step's last micro-batch reduce-scatters it: the built-in
    workload's own gradient accumulation does so (MemTracker measures it on CPU,
    tests/workload/test_memory_tracking.py), and torch.distributed.pipelining does so for every
    micro-batch of a schedule, for torchtitan too, keeping the parameters gathered after backward
    as well. torchtitan's own accumulation reduce-scatters every micro-batch."""
    p = count_parameters(EIGHT_B).total

    def state(profile: str, **layout: int) -> dict[str, int]:
        return estimate(EIGHT_B, Layout(dp=8, tp=1, zero_stage=3, **layout), seq_len=4096,
                        profile=profile).components

    one, accumulating = state("builtin", pp=1), state("builtin", pp=1, grad_acc=2)
    assert one["gradients"] == 0  # made after the activation peak, sharded
    assert accumulating["gradients"] == 4 * p  # whole fp32 gradients, not 4 p / 8
    titan = state("torchtitan", pp=1, grad_acc=2)
    assert titan["gradients"] == pytest.approx(4 * p / 8, rel=1e-9)  # reduced every micro-batch
    def pipelined(zero_stage: int, profile: str | MemoryProfile = "torchtitan") -> MemoryEstimate:
        return estimate(EIGHT_B, Layout(dp=8, tp=1, pp=4, grad_acc=8, zero_stage=zero_stage,
                                        recompute="full"), seq_len=4096, profile=profile)

    piped, kept = pipelined(3), pipelined(2)
    stage_params = piped.components["weights"] * 8 / 4  # the stage's fp32 shards, gathered
    assert piped.components["gradients"] == pytest.approx(4 * stage_params, rel=1e-6)
    # ZeRO-3 under a schedule leaves every layer gathered after each backward, beside all but one
    # micro-batch's activations: more than the two layers it gathers at a time otherwise, and no
    # more than ZeRO-2, which keeps them gathered from forward to backward
    two_layers = pipelined(3, replace(TORCHTITAN, pipeline_defers_fsdp_reduction=False))
    assert two_layers.components["buffers"] < piped.components["buffers"] \
        <= kept.components["buffers"]
    # the difference: the micro-batch whose backward just ended (on the last stage, the only one)
    assert 0 < kept.components["buffers"] - piped.components["buffers"] <= \
        piped.components["activations"]
    # at the optimizer step the whole gradients are freed, and the sharded ones are made
    assert piped.step_allocated_bytes < piped.allocated_bytes


def test_tp_and_ep_shard_the_parameters():
    w1 = _state(MOE, Layout(dp=2, tp=1, pp=1), "megatron")[0]
    w_tp = _state(MOE, Layout(dp=2, tp=2, pp=1), "megatron")[0]
    w_ep = _state(MOE, Layout(dp=2, tp=1, pp=1, ep=4), "megatron")[0]
    assert w_tp == pytest.approx(w1 / 2, rel=1e-3)
    pc = count_parameters(MOE)
    experts = MOE.num_layers * MOE.num_experts * 3 * MOE.hidden_size * MOE.moe_ffn_hidden_size
    assert w1 - w_ep == pytest.approx(2 * experts * (1 - 1 / 4), rel=1e-9)
    assert pc.total > experts


# ------------------------------------------------------------------ mechanisms: activations

def _act(layout, model=EIGHT_B, profile="megatron", seq=4096):
    return estimate(model, layout, seq_len=seq, profile=profile).components["activations"]


def test_recomputation_orders_activation_memory():
    base = dict(dp=1, tp=1, pp=1, mbs=2)
    none, sel, full = (_act(Layout(**base, recompute=r)) for r in ("none", "selective", "full"))
    assert full < sel <= none
    assert full < none / 5


def test_torchtitan_selective_keeps_every_other_matmul_output_as_its_op_policy_does():
    """torchtitan's "op" selective AC keeps the outputs of the 1st, 3rd, 5th and 7th matmul of a
    layer (wq, wv, w1, w2) and the attention output, plus the layer's input, and recomputes the
    rest one layer at a time; Megatron's selective drops nothing under flash attention."""
    shape, seq, mbs = EIGHT_B, 4096, 2
    layout = {r: Layout(dp=1, tp=1, pp=1, mbs=mbs, recompute=r) for r in ("none", "selective", "full")}
    act = {r: _act(layout[r], shape, "torchtitan", seq) for r in layout}
    h, q, kv, f = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.ffn_hidden_size
    tokens, layers = mbs * seq, shape.num_layers
    per_layer_kept = (2 * h + 2 * (q + q + kv + f + h)) * tokens  # bf16 input + kept outputs
    working = act["full"] - layers * 2 * h * tokens  # one recomputed layer and the LM head inputs
    assert act["selective"] == pytest.approx(layers * per_layer_kept + working, rel=1e-9)
    assert act["full"] < act["selective"] < act["none"]
    with pytest.raises(ValueError, match="not linears of the model"):
        replace(PROFILES["torchtitan"], selective_saves=("w4",))


def test_without_flash_attention_the_scores_are_saved_or_held_by_the_recomputed_layer():
    """Megatron's fused softmax (no flash attention) saves the softmax and the dropout's output,
    two s x s tensors per head (Korthikanti et al. 2022, Sec. 4.1), in every layer; recomputed, only
    the layer (or, with Megatron's selective, the core attention) being recomputed holds them."""
    shape, seq, mbs, tp = EIGHT_B, 4096, 2, 4
    fused = replace(PROFILES["megatron"], flash_attention=False)
    scores = 2 * 2 * shape.num_attention_heads * seq * seq * mbs / tp  # bf16, per layer
    for recompute, layers_holding in (("none", shape.num_layers), ("selective", 1), ("full", 1)):
        layout = Layout(dp=1, tp=tp, pp=1, mbs=mbs, recompute=recompute, sp=True)
        extra = _act(layout, shape, fused, seq) - _act(layout, shape, "megatron", seq)
        assert extra == pytest.approx(layers_holding * scores, rel=1e-9), recompute


def test_sequence_parallelism_and_cp_shard_activations():
    plain = _act(Layout(dp=1, tp=4, pp=1, mbs=2, sp=False))
    with_sp = _act(Layout(dp=1, tp=4, pp=1, mbs=2, sp=True))
    assert with_sp == pytest.approx(_act(Layout(dp=1, tp=1, pp=1, mbs=2)) / 4, rel=0.01)
    assert with_sp < plain
    cp2 = _act(Layout(dp=1, tp=1, pp=1, cp=2, mbs=2))
    assert cp2 == pytest.approx(_act(Layout(dp=1, tp=1, pp=1, mbs=2)) / 2, rel=0.01)


def test_activations_grow_linearly_with_the_micro_batch():
    one, four = (_act(Layout(dp=1, tp=2, pp=1, mbs=m, sp=True)) for m in (1, 4))
    assert four == pytest.approx(4 * one, rel=1e-6)


# A small vocabulary keeps the first stage the most loaded one, so its activations are what we see.
SMALL_VOCAB = replace(EIGHT_B, name="8b-small-vocab", vocab_size=1024)


def test_first_stage_holds_pp_micro_batches_under_1f1b_capped_by_grad_acc():
    per_mb = _act(Layout(dp=1, tp=1, pp=4, grad_acc=2), SMALL_VOCAB) / 2
    assert _act(Layout(dp=1, tp=1, pp=4, grad_acc=3), SMALL_VOCAB) == pytest.approx(3 * per_mb, rel=1e-6)
    assert _act(Layout(dp=1, tp=1, pp=4, grad_acc=64), SMALL_VOCAB) == pytest.approx(4 * per_mb, rel=1e-6)
    gpipe = _act(Layout(dp=1, tp=1, pp=4, grad_acc=16, pp_schedule="gpipe"), SMALL_VOCAB)
    # GPipe: every stage holds all grad_acc micro-batches (the last one also its LM head's inputs)
    assert 16 * per_mb <= gpipe <= 1.01 * 16 * per_mb


def test_interleaved_schedule_follows_megatrons_memory_penalty():
    pp, vpp = 4, 2
    per_mb = _act(Layout(dp=1, tp=1, pp=pp, grad_acc=2), SMALL_VOCAB) / 2
    inter = _act(Layout(dp=1, tp=1, pp=pp, grad_acc=64, pp_schedule="interleaved_1f1b", vpp=vpp),
                 SMALL_VOCAB)
    # Megatron: L/pp layers x pp micro-batches x (1 + (pp-1)/(pp*vpp))
    assert inter == pytest.approx(per_mb * pp * (1 + (pp - 1) / (pp * vpp)), rel=1e-6)


def test_logits_are_fp32_over_vocab_shard_and_only_where_the_head_is():
    one = estimate(EIGHT_B, Layout(dp=1, tp=2, pp=1, mbs=1), seq_len=4096, profile="nanotron")
    assert one.components["logits"] == 4096 * EIGHT_B.vocab_size // 2 * 10  # bf16 + fp32 + fp32 softmax
    first = estimate(EIGHT_B, Layout(dp=1, tp=2, pp=8, mbs=1, grad_acc=8), seq_len=4096, profile="nanotron")
    assert first.stage == "first" and first.components["logits"] == 0


def test_fragmentation_grows_with_pipelined_micro_batches_and_with_the_logits():
    def frag_share(layout, model=SMALL_VOCAB):
        c = estimate(model, layout, seq_len=4096, profile="nanotron").components
        return (c["fragmentation"] - PROFILES["nanotron"].reserved_floor_bytes) / (c["activations"] + c["logits"])
    alone = frag_share(Layout(dp=1, tp=1, pp=4, grad_acc=1))  # one micro-batch: blocks are reused
    piped = frag_share(Layout(dp=1, tp=1, pp=4, grad_acc=64))  # four in flight: freed out of order
    assert alone == pytest.approx(PROFILES["nanotron"].fragmentation_sequential, rel=1e-6)
    assert piped > 2 * alone
    with_logits = estimate(EIGHT_B, Layout(dp=1, tp=1, pp=1, mbs=2), seq_len=4096, profile="nanotron")
    c = with_logits.components
    assert c["fragmentation"] > PROFILES["nanotron"].fragmentation_sequential * c["activations"] + \
        PROFILES["nanotron"].reserved_floor_bytes


def test_stage_choice_first_last_and_most_loaded():
    layout = Layout(dp=1, tp=1, pp=2, mbs=8, grad_acc=1)  # one micro-batch: the LM head's stage is heavier
    first, last, loaded = (estimate(ONE_B, layout, seq_len=4096, profile="nanotron", stage=s)
                           for s in ("first", "last", "most_loaded"))
    assert (first.stage, last.stage, loaded.stage) == ("first", "last", "last")
    assert first.components["logits"] == 0 < last.components["logits"]
    assert loaded.total_bytes == max(first.total_bytes, last.total_bytes)
    with pytest.raises(ValueError, match="unknown stage 'middle'"):
        estimate(ONE_B, layout, seq_len=4096, stage="middle")


# ------------------------------------------------------------------ GELU MLPs
#
# GPT and MPT use a two-matrix GELU MLP (expansion 4), which ModelShape cannot say yet: GeluShape
# (sweep.validation.memory_reference.gpt_shape) carries mlp="gelu" and the memory model costs two matrices and two
# saved FFN-wide tensors.

def test_a_gelu_mlp_has_two_matrices_and_saves_two_ffn_wide_tensors():
    gelu = gpt_shape("gpt-1b", 24, 2048, 16, 50304)
    swiglu = ModelShape(**{f: getattr(gelu, f) for f in ModelShape.__dataclass_fields__})
    layout = Layout(dp=1, tp=1, pp=1, mbs=1)
    g, s_ = (estimate(m, layout, seq_len=2048, profile="megatron").components for m in (gelu, swiglu))
    h, f, layers = 2048, 4 * 2048, 24
    assert s_["weights"] - g["weights"] == 2 * layers * h * f  # one bf16 matrix less per layer
    assert s_["activations"] - g["activations"] == 2 * 2 * f * 2048 * layers  # two bf16 FFN tensors less
    with pytest.raises(ValueError, match="mlp must be 'swiglu' or 'gelu'"):
        estimate(replace(gelu, mlp="relu2"), layout, seq_len=2048)
