"""The memory model against runs that really happened: the playbook's measured nanotron runs
(peaks and outcomes), and published configurations that ran, each predicted to fit under the
closest profile.

Reference data ($SWEEP_REFDATA, never edited) is read through conftest's REFDATA path; without it
these tests skip.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from sweep.core.catalog import get_gpu, get_model
from sweep.core.layout import Layout
from sweep.core.model import ModelShape
from sweep.core.units import GiB, MiB
from sweep.models.memory import estimate, estimate_columns, reserved_interval
from sweep.models.memory_profiles import LLMFOUNDRY
from sweep.models.pipeline_stages import stage_block_counts
from sweep.validation.memory_reference import gpt_shape

ONE_B = get_model("playbook-1b")
EIGHT_B = get_model("playbook-8b")


# ------------------------------------------------------------------ measured runs (nanotron playbook)
#
# Mem Alloc (GB) and Mem Res (GB) are rank 0's torch.cuda.max_memory_allocated/reserved in GiB.
# nanotron's `log_memory` (src/nanotron/logging/base.py) resets the peak counters after the
# forward/backward pass of the first steps, so "Mem Alloc" is the peak of the optimizer-step window
# (mem_step_allocated_bytes), while "Mem Res" keeps the whole step's high-water mark because the
# cache is never emptied. Rank 0 sits on the first pipeline stage: errors use stage="first";
# feasibility uses the most loaded stage, as the planner does.

PLAYBOOK_MODELS = {"1.34G": ONE_B, "8.86G": EIGHT_B}
H100_BYTES = get_gpu("h100-sxm").memory_bytes


def _playbook_model(row) -> ModelShape:
    """A failed row lacks the shape columns nanotron writes on success: map it by name and shape."""
    model = PLAYBOOK_MODELS[row["name"].split("_")[0]]
    assert (row["hidden_size"], row["num_layers"], row["num_heads"], row["vocab_size"]) == (
        model.hidden_size, model.num_layers, model.num_attention_heads, model.vocab_size)
    return model


def _playbook_predictions(frame: pd.DataFrame, stage: str) -> pd.DataFrame:
    parts = []
    for model in PLAYBOOK_MODELS.values():
        rows = frame[[_playbook_model(r) is model for _, r in frame.iterrows()]]
        if rows.empty:
            continue
        n = len(rows)
        cols = {"dp": rows["dp"].to_numpy(), "tp": rows["tp"].to_numpy(), "pp": rows["pp"].to_numpy(),
                "cp": np.ones(n, int), "ep": np.ones(n, int), "mbs": rows["mbs"].to_numpy(),
                "grad_acc": rows["grad_acc"].to_numpy().astype(int), "zero_stage": rows["zero_stage"].to_numpy(),
                "vpp": np.ones(n, int), "sp": np.ones(n, bool),  # tp_mode=REDUCE_SCATTER in every run
                "recompute": np.full(n, "none", object), "pp_schedule": np.full(n, "1f1b", object)}
        out = estimate_columns(model, cols, seq_len=4096, profile="nanotron", stage=stage)
        parts.append(pd.DataFrame(out, index=rows.index))
    return pd.concat(parts).loc[frame.index]


def _empty_stage(frame: pd.DataFrame) -> np.ndarray:
    """nanotron cannot build a pipeline stage without blocks (a structural rule, not memory)."""
    return np.array([min(stage_block_counts(_playbook_model(r), int(r["pp"]), "nanotron")) == 0
                     for _, r in frame.iterrows()])


def _abs_rel_err(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    return (predicted.astype(float) / measured.astype(float) - 1.0).abs()


@pytest.fixture(scope="module")
def bench(refdata) -> pd.DataFrame:
    frame = pd.read_csv(refdata / "playbook_bench_full_1B_8B.csv").rename(columns={"batch_accum": "grad_acc"})
    assert set(frame["status"]) == {"Success", "OOM", "Other"}
    assert frame["seq_len"].eq(4096).all() and frame["tp_mode"].eq("REDUCE_SCATTER").all()
    first = _playbook_predictions(frame, "first")
    loaded = _playbook_predictions(frame, "most_loaded")
    frame["pred_step_alloc"] = first["mem_step_allocated_bytes"]
    frame["pred_alloc"] = first["mem_allocated_bytes"]
    frame["pred_reserved"] = first["mem_reserved_bytes"]
    frame["fits"] = loaded["mem_total_bytes"] <= H100_BYTES
    frame["empty_stage"] = _empty_stage(frame)
    return frame


def test_the_h100_capacity_is_what_the_allocator_can_reach_on_the_real_80_gb_card():
    # torch.cuda.get_device_properties(0).total_memory on an H100 80GB HBM3 (driver 580.159.04),
    # 480 MiB under nvidia-smi's 81559 MiB; PyTorch's OOM message there says "79.18 GiB"
    assert H100_BYTES == 81079 * MiB
    assert f"{H100_BYTES / GiB:.2f}" == "79.18"


def test_allocated_peak_of_the_step_window_is_predicted_closely(bench):
    ok = bench[bench["status"] == "Success"]
    err = _abs_rel_err(ok["pred_step_alloc"], ok["Mem Alloc (GB)"] * GiB)
    assert err.median() <= 0.08 and err.quantile(0.9) <= 0.25, (err.median(), err.quantile(0.9))


def test_reserved_peak_is_predicted_within_target(bench):
    ok = bench[bench["status"] == "Success"]
    err = _abs_rel_err(ok["pred_reserved"], ok["Mem Res (GB)"] * GiB)
    assert err.median() <= 0.15 and err.quantile(0.9) <= 0.45, (err.median(), err.quantile(0.9))


def test_the_live_tensor_peak_never_exceeds_what_the_allocator_reserved(bench):
    """Physics: reserved >= allocated. Our whole-step peak must sit under the measured reserve."""
    ok = bench[bench["status"] == "Success"]
    assert (ok["pred_alloc"] <= ok["Mem Res (GB)"] * GiB).mean() >= 0.95


def test_successful_runs_fit_and_oom_runs_do_not(bench):
    status = bench["status"]
    assert bench.loc[status == "Success", "fits"].mean() >= 0.99
    assert (~bench.loc[status == "OOM", "fits"]).mean() >= 0.90


def test_failed_runs_are_ruled_out_by_memory_or_by_an_empty_pipeline_stage(bench):
    failed = bench[bench["status"] != "Success"]
    ruled_out = (~failed["fits"]) | failed["empty_stage"]
    assert ruled_out.mean() >= 0.80
    # the structural rule costs (almost) no successful run
    assert bench.loc[bench["status"] == "Success", "empty_stage"].mean() <= 0.01


@pytest.fixture(scope="module")
def charts(refdata) -> pd.DataFrame:
    frame = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    frame["name"] = frame["model_label"].map({"1B": "1.34G", "8B": "8.86G"}) + "_"
    for col, key in (("hidden_size", "hidden_size"), ("num_layers", "num_layers"),
                     ("num_heads", "num_attention_heads"), ("vocab_size", "vocab_size")):
        frame[col] = [getattr(PLAYBOOK_MODELS[n[:-1]], key) for n in frame["name"]]
    assert frame["seq_len"].eq(4096).all()
    first = _playbook_predictions(frame, "first")
    loaded = _playbook_predictions(frame, "most_loaded")
    frame["pred_reserved"] = first["mem_reserved_bytes"]
    frame["fits"] = loaded["mem_total_bytes"] <= H100_BYTES
    frame["empty_stage"] = _empty_stage(frame)
    return frame


def test_chart_runs_reserved_memory_and_feasibility(charts):
    ok = charts[charts["status"] == "success"]
    err = _abs_rel_err(ok["pred_reserved"], ok["gpu_memory_GB"] * GiB)
    assert err.median() <= 0.15 and err.quantile(0.9) <= 0.45, (err.median(), err.quantile(0.9))
    assert ok["fits"].mean() >= 0.99
    failed = charts[charts["status"] == "failed"]
    assert ((~failed["fits"]) | failed["empty_stage"]).mean() >= 0.80


def test_best_playbook_configurations_fit_including_the_3b_and_80b_we_did_not_calibrate_on(refdata):
    """The heatmap's winners ran, 3B and 80B included (held out from the calibration): each fits and
    its reserved memory (rank 0) is predicted with a median error under 8 % and none over 25 %."""
    frame = pd.read_csv(refdata / "playbook_best_configs_heatmap.csv").dropna(subset=["dp"])
    models = {"1B": ONE_B, "3B": get_model("playbook-3b"), "8B": EIGHT_B, "80B": get_model("playbook-80b")}
    errors = []
    for r in frame.itertuples():
        layout = Layout(dp=int(r.dp), tp=int(r.tp), pp=int(r.pp), mbs=int(r.mbs), grad_acc=int(r.grad_acc),
                        zero_stage=int(r.zero_stage), sp=True)
        model = models[r.model_label]
        assert estimate(model, layout, seq_len=4096, profile="nanotron").total_bytes <= H100_BYTES, r
        first = estimate(model, layout, seq_len=4096, profile="nanotron", stage="first")
        errors.append(abs(first.reserved_bytes / (r.gpu_memory_GB * GiB) - 1))
    assert len(errors) == 26 and np.median(errors) <= 0.08 and max(errors) <= 0.25, errors


@pytest.mark.parametrize("gpus", [8, 16])
def test_no_80b_layout_fits_on_one_or_two_nodes(gpus):
    """The playbook's 80B cells at 1 and 2 nodes are empty: every configuration crashed or OOMed."""
    model = get_model("playbook-80b")
    for tp, pp in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 16)):
        if gpus % (tp * pp):
            continue
        for zero in (0, 1):
            layout = Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, mbs=1, grad_acc=256 // (gpus // (tp * pp)),
                            zero_stage=zero, sp=True)
            assert estimate(model, layout, seq_len=4096, profile="nanotron").total_bytes > H100_BYTES, layout


# ------------------------------------------------------------------ published configurations fit
#
# Each ran on a real cluster, so each must be predicted to fit under the closest profile.
# GPT and MPT shapes come from sweep.validation.memory_reference.gpt_shape (a two-matrix GELU MLP; its costing
# is tested in tests/models/test_memory.py).


def _fits(model, layout, seq, gpu, profile, dtype="bf16") -> tuple[bool, float]:
    est = estimate(model, layout, seq_len=seq, dtype=dtype, profile=profile)
    capacity = get_gpu(gpu).memory_bytes
    return est.total_bytes <= capacity, est.total_bytes / capacity


def test_megatron_core_h100_weak_scaling_configurations_fit(refdata):
    """Assumed (the table does not say): micro-batch 1, distributed optimizer, sequence parallelism,
    selective recomputation, 1F1B; DP and GBS as published."""
    frame = pd.read_csv(refdata / "megatron_core_h100_weak_scaling.csv")
    assert len(frame) == 9
    for r in frame.itertuples():
        model = gpt_shape(r.model_size_label, r.num_layers, r.hidden_size, r.attention_heads, r.vocab_size)
        layout = Layout(dp=r.data_parallel, tp=r.tensor_parallel, pp=r.pipeline_parallel, mbs=1,
                        grad_acc=r.global_batch_size // r.data_parallel, zero_stage=1,
                        recompute="selective", sp=r.tensor_parallel > 1)
        fits, share = _fits(model, layout, r.seq_len, "h100-sxm", "megatron")
        assert fits, (r.model_size_label, share)


def test_megatron_2021_a100_configurations_fit(refdata):
    """fp16, no distributed optimizer and no SP (2021), full recomputation (--checkpoint-activations),
    interleaved 1F1B where --num-layers-per-virtual-pipeline-stage is given."""
    frame = pd.read_csv(refdata / "megatron_narayanan2021_table1.csv")
    assert len(frame) == 10
    for r in frame.itertuples():
        model = gpt_shape(r.model_size_label, r.num_layers, r.hidden_size, r.attention_heads, r.vocab_size)
        flags = str(r.extra_flags_in_repro_script).split()
        vpp, schedule = 1, "1f1b"
        if "--num-layers-per-virtual-pipeline-stage" in flags:
            per_chunk = int(flags[flags.index("--num-layers-per-virtual-pipeline-stage") + 1])
            vpp, schedule = r.num_layers // r.pipeline_parallel // per_chunk, "interleaved_1f1b"
        dp = r.data_parallel_derived
        layout = Layout(dp=dp, tp=r.tensor_parallel, pp=r.pipeline_parallel, mbs=r.micro_batch_size,
                        grad_acc=r.global_batch_size // (dp * r.micro_batch_size), zero_stage=0,
                        recompute="full", sp=False, pp_schedule=schedule, vpp=vpp)
        fits, share = _fits(model, layout, r.seq_len, "a100-80gb", "megatron", dtype="fp16")
        assert fits, (r.model_size_label, share)


def test_llama3_405b_configurations_fit(refdata):
    """torchtitan profile (FSDP without resharding after forward = ZeRO-2, TP with SP, PP, CP).
    The paper does not state the recomputation mode; with none, 16 in-flight micro-batches of
    8 layers x 8,192 tokens would need ~80 GB of activations alone, so we assume full. DP is the one
    the GPU count implies (row 3 prints 4; 16,384 / (8*16*16) = 8)."""
    model = get_model("llama-3.1-405b")
    frame = pd.read_csv(refdata / "llama3_table4_405b_parallelism.csv")
    assert len(frame) == 3
    for r in frame.itertuples():
        layout = Layout(dp=r.dp_implied_by_gpus, tp=r.tp, pp=r.pp, cp=r.cp, mbs=1,
                        grad_acc=r.batch_size_per_dp, zero_stage=2, recompute="full", sp=True)
        fits, share = _fits(model, layout, r.seq_len, "h100-sxm", "torchtitan")
        assert fits, (r.stage_row, share)


MPT_SHAPES = {  # d_model, n_heads, n_layers (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml)
    "125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
    "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48),
    "70b": (8192, 64, 80)}


def test_llmfoundry_h100_and_a100_80gb_configurations_fit(refdata):
    """FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, activation checkpointing = full recompute;
    MPT's fused cross-entropy (the LLMFOUNDRY profile), vocab 50,368, data parallel over all GPUs."""
    frame = pd.read_csv(refdata / "llmfoundry_mpt_benchmarks.csv")
    frame = frame[frame["GPU"].isin(["h100_80gb", "a100_80gb"])]
    assert len(frame) == 138
    gpus = {"h100_80gb": "h100-sxm", "a100_80gb": "a100-80gb"}
    for _, r in frame.iterrows():
        hidden, heads, layers = MPT_SHAPES[r["Model"]]
        seq, gpus_n = int(r["SeqLen (T)"]), int(r["# GPUs"])
        model = gpt_shape(f"mpt-{r['Model']}", layers, hidden, heads, 50368)
        # these runs also learn a position embedding of seq x hidden, which ModelShape lacks
        pos_params = seq * hidden
        params = model.vocab_size * hidden + pos_params + layers * 12 * hidden ** 2
        assert params == pytest.approx(r["NumParams"], rel=0.01 if r["Model"] != "125m" else 0.05)
        layout = Layout(dp=gpus_n, tp=1, pp=1, mbs=int(r["MicroBatchSize"]), grad_acc=int(r["GradAccum"]),
                        zero_stage=3 if r["Sharding Strategy"] == "FULL_SHARD" else 2,
                        recompute="full" if r["Activation Checkpointing"] else "none")
        est = estimate(model, layout, seq_len=seq, profile=LLMFOUNDRY)
        # its state as FSDP holds it: 16 B/param sharded, plus the gathered bf16 copy
        total = est.total_bytes + pos_params * (16 / gpus_n + 2)
        capacity = get_gpu(gpus[r["GPU"]]).memory_bytes
        assert total <= capacity, (r["Model"], seq, r["MicroBatchSize"], total / capacity)


def test_torchtitans_own_8b_fsdp_benchmark_reserves_what_the_torchtitan_profile_predicts(refdata):
    """torchtitan's published Llama 3.1 8B runs without torch.compile or Float8 (benchmarks/
    llama3_h100_202412_torchtitan.md, Tables 1 and 3: FSDP over 8 and 128 H100s, local batch 2,
    selective AC, its default seq_len of 8192, torchtitan 9dec370 of December 2024, a version
    older than the profile's). "Memory(GiB)" is torchtitan's logged max_memory_reserved. Nothing
    was fitted to these runs; each measured peak lies in the band's interval and within 10 %."""
    frame = pd.read_csv(refdata / "torchtitan_benchmarks.csv")
    eager = frame[(frame["techniques"] == "FSDP") & (frame["model"] == "Llama 3.1 8B")]
    assert sorted(eager["num_gpus"]) == [8, 128]
    model = get_model("llama-3.1-8b")
    for r in eager.itertuples():
        layout = Layout(dp=int(r.num_gpus), tp=1, pp=1, mbs=int(r.local_batch_size), grad_acc=1,
                        zero_stage=3, recompute="selective")
        est = estimate(model, layout, seq_len=8192, profile="torchtitan")
        measured = float(r.memory_GiB) * GiB
        low, high = reserved_interval(est.reserved_bytes)
        assert float(low) <= measured <= float(high), (r.num_gpus, est.reserved_bytes / GiB)
        assert abs(est.reserved_bytes / measured - 1.0) <= 0.10, (r.num_gpus, est.reserved_bytes / GiB)


TORCHTITAN_MODELS = {"Llama 3.1 8B": "llama-3.1-8b", "Llama 3.1 70B": "llama-3.1-70b",
                     "Llama 3.1 405B": "llama-3.1-405b"}


def torchtitan_layout(r: pd.Series) -> Layout:
    """A row of torchtitan's December 2024 benchmark as the layout torchtitan 9dec370 ran.

    Without `pipeline_parallel_microbatches` a schedule runs one micro-batch per stage of the
    whole pipeline (experimental/pipelining_utils.py `build_pipeline_schedule`: `n_microbatches
    = num_total_stages`), and without split points an interleaved schedule puts two stages on
    each rank (`generate_split_points`: `num_stages_per_rank = 2`); FSDP keeps the gathered
    parameters between forward and backward under PP (ZeRO-2) and reshards them without
    (ZeRO-3)."""
    pp = int(r["pp"])
    recompute = "selective" if r["activation_checkpointing"] == "selective" else "full"
    common = dict(dp=int(r["fsdp"]), tp=int(r["tp"]), cp=int(r["cp"]), recompute=recompute,
                  sp=int(r["tp"]) > 1)
    if pp == 1:
        return Layout(pp=1, mbs=int(r["local_batch_size"]), grad_acc=1, zero_stage=3, **common)
    vpp = 2 if str(r["pp_schedule"]).startswith("Interleaved") else 1
    return Layout(pp=pp, vpp=vpp, mbs=int(r["local_batch_size"]) // (pp * vpp),
                  grad_acc=pp * vpp, zero_stage=2, **common,
                  pp_schedule="interleaved_1f1b" if vpp > 1 else "1f1b")


@pytest.fixture
def torchtitan_runs(refdata) -> pd.DataFrame:
    """Every run of torchtitan's December 2024 H100 benchmark that logged its memory, with its
    layout, the torchtitan profile's reserved peak and the relative error (none was fitted on)."""
    frame = pd.read_csv(refdata / "torchtitan_benchmarks.csv")
    frame = frame[frame["memory_GiB"].notna() & frame["fsdp"].notna()].copy()
    frame["layout"] = [torchtitan_layout(r) for _, r in frame.iterrows()]
    frame["seq"] = frame["seq_len"].fillna(8192).astype(int)  # the default training.seq_len
    frame["predicted"] = [
        estimate(get_model(TORCHTITAN_MODELS[r["model"]]), r["layout"], seq_len=r["seq"],
                 profile="torchtitan").reserved_bytes for _, r in frame.iterrows()]
    frame["measured"] = frame["memory_GiB"] * GiB
    frame["error"] = frame["predicted"] / frame["measured"] - 1.0
    return frame


def test_torchtitans_compiled_float8_runs_up_to_405b_lie_in_the_band(
        torchtitan_runs: pd.DataFrame) -> None:
    """Up to Llama 3.1 405B on 512 GPUs with FSDP, TP, PP and CP, each measured peak (the
    maximum over the GPUs) lies in the band's interval of the torchtitan profile's reserved
    peak. torch.compile, Float8 and AsyncTP are not modelled (on the 8B they move the peak by
    under 7 %, Tables 1 and 3). The pipelined 405B runs hold one mechanism the profile must
    count: torch.distributed.pipelining defers FSDP's reduce-scatter to the last micro-batch, so
    each stage holds its whole fp32 gradients (about 24 GiB there); without it they are predicted
    35-44 % under what they measured, outside the band."""
    from dataclasses import replace

    from sweep.models.memory_profiles import TORCHTITAN

    assert len(torchtitan_runs) == 18 and set(torchtitan_runs["model"]) == set(TORCHTITAN_MODELS)
    reducing_every_micro_batch = replace(TORCHTITAN, pipeline_defers_fsdp_reduction=False)
    for _, r in torchtitan_runs.iterrows():
        low, high = reserved_interval(r["predicted"])
        assert float(low) <= r["measured"] <= float(high), (r["table"], r["techniques"], r["seq"],
                                                           r["predicted"] / GiB, r["memory_GiB"])
        if r["layout"].pp > 1:
            without = estimate(get_model(TORCHTITAN_MODELS[r["model"]]), r["layout"],
                               seq_len=r["seq"], profile=reducing_every_micro_batch)
            assert r["measured"] > float(reserved_interval(without.reserved_bytes)[1]), r["table"]


def test_torchtitans_peaks_meet_the_issue_s_p90(torchtitan_runs: pd.DataFrame) -> None:
    """Issue 17's targets for the reserved peak on data no constant was fitted to: p90 of the
    absolute error <= 20 %. Met: 15.7 %."""
    assert float(np.quantile(torchtitan_runs["error"].abs(), 0.9)) <= 0.20


@pytest.mark.xfail(strict=True, reason="torchtitan's 18 peaks are predicted a median 7.6 % low "
                   "(p90 15.7 %): issue 17's median target of 7 % is not met on this framework")
def test_torchtitans_peaks_meet_the_issue_s_median(torchtitan_runs: pd.DataFrame) -> None:
    assert float(torchtitan_runs["error"].abs().median()) <= 0.07
