"""What nanotron cannot run as labelled: the capability table (see sweep.frameworks.base).

Each rule quotes nanotron at the supported version it applies to (`config_schema.MAIN` is main
@2411b022, `config_schema.PLAYBOOK` is @e24d2483); paths are under src/nanotron/. What the
generic planner rules already prune (tp dividing the heads and KV heads, 1F1B's grad_acc >=
pp - 1, ep without a MoE model, every pipeline stage getting a block) is not repeated here.

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


def _fp8(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.dtype == "fp8")


def _fp32(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.dtype in ("fp32", "tf32"))


def _interleaved(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray(columns["pp_schedule"]) == "interleaved_1f1b"


def _selective_recompute(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return np.asarray(columns["recompute"]) == "selective"


def _ffn_over_tp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return ctx.model.ffn_hidden_size % columns["tp"] != 0


RULES: Final[tuple[CapabilityRule, ...]] = (
    CapabilityRule(
        "moe_model",
        "nanotron's LlamaConfig/LlamaForTraining, the model llm-sweep renders, has no experts; "
        "nanotron's MoE is Qwen2Config.moe_config (main only, not rendered by llm-sweep) or "
        "examples/moe (not a core model)",
        "config/models_config.py, models/llama.py @2411b022 and @e24d2483",
        _moe_model),
    CapabilityRule(
        "expert_parallel",
        "ParallelContext asserts TP*CP*DP*PP == WORLD_SIZE, leaving expert_parallel_size out, so "
        "ep > 1 cannot start",
        "parallel/context.py ParallelContext.__init__ @2411b022",
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
        "the Llama attention always calls flash_attn_varlen_func, which supports fp16 and bf16 "
        "only; nanotron never enables TF32 either",
        "models/llama.py CoreAttention @2411b022 and @e24d2483",
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
        "takes the FFN width",
        "parallel/tensor_parallel/nn.py @2411b022 and @e24d2483",
        _ffn_over_tp),
)
