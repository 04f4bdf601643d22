"""Framework memory profiles: the constants and flags that differ between frameworks.

One memory model (sweep.memory), several profiles. A profile says how many bytes per parameter each
framework keeps, which of them ZeRO shards, how it splits layers over pipeline stages, how wide its
logits path is, and what its allocator and runtime cost beyond live tensors.

Only two constants are fitted to measurements (`fragmentation`, `reserved_floor_bytes`, calibrated
once on the playbook's nanotron runs and shared by every profile); everything else comes from how the
framework is written (sources named per field).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Mapping

MiB: Final = 1 << 20
GiB: Final = 1 << 30

# Calibrated on playbook_bench_full_1B_8B.csv (nanotron, 1,027 successful runs, see tests/test_memory.py):
# the share of the transient working set (activations + logits) that the caching allocator keeps as
# unusable free blocks, and the reserve it holds beyond live tensors even without transients.
FRAGMENTATION: Final = 0.25
RESERVED_FLOOR_BYTES: Final = 512 * MiB


@dataclass(frozen=True)
class MemoryProfile:
    name: str
    description: str
    # --- persistent state, bytes per parameter ---
    weight_bytes: float = 2.0  # the compute-dtype copy (bf16)
    grad_bytes: float = 0.0  # model-dtype gradient buffer (DDP buckets / param.grad)
    grad_needs_dp: bool = False  # that buffer exists only when the model is wrapped in DDP (dp > 1)
    fp32_grad_bytes: float = 4.0  # fp32 gradient accumulation / main_grad buffer
    master_bytes: float = 4.0  # fp32 master weights
    optimizer_bytes: float = 8.0  # Adam exp_avg + exp_avg_sq, fp32
    zero_shards_over_cp: bool = True  # ZeRO shards over dp*cp (Megatron, FSDP) or dp only (nanotron)
    # --- transients outside the forward/backward pass ---
    zero1_gather_bytes: float = 0.0  # ZeRO-1: all-gather buffer of updated params (+ its input shard)
    fsdp_unsharded_layers: int = 0  # ZeRO-3: layers whose bf16 params are gathered at once (prefetch)
    # --- pipeline ---
    stage_split: str = "even"  # "even": ceil(L/pp) layers on stage 0; "cost": nanotron's balanced split
    # --- activations and logits ---
    flash_attention: bool = True  # no s^2 attention-score tensors
    logits_bytes_per_element: float = 10.0  # bf16 logits + fp32 copy + fp32 softmax/grad (per V/tp element)
    tp_buffer_bytes_per_token_h: float = 4.0  # persistent SP gather buffers, bytes per token x hidden (tp > 1)
    workspace_bytes: int = 64 * MiB  # cuBLAS workspaces, RoPE tables and other fixed tensors
    # --- allocator and runtime (outside live tensors) ---
    fragmentation: float = FRAGMENTATION
    reserved_floor_bytes: int = RESERVED_FLOOR_BYTES
    cuda_context_bytes: int = 512 * MiB  # CUDA context + kernels; not in torch's allocator
    nccl_bytes_per_group: int = 256 * MiB  # NCCL channels/buffers per communicator in use


NANOTRON: Final = MemoryProfile(
    name="nanotron",
    description=(
        "nanotron (playbook sweep): bf16 params, bf16 DDP buckets when dp>1, fp32 grad accumulation "
        "(accumulate_grad_in_fp32), fp32 master + Adam; ZeRO-1 shards master+Adam over dp only and "
        "all-gathers the updated params; cost-balanced PP split with embedding/LM head as blocks"),
    grad_bytes=2.0, grad_needs_dp=True, fp32_grad_bytes=4.0, master_bytes=4.0, optimizer_bytes=8.0,
    zero_shards_over_cp=False, zero1_gather_bytes=2.0, stage_split="cost",
)

MEGATRON: Final = MemoryProfile(
    name="megatron",
    description=(
        "Megatron-LM/Megatron-Core: bf16 params, fp32 main_grad buffer, distributed optimizer "
        "(ZeRO-1: fp32 master + Adam sharded over dp*cp); even PP split"),
    grad_bytes=0.0, fp32_grad_bytes=4.0, master_bytes=4.0, optimizer_bytes=8.0,
    zero_shards_over_cp=True, stage_split="even",
)

TORCHTITAN: Final = MemoryProfile(
    name="torchtitan",
    description=(
        "torchtitan FSDP2: fp32 sharded params are the master copy, fp32 grads (reduce_dtype fp32), "
        "bf16 compute copies gathered per layer (ZeRO-3) or kept for the step (ZeRO-2)"),
    weight_bytes=4.0, grad_bytes=4.0, fp32_grad_bytes=0.0, master_bytes=0.0, optimizer_bytes=8.0,
    zero_shards_over_cp=True, fsdp_unsharded_layers=2, stage_split="even",
)

BUILTIN: Final = MemoryProfile(
    name="builtin",
    description="the built-in workload (FSDP2/DTensor, same state layout as torchtitan)",
    weight_bytes=4.0, grad_bytes=4.0, fp32_grad_bytes=0.0, master_bytes=0.0, optimizer_bytes=8.0,
    zero_shards_over_cp=True, fsdp_unsharded_layers=2, stage_split="even",
)

PROFILES: Final[Mapping[str, MemoryProfile]] = MappingProxyType(
    {p.name: p for p in (NANOTRON, MEGATRON, TORCHTITAN, BUILTIN)})


def get_profile(name: str) -> MemoryProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown memory profile {name!r}; known: {', '.join(PROFILES)}") from None
