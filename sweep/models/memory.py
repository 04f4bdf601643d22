"""Per-GPU memory of one training configuration, component by component, for the most loaded rank.

The model follows what a training step puts on a GPU:
- persistent state: weights, gradients (with the framework's fp32 accumulation), optimizer states,
  each sharded as the ZeRO stage says;
- the forward/backward transients: activations of the micro-batches in flight on the stage (by
  recomputation mode, TP/SP and CP sharding, pipeline schedule) and the logits + loss path
  (sweep.models.activation_memory);
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
How many layers each holds is the framework's split (sweep.models.pipeline_stages).

Each term above is a small pure function, named for it, of `MemoryConfig` (sweep.models.memory_config:
the rows' layouts, and what every row shares: model, profile, dtype, sequence length) and of what
one rank of a stage holds (`_StageParameters`, `StageActivations`); `_stage_memory` adds them up
for one rank of a stage. One vectorised function, `_compute`, does so for the first and the last
stage of every row; `estimate` calls it with one row, so the scalar and the column paths agree
exactly. Pure: no I/O; imports numpy, sweep.core.model/layout, the profiles and the modules named
above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from sweep.core.layout import LAYOUT_COLUMNS, LAYOUT_INT_COLUMNS, PP_SCHEDULES, RECOMPUTE_MODES, Layout
from sweep.core.model import ModelShape, count_parameters, mlp_kind
from sweep.core.units import GiB
from sweep.models.activation_memory import (
    LayerActivations,
    StageActivations,
    first_stage_activations,
    last_stage_activations,
    layer_activations,
    logits_at_forward_end,
    one_layer_at_a_time,
)
from sweep.models.memory_config import Layouts, MemoryConfig, fsdp_reduction_deferred
from sweep.models.memory_profiles import PROFILES, RESERVED_BAND, MemoryProfile, get_profile
from sweep.models.pipeline_stages import first_last_stage_layers

__all__ = ["COMPONENTS", "PROFILES", "MemoryEstimate", "MemoryProfile", "cuda_graphed", "estimate",
           "estimate_columns"]

COMPONENTS: Final = ("weights", "gradients", "optimizer", "activations", "logits", "buffers",
                     "fragmentation", "overhead")
STAGES: Final = ("most_loaded", "first", "last")
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


# ---------------------------------------------------------------- the rows

def _is(column: np.ndarray, value: str) -> np.ndarray:
    return np.asarray(column == value, dtype=bool)


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


def _config(model: ModelShape, columns: Mapping[str, np.ndarray], modes: Mapping[str, np.ndarray],
            seq_len: int, dtype: str, prof: MemoryProfile) -> MemoryConfig:
    if dtype not in _ACT_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(_ACT_BYTES)}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return MemoryConfig(model, prof, seq_len, float(_ACT_BYTES[dtype]), dtype in ("fp32", "tf32"),
                        Layouts.of(columns, modes))


# ---------------------------------------------------------------- parameters

@dataclass(frozen=True)
class _LayerParameters:
    """Parameters of one decoder layer: the dense ones (attention, norms, a dense MLP) and the
    experts' (all of them)."""

    dense: float
    expert: float


def _layer_parameters(model: ModelShape) -> _LayerParameters:
    expert = float(model.num_experts * 3 * model.hidden_size * model.moe_ffn_hidden_size)
    dense = float(count_parameters(model).per_layer) - expert
    if mlp_kind(model) == "gelu":  # two matrices, not SwiGLU's three
        dense -= float(model.hidden_size * model.ffn_hidden_size)
    return _LayerParameters(dense, expert)


def _layer_parameters_per_rank(cfg: MemoryConfig, layer: _LayerParameters) -> np.ndarray:
    """One layer's parameters on one rank: dense ones sharded over TP, experts over TP·EP (EP
    alone where the profile keeps experts whole on each TP rank)."""
    return layer.dense / cfg.layouts.tp + layer.expert / (cfg.layouts.ep * cfg.expert_tp)


@dataclass(frozen=True, eq=False)
class _StageParameters:
    """The parameters one rank of a pipeline stage holds: dense ones sharded over TP, experts
    over TP·EP; `head`: the LM head's among them, which a recomputing stage casts beside the
    one layer it recomputes."""

    dense: np.ndarray
    expert: np.ndarray
    head: np.ndarray


def _first_stage_parameters(cfg: MemoryConfig, layers: np.ndarray, layer: _LayerParameters
                            ) -> _StageParameters:
    """The embedding and the first stage's layers; with one stage, the final norm and the LM
    head too (a matrix of its own unless tied to the embedding)."""
    lay, model = cfg.layouts, cfg.model
    embedding = cfg.vocabulary_matrix
    head = float(model.hidden_size) + (0.0 if model.tie_word_embeddings else 1.0) * embedding
    dense = layers * layer.dense / lay.tp + embedding + np.where(lay.single_stage, head, 0.0)
    return _StageParameters(dense, layers * layer.expert / (cfg.expert_tp * lay.ep),
                            np.where(lay.single_stage, embedding, 0.0))


def _last_stage_parameters(cfg: MemoryConfig, layers: np.ndarray, layer: _LayerParameters
                           ) -> _StageParameters:
    """The last stage's layers, the final norm and the LM head."""
    lay = cfg.layouts
    head = cfg.vocabulary_matrix
    dense = layers * layer.dense / lay.tp + head + float(cfg.model.hidden_size)
    return _StageParameters(dense, layers * layer.expert / (cfg.expert_tp * lay.ep), head)


# ---------------------------------------------------------------- persistent state

@dataclass(frozen=True, eq=False)
class _StateBytes:
    """Bytes per parameter of the persistent state, before ZeRO shards it."""

    weights: float
    gradients: float  # param.grad plus the framework's fp32 accumulation buffer
    ddp_bucket: np.ndarray  # DDP's own buckets: only with replicas and ZeRO <= 1
    optimizer: float  # the fp32 master copy (unless the weights are one) and Adam's moments


def _state_bytes(cfg: MemoryConfig) -> _StateBytes:
    prof, lay = cfg.prof, cfg.layouts
    replicas = lay.dp * lay.ep * lay.cp
    return _StateBytes(
        weights=cfg.in_weight_dtype(prof.weight_bytes),
        gradients=cfg.in_weight_dtype(prof.grad_bytes) + prof.fp32_grad_bytes,
        ddp_bucket=np.where((replicas > 1) & (lay.zero_stage <= 1),
                            cfg.in_weight_dtype(prof.ddp_bucket_bytes), 0.0),
        optimizer=(0.0 if cfg.full_precision else prof.master_bytes) + prof.optimizer_bytes)


@dataclass(frozen=True, eq=False)
class _Shards:
    """How many ways ZeRO shards a rank's state: dense parameters over dp·ep, experts over dp,
    each times cp where the framework shards over CP too."""

    dense: np.ndarray
    expert: np.ndarray


def _zero_shards(cfg: MemoryConfig) -> _Shards:
    lay = cfg.layouts
    cp = lay.cp if cfg.prof.zero_shards_over_cp else 1.0
    if cfg.prof.expert_tp_only_without_ep:  # under EP the TP ranks shard the experts' state
        return _Shards(lay.dp * lay.ep * cp, lay.dp * cp * np.where(lay.ep > 1, lay.tp, 1.0))
    return _Shards(lay.dp * lay.ep * cp, lay.dp * cp)


def _sharded(cfg: MemoryConfig, bytes_per_parameter: float, from_stage: int,
             params: _StageParameters, shards: _Shards) -> np.ndarray:
    """Bytes of a state of `bytes_per_parameter`, which ZeRO shards from stage `from_stage` on."""
    on = cfg.layouts.zero_stage >= from_stage
    return bytes_per_parameter * (params.dense / np.where(on, shards.dense, 1.0)
                                  + params.expert / np.where(on, shards.expert, 1.0))


@dataclass(frozen=True, eq=False)
class _Gradients:
    """A rank's gradients: those alive at the activation peak, and those the backward makes
    after it, which exist only in the optimizer step's window."""

    at_peak: np.ndarray
    made_later: np.ndarray


def cuda_graphed(prof: MemoryProfile, pp: ArrayLike, ep: ArrayLike) -> np.ndarray:
    """Where the framework captures the forward-backward step in a CUDA graph
    (`MemoryProfile.cuda_graphs`): layouts with one pipeline stage and no expert parallelism."""
    stages, experts = (np.asarray(x, dtype=np.float64) for x in (pp, ep))
    return np.asarray(prof.cuda_graphs & (stages == 1) & (experts == 1), dtype=bool)


def _cuda_graphed(cfg: MemoryConfig) -> np.ndarray:
    return cuda_graphed(cfg.prof, cfg.layouts.pp, cfg.layouts.ep)


def _gradients(cfg: MemoryConfig, params: _StageParameters, nbytes: _StateBytes, shards: _Shards
               ) -> _Gradients:
    """ZeRO-2 and up shard them; FSDP whose reduce-scatter waits for the step's last
    micro-batch holds whole ones until then (whose shards it makes after the peak), and a
    profile that frees them each step makes them after the peak of a single micro-batch (not
    under a CUDA graph, whose step zeroes them in place)."""
    prof, lay = cfg.prof, cfg.layouts
    later = np.where(prof.grads_freed_each_step & (lay.grad_acc == 1) & ~_cuda_graphed(cfg),
                     1.0, 0.0)
    deferred = fsdp_reduction_deferred(prof, lay.zero_stage, lay.pp, lay.grad_acc)
    sharded = _sharded(cfg, nbytes.gradients, 2, params, shards)
    whole = prof.fsdp_accumulated_grad_bytes * (params.dense + params.expert)
    at_peak = np.where(deferred, whole, sharded * (1.0 - later)
                       + nbytes.ddp_bucket * (params.dense + params.expert))
    return _Gradients(at_peak, np.where(deferred, sharded - whole, sharded * later))


def _optimizer_step_needs(cfg: MemoryConfig, params: _StageParameters, shards: _Shards,
                          gradients: _Gradients) -> np.ndarray:
    """What the optimizer step needs beyond the activation peak's state: the gradients made after
    it (deferred: the sharded ones, the whole ones freed by then), the ZeRO-1 all-gather of the
    updated parameters and the optimizer's own temporaries."""
    prof, lay = cfg.prof, cfg.layouts
    gather = np.where((lay.zero_stage >= 1) & (shards.dense > 1), prof.zero1_gather_bytes
                      * (params.dense + params.expert) * (1.0 + 1.0 / shards.dense), 0.0)
    temporaries = _sharded(cfg, prof.optimizer_step_temp_bytes, 1, params, shards)
    return gather + gradients.made_later + temporaries


@dataclass(frozen=True, eq=False)
class _ModelState:
    """A rank's weights, gradients and optimizer states at the activation peak, and what the
    optimizer step needs beyond them."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    step_needs: np.ndarray


def _model_state(cfg: MemoryConfig, params: _StageParameters) -> _ModelState:
    nbytes, shards = _state_bytes(cfg), _zero_shards(cfg)
    gradients = _gradients(cfg, params, nbytes, shards)
    return _ModelState(
        weights=_sharded(cfg, nbytes.weights, cfg.prof.weights_shard_from_zero, params, shards),
        gradients=gradients.at_peak, optimizer=_sharded(cfg, nbytes.optimizer, 1, params, shards),
        step_needs=_optimizer_step_needs(cfg, params, shards, gradients))


# ---------------------------------------------------------------- buffers, allocator, runtime

def _fixed_buffers(cfg: MemoryConfig) -> np.ndarray:
    """Workspaces, and the sequence-parallel gather buffers where TP is on."""
    prof, lay = cfg.prof, cfg.layouts
    return prof.workspace_bytes + np.where(lay.tp > 1, prof.tp_buffer_bytes_per_token_h
                                           * cfg.tokens * float(cfg.model.hidden_size), 0.0)


def _fsdp_gathered(cfg: MemoryConfig, params: _StageParameters, acts: StageActivations,
                   layer_params: np.ndarray) -> float | np.ndarray:
    """FSDP's gathered compute copies: ZeRO-2 keeps every layer's from forward to backward,
    ZeRO-3 a few layers at a time; under a schedule ZeRO-3's backward leaves every layer
    gathered beside all but one micro-batch's activations (the later of two peaks)."""
    prof, lay = cfg.prof, cfg.layouts
    if not prof.fsdp_unsharded_layers:
        return 0.0
    gathered = prof.fsdp_gathered_bytes * (params.dense + params.expert)
    a_few = prof.fsdp_gathered_bytes * prof.fsdp_unsharded_layers * layer_params
    after_backward = np.maximum(a_few, gathered - acts.activations / acts.in_flight)
    under_pipeline = (lay.pp > 1) & prof.pipeline_defers_fsdp_reduction
    return np.where(lay.zero_stage == 2, gathered, np.where(
        lay.zero_stage >= 3, np.where(under_pipeline, after_backward, a_few), 0.0))


def _autocast_casts(cfg: MemoryConfig, params: _StageParameters, acts: StageActivations,
                    layer: LayerActivations, layer_params: np.ndarray) -> np.ndarray:
    """Autocast's weight casts: its cache holds every one until its region exits, at the end of
    the forward and loss (the built-in pipeline's region spans its schedule, backward too). A
    layer that is not recomputed saves its casts for backward anyway; a recomputed one casts
    again in backward, one layer at a time, beside the LM head's saved cast. So with
    recomputation on one stage the end of the forward is a second candidate peak: all the
    casts, the loss's forward tensors, and the activations less the layer being recomputed;
    what it holds beyond the backward's peak counts here."""
    act, logits = acts.activations, acts.logits
    cast_bytes = 0.0 if cfg.full_precision else cfg.prof.autocast_weight_bytes
    casts_all = cast_bytes * (params.dense + params.expert)
    released = one_layer_at_a_time(cfg.layouts.modes, cfg.prof) & cfg.layouts.single_stage
    casts = np.where(released, cast_bytes * (layer_params + params.head), casts_all)
    loss_forward = logits_at_forward_end(cfg)
    forward_end = np.where(released & (loss_forward > 0),
                           act - layer.working + loss_forward + casts_all, 0.0)
    return casts + np.maximum(forward_end - (act + logits + casts), 0.0)


def _fragmentation(cfg: MemoryConfig, acts: StageActivations) -> np.ndarray:
    """What the caching allocator holds beyond live tensors (the module docstring says why)."""
    prof = cfg.prof
    return (prof.fragmentation_sequential * acts.activations / acts.in_flight
            + prof.fragmentation_pipelined * acts.activations * (1.0 - 1.0 / acts.in_flight)
            + prof.fragmentation_logits * acts.logits + prof.reserved_floor_bytes)


def _runtime_overhead(cfg: MemoryConfig) -> np.ndarray:
    """Outside the allocator: the CUDA context, and NCCL's buffers per communicator in use."""
    lay = cfg.layouts
    groups = sum(((x > 1).astype(np.float64) for x in (lay.dp * lay.ep, lay.tp, lay.pp, lay.cp,
                                                       lay.ep)), np.zeros_like(lay.tp))
    return cfg.prof.cuda_context_bytes + cfg.prof.nccl_bytes_per_group * groups


# ---------------------------------------------------------------- one stage, and the rank described

@dataclass(frozen=True, eq=False)
class _StageMemory:
    """One rank of a pipeline stage: bytes per component (`COMPONENTS`) at the peak, and the
    live tensors of the optimizer-step window."""

    components: dict[str, np.ndarray]
    step_allocated: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return sum(self.components.values(), np.zeros_like(self.step_allocated))


def _stage_memory(cfg: MemoryConfig, params: _StageParameters, acts: StageActivations,
                  layer: LayerActivations, layer_params: np.ndarray) -> _StageMemory:
    state = _model_state(cfg, params)
    act, logits = acts.activations, acts.logits
    casts = _autocast_casts(cfg, params, acts, layer, layer_params)
    step_extra = np.maximum(state.step_needs - (act + logits + casts), 0.0)
    fixed = _fixed_buffers(cfg)
    buffers = fixed + _fsdp_gathered(cfg, params, acts, layer_params) + casts + step_extra
    components = {"weights": state.weights, "gradients": state.gradients,
                  "optimizer": state.optimizer, "activations": act, "logits": logits,
                  "buffers": buffers, "fragmentation": _fragmentation(cfg, acts),
                  "overhead": _runtime_overhead(cfg) + 0 * act}
    # the gathered copies and the casts are freed by the optimizer step
    step = state.weights + state.gradients + state.optimizer + fixed + state.step_needs
    return _StageMemory({name: np.rint(v).astype(np.int64) for name, v in components.items()},
                        np.rint(step).astype(np.int64))


def _stage_memories(cfg: MemoryConfig, pp: np.ndarray) -> tuple[_StageMemory, _StageMemory]:
    """One rank of the first and one of the last pipeline stage."""
    layers_first, layers_last = first_last_stage_layers(cfg.model, pp, cfg.prof)
    layer_params = _layer_parameters(cfg.model)
    per_rank = _layer_parameters_per_rank(cfg, layer_params)
    layer = layer_activations(cfg)
    first = _stage_memory(cfg, _first_stage_parameters(cfg, layers_first, layer_params),
                          first_stage_activations(cfg, layers_first, layer), layer, per_rank)
    last = _stage_memory(cfg, _last_stage_parameters(cfg, layers_last, layer_params),
                         last_stage_activations(cfg, layers_last, layer), layer, per_rank)
    return first, last


def _described_is_last(first: _StageMemory, last: _StageMemory, single: np.ndarray,
                       stage: str) -> np.ndarray:
    """Per row, whether the rank described is the last stage's (`stage`, `STAGES`)."""
    if stage == "first":
        return np.zeros_like(single)
    if stage == "last":
        return ~single
    return (~single) & (last.total > first.total)


def _output_columns(first: _StageMemory, last: _StageMemory, use_last: np.ndarray
                    ) -> dict[str, np.ndarray]:
    out = {f"mem_{name}_bytes": np.where(use_last, last.components[name], first.components[name])
           for name in COMPONENTS}
    allocated = sum((out[f"mem_{n}_bytes"] for n in COMPONENTS[:6]),
                    np.zeros_like(first.step_allocated))
    out["mem_allocated_bytes"] = allocated
    out["mem_reserved_bytes"] = allocated + out["mem_fragmentation_bytes"]
    out["mem_total_bytes"] = out["mem_reserved_bytes"] + out["mem_overhead_bytes"]
    out["mem_step_allocated_bytes"] = np.where(use_last, last.step_allocated, first.step_allocated)
    out["mem_last_stage"] = use_last
    return out


def _compute(model: ModelShape, columns: Mapping[str, np.ndarray], masks: Mapping[str, np.ndarray],
             seq_len: int, dtype: str, prof: MemoryProfile, stage: str) -> dict[str, np.ndarray]:
    cfg = _config(model, columns, masks, seq_len, dtype, prof)
    first, last = _stage_memories(cfg, columns["pp"])
    use_last = _described_is_last(first, last, cfg.layouts.single_stage, stage)
    return _output_columns(first, last, use_last)


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
