"""What nanotron cannot run as labelled: the capability table (see sweep.frameworks.base).

Each rule quotes nanotron at the supported version it applies to (`config_schema.MAIN` is main
@2411b022, `config_schema.PLAYBOOK` is @e24d2483); paths are under src/nanotron/. What the
generic planner rules already prune (tp dividing the heads and KV heads, 1F1B's grad_acc >=
pp - 1, ep without a MoE model, every pipeline stage getting a block) is not repeated here.

A MoE model renders at main as a Qwen2Config with `moe_config` (the template,
templates/launch/nanotron.yaml.j2); what that model cannot run is below (`moe_pipeline`,
`moe_fp16`, `expert_parallel`), and at the playbook's commit there is no MoE at all (`moe_model`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from sweep.frameworks.base import CapabilityContext, CapabilityRule, Columns
from sweep.frameworks.nanotron.config_schema import MAIN, PLAYBOOK

Mask = Callable[[Columns, CapabilityContext], np.ndarray]


def _everywhere(columns: Columns, value: bool) -> np.ndarray:
    return np.full(len(columns["tp"]), value, dtype=bool)


def _at(version: str, mask: Mask) -> Mask:
    """`mask` where the run renders for `version`, nowhere else."""
    def fails(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
        if ctx.framework_version != version:
            return _everywhere(columns, False)
        return mask(columns, ctx)
    return fails


def _context_parallel(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return columns["cp"] > 1


def _expert_parallel(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return columns["ep"] > 1


def _moe_model(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.model.num_experts > 0)


def _moe_pipeline(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return (columns["pp"] > 1) & (ctx.model.num_experts > 0)


def _moe_fp16(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.model.num_experts > 0 and ctx.dtype == "fp16")


def _head_dim(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    model = ctx.model
    return _everywhere(columns, model.head_dim != model.hidden_size // model.num_attention_heads)


def _fp8(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.dtype == "fp8")


def _fp32(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.dtype in ("fp32", "tf32"))


def _interleaved(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray(columns["pp_schedule"]) == "interleaved_1f1b"


def _selective_recompute(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray(columns["recompute"]) == "selective"


def _ffn_over_tp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return (ctx.model.ffn_hidden_size % columns["tp"] != 0) & (ctx.model.num_experts == 0)


RULES: Final[tuple[CapabilityRule, ...]] = (
    CapabilityRule(
        "moe_model",
        "this commit has no Qwen2Config and no MoEConfig: its one core model with a Llama "
        "shape, LlamaConfig/LlamaForTraining, has no experts (examples/moe is no core model)",
        "config/models_config.py, models/llama.py @e24d2483",
        _at(PLAYBOOK, _moe_model)),
    CapabilityRule(
        "moe_pipeline",
        "a MoE model is a Qwen2Config, and Qwen2Model.forward calls position_ids.numel(), which "
        "on every pipeline rank but the first is a TensorPointer (the data generator feeds the "
        "first stage only), so pp > 1 fails in the first forward",
        "models/qwen.py Qwen2Model.forward, data/dataloader.py dummy_infinite_data_generator "
        "@2411b022",
        _at(MAIN, _moe_pipeline)),
    CapabilityRule(
        "moe_fp16",
        "the experts run grouped_gemm's ops.gmm, which checks that its operands are bfloat16",
        "nn/moe.py GroupedMLP @2411b022; fanshiqing/grouped_gemm csrc/grouped_gemm.cu "
        "GroupedGemm (TORCH_CHECK(a.scalar_type() == torch::kBFloat16))",
        _at(MAIN, _moe_fp16)),
    CapabilityRule(
        "expert_parallel",
        "ParallelContext asserts TP*CP*DP*PP == WORLD_SIZE, leaving expert_parallel_size out, "
        "then lays the ranks out as (ep, pp, dp, cp, tp), so ep > 1 cannot start; nor would "
        "the MoE layer send tokens to experts on other ranks (each rank routes its tokens "
        "over all experts while holding num_experts / ep of them)",
        "parallel/context.py ParallelContext.__init__, nn/moe.py Qwen2MoELayer @2411b022",
        _at(MAIN, _expert_parallel)),
    CapabilityRule(
        "expert_parallel",
        "expert parallelism only shards experts, and nanotron's Llama has none (ep ranks would be "
        "idle replicas of a dense model)",
        "parallel/context.py, models/llama.py @e24d2483",
        _at(PLAYBOOK, _expert_parallel)),
    CapabilityRule(
        "context_parallel",
        "'Init with Context parallel size > 1 not supported yet' (raised for every run that does "
        "not resume a checkpoint)",
        "trainer.py DistributedTrainer._load_model_checkpoint @2411b022",
        _at(MAIN, _context_parallel)),
    CapabilityRule(
        "context_parallel",
        "ParallelismArgs has no context_parallel_size at this commit (added by b641237d, on main "
        "2025-03-21), and the strict config loader rejects the key",
        "config/parallelism_config.py @e24d2483",
        _at(PLAYBOOK, _context_parallel)),
    CapabilityRule(
        "fp8",
        "ModelArgs.dtype is a torch dtype from str_to_dtype, which has no float8; nanotron's fp8 "
        "code (src/nanotron/fp8) is not reachable from the YAML config",
        "config/utils_config.py, config/config.py ModelArgs @2411b022 and @e24d2483",
        _fp8),
    CapabilityRule(
        "fp32",
        "the Llama attention always calls flash_attn_varlen_func (Qwen2's, for MoE models, "
        "flash_attn_varlen_kvpacked_func), which supports fp16 and bf16 only; nanotron never "
        "enables TF32 either",
        "models/llama.py CoreAttention @2411b022 and @e24d2483, models/qwen.py @2411b022",
        _fp32),
    CapabilityRule(
        "interleaved_1f1b",
        "nanotron has two pipeline engines, 1f1b (OneForwardOneBackward) and afab "
        "(AllForwardAllBackward); no interleaved/virtual-stage schedule",
        "parallel/pipeline_parallel/engine.py, config/utils_config.py cast_str_to_pipeline_engine",
        _interleaved),
    CapabilityRule(
        "selective_recompute",
        "ParallelismArgs has recompute_layer (whole-layer recompute) only; the RecomputeGranularity "
        "enum is read by no model",
        "config/parallelism_config.py, models/llama.py @2411b022 and @e24d2483",
        _selective_recompute),
    CapabilityRule(
        "ffn_over_tp",
        "TensorParallelRowLinear asserts in_features % tp == 0, and the MLP's down projection "
        "takes the FFN width (a dense MLP: main's MoE experts are not sharded over TP)",
        "parallel/tensor_parallel/nn.py @2411b022 and @e24d2483, nn/moe.py GroupedMLP @2411b022",
        _ffn_over_tp),
    CapabilityRule(
        "head_dim",
        "LlamaConfig and Qwen2Config have no head_dim: the attention takes hidden_size // "
        "num_attention_heads, so a model with another head width would run as a different model",
        "models/llama.py CausalSelfAttention, models/qwen.py Qwen2Attention @2411b022; "
        "models/llama.py @e24d2483",
        _head_dim),
)
