"""Where a rank's experts live: sharded over TP and EP (Megatron, torchtitan), or, as in nanotron
main, whole on every TP rank (`MemoryProfile.experts_shard_over_tp`): nn/moe.py GroupedMLP holds
num_experts / ep whole experts as plain parameters, which trainer.py ties across the TP group
(@2411b022), and each TP rank runs them on the tokens it holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sweep.core.layout import Layout
from sweep.core.model import ModelShape
from sweep.models.memory import estimate
from sweep.models.memory_profiles import MemoryProfile, get_profile

MOE = ModelShape(name="moe-8e-8l", num_layers=8, hidden_size=1024, num_attention_heads=8,
                 num_kv_heads=8, ffn_hidden_size=2048, vocab_size=32000,
                 tie_word_embeddings=False, num_experts=8, experts_per_token=2)
DENSE = replace(MOE, name="dense-8l", num_experts=0, experts_per_token=0, moe_ffn_hidden_size=0)
NANOTRON = get_profile("nanotron")
SHARDED = replace(NANOTRON, experts_shard_over_tp=True)  # nanotron, were its experts TP-sharded


def components(model: ModelShape, layout: Layout, profile: MemoryProfile) -> dict[str, int]:
    return estimate(model, layout, seq_len=2048, profile=profile).components


def test_nanotron_s_profile_keeps_experts_whole_and_the_others_shard_them() -> None:
    assert not NANOTRON.experts_shard_over_tp
    assert get_profile("megatron").experts_shard_over_tp
    assert get_profile("torchtitan").experts_shard_over_tp


@pytest.mark.parametrize("tp", [2, 4])
def test_each_tp_rank_holds_every_expert_s_weights(tp: int) -> None:
    layout = Layout(dp=1, tp=tp, pp=1)
    expert_parameters = MOE.num_layers * MOE.num_experts * 3 * MOE.hidden_size * MOE.ffn_hidden_size
    whole = components(MOE, layout, NANOTRON)["weights"]
    sharded = components(MOE, layout, SHARDED)["weights"]
    # bf16 weights: the experts' (tp - 1) / tp share that sharding would have removed
    assert whole - sharded == pytest.approx(2 * expert_parameters * (1 - 1 / tp), abs=16)


def test_experts_are_still_sharded_over_ep() -> None:
    one = components(MOE, Layout(dp=1, tp=1, pp=1, ep=1), NANOTRON)["weights"]
    two = components(MOE, Layout(dp=1, tp=1, pp=1, ep=2), NANOTRON)["weights"]
    expert_parameters = MOE.num_layers * MOE.num_experts * 3 * MOE.hidden_size * MOE.ffn_hidden_size
    assert one - two == pytest.approx(2 * expert_parameters / 2, abs=16)


def test_whole_experts_run_on_the_tokens_a_rank_holds() -> None:
    """Without SP every TP rank runs the whole micro-batch through its experts (more activations
    than TP-sharded experts); with SP it runs 1/tp of the tokens, which saves as much as cutting
    each expert's width by tp."""
    no_sp, sp = Layout(dp=1, tp=4, pp=1, sp=False), Layout(dp=1, tp=4, pp=1, sp=True)
    assert (components(MOE, no_sp, NANOTRON)["activations"]
            > components(MOE, no_sp, SHARDED)["activations"])
    assert (components(MOE, sp, NANOTRON)["activations"]
            == pytest.approx(components(MOE, sp, SHARDED)["activations"], abs=16))


def test_a_dense_model_is_the_same_either_way() -> None:
    for layout in (Layout(dp=1, tp=4, pp=1), Layout(dp=2, tp=2, pp=2, grad_acc=2, sp=True)):
        assert components(DENSE, layout, NANOTRON) == components(DENSE, layout, SHARDED)
