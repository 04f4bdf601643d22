"""What torchtitan cannot run as labelled: the capability table (see sweep.frameworks.base).

The table is per version: each rule says which of the adapter's version keys it applies to
(`ctx.framework_version`). Sources are torchtitan v0.2.0 (29624e37f) and v0.2.2 (73a0e6979) for
the 0.2 JobConfig form, and torchtitan 0.3.0 (the PyPI wheel) and main at b5bcd76c6 for the
Python config form; where they differ the rule says so.

The layouts map to torchtitan as the templates render them. 0.2 (launch/torchtitan.toml.j2):
ZeRO-0 is DDP (data_parallel_replicate_degree = dp), ZeRO-2/3 are FSDP2 over
data_parallel_shard_degree = dp with reshard_after_forward never/always. 0.3 and main
(launch/torchtitan.config.py.j2): there is no DDP path any more; every run goes through
fully_shard (torchtitan/models/llama3/parallelize.py, "Always run apply_fsdp_to_decoder"), so
ZeRO-0 is HSDP with a shard degree of 1 (dp_replicate = dp·ep: parameters, gradients and optimizer
state replicated) and mixed precision is always FSDP's; ZeRO-2/3 shard over dp_shard = dp·ep, the
dense region from which expert parallelism borrows its ranks (ParallelismConfig.expert_parallel_degree:
dp_shard·cp·tp = efsdp·ep). Pipeline runs put grad_acc micro-batches of mbs sequences through one
schedule step; interleaved 1F1B uses torchtitan's default of two stages per rank (no
pipeline_parallel_layers_per_stage).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from sweep.frameworks.base import CapabilityContext, CapabilityRule, Columns
from sweep.frameworks.torchtitan.flavors import flavor_for
from sweep.frameworks.torchtitan.version import CONFIG_MODULE_KEYS, MAIN, V02, V020

PARALLELIZE = ("torchtitan/models/llama3/infra/parallelize.py parallelize_llama "
               "(v0.2.0 29624e37f, v0.2.2 73a0e6979)")
AMP = "torchtitan/distributed/utils.py maybe_enable_amp (v0.2.0 29624e37f, v0.2.2 73a0e6979)"
TORCH_SCHEDULES = "torch/distributed/pipelining/schedules.py (torch 2.13)"
INTERLEAVED_STAGES_PER_RANK: Final = 2  # pipeline_llm's default without layers_per_stage
TOML_KEYS: Final = (V02, V020)  # the 0.2 JobConfig form
V03_SOURCES: Final = "torchtitan 0.3.0 (PyPI wheel) and main b5bcd76c6"
DECODER = "torchtitan/models/common/decoder.py Decoder.Config.update_from_config (" + V03_SOURCES + ")"
FULL_DTENSOR = "torchtitan/distributed/full_dtensor.py resolve_fsdp_mesh (" + V03_SOURCES + ")"
MOE_SHARDING = "torchtitan/models/common/moe_sharding.py (" + V03_SOURCES + ")"
Rule = Callable[[Columns, CapabilityContext], np.ndarray]


def only(keys: tuple[str, ...], fails: Rule) -> Rule:
    """The rule `fails` for the runs rendered for one of `keys`; no candidate fails otherwise."""
    def applies(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
        if ctx.framework_version not in keys:
            return _all(columns, False)
        return fails(columns, ctx)
    applies.__name__ = getattr(fails, "__name__", "rule")
    return applies


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


def seq_len_divisor_v03(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    """0.3: tp divides the sequence only with sequence parallelism; cp by 2·cp (load balancing).
    0.3.0 divides the sequence; main (token budgets) the tokens of one micro-batch, mbs·seq_len."""
    tp_part = np.where(columns["sp"].astype(bool), columns["tp"], 1)
    cp_part = np.where(columns["cp"] > 1, 2 * columns["cp"], 1)
    tokens = ctx.seq_len * (columns["mbs"] if ctx.framework_version == MAIN else 1)
    return np.asarray(tokens % (tp_part * cp_part) != 0)


def pp_with_tied_embeddings(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray((columns["pp"] > 1) & ctx.model.tie_word_embeddings)


def ep_without_fsdp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    """ZeRO-0 leaves dp_shard = 1: EP would borrow TP/CP ranks, not add dense replicas."""
    return np.asarray((columns["ep"] > 1) & (columns["zero_stage"] == 0))


TEST_TOKENIZER_VOCAB: Final = 2020  # tests/assets/tokenizer/tokenizer.json's vocabulary (main b5bcd76c6)


def vocab_below_tokenizer(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _all(columns, ctx.model.vocab_size < TEST_TOKENIZER_VOCAB)


def expert_tp_as_labelled(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    """run.moe.expert_tensor_parallel against what 0.3 does: experts are TP-sharded (etp = tp) when
    ep = 1 and not at all (etp = 1) when ep > 1; at tp = 1 the two are the same."""
    wanted = ctx.expert_tensor_parallel
    if not ctx.model.num_experts or wanted is None:
        return _all(columns, False)
    tp_sharded = (columns["ep"] == 1) & (columns["tp"] > 1)
    if wanted == "tp":
        return np.asarray((columns["tp"] > 1) & ~tp_sharded)
    return np.asarray(tp_sharded)


ALL = (*TOML_KEYS, *CONFIG_MODULE_KEYS)

RULES: Final[tuple[CapabilityRule, ...]] = (
    CapabilityRule(
        "torchtitan_no_model_definition",
        "torchtitan 0.2 builds models from a named flavor and cannot describe a model by its "
        "dimensions; no llama3 flavor (8B, 70B, 405B) has exactly this model's shape (layers, "
        "hidden, heads, kv heads, head dim, ffn, vocab 128256, untied, dense); torchtitan 0.3 "
        "(run.framework_version: v0.3, the default) builds it by its dimensions",
        "torchtitan/models/llama3/__init__.py llama3_args (v0.2.0 29624e37f, v0.2.2 73a0e6979)",
        only(TOML_KEYS, no_flavor)),
    CapabilityRule(
        "torchtitan_dtype",
        "torchtitan trains in bf16 or fp32 (training.mixed_precision_param: bfloat16|float32, "
        "plus the float8 converter); it has no fp16 mode and never enables TF32 matmuls",
        "torchtitan/config/job_config.py Training (v0.2.0 29624e37f, v0.2.2 73a0e6979); "
        "torchtitan/config/configs.py TrainingConfig (" + V03_SOURCES + ")",
        only(ALL, unsupported_dtype)),
    CapabilityRule(
        "torchtitan_ep_dense",
        "expert parallelism applies only to torchtitan 0.2's MoE models (llama4, deepseek_v3, "
        "qwen3), which have no flavor of our catalog's shapes; llama3 has no experts; torchtitan "
        "0.3 runs the catalog's MoE models by their dimensions (run.framework_version: v0.3)",
        "torchtitan/distributed/parallel_dims.py ParallelDims (v0.2.2 73a0e6979)",
        only(TOML_KEYS, expert_parallel)),
    CapabilityRule(
        "torchtitan_ddp_nd",
        "ZeRO-0 is torchtitan's DDP, which raises 'DDP has not supported > 1D parallelism' "
        "together with TP or PP",
        PARALLELIZE, only(TOML_KEYS, ddp_with_model_parallelism)),
    CapabilityRule(
        "torchtitan_cp_shards",
        "with CP > 1 torchtitan always applies FSDP over the CP ranks (0.2: fsdp_enabled = "
        "dp_shard > 1 or cp > 1; 0.3: the FSDP shard axes are dp_shard and cp): the parameters "
        "are sharded, so the run is not ZeRO-0",
        "torchtitan/distributed/parallel_dims.py fsdp_enabled; " + PARALLELIZE + "; " + FULL_DTENSOR,
        only(ALL, zero0_with_cp)),
    CapabilityRule(
        "torchtitan_mixed_precision_off",
        "without FSDP (ZeRO-0 or a single data-parallel replica, no CP) torchtitan turns mixed "
        "precision off under TP or PP ('Mixed precision training with TP or PP is only supported "
        "when FSDP/HSDP/CP is enabled'): the run would compute in fp32, not the dtype it says",
        AMP, only(TOML_KEYS, mixed_precision_off)),
    CapabilityRule(
        "torchtitan_tp_is_sp",
        "torchtitan 0.2's tensor parallelism always shards norms and activations along the "
        "sequence (SequenceParallel); TP without SP is not available (0.3 has "
        "parallelism.enable_sequence_parallel)",
        PARALLELIZE + " apply_tp", only(TOML_KEYS, tp_without_sp)),
    CapabilityRule(
        "torchtitan_seq_len_divisor",
        "the sequence length must be divisible by TP degree x 2 x CP degree",
        PARALLELIZE + " (ParallelDims.seq_len_divisor)", only(TOML_KEYS, seq_len_divisor)),
    CapabilityRule(
        "torchtitan_seq_len_divisor_v03",
        "the sequence length (main: the tokens of one micro-batch, mbs x seq_len) must be "
        "divisible by the TP degree (with sequence parallelism) times 2 x the CP degree (with "
        "CP): '... must be divisible by ... for the configured sequence/context parallelism'",
        "torchtitan/trainer.py Trainer.__init__ (" + V03_SOURCES + ")",
        only(CONFIG_MODULE_KEYS, seq_len_divisor_v03)),
    CapabilityRule(
        "torchtitan_pp_tied_embeddings",
        "'Weight tying is not supported with Pipeline Parallel': a tied-embedding model cannot "
        "be pipelined",
        DECODER, only(CONFIG_MODULE_KEYS, pp_with_tied_embeddings)),
    CapabilityRule(
        "torchtitan_ep_needs_fsdp",
        "torchtitan's expert parallelism borrows its ranks from the FSDP/CP/TP region "
        "(dp_shard·cp·tp = efsdp·ep); under ZeRO-0 (dp_shard = 1) the EP ranks would be TP/CP "
        "ranks, not the dp·ep dense replicas the layout says",
        "torchtitan/config/configs.py ParallelismConfig.expert_parallel_degree; "
        "torchtitan/distributed/parallel_dims.py (" + V03_SOURCES + ")",
        only(CONFIG_MODULE_KEYS, ep_without_fsdp)),
    CapabilityRule(
        "torchtitan_expert_tp",
        "torchtitan 0.3 has no expert-TP setting: routed experts are sharded over TP when "
        "ep = 1 (expert TP = tp) and over EP alone when ep > 1 (expert TP = 1); run.moe."
        "expert_tensor_parallel asks for the other one",
        MOE_SHARDING + " _routed_experts_sharding_configs",
        only(CONFIG_MODULE_KEYS, expert_tp_as_labelled)),
    CapabilityRule(
        "torchtitan_vocab_below_tokenizer",
        f"the benchmark's data is tokenized by the checkout's test tokenizer, whose ids reach "
        f"{TEST_TOKENIZER_VOCAB - 1}: a model with a smaller vocabulary would index its "
        f"embedding out of range",
        "tests/assets/tokenizer/tokenizer.json (" + V03_SOURCES + ")",
        only(CONFIG_MODULE_KEYS, vocab_below_tokenizer)),
    CapabilityRule(
        "torchtitan_interleaved_stages",
        "torchtitan's interleaved 1F1B without pipeline_parallel_layers_per_stage uses exactly "
        "2 stages per rank",
        "torchtitan/distributed/pipeline_parallel.py pipeline_llm (v0.2.0 29624e37f, v0.2.2 "
        "73a0e6979; _get_pipeline_metadata in " + V03_SOURCES + ")",
        only(ALL, interleaved_stages)),
    CapabilityRule(
        "torchtitan_1f1b_microbatches",
        "Schedule1F1B: 'Number of microbatches must be greater than or equal to the number of "
        "stages' (grad_acc micro-batches per step, one stage per PP rank)",
        TORCH_SCHEDULES + " Schedule1F1B", only(ALL, one_f_one_b_microbatches)),
    CapabilityRule(
        "torchtitan_interleaved_rounds",
        "ScheduleInterleaved1F1B requires the number of microbatches to be a multiple of the "
        "number of rounds (max(1, microbatches // pp))",
        TORCH_SCHEDULES + " ScheduleInterleaved1F1B", only(ALL, interleaved_rounds)),
)
