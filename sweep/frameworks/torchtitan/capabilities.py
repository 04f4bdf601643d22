"""What torchtitan cannot run as labelled: the capability table (see sweep.frameworks.base).

Sources are torchtitan v0.2.0 (29624e37f) and v0.2.2 (73a0e6979); where they differ the rule says
so. The layouts map to torchtitan as templates/launch/torchtitan.toml.j2 renders them: ZeRO-0 is
DDP (data_parallel_replicate_degree = dp), ZeRO-2/3 are FSDP2 over data_parallel_shard_degree = dp
with reshard_after_forward never/always; pipeline runs put grad_acc micro-batches of mbs
sequences through one schedule step; interleaved 1F1B uses torchtitan's default of two stages per
rank (no pipeline_parallel_layers_per_stage).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from sweep.frameworks.base import CapabilityContext, CapabilityRule, Columns
from sweep.frameworks.torchtitan.flavors import flavor_for

PARALLELIZE = ("torchtitan/models/llama3/infra/parallelize.py parallelize_llama "
               "(v0.2.0 29624e37f, v0.2.2 73a0e6979)")
AMP = "torchtitan/distributed/utils.py maybe_enable_amp (v0.2.0 29624e37f, v0.2.2 73a0e6979)"
TORCH_SCHEDULES = "torch/distributed/pipelining/schedules.py (torch 2.13)"
INTERLEAVED_STAGES_PER_RANK: Final = 2  # pipeline_llm's default without layers_per_stage


def _all(columns: Columns, value: bool) -> np.ndarray:
    return np.full(len(columns["tp"]), value, dtype=bool)


def no_flavor(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _all(columns, flavor_for(ctx.model) is None)


def unsupported_dtype(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _all(columns, ctx.dtype in ("fp16", "tf32"))


def expert_parallel(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray(columns["ep"] > 1)


def ddp_with_model_parallelism(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    model_parallel = (columns["tp"] > 1) | (columns["pp"] > 1)
    ddp = (columns["zero_stage"] == 0) & (columns["dp"] > 1) & (columns["cp"] == 1)
    return np.asarray(ddp & model_parallel)


def zero0_with_cp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray((columns["zero_stage"] == 0) & (columns["cp"] > 1))


def fsdp_enabled(columns: Columns) -> np.ndarray:
    """ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1 (dp_shard = dp under ZeRO-2/3)."""
    return ((columns["zero_stage"] > 0) & (columns["dp"] > 1)) | (columns["cp"] > 1)


def mixed_precision_off(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    if ctx.dtype not in ("bf16", "fp8"):
        return _all(columns, False)
    model_parallel = (columns["tp"] > 1) | (columns["pp"] > 1)
    return np.asarray(~fsdp_enabled(columns) & model_parallel)


def tp_without_sp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray((columns["tp"] > 1) & ~columns["sp"].astype(bool))


def seq_len_divisor(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray(ctx.seq_len % (columns["tp"] * 2 * columns["cp"]) != 0)


def interleaved_stages(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    interleaved = (columns["pp_schedule"] == "interleaved_1f1b") & (columns["pp"] > 1)
    return np.asarray(interleaved & (columns["vpp"] != INTERLEAVED_STAGES_PER_RANK))


def one_f_one_b_microbatches(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    single = (columns["pp_schedule"] == "1f1b") & (columns["pp"] > 1)
    return np.asarray(single & (columns["grad_acc"] < columns["pp"]))


def interleaved_rounds(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    interleaved = (columns["pp_schedule"] == "interleaved_1f1b") & (columns["pp"] > 1)
    rounds = np.maximum(1, columns["grad_acc"] // np.maximum(columns["pp"], 1))
    return np.asarray(interleaved & (columns["grad_acc"] % rounds != 0))


RULES: Final[tuple[CapabilityRule, ...]] = (
    CapabilityRule(
        "torchtitan_no_model_definition",
        "torchtitan builds models from a named flavor and cannot describe a model by its "
        "dimensions; no llama3 flavor (8B, 70B, 405B) has exactly this model's shape (layers, "
        "hidden, heads, kv heads, head dim, ffn, vocab 128256, untied, dense)",
        "torchtitan/models/llama3/__init__.py llama3_args (v0.2.0 29624e37f, v0.2.2 73a0e6979)",
        no_flavor),
    CapabilityRule(
        "torchtitan_dtype",
        "torchtitan trains in bf16 or fp32 (training.mixed_precision_param: bfloat16|float32, "
        "plus the float8 converter); it has no fp16 mode and never enables TF32 matmuls",
        "torchtitan/config/job_config.py Training (v0.2.0 29624e37f, v0.2.2 73a0e6979)",
        unsupported_dtype),
    CapabilityRule(
        "torchtitan_ep_dense",
        "expert parallelism applies only to torchtitan's MoE models (llama4, deepseek_v3, "
        "qwen3), which have no flavor of our catalog's shapes; llama3 has no experts",
        "torchtitan/distributed/parallel_dims.py ParallelDims (v0.2.2 73a0e6979)",
        expert_parallel),
    CapabilityRule(
        "torchtitan_ddp_nd",
        "ZeRO-0 is torchtitan's DDP, which raises 'DDP has not supported > 1D parallelism' "
        "together with TP or PP",
        PARALLELIZE, ddp_with_model_parallelism),
    CapabilityRule(
        "torchtitan_cp_shards",
        "with CP > 1 torchtitan always applies FSDP over the CP ranks (fsdp_enabled = dp_shard "
        "> 1 or cp > 1; HSDP when dp_replicate > 1): the parameters are sharded, so the run "
        "is not ZeRO-0",
        "torchtitan/distributed/parallel_dims.py fsdp_enabled; " + PARALLELIZE,
        zero0_with_cp),
    CapabilityRule(
        "torchtitan_mixed_precision_off",
        "without FSDP (ZeRO-0 or a single data-parallel replica, no CP) torchtitan turns mixed "
        "precision off under TP or PP ('Mixed precision training with TP or PP is only supported "
        "when FSDP/HSDP/CP is enabled'): the run would compute in fp32, not the dtype it says",
        AMP, mixed_precision_off),
    CapabilityRule(
        "torchtitan_tp_is_sp",
        "torchtitan's tensor parallelism always shards norms and activations along the sequence "
        "(SequenceParallel); TP without SP is not available",
        PARALLELIZE + " apply_tp", tp_without_sp),
    CapabilityRule(
        "torchtitan_seq_len_divisor",
        "the sequence length must be divisible by TP degree x 2 x CP degree",
        PARALLELIZE + " (ParallelDims.seq_len_divisor)", seq_len_divisor),
    CapabilityRule(
        "torchtitan_interleaved_stages",
        "torchtitan's interleaved 1F1B without pipeline_parallel_layers_per_stage uses exactly "
        "2 stages per rank",
        "torchtitan/distributed/pipeline_parallel.py pipeline_llm (v0.2.0 29624e37f, v0.2.2 73a0e6979)",
        interleaved_stages),
    CapabilityRule(
        "torchtitan_1f1b_microbatches",
        "Schedule1F1B: 'Number of microbatches must be greater than or equal to the number of "
        "stages' (grad_acc micro-batches per step, one stage per PP rank)",
        TORCH_SCHEDULES + " Schedule1F1B", one_f_one_b_microbatches),
    CapabilityRule(
        "torchtitan_interleaved_rounds",
        "ScheduleInterleaved1F1B requires the number of microbatches to be a multiple of the "
        "number of rounds (max(1, microbatches // pp))",
        TORCH_SCHEDULES + " ScheduleInterleaved1F1B", interleaved_rounds),
)
