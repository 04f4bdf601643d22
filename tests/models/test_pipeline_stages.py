"""How each framework places a model's blocks on its pipeline stages (sweep.models.pipeline_stages):
the memory model's per-stage layers and the planner's `pp_layers` rule both read these splits."""

from __future__ import annotations

from sweep.core.catalog import get_model
from sweep.models.pipeline_stages import stage_block_counts, stage_layer_counts

ONE_B = get_model("playbook-1b")
EIGHT_B = get_model("playbook-8b")


def test_nanotron_balances_stages_by_cost_with_the_lm_head_as_a_block():
    assert stage_layer_counts(EIGHT_B, 2, "nanotron")[0] == 18  # "Local Params" 4.92G in the playbook
    assert stage_layer_counts(EIGHT_B, 32, "nanotron")[0] == 2  # 1.02G
    assert stage_layer_counts(ONE_B, 2, "nanotron") == (10, 6)  # 940M: the head costs 4 layers
    assert sum(stage_layer_counts(EIGHT_B, 8, "nanotron")) == EIGHT_B.num_layers
    assert min(stage_block_counts(ONE_B, 32, "nanotron")) == 0  # 16 layers cannot fill 32 stages
    assert min(stage_block_counts(EIGHT_B, 32, "nanotron")) >= 1


def test_megatron_splits_evenly_and_counts_the_loss_then_the_embedding_where_layers_do_not_divide():
    """What templates/launch/megatron.args renders: no flag where L divides, then
    --account-for-loss-in-pipeline-split, then also --account-for-embedding-in-pipeline-split."""
    assert stage_layer_counts(EIGHT_B, 4, "megatron") == (8, 8, 8, 8)
    assert stage_layer_counts(EIGHT_B, 3, "megatron") == (11, 11, 10)  # 32 + loss = 33
    # 16 layers over 6 stages: 16 + loss + embedding = 18, three a stage; the first and last hold
    # the embedding and the loss in place of a layer
    assert stage_layer_counts(ONE_B, 6, "megatron") == (2, 3, 3, 3, 3, 2)
    assert stage_block_counts(ONE_B, 6, "megatron") == (3,) * 6


def test_torchtitan_counts_the_embedding_and_the_output_as_a_layer_each():
    """torchtitan 0.2's generate_llm_fqn_per_model_part (torchtitan/distributed/pipeline_parallel.py)
    with its default pipeline_parallel_first/last_stage_less_layers = 1: L + 2 effective layers dealt
    out evenly, the first stages taking the remainder; the first stage's share includes the
    embedding, the last stage's the norm and output."""
    assert stage_layer_counts(ONE_B, 3, "torchtitan") == (5, 6, 5)  # 18 effective: 6, 6, 6
    assert stage_layer_counts(ONE_B, 4, "torchtitan") == (4, 5, 4, 3)  # 18: 5, 5, 4, 4
    assert stage_block_counts(ONE_B, 18, "torchtitan") == (1,) * 18  # the embedding alone on stage 0
    assert stage_layer_counts(ONE_B, 18, "torchtitan")[0] == 0


def test_the_builtin_workload_splits_layers_evenly():
    assert stage_layer_counts(ONE_B, 3, "builtin") == (6, 5, 5)
