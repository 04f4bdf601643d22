"""What Megatron-LM cannot run as labelled: the capability table (see sweep.frameworks.base).

Each rule quotes Megatron at the versions the adapter supports: megatron-core 0.17.1 (tag
core_v0.17.1 @266f1c97) and 0.19.2 (the PyPI wheel; no tag in the repository), and the rule
still holds at main @d98e8a64 (2026-08-22). Paths are under megatron/ of the wheel or checkout.

What the generic planner rules already prune is not repeated here: tp dividing the attention
and KV heads (Megatron's TransformerConfig asserts both), ep dividing the experts (validate_args:
"Number of experts should be a multiple of expert model parallel_size"), 2·cp dividing seq_len
(validate_args: "seq-length should be a multiple of 2 * context-parallel-size"), layers that
split evenly over pp·vpp stages counting the loss and embedding as layers (validate_args and
TransformerConfig; launch/megatron.args renders --account-for-loss/embedding-in-pipeline-split
then), and interleaving needing grad_acc to be a multiple of pp (schedules.py
forward_backward_pipelining_with_interleaving: "The remainder of M ... divided by N ... should
be 0, or larger than or equal to the pipeline-parallel size"; N defaults to pp). ZeRO stages
above 1 are not offered (`FrameworkAdapter.zero_stages`).

Checked by the contract test (tests/frameworks/megatron/test_contract.py), which runs every
rendered argument list through Megatron's own parse_args, validate_args and
core_transformer_config_from_args at both versions.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from sweep.frameworks.base import CapabilityContext, CapabilityRule, Columns

VERSIONS: Final = "core_v0.17.1 @266f1c97, megatron-core 0.19.2, main @d98e8a64"


def _everywhere(columns: Columns, value: bool) -> np.ndarray:
    return np.full(len(columns["tp"]), value, dtype=bool)


def _gpipe(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    """A real pipeline (pp > 1) labelled GPipe: at pp = 1 no schedule runs, whatever the label."""
    return (np.asarray(columns["pp_schedule"]) == "gpipe") & (columns["pp"] > 1)


def _tf32(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return _everywhere(columns, ctx.dtype == "tf32")


def _moe_tp_without_sp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    return (ctx.model.num_experts > 0) & (columns["tp"] > 1) & ~np.asarray(columns["sp"], bool)


def _tp_comm_overlap_without_sp(columns: Columns, ctx: CapabilityContext) -> np.ndarray:
    """Only where the spec asks for TP communication overlap (run.tp_comm_overlap). An override
    can still turn it on for a few runs after planning: launch/megatron.sh refuses those."""
    return ctx.tp_comm_overlap & (columns["tp"] > 1) & ~np.asarray(columns["sp"], bool)


RULES: Final[tuple[CapabilityRule, ...]] = (
    CapabilityRule(
        "gpipe_schedule",
        "Megatron-LM has no GPipe (all-forward-all-backward) training schedule: "
        "get_forward_backward_func returns forward_backward_no_pipelining at pp = 1, "
        "forward_backward_pipelining_without_interleaving (1F1B) at pp > 1, and "
        "forward_backward_pipelining_with_interleaving with virtual stages; a gpipe row would "
        "run 1F1B",
        f"core/pipeline_parallel/schedules.py get_forward_backward_func ({VERSIONS})",
        _gpipe),
    CapabilityRule(
        "tf32",
        "Megatron-LM has no TF32 switch (no --tf32 argument, no allow_tf32 anywhere in "
        "megatron/training or the GPT model path): without --bf16/--fp16 it trains in fp32, so a "
        "tf32 row would run as fp32",
        f"training/arguments.py _add_mixed_precision_args ({VERSIONS})",
        _tf32),
    CapabilityRule(
        "moe_tp_without_sp",
        "MoELayer.forward raises ValueError in training when tensor parallelism > 1 without "
        "sequence parallelism (\"During training, performance may degrade if MoE and tensor "
        "parallelism are enabled without also enabling sequence parallelism.\")",
        f"core/transformer/moe/moe_layer.py MoELayer.forward ({VERSIONS})",
        _moe_tp_without_sp),
    CapabilityRule(
        "tp_comm_overlap_without_sp",
        "validate_args: \"Tensor parallel communication/GEMM overlap can happen only when "
        "sequence parallelism is enabled\" (run.tp_comm_overlap with tp > 1 and sp off)",
        f"training/arguments.py validate_args ({VERSIONS})",
        _tp_comm_overlap_without_sp),
)
