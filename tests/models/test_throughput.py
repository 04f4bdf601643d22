"""The throughput model: each term follows the physics it claims, vectorised over plan rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from sweep.core.catalog import get_gpu, get_model
from sweep.models.flops import flops_per_token
from sweep.models.throughput import FEATURES, Coefficients, features, predict
from sweep.models.throughput_inputs import Workload

H100 = get_gpu("h100-sxm")
WORK_1B = Workload(get_model("playbook-1b"), 4096, H100)
WORK_8B = Workload(get_model("playbook-8b"), 4096, H100)


def rows(*layouts: dict) -> pd.DataFrame:
    base = {"dp": 1, "tp": 1, "pp": 1, "mbs": 1, "grad_acc": 1, "zero_stage": 0}
    return pd.DataFrame([{**base, **layout} for layout in layouts])


def test_compute_is_the_matmul_flops_over_the_peak_without_parallelism() -> None:
    """The input embedding is a lookup: the hardware does 6N + 12·L·h·s minus 6·V·h (untied),
    up to the final norm weights (rel 1e-6)."""
    frame = rows({"dp": 8, "mbs": 2, "grad_acc": 16})
    got = features(frame, WORK_8B)["compute"].iloc[0]
    tokens_per_gpu = 2 * 16 * 4096
    shape = WORK_8B.shape
    lookup = 6 * shape.vocab_size * shape.hidden_size
    matmul = flops_per_token(shape, 4096, "full_attention") - lookup
    expected = tokens_per_gpu * matmul / 989.5e12
    assert got == pytest.approx(expected, rel=1e-5)


def test_tp_divides_the_compute_of_each_gpu() -> None:
    f = features(rows({"tp": 1, "mbs": 4}, {"tp": 4, "mbs": 4}), WORK_8B)["compute"]
    assert f.iloc[0] / f.iloc[1] == pytest.approx(4.0)


def test_pipeline_bubble_is_the_other_stages_work_once() -> None:
    """1F1B: m micro-batches at the pace of the busiest stage, plus filling and draining the
    pipeline, which costs the other stages' work once: (m − 1)·t_max + Σ_s t_s. For a balanced
    split that is (m + pp − 1)·t; an unbalanced one pays less than (pp − 1)·t_max."""
    f = features(rows({"pp": 4, "grad_acc": 8}, {"pp": 4, "grad_acc": 16}, {"grad_acc": 1}),
                 WORK_8B)["compute"].to_numpy()
    t_max = (f[1] - f[0]) / 8  # one more micro-batch costs one busiest-stage slot
    total = f[2]  # the whole model, one micro-batch (pp = 1)
    assert f[0] == pytest.approx(7 * t_max + total)
    assert total <= 4 * t_max and f[0] <= (8 + 3) * t_max


def test_busiest_stage_carries_at_least_its_share_of_the_work() -> None:
    """The stage that paces the pipeline is the busiest in time, its GEMMs and its memory-bound
    bytes together (the LM head's stage holds few layers but all the fp32 logits)."""
    f = features(rows({"grad_acc": 8}, {"pp": 2, "grad_acc": 8}, {"pp": 8, "grad_acc": 8}),
                 WORK_1B)
    prior = Coefficients()
    work = (f["compute"] * prior.compute + f["memory_traffic"] * prior.memory_traffic).to_numpy()
    slots = np.array([8, 9, 15])
    per_slot = work / slots
    assert per_slot[1] >= per_slot[0] / 2 and per_slot[2] >= per_slot[0] / 8
    assert per_slot[1] < per_slot[0] * 0.7  # and still gains from the split


def test_tp_inside_a_node_is_intra_node_traffic_and_across_nodes_inter_node() -> None:
    f = features(rows({"tp": 1}, {"tp": 8}, {"tp": 16}), WORK_8B)
    assert f.loc[0, "layer_comm"] == 0 and f.loc[0, "layer_comm_inter"] == 0
    assert f.loc[1, "layer_comm"] > 0 and f.loc[1, "layer_comm_inter"] == 0
    assert f.loc[2, "layer_comm"] == 0 and f.loc[2, "layer_comm_inter"] > 0
    # NVLink 450 GB/s vs 8 rails × 50 GB/s: crossing nodes costs more per byte moved.
    per_byte_8 = f.loc[1, "layer_comm"] / (7 / 8)
    per_byte_16 = f.loc[2, "layer_comm_inter"] / (15 / 16)
    assert per_byte_16 > per_byte_8


def test_dp_allreduce_moves_twice_the_reduce_scatter_of_zero1_gradients() -> None:
    work = dataclasses.replace(WORK_1B, dtype="fp32", grad_reduce_bytes=4)  # equal byte widths
    f = features(rows({"dp": 4, "zero_stage": 0}, {"dp": 4, "zero_stage": 1}), work)
    # ZeRO-0: all-reduce = 2 × RS; ZeRO-1: RS of fp32 gradients + AG of fp32 parameters.
    assert f.loc[0, "dp_comm"] == pytest.approx(f.loc[1, "dp_comm"])
    f2 = features(rows({"dp": 4, "zero_stage": 0}, {"dp": 4, "zero_stage": 1}), WORK_1B)
    assert f2.loc[1, "dp_comm"] == pytest.approx(f2.loc[0, "dp_comm"] * (4 + 2) / (2 * 4))


def test_a_dp_group_that_leaves_the_node_is_inter_node_traffic() -> None:
    f = features(rows({"dp": 8}, {"dp": 16}, {"dp": 1}), WORK_1B)
    assert f.loc[0, "dp_comm"] > 0 and f.loc[0, "dp_comm_inter"] == 0
    assert f.loc[1, "dp_comm"] == 0 and f.loc[1, "dp_comm_inter"] > 0
    assert f.loc[2, ["dp_comm", "dp_comm_inter"]].sum() == 0


def test_pipeline_messages_cross_nodes_only_when_a_stage_fills_a_node() -> None:
    f = features(rows({"pp": 2, "grad_acc": 4}, {"pp": 2, "dp": 8, "grad_acc": 4}), WORK_1B)
    assert f.loc[0, "p2p_inter"] == 0 and f.loc[0, "pp_comm"] > 0
    assert f.loc[1, "p2p_inter"] > 0


def test_pipeline_tp_sync_charges_every_layer_after_a_stages_first_per_tp_ring_position() -> None:
    """Only pipeline runs with TP pay it, per micro-batch, (layers on the busiest stage − 1)·(tp − 1):
    nothing without a pipeline, without TP, or with one layer per stage."""
    f = features(rows({"pp": 1, "tp": 4, "grad_acc": 8}, {"pp": 2, "tp": 1, "grad_acc": 8},
                      {"pp": 2, "tp": 4, "grad_acc": 8}, {"pp": 2, "tp": 8, "grad_acc": 8},
                      {"pp": 2, "tp": 4, "grad_acc": 16}), WORK_8B)["pipe_tp_sync"]
    one_layer_each = dataclasses.replace(WORK_8B, stage_split="even")  # 32 layers on 32 stages
    assert features(rows({"pp": 32, "tp": 4, "grad_acc": 64}), one_layer_each)[
        "pipe_tp_sync"].iloc[0] == 0
    assert f.iloc[0] == 0 and f.iloc[1] == 0
    assert f.iloc[3] == pytest.approx(f.iloc[2] * 7 / 3)  # tp − 1
    assert f.iloc[4] == pytest.approx(2 * f.iloc[2])  # per micro-batch
    assert f.iloc[2] == 8 * 17 * 3  # 8 micro-batches, 18 layers on the busiest stage, tp − 1 = 3


def test_per_layer_costs_follow_the_stage_with_the_most_layers_not_the_heads_stage() -> None:
    """1B at pp = 8: nanotron places 3,2,3,2,3,2,1,0 layers, the LM head on the last stage,
    which is then the FLOP-busiest with no layer; the per-layer costs are paced by 3 layers."""
    f = features(rows({"pp": 8, "tp": 8, "grad_acc": 16}), WORK_1B)
    assert f.loc[0, "pipe_tp_sync"] == 16 * (3 - 1) * (8 - 1)


def test_a_measured_fabric_replaces_the_catalogs_inter_node_bandwidth() -> None:
    """A table's runs may carry the all-reduce bandwidth their job measured across its nodes
    (shared by a node's 8 GPUs): a slow fabric makes inter-node traffic slower, none leaves the
    catalog's figure, and traffic inside a node does not change."""
    layouts = rows({"dp": 16}, {"dp": 16}, {"dp": 16}, {"dp": 8})
    measured = layouts.assign(inter_node_busbw_GBps=[np.nan, 8 * H100.inter_node_GBps, 13.0,
                                                     13.0])
    f, g = features(layouts, WORK_1B), features(measured, WORK_1B)
    assert g.loc[0, "dp_comm_inter"] == pytest.approx(f.loc[0, "dp_comm_inter"])
    assert g.loc[1, "dp_comm_inter"] == pytest.approx(f.loc[1, "dp_comm_inter"])
    assert g.loc[2, "dp_comm_inter"] > 5 * f.loc[2, "dp_comm_inter"]
    assert g.loc[3, "dp_comm"] == pytest.approx(f.loc[3, "dp_comm"])


def test_zero_shards_the_optimizer_update() -> None:
    f = features(rows({"dp": 8, "zero_stage": 0}, {"dp": 8, "zero_stage": 1}), WORK_1B)
    assert f.loc[0, "optimizer"] == pytest.approx(8 * f.loc[1, "optimizer"])


def test_prediction_is_the_sum_of_its_terms_and_mfu_follows_from_throughput() -> None:
    frame = rows({"dp": 8, "mbs": 2, "grad_acc": 16}, {"dp": 2, "tp": 4, "mbs": 4, "grad_acc": 32})
    out = predict(frame, WORK_8B)
    terms = out[[f"t_{name}" for name in FEATURES]].sum(axis=1)
    assert np.allclose(out["pred_step_time_s"], terms)
    fpt = flops_per_token(WORK_8B.shape, 4096, "full_attention")
    assert np.allclose(out["pred_mfu"], out["pred_tokens_per_s_per_gpu"] * fpt / 989.5e12)
    assert ((out["pred_mfu"] > 0) & (out["pred_mfu"] < 1)).all()


def test_larger_micro_batches_are_more_efficient_at_equal_tokens() -> None:
    out = predict(rows({"dp": 8, "mbs": 1, "grad_acc": 32}, {"dp": 8, "mbs": 4, "grad_acc": 8}),
                  WORK_1B)
    assert out.loc[1, "pred_tokens_per_s_per_gpu"] > out.loc[0, "pred_tokens_per_s_per_gpu"]


def test_vectorised_prediction_equals_row_by_row() -> None:
    frame = rows({"dp": 8}, {"dp": 2, "tp": 2, "pp": 2, "grad_acc": 8, "zero_stage": 1},
                 {"dp": 4, "tp": 16, "mbs": 8}, {"tp": 8, "pp": 8, "grad_acc": 64})
    together = predict(frame, WORK_8B)["pred_step_time_s"].to_numpy()
    alone = [predict(frame.iloc[[i]], WORK_8B)["pred_step_time_s"].iloc[0] for i in range(4)]
    assert np.allclose(together, alone)


def test_recomputation_adds_forward_flops() -> None:
    frame = rows({"recompute": "none"}, {"recompute": "selective"}, {"recompute": "full"})
    c = features(frame, WORK_8B)["compute"].to_numpy()
    assert c[0] < c[1] < c[2] and c[2] / c[0] < 4 / 3 + 1e-9


def test_missing_layout_column_is_named() -> None:
    with pytest.raises(ValueError, match=r"grad_acc"):
        features(pd.DataFrame([{"dp": 1, "tp": 1, "pp": 1, "mbs": 1, "zero_stage": 0}]), WORK_1B)


def test_coefficients_round_trip_and_reject_unknown_names() -> None:
    c = Coefficients(compute=2.0, inter_scaling=1.0)
    assert Coefficients.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown coefficient"):
        Coefficients.from_dict({"computee": 1.0})


def test_a_device_without_a_catalogue_peak_gets_times_but_no_mfu() -> None:
    """CPU runs: the built-in workload measures its peak at run time, the catalog has none."""
    work = Workload(get_model("tiny-4l"), 128, get_gpu("cpu"), dtype="fp32", gpus_per_node=2)
    out = predict(rows({"dp": 2, "mbs": 2, "grad_acc": 2}, {"dp": 1, "tp": 2, "mbs": 2,
                                                             "grad_acc": 4}), work)
    assert (out.pred_step_time_s > 0).all() and out.pred_mfu.isna().all()
