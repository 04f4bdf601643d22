"""Per-GPU memory of one training configuration, component by component, for the most loaded rank.

The model follows what a training step puts on a GPU:
- persistent state: weights, gradients (with the framework's fp32 accumulation), optimizer states,
  each sharded as the ZeRO stage says;
- the forward/backward transients: activations of the micro-batches in flight on the stage (by
  recomputation mode, TP/SP and CP sharding, pipeline schedule) and the logits + loss path;
- buffers: fixed workspaces, sequence-parallel gather buffers, FSDP's gathered copies, autocast's
  weight casts, and what the optimizer step adds (the ZeRO-1 all-gather; gradients a framework
  makes only after the activation peak) where it exceeds the activation memory freed by then;
- what the caching allocator holds beyond live tensors (fragmentation), by what causes it: a small
  share of the activations of a micro-batch alone in flight (the next one reuses its blocks), a
  larger share of those the pipeline keeps in flight (freed out of order, they leave holes), a share
  of the logits (the largest blocks, re-split between steps), and a floor
  (sweep.models.memory_profiles names the calibrated constants);
- what lives outside the allocator: the CUDA context and NCCL communicator buffers.

`allocated` = live tensors at the peak; `reserved` = allocated + fragmentation (what
`torch.cuda.max_memory_reserved` reports); `total` = reserved + runtime overhead: what must fit.
`step_allocated` is the peak of the optimizer-step window alone (what nanotron's benchmark table
reports as "Mem Alloc": its `log_memory` resets the peak counters right after the forward/backward pass).

The most loaded rank is the first or the last pipeline stage (embedding and most in-flight
micro-batches, or the LM head and the logits); `stage=` picks one to compare with a measurement.
One vectorised function computes every number; `estimate` calls it with one row, so the scalar and
the column paths agree exactly. Pure: no I/O; imports numpy, sweep.core.model/layout and the profiles.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from sweep.core.layout import LAYOUT_COLUMNS, LAYOUT_INT_COLUMNS, PP_SCHEDULES, RECOMPUTE_MODES, Layout
from sweep.core.model import ModelShape, count_parameters, mlp_kind
from sweep.core.units import GiB
from sweep.models.memory_profiles import PROFILES, RESERVED_BAND, MemoryProfile, get_profile

__all__ = ["COMPONENTS", "PROFILES", "MemoryEstimate", "MemoryProfile", "estimate", "estimate_columns",
           "fsdp_reduction_deferred", "megatron_extra_layers", "split_stages", "stage_layer_counts", "stage_block_counts",
           "STAGE_SPLITS"]

COMPONENTS: Final = ("weights", "gradients", "optimizer", "activations", "logits", "buffers",
                     "fragmentation", "overhead")
STAGES: Final = ("most_loaded", "first", "last")
STAGE_SPLITS: Final = ("even", "cost", "embedding_blocks", "megatron")
_ACT_BYTES: Final = {"bf16": 2, "fp16": 2, "fp8": 2, "tf32": 4, "fp32": 4}


@dataclass(frozen=True)
class MemoryEstimate:
    components: dict[str, int]
    allocated_bytes: int
    reserved_bytes: int
    total_bytes: int
    step_allocated_bytes: int = 0
    stage: str = "first"  # the pipeline stage described: "first" (holds rank 0) or "last"

    def explain(self) -> str:
        """A fixed-width table of the breakdown (for `sweep plan --explain`)."""
        lines = [f"{'component':<16}{'GiB':>10}{'share':>8}", "-" * 34]
        for name in COMPONENTS:
            value = self.components[name]
            share = value / self.total_bytes if self.total_bytes else 0.0
            lines.append(f"{name:<16}{value / GiB:>10.2f}{share:>7.1%}")
        lines.append("-" * 34)
        lines.append(f"{'allocated':<16}{self.allocated_bytes / GiB:>10.2f}   live tensors at the peak")
        lines.append(f"{'reserved':<16}{self.reserved_bytes / GiB:>10.2f}   + allocator fragmentation")
        lines.append(f"{'total':<16}{self.total_bytes / GiB:>10.2f}   + CUDA context and NCCL")
        lines.append(f"{'step peak':<16}{self.step_allocated_bytes / GiB:>10.2f}   "
                     "live tensors during the optimizer step")
        lines.append(f"rank described: {self.stage} pipeline stage")
        return "\n".join(lines)


# ---------------------------------------------------------------- pipeline stages

def _layer_cost(model: ModelShape) -> tuple[int, int]:
    """nanotron's block costs (LlamaModel.get_block_compute_costs): decoder layer and LM head."""
    h = model.hidden_size
    layer = 4 * model.num_attention_heads * model.head_dim * h + 3 * model.ffn_hidden_size * h
    return layer, model.vocab_size * h


@functools.cache
def _cost_split(model: ModelShape, pp: int) -> tuple[tuple[int, int], ...]:
    """nanotron's balanced split: (decoder layers, all blocks) per stage.

    Blocks in order: embedding, L decoder layers, final norm, LM head, cast-to-fp32, loss; a block goes
    to the current stage, which closes once the cumulative cost reaches its share (cum >= total*(r+1)/pp,
    the rule of the 2025 playbook runs: 1B at pp=2 puts 10 layers on stage 0).
    """
    layer, head = _layer_cost(model)
    costs = [(0, False)] + [(layer, True)] * model.num_layers + [(0, False), (head, False),
                                                                  (0, False), (0, False)]
    total = layer * model.num_layers + head
    layers = [0] * pp
    blocks = [0] * pp
    rank, cum = 0, 0
    for cost, is_layer in costs:
        cum += cost
        layers[rank] += is_layer
        blocks[rank] += 1
        if rank < pp - 1 and cum * pp >= total * (rank + 1):
            rank += 1
    return tuple(zip(layers, blocks))


@functools.cache
def _even_split(layers: int, pp: int, embedding_blocks: int, head_blocks: int
                ) -> tuple[tuple[int, int], ...]:
    """(decoder layers, blocks) per stage when `embedding_blocks` embedding blocks, the L layers and
    `head_blocks` head blocks are dealt out evenly in that order, the first stages taking one more
    where they do not divide."""
    items = [False] * embedding_blocks + [True] * layers + [False] * head_blocks
    base, extra = divmod(len(items), pp)
    out, start = [], 0
    for rank in range(pp):
        size = base + (1 if rank < extra else 0)
        out.append((sum(items[start:start + size]), size))
        start += size
    return tuple(out)


def megatron_extra_layers(layers: int, stages: int) -> int | None:
    """How many of the loss and the embedding Megatron counts as a layer in its even split: the
    fewest of 0, 1 (--account-for-loss-in-pipeline-split) and 2 (and
    --account-for-embedding-in-pipeline-split) that make the layers divide, as
    templates/launch/megatron.args renders them; None where none does (Megatron refuses the
    split, and the adapter's `pipeline_fits` prunes it)."""
    return next((extra for extra in (0, 1, 2) if (layers + extra) % stages == 0), None)


def split_stages(model: ModelShape, pp: int, split: str) -> tuple[tuple[int, int], ...]:
    """(decoder layers, blocks) on each pipeline stage, under a framework's split (`STAGE_SPLITS`):

    - "cost": nanotron's balanced split by compute cost (`_cost_split`);
    - "even": the layers dealt out evenly, the first stages taking one more (the built-in
      workload; DeepSpeed's partition method "type:transformer", with the embedding on stage 0);
    - "embedding_blocks": the embedding and the LM head count as one layer each (torchtitan 0.2's
      `generate_llm_fqn_per_model_part` with its default pipeline_parallel_first/last_stage_less_layers
      of 1, torchtitan/distributed/pipeline_parallel.py; DeepSpeed's "type:transformer|embedding");
    - "megatron": Megatron-LM's even split, counting the loss and then the embedding as a layer
      where the layers alone do not divide (`megatron_extra_layers`).
    """
    if split == "cost":
        return _cost_split(model, pp)
    if split == "even":
        return _even_split(model.num_layers, pp, 0, 0)
    if split == "embedding_blocks":
        return _even_split(model.num_layers, pp, 1, 1)
    if split == "megatron":
        extra = megatron_extra_layers(model.num_layers, pp) or 0
        return _even_split(model.num_layers, pp, 1 if extra == 2 else 0, 1 if extra >= 1 else 0)
    raise ValueError(f"unknown stage split {split!r}; known: {', '.join(STAGE_SPLITS)}")


def stage_layer_counts(model: ModelShape, pp: int, profile: str | MemoryProfile = "builtin"
                       ) -> tuple[int, ...]:
    """Decoder layers on each pipeline stage, as the profile's framework splits them."""
    return tuple(n for n, _ in split_stages(model, pp, get_profile(profile).stage_split))


def stage_block_counts(model: ModelShape, pp: int, profile: str | MemoryProfile = "builtin"
                       ) -> tuple[int, ...]:
    """Pipeline blocks per stage; a stage with none cannot run. nanotron counts the embedding, the
    final norm, the LM head, the fp32 cast and the loss as blocks too; torchtitan and Megatron
    (where it accounts for them) the embedding and the head; the even split counts layers."""
    return tuple(b for _, b in split_stages(model, pp, get_profile(profile).stage_split))


def _first_last_layers(model: ModelShape, pp: np.ndarray, profile: MemoryProfile
                       ) -> tuple[np.ndarray, np.ndarray]:
    pp = np.asarray(pp, dtype=np.int64)
    if pp.size == 0:
        return np.zeros(0), np.zeros(0)
    first = np.zeros(int(pp.max()) + 1, dtype=np.float64)  # lookup tables indexed by pp (O(n))
    last = np.zeros_like(first)
    for p in np.flatnonzero(np.bincount(pp)):
        counts = stage_layer_counts(model, int(p), profile)
        first[p], last[p] = counts[0], counts[-1]
    return first[pp], last[pp]


def _is(column: np.ndarray, value: str) -> np.ndarray:
    return np.asarray(column == value, dtype=bool)


# ---------------------------------------------------------------- the model

def fsdp_reduction_deferred(prof: MemoryProfile, zero_stage: ArrayLike, pp: ArrayLike,
                            grad_acc: ArrayLike) -> np.ndarray:
    """Where FSDP's reduce-scatter waits for the step's last micro-batch, so that a rank holds
    whole gradients until then, not its 1/(dp·cp) shard of them
    (`MemoryProfile.pipeline_defers_fsdp_reduction`, `grad_acc_defers_fsdp_reduction`)."""
    zero, stages, micro = (np.asarray(x, dtype=np.float64) for x in (zero_stage, pp, grad_acc))
    return (zero >= 2) & (((stages > 1) & prof.pipeline_defers_fsdp_reduction)
                          | ((micro > 1) & prof.grad_acc_defers_fsdp_reduction))


def _check_columns(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate the columns; return one boolean mask per recompute mode and pipeline schedule."""
    missing = [c for c in LAYOUT_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"estimate_columns: missing columns {missing}")
    n = len(np.asarray(columns["dp"]))
    for name in LAYOUT_COLUMNS:
        if len(np.asarray(columns[name])) != n:
            raise ValueError(f"estimate_columns: column {name!r} has length "
                             f"{len(np.asarray(columns[name]))}, expected {n}")
    for name in (c for c in LAYOUT_INT_COLUMNS if c != "zero_stage"):  # counts: at least 1
        if n and np.min(np.asarray(columns[name])) < 1:
            raise ValueError(f"estimate_columns: column {name!r} must be >= 1")
    masks: dict[str, np.ndarray] = {}
    for name, allowed in (("recompute", RECOMPUTE_MODES), ("pp_schedule", PP_SCHEDULES)):
        column = np.asarray(columns[name])
        known = np.zeros(n, dtype=bool)
        for value in allowed:
            masks[value] = _is(column, value)
            known |= masks[value]
        if not known.all():
            bad = sorted({str(v) for v in column[~known]})
            raise ValueError(f"estimate_columns: column {name!r} has {bad}; allowed: {allowed}")
    return masks


def _one_layer_at_a_time(masks: Mapping[str, np.ndarray], prof: MemoryProfile) -> np.ndarray:
    """Rows whose layers are recomputed in backward, one layer at a time: full recomputation, and
    selective where the profile's selective policy recomputes more than the attention scores."""
    return masks["full"] | (masks["selective"] & bool(prof.selective_saves))


def _activations(model: ModelShape, prof: MemoryProfile, masks: Mapping[str, np.ndarray],
                 f64: Mapping[str, np.ndarray], sp: np.ndarray, single: np.ndarray, n_first: np.ndarray,
                 n_last: np.ndarray, seq_len: int, a: float, gelu: bool, autocast: bool,
                 one_at_a_time: np.ndarray) -> tuple[np.ndarray, ...]:
    """Activation and logits bytes on one rank of the first and of the last stage, the
    micro-batches each holds in flight, and the one layer's activations that a recomputing
    backward holds beside them. `one_at_a_time`: the rows whose layers are recomputed in backward
    (`_one_layer_at_a_time`)."""
    tp, pp, cp, mbs, ga, vpp = (f64[k] for k in ("tp", "pp", "cp", "mbs", "grad_acc", "vpp"))
    h, q, kv = float(model.hidden_size), float(model.q_dim), float(model.kv_dim)
    tokens = mbs * seq_len / cp  # of one micro-batch on one rank: CP splits the sequence
    sp_div = np.where(sp, tp, 1.0)  # SP shards the norm and linear inputs too
    k = float(model.experts_per_token) if model.is_moe else 1.0
    ffn = float(model.moe_ffn_hidden_size if model.is_moe else model.ffn_hidden_size)
    ffn_saved = 2.0 if gelu else 4.0  # GELU: fc1 output, fc2 input; SwiGLU: gate, up, silu, product
    r = max(prof.residual_bytes, a)  # the residual stream: what the norms save, the layer input
    norm = (2.0 if prof.norm_saves_output else 1.0) * r  # per norm
    # a profile whose linears read their input through autocast's casts (one per linear) saves
    # one per norm without it: the linears after a norm share its output
    copies = 2 if prof.autocast_weight_bytes and not autocast else prof.linear_input_copies
    kv_saved = q if prof.kv_saved_at_query_width else kv
    # per token and layer: 2 norms, the linears' normed inputs (h each), q, k, v, attention output,
    # FFN
    per_token_layer = ((2 * norm + copies * a) * h / sp_div
                       + a * (2 * q + 2 * kv_saved + ffn_saved * k * ffn) / tp
                       + (a * 2 * h * k / sp_div if model.is_moe else 0.0))  # MoE: permuted tokens
    # Without flash attention the core attention saves its softmax and the dropout's output, two
    # s x s tensors per head (Korthikanti et al. 2022, Sec. 4.1), unless it is recomputed; a
    # recomputing backward holds them for the one layer (or core attention) it recomputes.
    scores = 0.0 if prof.flash_attention else a * 2 * model.num_attention_heads * (seq_len / cp) / tp
    per_token_layer = per_token_layer + np.where(masks["none"], scores, 0.0)
    # full: keeps each layer's input and recomputes one layer at a time in backward; selective
    # with the profile's `selective_saves` also keeps those linears' outputs and the attention
    # output (wo and w2 end in a reduction: hidden-wide)
    output_width = {"wq": q / tp, "wk": kv / tp, "wv": kv / tp, "wo": h / sp_div,
                    "w1": k * ffn / tp, "w3": k * ffn / tp, "w2": h / sp_div}
    kept = r * h / sp_div + a * (q / tp + sum(output_width[name] for name in prof.selective_saves))
    stored = np.where(masks["full"], r * h / sp_div, np.where(one_at_a_time, kept, per_token_layer))
    stored_per_layer = stored * tokens
    working_layer = (np.where(one_at_a_time, per_token_layer * tokens, 0.0)
                     + np.where(masks["none"], 0.0, scores * tokens))
    head_inputs = (r + a) * h / sp_div * tokens  # final norm + LM head inputs, one micro-batch

    # micro-batches in flight: 1F1B holds pp on the first stage (capped by grad_acc) and 1 on the last;
    # GPipe holds all; interleaved 1F1B follows Megatron: pp * (1 + (pp-1)/(pp*vpp)) on the first
    interleaved = masks["interleaved_1f1b"] & (vpp > 1)
    gpipe = masks["gpipe"]
    first_mb = np.where(gpipe, ga, np.where(interleaved, np.minimum(ga, pp + (pp - 1) / vpp),
                                            np.minimum(ga, pp)))
    first_mb = np.where(single, 1.0, first_mb)
    last_mb = np.where(gpipe, ga, np.where(interleaved, np.minimum(ga, ((vpp - 1) * pp + 1) / vpp), 1.0))
    last_mb = np.maximum(last_mb, 1.0)
    act_first = stored_per_layer * n_first * first_mb + working_layer + np.where(single, head_inputs, 0.0)
    act_last = stored_per_layer * n_last * last_mb + working_layer + head_inputs
    logits = tokens * model.vocab_size / tp * prof.logits_bytes_per_element
    return act_first, act_last, np.where(single, logits, 0.0), logits, first_mb, last_mb, working_layer


def _compute(model: ModelShape, columns: Mapping[str, np.ndarray], masks: Mapping[str, np.ndarray],
             seq_len: int, dtype: str, prof: MemoryProfile, stage: str) -> dict[str, np.ndarray]:
    if dtype not in _ACT_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(_ACT_BYTES)}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    f64 = {k: np.asarray(columns[k], dtype=np.float64) for k in LAYOUT_INT_COLUMNS}
    dp, tp, pp, cp, ep, zero = (f64[k] for k in ("dp", "tp", "pp", "cp", "ep", "zero_stage"))
    sp = np.asarray(columns["sp"], dtype=bool)
    a = float(_ACT_BYTES[dtype])
    full_precision = dtype in ("fp32", "tf32")

    pc = count_parameters(model)
    h, vocab = float(model.hidden_size), float(model.vocab_size)
    gelu = mlp_kind(model) == "gelu"
    expert_per_layer = float(model.num_experts * 3 * model.hidden_size * model.moe_ffn_hidden_size)
    dense_per_layer = float(pc.per_layer) - expert_per_layer
    if gelu:  # two matrices, not SwiGLU's three
        dense_per_layer -= float(model.hidden_size * model.ffn_hidden_size)

    # --- parameters held by one rank of the first and of the last stage
    n_first, n_last = _first_last_layers(model, columns["pp"], prof)
    head = vocab * h / tp
    single = pp == 1
    dense_first = n_first * dense_per_layer / tp + head + np.where(
        single, h + (0.0 if model.tie_word_embeddings else 1.0) * head, 0.0)
    dense_last = n_last * dense_per_layer / tp + head + h
    expert_first = n_first * expert_per_layer / (tp * ep)
    expert_last = n_last * expert_per_layer / (tp * ep)

    # --- state bytes per parameter and ZeRO sharding
    cp_shard = cp if prof.zero_shards_over_cp else 1.0
    n_dense, n_expert = dp * ep * cp_shard, dp * cp_shard
    replicas = dp * ep * cp
    def in_dtype(nbytes: float) -> float:  # a buffer kept in the weights' dtype is fp32 in fp32 runs
        return max(nbytes, 4.0) if full_precision and nbytes else nbytes

    w_b = in_dtype(prof.weight_bytes)
    g_b = in_dtype(prof.grad_bytes) + prof.fp32_grad_bytes
    bucket_b = np.where((replicas > 1) & (zero <= 1), in_dtype(prof.ddp_bucket_bytes), 0.0)
    o_b = (0.0 if full_precision else prof.master_bytes) + prof.optimizer_bytes

    # gradients that do not exist yet at the activation peak (made in the backward that follows)
    grads_later = np.where(prof.grads_freed_each_step & (f64["grad_acc"] == 1), 1.0, 0.0)
    # FSDP whose reduce-scatter waits for the step's last micro-batch: whole gradients until then
    deferred = fsdp_reduction_deferred(prof, zero, pp, f64["grad_acc"])
    under_pipeline = (pp > 1) & prof.pipeline_defers_fsdp_reduction

    def state(p_dense: np.ndarray, p_expert: np.ndarray) -> tuple[np.ndarray, ...]:
        def sharded(bytes_pp, from_stage):
            on = zero >= from_stage
            return bytes_pp * (p_dense / np.where(on, n_dense, 1.0) + p_expert / np.where(on, n_expert, 1.0))
        weights = sharded(w_b, prof.weights_shard_from_zero)
        param_grads = sharded(g_b, 2)
        unsharded_grads = prof.fsdp_accumulated_grad_bytes * (p_dense + p_expert)
        grads = np.where(deferred, unsharded_grads,
                         param_grads * (1.0 - grads_later) + bucket_b * (p_dense + p_expert))
        optim = sharded(o_b, 1)
        gather = np.where((zero >= 1) & (n_dense > 1),
                          prof.zero1_gather_bytes * (p_dense + p_expert) * (1.0 + 1.0 / n_dense), 0.0)
        # what the optimizer step needs beyond the activation peak's state: the gradients made after
        # it (deferred: the sharded ones, the whole ones freed by then), the ZeRO-1 all-gather and
        # the optimizer's own temporaries
        temporaries = sharded(prof.optimizer_step_temp_bytes, 1)
        later = np.where(deferred, param_grads - unsharded_grads, param_grads * grads_later)
        return weights, grads, optim, gather + later + temporaries

    recomputed = _one_layer_at_a_time(masks, prof)
    act_first, act_last, logits_first, logits, first_mb, last_mb, working = _activations(
        model, prof, masks, f64, sp, single, n_first, n_last, seq_len, a, gelu, not full_precision,
        recomputed)
    # the loss at the end of a single stage's forward (with every weight cast, see below)
    logits_forward = np.where(single, f64["mbs"] * seq_len / cp * vocab / tp
                              * prof.logits_forward_bytes_per_element, 0.0)

    # --- fixed buffers and runtime
    tokens = f64["mbs"] * seq_len / cp
    buffers_fixed = prof.workspace_bytes + np.where(tp > 1, prof.tp_buffer_bytes_per_token_h * tokens * h, 0.0)
    groups = sum((x > 1).astype(np.float64) for x in (dp * ep, tp, pp, cp, ep))
    overhead = prof.cuda_context_bytes + prof.nccl_bytes_per_group * groups

    def stage_total(p_dense, p_expert, act, lg, lg_forward, in_flight, head_params):
        weights, grads, optim, step_needs = state(p_dense, p_expert)
        layer_params = (dense_per_layer + expert_per_layer / ep) / tp
        fsdp = 0.0
        if prof.fsdp_unsharded_layers:
            gathered = prof.fsdp_gathered_bytes * (p_dense + p_expert)
            a_few = prof.fsdp_gathered_bytes * prof.fsdp_unsharded_layers * layer_params
            # ZeRO-3 under a schedule: each forward reshards, each backward leaves every layer
            # gathered, beside all but one micro-batch's activations (the later of two peaks)
            after_backward = np.maximum(a_few, gathered - act / in_flight)
            fsdp = np.where(zero == 2, gathered,
                            np.where(zero >= 3, np.where(under_pipeline, after_backward, a_few), 0.0))
        # autocast's weight casts: its cache holds every one until its region exits, at the end of
        # the forward and loss (the built-in pipeline's region spans its schedule, backward too).
        # A layer that is not recomputed saves its casts for backward anyway; a recomputed one
        # casts again in backward, one layer at a time, beside the LM head's saved cast. So with
        # recomputation on one stage the end of the forward is a second candidate peak: all the
        # casts, the loss's forward tensors, and the activations less the layer being recomputed.
        cast_bytes = 0.0 if full_precision else prof.autocast_weight_bytes
        casts_all = cast_bytes * (p_dense + p_expert)
        released = recomputed & single
        casts = np.where(released, cast_bytes * (layer_params + head_params), casts_all)
        forward_end = np.where(released & (lg_forward > 0), act - working + lg_forward + casts_all, 0.0)
        casts = casts + np.maximum(forward_end - (act + lg + casts), 0.0)
        step_extra = np.maximum(step_needs - (act + lg + casts), 0.0)
        buffers = buffers_fixed + fsdp + casts + step_extra
        frag = (prof.fragmentation_sequential * act / in_flight
                + prof.fragmentation_pipelined * act * (1.0 - 1.0 / in_flight)
                + prof.fragmentation_logits * lg + prof.reserved_floor_bytes)
        comps = {"weights": weights, "gradients": grads, "optimizer": optim, "activations": act,
                 "logits": lg, "buffers": buffers, "fragmentation": frag, "overhead": overhead + 0 * act}
        step = weights + grads + optim + buffers_fixed + step_needs  # gathered copies freed by then
        return {name: np.rint(v).astype(np.int64) for name, v in comps.items()}, np.rint(step).astype(np.int64)

    first, step_first = stage_total(dense_first, expert_first, act_first, logits_first, logits_forward,
                                    first_mb, np.where(single, head, 0.0))
    last, step_last = stage_total(dense_last, expert_last, act_last, logits, logits_forward, last_mb, head)
    total_first = sum(first.values())
    total_last = sum(last.values())
    if stage == "first":
        use_last = np.zeros_like(single)
    elif stage == "last":
        use_last = ~single
    else:
        use_last = (~single) & (total_last > total_first)
    out = {f"mem_{name}_bytes": np.where(use_last, last[name], first[name]) for name in COMPONENTS}
    allocated = sum(out[f"mem_{n}_bytes"] for n in COMPONENTS[:6])
    out["mem_allocated_bytes"] = allocated
    out["mem_reserved_bytes"] = allocated + out["mem_fragmentation_bytes"]
    out["mem_total_bytes"] = out["mem_reserved_bytes"] + out["mem_overhead_bytes"]
    out["mem_step_allocated_bytes"] = np.where(use_last, step_last, step_first)
    out["mem_last_stage"] = use_last
    return out


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")


def estimate_columns(model: ModelShape, columns: Mapping[str, np.ndarray], *, seq_len: int,
                     dtype: str = "bf16", profile: str | MemoryProfile = "builtin",
                     stage: str = "most_loaded") -> dict[str, np.ndarray]:
    """Vectorised estimate: int64 arrays `mem_<component>_bytes`, `mem_allocated_bytes`,
    `mem_reserved_bytes`, `mem_total_bytes` and `mem_step_allocated_bytes`, one value per row.

    `stage`: "most_loaded" (feasibility: the larger of the first and last pipeline stage), or
    "first" / "last" (to compare with a measurement taken on one rank: rank 0 is the first stage).
    """
    prof = get_profile(profile)
    _check_stage(stage)
    masks = _check_columns(columns)
    out = _compute(model, columns, masks, seq_len, dtype, prof, stage)
    out.pop("mem_last_stage")
    return out


def estimate(model: ModelShape, layout: Layout, *, seq_len: int, dtype: str = "bf16",
             profile: str | MemoryProfile = "builtin", stage: str = "most_loaded") -> MemoryEstimate:
    prof = get_profile(profile)
    _check_stage(stage)
    row = layout.to_dict()
    columns = {name: np.asarray([row[name]]) for name in LAYOUT_COLUMNS}
    masks = _check_columns(columns)
    out = _compute(model, columns, masks, seq_len, dtype, prof, stage)
    return MemoryEstimate(
        components={name: int(out[f"mem_{name}_bytes"][0]) for name in COMPONENTS},
        allocated_bytes=int(out["mem_allocated_bytes"][0]),
        reserved_bytes=int(out["mem_reserved_bytes"][0]),
        total_bytes=int(out["mem_total_bytes"][0]),
        step_allocated_bytes=int(out["mem_step_allocated_bytes"][0]),
        stage="last" if bool(out["mem_last_stage"][0]) else "first",
    )


def reserved_interval(predicted_bytes: ArrayLike, band: tuple[float, float] = RESERVED_BAND,
                      fixed_bytes: ArrayLike = 0) -> tuple[np.ndarray, np.ndarray]:
    """The interval in which the measured bytes should lie (90 % of held-out runs did), per run.

    `predicted_bytes`: the memory model's reserved peak (`mem_reserved_bytes`); `fixed_bytes`: what
    is added outside the allocator and not fitted (`mem_overhead_bytes`, to get an interval of
    `mem_total_bytes`). Why a band on the measurement rather than on the prediction: the held-out
    error is predicted / measured - 1 = e, so measured = predicted / (1 + e), and the 5th..95th
    percentiles of e give [predicted / (1 + e95), predicted / (1 + e05)]. A candidate whose upper
    bound stays under the budget fits with that confidence; one whose interval straddles it is
    uncertain, not infeasible (the memory rule probes it: `sweep.plan.space.memory_over`). Pure and
    vectorised.
    """
    lo, hi = band
    if not -1.0 < lo <= hi:
        raise ValueError(f"band must satisfy -1 < low <= high; got {band}")
    predicted = np.asarray(predicted_bytes, dtype=np.float64)
    fixed = np.asarray(fixed_bytes, dtype=np.float64)
    return predicted / (1.0 + hi) + fixed, predicted / (1.0 + lo) + fixed
