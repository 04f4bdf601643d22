"""The pipeline stage that paces a training step, and the terms it sets, vectorised over plan
rows: the GEMM FLOPs (``compute``), the memory-bound bytes (``memory_traffic``), the layer passes
(``layer_passes``) and the parameters the optimizer updates (``optimizer``).

1F1B runs the m micro-batches at the pace of the busiest stage, and filling and draining the
pipeline costs the other stages' work once: (m − 1) · W_max + Σ_s W_s, not (m + pp − 1) · W_max,
which would overcharge unbalanced splits. The stages are the framework's own
(sweep.models.pipeline_stages: nanotron's cost-balanced split, the even ones), the LM head on the
last stage. The busiest stage is the one with the most work in time, its FLOPs and its memory-bound
bytes together at the prior rates: nanotron balances FLOPs, so the LM head's stage holds few layers
but all the fp32 logits' bytes. The per-layer terms follow the stage with the most layers instead
(at pp = 8 nanotron's last stage can hold the LM head and no layer); the parameter terms, the
largest stage.

Memory-bound bytes are the ones no FLOP count sees (norms, residuals, rotary, SwiGLU, attention
I/O, the loss, casts), per framework's kernels (sweep.models.traffic). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sweep.core.model import ModelShape, count_parameters
from sweep.models.flops import core_attention_flops_per_token, layer_flops_per_token
from sweep.models.pipeline_stages import split_stages
from sweep.models.throughput_inputs import Rows, Workload

# ---------------------------------------------------------------- the pipeline stage that paces a step

def _stage_counts(shape: ModelShape, pp: int, split: str) -> np.ndarray:
    """Decoder layers on each pipeline stage, as the framework splits them."""
    return np.asarray([layers for layers, _ in split_stages(shape, pp, split)], dtype=float)


@dataclass(frozen=True, eq=False)
class MemoryBoundBytes:
    """Memory-bound bytes per row, by its recomputation mode (`sweep.models.traffic`)."""

    per_token_layer: np.ndarray  # per token and decoder layer
    per_token_head: np.ndarray  # per token outside the layers (the logits and the loss)
    per_layer_parameter: np.ndarray  # per parameter of a layer and micro-batch
    per_head_parameter: np.ndarray  # per embedding/LM head parameter and micro-batch


def memory_bound_bytes(work: Workload, recompute: np.ndarray) -> MemoryBoundBytes:
    """Memory-bound work that no FLOP count sees, at the HBM rate. Fused kernels: per token and
    layer (fwd + bwd ≈ 3 × fwd) the norms, residual adds, rotary, SwiGLU and attention I/O move
    ~(18h + 3F) elements forward; nanotron's loss casts the logits to fp32
    (models/llama.py:971-973) and runs max, subtract, exp, sum, divide and the backward in place
    over them (tensor_parallel/functional.py:31-107): ~60 bytes per logit. Per token this grows
    as h and V while the GEMMs grow as h^2 and V·h: it weighs 2x more on h = 2048 than on
    h = 4096. The built-in workload's eager kernels move 5-8 times that, and its casts and fp32
    gradient accumulation move bytes per parameter and micro-batch too."""
    shape = work.shape
    ffn = shape.moe_ffn_hidden_size * shape.experts_per_token if shape.is_moe \
        else shape.ffn_hidden_size
    modes = [str(m) for m in np.unique(recompute)]
    counts = [work.traffic.counts(work.dtype, m) for m in modes]
    rows = [recompute == m for m in modes]

    def column(values: list[float]) -> np.ndarray:
        return np.select(rows, values, np.nan) if rows else np.zeros(len(recompute))

    return MemoryBoundBytes(
        column([c.per_token_layer(shape.hidden_size, shape.q_dim, ffn) for c in counts]),
        column([c.per_token_head(shape.hidden_size, shape.vocab_size) for c in counts]),
        column([c.layer_param for c in counts]), column([c.head_param for c in counts]))


@dataclass(frozen=True, eq=False)
class PacingStage:
    """Per row: the stage that paces the pipeline and the whole model, per token."""

    flops: np.ndarray  # of the pacing stage
    total_flops: np.ndarray  # of all stages
    layers: np.ndarray  # of the stage with the most layers
    params: np.ndarray  # of the largest stage
    bytes: np.ndarray  # memory-bound, of the pacing stage
    total_bytes: np.ndarray  # memory-bound, of all stages


def _layer_flops(shape: ModelShape, seq_len: int, recompute: np.ndarray) -> np.ndarray:
    """Training FLOPs per token of one decoder layer. Recomputation repeats the forward (1/3 of
    training FLOPs) of what it recomputes, as `sweep.models.flops.hardware_flops_per_token`
    counts it."""
    L = shape.num_layers
    attention_core = core_attention_flops_per_token(shape, seq_len, "full_attention") / L
    layer = layer_flops_per_token(shape, seq_len, "full_attention") / L
    extra = np.select([recompute == "full", recompute == "selective"],
                      [layer / 3.0, attention_core / 3.0], 0.0)
    return layer + extra


def _busiest_stage(counts: np.ndarray, flops: tuple[np.ndarray, float],
                   nbytes: tuple[np.ndarray, np.ndarray], seconds_per_flop: float,
                   seconds_per_byte: float) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and memory-bound bytes per token of the stage that paces 1F1B, for rows of one
    pipeline depth whose stages hold `counts` layers: (per layer, on the LM head's stage) each.

    It is the stage with the most work in time, its FLOPs and its bytes together (at the prior
    rates): nanotron balances FLOPs, so the LM head's stage holds few layers but all the fp32
    logits' bytes. Its FLOPs and bytes are charged together, not the FLOP-busiest stage's FLOPs
    plus the layer-heaviest stage's bytes plus the head's."""
    per_stage = counts[None, :] * flops[0][:, None]
    per_stage[:, -1] += flops[1]
    per_bytes = counts[None, :] * nbytes[0][:, None]
    per_bytes[:, -1] += nbytes[1]
    busiest = np.argmax(per_stage * seconds_per_flop + per_bytes * seconds_per_byte, axis=1)
    return per_stage[np.arange(len(busiest)), busiest], per_bytes[np.arange(len(busiest)), busiest]


def _stage_split(shape: ModelShape, seq_len: int, pp: np.ndarray, recompute: np.ndarray,
                 split: str = "cost", layer_bytes: np.ndarray | float = 0.0,
                 head_bytes: np.ndarray | float = 0.0, seconds_per_flop: float = 0.0,
                 seconds_per_byte: float = 0.0) -> PacingStage:
    """The stages of each row's pipeline: FLOPs and the memory-bound bytes (`layer_bytes` per
    layer, `head_bytes` on the last stage, per row or for all) of the stage that paces it and of
    all stages, per token; the layers of the stage with the most layers; the parameters of the
    largest stage. The pacing stage has the most work in time at the prior rates
    (`seconds_per_flop`, `seconds_per_byte`).

    The stages are the framework's own split (nanotron balances a cost that counts the LM head as
    vocab/(4h + 3F) layers; Megatron and the others split the layers evenly), the LM head on the
    last stage."""
    params = count_parameters(shape)
    L = shape.num_layers
    layer_f = _layer_flops(shape, seq_len, recompute)
    head_f = 6.0 * shape.vocab_size * shape.hidden_size
    total = L * layer_f + head_f
    stage_f = np.array(total, dtype=float, copy=True)
    layer_b = np.broadcast_to(np.asarray(layer_bytes, dtype=float), pp.shape)
    head_b = np.broadcast_to(np.asarray(head_bytes, dtype=float), pp.shape)
    total_b = L * layer_b + head_b
    stage_b = np.array(total_b, dtype=float, copy=True)
    stage_layers = np.full(len(pp), float(L))
    stage_params = np.full(len(pp), float(params.total))
    for p in np.unique(pp[pp > 1]):
        rows = pp == p
        counts = _stage_counts(shape, int(p), split)
        stage_f[rows], stage_b[rows] = _busiest_stage(
            counts, (layer_f[rows], head_f), (layer_b[rows], head_b[rows]),
            seconds_per_flop, seconds_per_byte)
        # Per-layer costs (layer passes, TP collectives, pipe_tp_sync) pace the stage with the
        # most layers, not the FLOP-busiest one: at 1B, pp = 8 nanotron places 3,2,3,2,3,2,1,0
        # layers and the LM head (~3.2 layers of FLOPs) on the last stage, which is then the
        # busiest with no layer at all, and would charge pipe_tp_sync for none.
        stage_layers[rows] = max(float(counts.max()), 1.0)
        # The first stage holds the embedding, the last the LM head (a copy of it when tied).
        # (MoE: all experts count; sharding them over EP is left out of this estimate.)
        stage_params[rows] = counts.max() * params.per_layer + params.embedding
    return PacingStage(stage_f, total, stage_layers, stage_params, stage_b, total_b)


def pacing_stage(rows: Rows, work: Workload, traffic: MemoryBoundBytes, prior_compute: float
                 ) -> PacingStage:
    """The rows' pacing stages under the workload's split, the busiest in time at the prior
    rates: `prior_compute` (the `compute` coefficient's prior, 1 / GEMM efficiency) over the peak
    per FLOP, the HBM datasheet rate per byte."""
    hbm = work.gpu.hbm_GBps * 1e9
    return _stage_split(work.shape, work.seq_len, rows.pp, rows.recompute, work.stage_split,
                        traffic.per_token_layer, traffic.per_token_head,
                        prior_compute / work.peak, 1.0 / hbm if hbm > 0 else 0.0)


# ---------------------------------------------------------------- the terms that follow the micro-batches

def compute(rows: Rows, work: Workload, stage: PacingStage) -> np.ndarray:
    """1F1B: the busiest stage sets the pace of the m micro-batches; filling and draining the
    pipeline costs the *other* stages' work once: (m − 1)·t_max + Σ_s t_s (with vpp virtual
    stages, that fill shrinks vpp-fold); (m + pp − 1)·t_max would overcharge unbalanced splits."""
    work_slots = rows.grad_acc * stage.flops + (stage.total_flops - stage.flops) / rows.vpp
    return rows.tokens(work) * work_slots / (rows.tp * rows.cp) / work.peak


def memory_traffic(rows: Rows, work: Workload, stage: PacingStage, traffic: MemoryBoundBytes
                   ) -> np.ndarray:
    """The pacing stage's memory-bound bytes at the HBM rate, in the same 1F1B form as
    `compute` (its layers' and, on the last stage, the logits'), and per micro-batch the bytes
    per parameter of the stage (casts, gradient accumulation)."""
    hbm = work.gpu.hbm_GBps * 1e9
    m, tp = rows.grad_acc, rows.tp
    byte_slots = m * stage.bytes + (stage.total_bytes - stage.bytes) / rows.vpp
    params = count_parameters(work.shape)
    head_params = params.embedding + params.lm_head
    param_bytes = m * ((stage.params - head_params) * traffic.per_layer_parameter
                       + head_params * traffic.per_head_parameter) / tp
    return ((rows.tokens(work) / (tp * rows.cp) * byte_slots + param_bytes) / hbm if hbm > 0
            else np.zeros_like(tp))


def layer_passes(rows: Rows, work: Workload, stage: PacingStage) -> np.ndarray:
    """Layer passes in the same form, by the stage with the most layers: (m − 1)·layers_max + L."""
    return rows.grad_acc * stage.layers + (work.shape.num_layers - stage.layers) / rows.vpp


# ---------------------------------------------------------------- the parameters a GPU holds

def parameter_shard(rows: Rows, stage: PacingStage) -> np.ndarray:
    """Parameters of this GPU's share of the largest stage (TP-sharded)."""
    return stage.params / rows.tp


def optimizer(rows: Rows, stage: PacingStage) -> np.ndarray:
    """Parameters this GPU updates, after ZeRO sharding."""
    shard = parameter_shard(rows, stage)
    return np.where(rows.zero_stage >= 1, shard / (rows.dp * rows.ep), shard)


__all__ = ["MemoryBoundBytes", "PacingStage", "compute", "layer_passes", "memory_bound_bytes",
           "memory_traffic", "optimizer", "pacing_stage", "parameter_shard"]
