"""Framework memory profiles: the constants and flags that differ between frameworks.

One memory model (sweep.models.memory), several profiles. A profile says how many bytes per parameter each
framework keeps, which of them ZeRO shards, how it splits layers over pipeline stages, how wide its
logits path is, and what its allocator and runtime cost beyond live tensors.

Only the allocator constants are fitted to measurements (three fragmentation shares and a floor,
fitted by scripts/fit_memory.py on the playbook's nanotron runs, read from sweep/models/fitted_memory.py
and shared by every profile unless a spec names its own, `constraints.allocator`, applied by
`Allocator`; `sweep.models.memory.reserved_interval` turns their leave-one-model-out error into a band);
everything else comes from how the framework is written (each profile's description says what it
keeps).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from sweep.core.units import MiB
from sweep.models import fitted_memory

if TYPE_CHECKING:  # numpy is imported where the interval is drawn (see sweep.frameworks.base)
    pass

# The caching allocator's reserve beyond live tensors, as shares of the transient bytes that cause it:
# - activations of a micro-batch that is alone in flight: each micro-batch allocates and frees the same
#   sizes in the same order, so the cached blocks are reused and little is lost;
# - activations of micro-batches the pipeline schedule keeps in flight: the oldest is freed while newer
#   ones stay, so its blocks become holes between live tensors that later requests only partly fill;
# - logits and loss: the largest tensors of the step, allocated when the pool is fullest, then re-split
#   by smaller requests, so they need fresh segments again next time;
# - a floor: rounding and small-block pools.
# Fitted, not chosen: scripts/fit_memory.py searches the grid of sweep.validation.memory_fit.GRID on the playbook's
# results table (playbook_bench_full_1B_8B.csv, nanotron, 1,027 successful runs) for the objective of
# sweep.validation.memory_fit.OBJECTIVE (the smallest mean reserved-peak error of rank 0 that keeps >= 99 % of the
# successful runs, prunes >= 90 % of the OOM runs, and fits every published llm-foundry
# H100/A100-80GB configuration, which bounds the sequential share) and writes them with their
# provenance (data sha256, grid, objective, date) to sweep/models/fitted_memory.py; tests/validation/test_memory_fit.py
# reruns the fit. One set for every profile: only nanotron rows measured the reserved peak.
FRAG_SEQUENTIAL: Final = fitted_memory.FRAG_SEQUENTIAL
FRAG_PIPELINED: Final = fitted_memory.FRAG_PIPELINED
FRAG_LOGITS: Final = fitted_memory.FRAG_LOGITS
RESERVED_FLOOR_BYTES: Final = fitted_memory.RESERVED_FLOOR_BYTES
# How far off the reserved peak is on a model the constants were not fitted on: the 5th and 95th
# percentiles of predicted / measured - 1, leave-one-model-out (sweep.validation.memory_fit.cross_validate).
RESERVED_BAND: Final[tuple[float, float]] = fitted_memory.RESERVED_BAND


# The linears of a Llama-style layer, in the order its forward calls them (sweep.workload.model
# and torchtitan name them so).
LINEARS: Final = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")


@dataclass(frozen=True)
class MemoryProfile:
    name: str
    description: str
    # --- persistent state, bytes per parameter ---
    weight_bytes: float = 2.0  # the stored weights (bf16 copy, or fp32 when they are the master copy)
    grad_bytes: float = 0.0  # param.grad in the weights' dtype
    ddp_bucket_bytes: float = 0.0  # DDP's own gradient buckets: only with replicas and ZeRO <= 1
    fp32_grad_bytes: float = 4.0  # fp32 gradient accumulation / main_grad buffer
    master_bytes: float = 4.0  # fp32 master weights
    optimizer_bytes: float = 8.0  # Adam exp_avg + exp_avg_sq, fp32
    zero_shards_over_cp: bool = True  # ZeRO shards over dp*cp (Megatron, FSDP) or dp only (nanotron)
    # TP shards each expert's weights (and its FFN activations), or every TP rank keeps its EP
    # share of the experts whole and runs them on the tokens it holds (nanotron main's GroupedMLP)
    experts_shard_over_tp: bool = True
    # ... but only without expert parallelism: with EP > 1 each TP rank keeps its EP share of the
    # experts whole for compute, and the TP ranks join the experts' ZeRO group instead (torchtitan
    # 0.3: ETP = 1 under EP, ParallelDims `efsdp = dp_shard * cp * tp // ep`)
    expert_tp_only_without_ep: bool = False
    weights_shard_from_zero: int = 3  # FSDP2 shards the stored (fp32) params already at "ZeRO-2"
    # --- transients ---
    zero1_gather_bytes: float = 0.0  # ZeRO-1: all-gather buffer of updated params (+ its input shard)
    # FSDP: ZeRO-2 (reshard_after_forward=False) keeps every layer's gathered compute copy from
    # forward to backward; ZeRO-3 gathers this many layers at a time (current + prefetch)
    fsdp_unsharded_layers: int = 0
    fsdp_gathered_bytes: float = 2.0  # bytes per parameter of that gathered copy (bf16 param_dtype)
    # FSDP2 whose gradient reduce-scatter is deferred to a step's last micro-batch
    # (`set_requires_gradient_sync(False)`) keeps each parameter's whole, unsharded gradient until
    # then, in the reduce dtype where one is set (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    # `to_accumulated_grad_if_needed`, torch 2.13), not 1/(dp·cp) of it. torch.distributed.
    # pipelining defers it for every micro-batch of a schedule, and keeps the parameters gathered
    # after each backward too (stage.py `backward_maybe_with_nosync`: `set_reshard_after_backward(
    # False)`), so under pp > 1 a stage holds its whole gathered copy at ZeRO-3 too, at the end of
    # each backward, beside all but one micro-batch's activations (no published run measures it).
    pipeline_defers_fsdp_reduction: bool = False  # the framework pipelines with torch's schedules
    grad_acc_defers_fsdp_reduction: bool = False  # its own gradient accumulation defers it too
    fsdp_accumulated_grad_bytes: float = 4.0  # bytes per parameter of that unsharded gradient
    autocast_weight_bytes: float = 0.0  # torch.autocast's bf16 weight casts, saved for backward
    # --- pipeline ---
    # how layers go to pipeline stages: sweep.models.pipeline_stages.split_stages
    stage_split: str = "even"
    # --- activations and logits ---
    flash_attention: bool = True  # no s^2 attention-score tensors
    residual_bytes: float = 2.0  # bytes per element of the residual stream the two norms save
    # What a layer saves for backward beyond that (defaults: a fused norm hands one bf16 output to
    # the linears that read it, attention saves K/V at their own width):
    norm_saves_output: bool = False  # the norm's scaled output is saved too (a plain `x * weight`)
    linear_input_copies: int = 2  # copies of the normed input the linears save (per cast, if unfused)
    kv_saved_at_query_width: bool = False  # K/V repeated to every query head before attention
    # The linears (model names wq wk wv wo w1 w3 w2) whose outputs selective recomputation keeps,
    # with the attention output, recomputing the rest of the layer one layer at a time (torch's
    # selective activation checkpointing); (): Megatron's, which drops only the s² attention
    # scores, nothing under flash attention
    selective_saves: tuple[str, ...] = ()
    # In a mixture-of-experts layer, where the policy keeps other outputs (None: the same): the
    # experts' grouped matmuls may not count as matmuls to it; and whether it keeps the tokens
    # expert parallelism's all-to-all dispatched and combined (a communication's output)
    moe_selective_saves: tuple[str, ...] | None = None
    selective_keeps_dispatch: bool = False
    # zero_grad(set_to_none=True): with one micro-batch per step the gradients are made during
    # backward, after the activation peak (the logits' backward), so that peak holds none of them
    grads_freed_each_step: bool = False
    # Bytes per parameter the optimizer step allocates beyond its state, sharded as that state:
    # torch.optim.AdamW's foreach implementation (PyTorch's default on CUDA when neither `fused`
    # nor `foreach` is set) takes sqrt(exp_avg_sq) of the whole parameter group at once
    # (torch/optim/adam.py `_multi_tensor_adam`: `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`),
    # one fp32 copy of the parameters; the fused kernels (apex/TE FusedAdam, `fused=True`) need none
    optimizer_step_temp_bytes: float = 0.0
    logits_bytes_per_element: float = 10.0  # bf16 logits + fp32 copy + fp32 softmax/grad (per V/tp element)
    # A chunked loss (torchtitan 0.3's ChunkedLossWrapper) runs the LM head and the loss on
    # 1/loss_chunks of the tokens at a time, each chunk's backward before the next chunk's
    # forward, so the logits of one chunk are alive at once, never the whole [B, L, V/tp]
    loss_chunks: int = 1
    # What such a loss holds for its whole loop, per token x hidden, not sharded by SP (the
    # decoder's final norm replicates the hidden states over TP before the chunks are cut): the
    # fp32 buffer it gathers the hidden states' gradient in and the detached bf16 chunk copies
    loss_hidden_bytes_per_element: float = 0.0
    # And, under FSDP (ZeRO >= 2) where the reduction is not deferred anyway, the LM head's whole
    # gradient in the reduce dtype: it turns the head's gradient sync off until the last chunk
    loss_head_grad_bytes: float = 0.0
    # The forward-backward step is captured in a CUDA graph where the framework allows it (one
    # pipeline stage, no expert parallelism), and the gradients are zeroed in place each step,
    # never freed (`zero_grad(set_to_none=False)`), so the activation peak holds them. The
    # graph's private pool is sized by the step it captured, as the eager step's cache is, and
    # the eager warm-up's cached blocks are released before the capture
    # (torch/cuda/graphs.py `graph.__enter__` calls `torch.cuda.empty_cache()`, torch 2.13)
    cuda_graphs: bool = False
    # What the loss holds per logit at the end of its forward. Counted only where that moment can
    # be the peak: torch.autocast caches the bf16 cast of every weight it casts until its region
    # exits (`cache_enabled`, the default), so at the end of the forward every layer's cast is
    # alive even where layers are recomputed (their backward then holds one layer's at a time)
    logits_forward_bytes_per_element: float = 0.0
    tp_buffer_bytes_per_token_h: float = 4.0  # persistent SP gather buffers, bytes per token x hidden (tp > 1)
    workspace_bytes: int = 64 * MiB  # cuBLAS workspaces, RoPE tables and other fixed tensors
    # --- allocator and runtime (outside live tensors) ---
    fragmentation_sequential: float = FRAG_SEQUENTIAL
    fragmentation_pipelined: float = FRAG_PIPELINED
    fragmentation_logits: float = FRAG_LOGITS
    reserved_floor_bytes: int = RESERVED_FLOOR_BYTES
    cuda_context_bytes: int = 512 * MiB  # CUDA context + kernels; not in torch's allocator
    nccl_bytes_per_group: int = 256 * MiB  # NCCL channels/buffers per communicator in use
    # The fields whose values are read from the framework's source but not yet checked against a
    # measurement on a GPU (docs/planning.md lists them)
    unvalidated: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = {name for name in (*self.selective_saves, *(self.moe_selective_saves or ()))
                   if name not in LINEARS}
        if unknown:
            raise ValueError(f"profile {self.name!r}: selective_saves names {sorted(unknown)}, "
                             f"not linears of the model ({', '.join(LINEARS)})")
        if self.loss_chunks < 1:
            raise ValueError(f"profile {self.name!r}: loss_chunks must be >= 1, got {self.loss_chunks}")
        fields = set(self.__dataclass_fields__)
        unknown = set(self.unvalidated) - fields
        if unknown:
            raise ValueError(f"profile {self.name!r}: unvalidated names {sorted(unknown)}, which "
                             "are not fields of MemoryProfile")


NANOTRON: Final = MemoryProfile(
    name="nanotron",
    description=(
        "nanotron (playbook sweep): bf16 params, bf16 DDP buckets when dp>1, fp32 grad accumulation "
        "(accumulate_grad_in_fp32), fp32 master + Adam; ZeRO-1 shards master+Adam over dp only and "
        "all-gathers the updated params; cost-balanced PP split with embedding/LM head as blocks"),
    ddp_bucket_bytes=2.0, fp32_grad_bytes=4.0, master_bytes=4.0, optimizer_bytes=8.0,
    zero_shards_over_cp=False, zero1_gather_bytes=2.0, stage_split="cost",
    # MoE (main): nn/moe.py GroupedMLP holds num_experts / ep whole experts as plain parameters,
    # replicated on every TP rank (trainer.py mark_unsharded_params_as_tied_across_tp), @2411b022;
    # read from the source: no nanotron MoE run has measured it (the playbook's runs are dense)
    experts_shard_over_tp=False, unvalidated=("experts_shard_over_tp",),
)

MEGATRON: Final = MemoryProfile(
    name="megatron",
    description=(
        "Megatron-LM/Megatron-Core: bf16 params, fp32 main_grad buffer (also DDP's bucket), "
        "distributed optimizer (ZeRO-1: fp32 master + Adam sharded over dp*cp); even PP split, the "
        "loss and the embedding counted as layers where the layers do not divide"),
    fp32_grad_bytes=4.0, master_bytes=4.0, optimizer_bytes=8.0, zero_shards_over_cp=True,
    stage_split="megatron",
)

TORCHTITAN: Final = MemoryProfile(
    name="torchtitan",
    description=(
        "torchtitan FSDP2: fp32 sharded params are the master copy, fp32 grads (reduce_dtype fp32), "
        "bf16 compute copies gathered per layer (ZeRO-3) or kept for the step (ZeRO-2); under PP "
        "whole fp32 gradients until the last micro-batch; PP split with the embedding and the "
        "output counted as a layer each"),
    weight_bytes=4.0, grad_bytes=4.0, ddp_bucket_bytes=4.0, fp32_grad_bytes=0.0, master_bytes=0.0,
    optimizer_bytes=8.0, zero_shards_over_cp=True, weights_shard_from_zero=2, fsdp_unsharded_layers=2,
    stage_split="embedding_blocks",
    # pipeline runs use torch.distributed.pipelining's schedules (torchtitan/distributed/
    # pipeline_parallel.py); its own gradient accumulation reduce-scatters every micro-batch
    # (train.py `train_step` calls plain backward per micro-batch, v0.2.2); reduce dtype fp32
    pipeline_defers_fsdp_reduction=True, fsdp_accumulated_grad_bytes=4.0,
    # selective_ac_option "op" (torchtitan v0.2.0-v0.2.2, torchtitan/distributed/
    # activation_checkpoint.py `_apply_op_sac`: "Saves output of all compute ops, except every
    # second mm"), counted per layer in the order the Llama block calls them: wq, wk, wv, wo, w1,
    # w3, w2 (torchtitan/models/llama3/model/model.py), so the 1st, 3rd, 5th and 7th are kept
    selective_saves=("wq", "wv", "w1", "w2"),
    # train_step starts with `self.optimizers.zero_grad()` (torchtitan/train.py, v0.2.2), which
    # sets every grad to None; FSDP2 makes each sharded gradient in that step's backward, so with
    # one micro-batch the activation peak (the logits' backward) holds none of them. Its default
    # optimizer is fused (job_config.py `implementation: ... = "fused"`): no step temporaries.
    grads_freed_each_step=True,
)

# torchtitan 0.3.0 (PyPI, 2026-09-03), read from its source; what is not cited here is 0.2's
# (TORCHTITAN above), because 0.3.0 does it the same way:
# - FSDP2 with bf16 params and fp32 reduce (config/configs.py TrainingConfig
#   mixed_precision_param / mixed_precision_reduce, distributed/fsdp.py apply_fsdp_to_decoder);
# - the fused AdamW (components/optimizer/optimizer.py OptimizersContainer.Config
#   `implementation = "fused"`, as 0.2's job_config.py): no step temporaries;
# - gradient accumulation calls plain backward per micro-batch (trainer.py `train_step`), so
#   FSDP reduce-scatters every micro-batch; pipelines run torch's schedules;
# - the pipeline split: `_generate_llm_fqn_per_model_part` (distributed/pipeline_parallel.py) is
#   0.2's `generate_llm_fqn_per_model_part` renamed, with the same defaults
#   (ParallelismConfig pipeline_parallel_first/last_stage_less_layers = 1, config/configs.py):
#   the embedding and the output count as a layer each, so the stage split is 0.2's.
TORCHTITAN_03: Final = replace(
    TORCHTITAN, name="torchtitan-0.3",
    description=(
        "torchtitan 0.3 (FSDP2 as 0.2): fused QKV, so selective AC keeps wqkv, w1 and w2 (in a "
        "MoE layer wqkv and, under EP, the all-to-all's tokens); the "
        "chunked loss (8 chunks) holds one chunk's logits, an fp32 gradient buffer and bf16 copies "
        "of the hidden states, and under FSDP the LM head's whole fp32 gradient; the step is a "
        "CUDA graph at pp = 1 and ep = 1, whose gradients are zeroed, not freed; under EP the "
        "experts are not TP-sharded (the TP ranks join their FSDP group). Read from the source, "
        "not yet validated on a GPU: selective_saves, moe_selective_saves, "
        "selective_keeps_dispatch, loss_chunks, loss_hidden_bytes_per_element, "
        "loss_head_grad_bytes, cuda_graphs, expert_tp_only_without_ep"),
    # models/llama3/__init__.py builds every flavor with `fuse_qkv=True` (qwen3's too): one wqkv
    # linear (models/common/attention.py FusedQKVLinear). SelectiveAC (distributed/
    # activation_checkpoint.py) saves "all compute/comm ops, except every second mm/linear",
    # counting a block's mms from 1: wqkv, wo, w1, w3, w2, so the 1st, 3rd and 5th are kept, and
    # wqkv's output is q, k and v together
    selective_saves=("wq", "wk", "wv", "w1", "w2"),
    # In a MoE block the routed experts run `torch._grouped_mm` (models/common/moe.py
    # GroupedExperts), which is neither in SelectiveAC's save ops (`_get_default_save_ops`: torch's
    # compute-intensive ops, linear, SDPA, topk) nor an mm it counts: recomputed; the router's
    # gate is forced to recompute (`force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]`),
    # so of the mms only wqkv is kept; `all_to_all_single` is a save op, so under EP the
    # dispatched and the combined tokens are kept
    moe_selective_saves=("wq", "wk", "wv"), selective_keeps_dispatch=True,
    # components/loss.py ChunkedLossWrapper (`num_chunks: int = 8`), the loss of every llama3 and
    # qwen3 config (models/*/config_registry.py): per chunk `lm_head(h_chunk)`, the inner
    # CrossEntropyLoss (`pred.flatten(0, 1).float()`, as 0.2's: 10 bytes per logit), then
    # `chunk_loss.backward()` before the next chunk
    loss_chunks=8,
    # GradAccumulator(hidden_states, dtype=torch.float32): `torch.zeros_like(local,
    # dtype=torch.float32)` of the whole hidden states (4), and the chunks `c.contiguous()`,
    # `.detach().requires_grad_()`, kept in `h_chunks` for the whole loop (2)
    loss_hidden_bytes_per_element=6.0,
    # `lm_head.set_requires_gradient_sync(False, recurse=False)` until the last chunk: FSDP2 keeps
    # the head's unsharded gradient, accumulated in the fp32 reduce dtype
    loss_head_grad_bytes=4.0,
    # config/configs.py TrainingConfig `disable_cuda_graphs: bool = False`; trainer.py wraps the
    # forward-backward in distributed/cudagraph.py `wrap_with_cuda_graph` (one eager warm-up
    # call, then the capture into one shared `torch.cuda.graph_pool_handle()`) and starts each
    # step with `zero_grad(set_to_none=self.config.training.disable_cuda_graphs)`;
    # Trainer.Config._validate_cuda_graphs refuses CUDA graphs with pipeline parallelism and with
    # expert parallelism's default token dispatchers, so those runs disable them
    cuda_graphs=True,
    # distributed/parallel_dims.py: the sparse mesh (pp, dp_replicate, efsdp, ep) with
    # `efsdp = fsdp * self.tp // self.ep`; models/common/moe_sharding.py
    # `_routed_experts_sharding_configs`: with EP the experts take `expert_param_placement_sparse()`
    # (no TP placement) and their input the sequence-parallel placement (each TP rank routes its
    # share of the tokens), without EP `expert_param_placement_dense(tp_placement=...)`
    expert_tp_only_without_ep=True,
    unvalidated=("selective_saves", "moe_selective_saves", "selective_keeps_dispatch",
                 "loss_chunks", "loss_hidden_bytes_per_element",
                 "loss_head_grad_bytes", "cuda_graphs", "expert_tp_only_without_ep"),
)

BUILTIN: Final = MemoryProfile(
    name="builtin",
    description=(
        "the built-in workload (sweep.workload): fp32 params and grads under torch.autocast (bf16 "
        "weight casts saved for backward, fp32 residual stream); ZeRO 0 = DDP, 1 = "
        "ZeroRedundancyOptimizer + DDP, 2/3 = FSDP2 without a mixed-precision policy (fp32 gathers; "
        "whole fp32 gradients while it accumulates micro-batches)"),
    weight_bytes=4.0, grad_bytes=4.0, ddp_bucket_bytes=4.0, fp32_grad_bytes=0.0, master_bytes=0.0,
    optimizer_bytes=8.0, zero_shards_over_cp=True, weights_shard_from_zero=2, fsdp_unsharded_layers=2,
    fsdp_gathered_bytes=4.0, autocast_weight_bytes=2.0, residual_bytes=4.0, stage_split="even",
    # sweep.workload.parallel.DataParallel.accumulate defers FSDP's reduction to the last
    # micro-batch, and its pipelines run torch's schedules; fp32 parameters, no reduce dtype
    pipeline_defers_fsdp_reduction=True, grad_acc_defers_fsdp_reduction=True,
    fsdp_accumulated_grad_bytes=4.0,
    # Counted from what sweep.workload.model saves (tests/workload/test_saved_activations.py
    # measures it): RMSNorm keeps its fp32 input and its fp32 output (the `* weight` saves it);
    # autocast casts the normed input once per linear (wq, wk, wv; w1, w3); K/V are repeated to
    # the query heads before SDPA; its selective policy keeps every mm and attention output;
    # cross-entropy keeps the fp32 log-softmax, and its backward holds two fp32 gradients beside
    # it (12 bytes per logit); the optimizer sets param.grad to None after each step. Its AdamW
    # takes PyTorch's default implementation, foreach on CUDA: an fp32 sqrt(v) of every parameter
    # at the step (on CPU the default is per tensor, so this over-counts a CPU run by that much).
    norm_saves_output=True, linear_input_copies=5, kv_saved_at_query_width=True,
    selective_saves=("wq", "wk", "wv", "wo", "w1", "w3", "w2"), logits_bytes_per_element=12.0,
    # the bf16 logits, their fp32 copy and the fp32 log-softmax while cross-entropy's forward runs
    # (MemTracker: 10.0 bytes per logit), beside autocast's cache of every layer's weight cast
    logits_forward_bytes_per_element=10.0,
    grads_freed_each_step=True, optimizer_step_temp_bytes=4.0,
)

# Not a framework the planner runs: the profile under which the published llm-foundry (Composer FSDP,
# MPT) configurations are checked. MPT trains with flash-attn's fused cross-entropy, which keeps only
# the bf16 logits and writes their gradient in place (4 bytes per vocab element at the peak).
LLMFOUNDRY: Final = replace(
    TORCHTITAN, name="llmfoundry",
    description="llm-foundry/Composer FSDP (as torchtitan) with the fused cross-entropy of MPT",
    logits_bytes_per_element=4.0, selective_saves=(),
    grads_freed_each_step=False,  # Composer's FSDP(1) and its zero_grad: not read, so not assumed
)

# Not a framework the planner runs: the profile under which BLOOM-176B's topology sweep (2022,
# Megatron-DeepSpeed with DeepSpeed ZeRO-1 on A100 80 GB, sweep.validation.bloom_reference) is checked. The
# module keeps bf16 (or fp16) weights and their gradients, unsharded; DeepSpeed's ZeRO-1 shards the
# fp32 master copy and Adam's moments over DP and makes an fp32 gradient partition at the step.
# Megatron's fused softmax (no flash attention) saves s x s tensors per head unless recomputed.
# The CUDA context is the one the sweep's chronicle measured on an A100 ("1573MiB for cuda
# kernels", bigscience train/tr11-176B-ml/chronicles-prequel.md).
MEGATRON_DEEPSPEED: Final = replace(
    MEGATRON, name="megatron-deepspeed",
    description=("Megatron-DeepSpeed with DeepSpeed ZeRO-1 (BLOOM's 2022 sweep): bf16 params and "
                 "grads, fp32 master + Adam sharded over dp, fp32 gradient partition at the step; "
                 "fused softmax attention; DeepSpeed's even split of the layers"),
    grad_bytes=2.0, fp32_grad_bytes=0.0, optimizer_step_temp_bytes=4.0, flash_attention=False,
    stage_split="even", cuda_context_bytes=1573 * MiB,
)

PROFILES: Final[Mapping[str, MemoryProfile]] = MappingProxyType(
    {p.name: p for p in (NANOTRON, MEGATRON, TORCHTITAN, BUILTIN)})

# A framework's profile at one of its versions (the key of the adapter's SupportedVersion, what
# a spec's run.framework_version names), where it is not the framework's own in PROFILES.
# torchtitan main at b5bcd76 (the commit the contract tests pin) does what TORCHTITAN_03 cites as
# 0.3.0 does: ChunkedLossWrapper (num_chunks 8, fp32 GradAccumulator, the head's sync off) in
# the llama3 and qwen3 registries, `disable_cuda_graphs: bool = False` and
# `zero_grad(set_to_none=...disable_cuda_graphs)`, `fuse_qkv=True`, SelectiveAC's every second
# mm, `efsdp = fsdp * self.tp // self.ep`, and the same `_generate_llm_fqn_per_model_part`.
VERSION_PROFILES: Final[Mapping[tuple[str, str], MemoryProfile]] = MappingProxyType(
    {("torchtitan", "v0.3"): TORCHTITAN_03, ("torchtitan", "main"): TORCHTITAN_03})

_BY_NAME: Final[Mapping[str, MemoryProfile]] = MappingProxyType(
    {**PROFILES, **{p.name: p for p in VERSION_PROFILES.values()}})


# The environment variables that configure PyTorch's CUDA caching allocator (the second is the
# device-generic name that recent releases document, torch.cuda.memory.get_allocator_backend).
# The fragmentation constants were fitted on runs that set neither: `expandable_segments`,
# `max_split_size_mb` or `garbage_collection_threshold` change what the allocator reserves beyond
# live tensors.
ALLOCATOR_ENV: Final = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def allocator_settings(envs: Iterable[Mapping[str, str]]) -> list[str]:
    """The caching-allocator settings among run environments, as NAME=value, once each."""
    found = {f"{name}={env[name]}" for env in envs for name in ALLOCATOR_ENV if name in env}
    return sorted(found)


@dataclass(frozen=True)
class Allocator:
    """The four allocator constants: the three fragmentation shares and the floor. The fitted
    ones are every profile's own; a spec can name others (`constraints.allocator`, fitted on a
    cluster's own runs by `sweep memory-check RUNS --write-constants`), and `sweep.validation.memory_fit` searches
    them."""

    sequential: float
    pipelined: float
    logits: float
    floor_bytes: int

    def apply(self, profile: str | MemoryProfile) -> MemoryProfile:
        """The profile with these constants in place of its own."""
        return replace(get_profile(profile), fragmentation_sequential=self.sequential,
                       fragmentation_pipelined=self.pipelined, fragmentation_logits=self.logits,
                       reserved_floor_bytes=int(self.floor_bytes))

    @classmethod
    def of(cls, profile: str | MemoryProfile) -> Allocator:
        p = get_profile(profile)
        return cls(p.fragmentation_sequential, p.fragmentation_pipelined, p.fragmentation_logits,
                   p.reserved_floor_bytes)

    def describe(self) -> str:
        return (f"sequential {self.sequential:g}, pipelined {self.pipelined:g}, logits "
                f"{self.logits:g}, floor {self.floor_bytes / MiB:g} MiB")


def profile_for(framework: str, version: str = "") -> MemoryProfile:
    """The profile of `framework` at `version` (a SupportedVersion key, already resolved to the
    adapter's default where a spec names none): its own in VERSION_PROFILES, else the
    framework's."""
    return VERSION_PROFILES.get((framework, version)) or get_profile(framework)


def profile_with(framework: str, allocator: Allocator | None, version: str = "") -> MemoryProfile:
    """The profile of `framework` at `version` (`profile_for`) with `allocator`'s constants in
    place of its own (None: as fitted)."""
    profile = profile_for(framework, version)
    return profile if allocator is None else allocator.apply(profile)


def get_profile(name: str | MemoryProfile) -> MemoryProfile:
    """A profile by name (a framework's, or a version's such as "torchtitan-0.3"); a
    MemoryProfile passes through (for frameworks outside PROFILES)."""
    if isinstance(name, MemoryProfile):
        return name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown memory profile {name!r}; known: {', '.join(_BY_NAME)}") from None
