"""A mechanistic step-time model, vectorised over plan rows.

The step time is a sum of physical terms, each a *feature* measured in seconds (or a count) from
the layout, the model shape and the catalog's link bandwidths, times one coefficient:

    T = Σ_k θ_k · f_k

- ``compute``      ((m − 1) · W_max + Σ_s W_s) / peak. W_s is the FLOPs of stage s for one
                   micro-batch on one GPU, over the framework's own split (nanotron's cost-balanced
                   split from sweep.models.pipeline_stages, LM head on the last stage; recomputation
                   adds forward FLOPs). θ = 1 / GEMM efficiency. m = grad_acc: the busiest stage
                   paces the m micro-batches and filling/draining the 1F1B pipeline costs the other
                   stages' work once ((m + pp − 1) · W_max would overcharge unbalanced splits).
- ``layer_passes`` the same in layers, (m − 1) · layers_max + L: a fixed cost per layer and
                   micro-batch (kernel launches, non-GEMM work). It makes the efficiency rise with
                   the micro-batch and fall with the TP shard. θ = seconds per layer pass. The
                   per-layer terms follow the stage with the most layers, not the FLOP-busiest
                   (at pp = 8 nanotron's last stage can hold the LM head and no layer).
- ``layer_comm``   (m + pp − 1) · layers_per_stage · bytes/bandwidth of the per-layer collectives
                   on the critical path: TP (8 all-gather/reduce-scatter with SP, 4 all-reduce
                   without), CP ring exchange of K/V, EP all-to-all. θ = exposed fraction.
                   ``layer_comm_inter``: the same for groups that span nodes.
- ``dp_comm``      gradient synchronisation per step: all-reduce (ZeRO-0), reduce-scatter +
                   all-gather (ZeRO-1/2), plus per-micro-batch gathers (ZeRO-3). θ = exposed part.
                   ``dp_comm_inter``: the same for DP groups that span nodes.
- ``pp_comm``      (m + pp − 1) · 2 point-to-point activation transfers. θ = exposed fraction.
- ``latency``      latency steps on the critical path (n − 1 per per-layer TP collective: NCCL
                   runs all-gather/reduce-scatter as rings; 1 + log2 n for CP/EP; one
                   per p2p message) inside a node: θ = α, seconds per step.
                   ``latency_inter``: per-layer collectives across nodes, times the congestion
                   factor. ``p2p_inter``: pipeline messages across nodes, one per message (the TP
                   ranks of a stage send their shards at once), times the congestion factor.
- ``dp_latency``   latency steps of the gradient buckets (25 MB each), overlapped like dp_comm.
- ``dp_exposed``   the DP time nothing can hide: the gradient reduction beyond the backward pass
                   of the last micro-batch (2/3 of its compute), plus ZeRO's parameter
                   all-gather after the optimizer step. θ ≈ 1.
- ``slot_sync``    (m + pp − 1) · (nodes − 1): a per-micro-batch cost that grows with the job.
- ``optimizer``    parameters updated per GPU (after ZeRO sharding): θ = seconds per parameter.
- ``step_overhead`` 1: θ = fixed seconds per step.
- ``pipe_tp_sync`` pipeline runs only: m · (layers on the busiest stage − 1) · (tp − 1), a fixed
                   time per micro-batch for every layer after a stage's first, per TP ring
                   position (with vpp, after each chunk's first). θ ≈ 2.4 ms. See below.
- ``memory_traffic`` memory-bound bytes no FLOP count sees (norms, residuals, rotary, SwiGLU,
                   attention I/O, the loss, casts: `sweep.models.traffic`, per framework) at the
                   catalog's HBM rate, in the same 1F1B form as ``compute``. θ = 1, kept at the
                   prior by every fit (`sweep.calibration.throughput_fit.PHYSICAL_FEATURES`): within one model
                   these bytes grow with the tokens exactly as the FLOPs do, so only a second
                   model could fit it.

Not every term adds. The GPU's queue (compute, layer_comm(_inter), pp_comm, memory_traffic) and
the host's (layer_passes, latency, pipe_tp_sync, p2p_inter) run side by side: step = the other
terms + (gpu^p + host^p)^(1/p) (`step_time`), p = ``overlap_power`` chosen by the fit from
{0, 2, 4, 8, 16} (0 adds them) by the one-standard-error rule
(`sweep.calibration.throughput_fit.simplest_within_one_error`). A small micro-batch on a narrow TP shard is
bound by the host issuing kernels, a large one by the GPU; a sum would charge both, so a fit on
a mostly GPU-bound model would set the host's cost near zero and one on a mostly host-bound
model would charge it on top of the other's GEMMs.

Why ``pipe_tp_sync`` has its form: in nanotron's pipeline runs, the step time at fixed tokens,
fitted against the micro-batch count for each (model, dp, tp, pp), holds a fixed cost per
micro-batch that grows with tp − 1 and vanishes at tp = 1; that grows with the layers on a
stage, not with their width (the 1B and 8B models agree per layer within ~20 %), so it is not
activation bytes; and that all but vanishes when a stage holds one layer. So each TP collective
after a stage's first layer costs ~0.3 ms per ring hop, some 7× the ring latency of the same
collective without a pipeline. A likely cause is nanotron's blocking p2p (a metadata receive the
host waits on before each activation): the host cannot run ahead of the GPU and the TP ranks
enter each collective out of step. The data fix the form, not the cause. Each of the other
forms the same residuals admit (a p2p latency per micro-batch slot, a fixed cost per layer pass
in pipeline runs, every layer pass charged per tp − 1, activation bytes) explains less of them,
or less on a model left out.

Bandwidth of a group: inside one node, the catalog's NVLink figure; across nodes, the per-GPU
network link times the group's ranks on one node (hierarchical collectives use every rail), capped
by NVLink, and divided by (nodes spanned)^inter_scaling: large fabrics deliver less per GPU. The
same congestion factor, nodes^inter_scaling, multiplies inter-node latency. A bandwidth the
run's job measured over all its nodes (`MEASURED_INTER_NODE`) already holds that job's
congestion, so its groups are scaled by (nodes spanned / job's nodes)^inter_scaling instead. Rank
order is tp (innermost), cp, dp, pp (outermost), as in Megatron and nanotron.

The features come from small pure functions, each named for its term, of the plan rows' layouts
(`_Rows`), the stage that paces their pipeline (`_PacingStage`) and the links their collectives
use (`_Fabric`); `features` lays them out in FEATURES order.

Pure: no I/O. Coefficients are fitted by `sweep.calibration.throughput_fit`; how well the model predicts, in
sample and on a model it was not fitted on, is measured by `sweep calibrate`, `sweep replay --cv
model` and the benchmarks, and reported in docs/search.md ("Sweep economy").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Final

import numpy as np
import pandas as pd

from sweep.core.hardware import GpuSpec
from sweep.core.layout import PLAYBOOK_LAYOUT_COLUMNS
from sweep.core.model import ModelShape, count_parameters
from sweep.models.flops import (
    DEFAULT_CONVENTION,
    core_attention_flops_per_token,
    flops_per_token,
    layer_flops_per_token,
)
from sweep.models.pipeline_stages import split_stages
from sweep.models.traffic import DTYPE_BYTES, FUSED, Traffic

FEATURES: Final = ("compute", "layer_passes", "layer_comm", "layer_comm_inter", "dp_comm",
                   "dp_comm_inter", "pp_comm", "latency", "latency_inter", "p2p_inter",
                   "dp_latency", "dp_exposed", "slot_sync", "optimizer", "step_overhead",
                   "pipe_tp_sync", "memory_traffic")
# Optional column: the all-reduce bus bandwidth (GB/s) a run's job measured across its nodes.
MEASURED_INTER_NODE: Final = "inter_node_busbw_GBps"


@dataclass(frozen=True)
class Coefficients:
    """One coefficient per feature. The defaults are physical priors, not fits."""

    compute: float = 1 / 0.6          # 60 % of the dense peak in large GEMMs
    layer_passes: float = 1.0e-4      # 100 µs per layer and micro-batch (fwd + bwd)
    layer_comm: float = 0.5           # half the NVLink TP traffic is hidden behind GEMMs
    layer_comm_inter: float = 1.0     # across nodes, none is
    dp_comm: float = 0.3              # bucketed gradient reduction mostly overlaps backward
    dp_comm_inter: float = 0.3
    pp_comm: float = 1.0
    latency: float = 1.0e-5           # 10 µs per latency step inside a node
    latency_inter: float = 2.0e-5     # 20 µs per step across nodes
    p2p_inter: float = 5.0e-5         # a pipeline send/recv pair across nodes
    dp_latency: float = 2.0e-6        # per latency step of a gradient bucket, mostly overlapped
    dp_exposed: float = 1.0           # DP traffic that nothing hides
    slot_sync: float = 2.0e-5         # a small collective over every node, per micro-batch
    optimizer: float = 1.5e-11        # ~40 bytes per parameter at ~3 TB/s
    step_overhead: float = 0.05
    pipe_tp_sync: float = 1.0e-3      # 1 ms per layer, micro-batch and TP ring position (pp > 1)
    memory_traffic: float = 1.0       # element-wise and fp32-logits bytes at the HBM datasheet rate
    # Not linear: inter-node bandwidth per GPU falls as (nodes spanned)^-inter_scaling.
    inter_scaling: float = 0.0
    # Not linear: how the GPU's queue (GPU_STREAM) and the host's (HOST_FLOOR) combine,
    # (gpu^p + host^p)^(1/p); 0 adds them (no overlap). See `step_time`.
    overlap_power: float = 0.0

    def vector(self) -> np.ndarray:
        """The linear coefficients, in FEATURES order."""
        return np.array([getattr(self, name) for name in FEATURES], dtype=float)

    @classmethod
    def from_vector(cls, values: np.ndarray | list[float], inter_scaling: float = 0.0,
                    overlap_power: float = 0.0) -> Coefficients:
        linear = {name: float(v) for name, v in zip(FEATURES, values, strict=True)}
        return cls(**linear, inter_scaling=float(inter_scaling),
                   overlap_power=float(overlap_power))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, float]) -> Coefficients:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown coefficient(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: float(v) for k, v in values.items()})


@dataclass(frozen=True)
class Workload:
    """What every row of one (model, hardware) group shares."""

    shape: ModelShape
    seq_len: int
    gpu: GpuSpec
    dtype: str = "bf16"
    gpus_per_node: int = 8
    grad_reduce_bytes: int = 4  # the framework adapter's (`FrameworkAdapter.grad_reduce_bytes`)
    bucket_bytes: float = 25e6
    flops_convention: str = DEFAULT_CONVENTION
    # A device without a catalogue peak (CPU runs) uses a nominal one; the fitted `compute`
    # coefficient absorbs the scale, and MFU is not predicted.
    nominal_peak: float = 1e11
    # How the framework splits layers over pipeline stages (`sweep.models.pipeline_stages.split_stages`:
    # "cost", nanotron's balanced split; "even"; "embedding_blocks"; "megatron"), the profile's.
    stage_split: str = "cost"
    # The memory-bound bytes of the framework's kernels (sweep.models.traffic): fused, or the built-in's.
    traffic: Traffic = FUSED

    @property
    def peak(self) -> float:
        return self.gpu.peak_flops.get(self.dtype, self.nominal_peak)

    @property
    def has_peak(self) -> bool:
        return self.dtype in self.gpu.peak_flops


def _column(frame: pd.DataFrame, name: str, default: float | str | bool) -> np.ndarray:
    if name in frame:
        return frame[name].to_numpy()
    return np.full(len(frame), default)


def _ring_steps(n: np.ndarray) -> np.ndarray:
    """Latency steps of one ring all-gather or reduce-scatter over n ranks: n − 1 hops, each a
    synchronised send/recv. NCCL runs the small per-layer TP collectives as rings (trees exist
    only for all-reduce), so their latency grows with the group, not with its logarithm."""
    return np.where(n > 1, n - 1.0, 0.0)


def _steps(n: np.ndarray) -> np.ndarray:
    """Latency steps of one collective over n ranks: 1 + log2 n (NCCL's tree-like algorithms;
    a ring's n − 1 fitted the playbook's runs worse)."""
    return np.where(n > 1, 1 + np.log2(np.maximum(n, 1)), 0.0)


def _ring_time(n: np.ndarray, nbytes: np.ndarray, bw_Bps: np.ndarray) -> np.ndarray:
    """One all-gather or reduce-scatter over n ranks of a buffer of `nbytes` (whole buffer)."""
    return np.where(n > 1, (n - 1) / np.maximum(n, 1) * nbytes / bw_Bps, 0.0)


@dataclass(frozen=True)
class _Group:
    """Where a communication group sits: its bandwidth and whether it leaves the node."""

    bandwidth: np.ndarray  # bytes/s
    inter: np.ndarray  # bool: the group spans nodes

    def split(self, seconds: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(intra-node part, inter-node part) of a time computed with this group's bandwidth."""
        seconds = np.broadcast_to(seconds, self.inter.shape)
        return np.where(self.inter, 0.0, seconds), np.where(self.inter, seconds, 0.0)


def _inter_node_bandwidth(frame: pd.DataFrame, work: Workload
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU inter-node bandwidth in bytes/s, per row: the catalog's figure, unless the row
    carries the all-reduce bus bandwidth its job measured over all its nodes
    (`MEASURED_INTER_NODE`, GB/s, shared by a node's GPUs). The same GPUs deliver very different
    fabrics: in the playbook's table ~180 GB/s at 8-64 nodes in some campaigns and ~800 / nodes
    in others (13 GB/s at 64 nodes), which no constant of the model can hold. A plan has no such
    column: it is predicted with the catalog.

    Also the node count that figure already holds the fabric's congestion at: the job's nodes
    where it was measured (an all-reduce over all of them), 1 for the catalog's per-link figure.
    `_group` scales by (nodes spanned / that)^inter_scaling, so a measured figure is not charged
    the job's congestion a second time."""
    inter = np.full(len(frame), work.gpu.inter_node_GBps * 1e9)
    reference = np.maximum(1.0, world_size(frame) / work.gpus_per_node)
    if MEASURED_INTER_NODE in frame:
        measured = pd.to_numeric(frame[MEASURED_INTER_NODE], errors="coerce").to_numpy(float)
        per_gpu = measured * 1e9 / work.gpus_per_node
        known = np.isfinite(per_gpu) & (per_gpu > 0)
        inter = np.where(known, per_gpu, inter)
    return inter, reference


def _group(size: np.ndarray, stride: np.ndarray, work: Workload, scaling: float,
           inter: tuple[np.ndarray, np.ndarray]) -> _Group:
    """A collective over `size` ranks placed `stride` apart (tp innermost, pp outermost), across
    nodes over `inter` bytes/s per GPU (`_inter_node_bandwidth`)."""
    g = work.gpus_per_node
    intra = work.gpu.intra_node_GBps * 1e9
    spans = size * stride > g
    local = np.clip(g // np.maximum(stride, 1), 1, np.maximum(size, 1))
    nodes = np.maximum(1.0, size * stride / g)
    per_gpu, reference = inter
    across = np.minimum(intra, local * per_gpu) / (nodes / reference) ** scaling
    return _Group(np.where(spans, across, intra), spans)


@dataclass(frozen=True, eq=False)
class _Fabric:
    """The links the rows' collectives run over: the catalog's, with the inter-node bandwidth per
    row (`_inter_node_bandwidth`) and its congestion exponent (`Coefficients.inter_scaling`)."""

    work: Workload
    scaling: float
    inter: tuple[np.ndarray, np.ndarray]

    def group(self, size: np.ndarray, stride: np.ndarray) -> _Group:
        return _group(size, stride, self.work, self.scaling, self.inter)


@dataclass(frozen=True, eq=False)
class _Rows:
    """The plan rows' layouts as arrays. A column the table leaves out takes its default:
    cp = ep = vpp = 1, sequence parallelism on, no recomputation."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    mbs: np.ndarray
    grad_acc: np.ndarray  # m: the micro-batches of a step
    zero_stage: np.ndarray  # int
    cp: np.ndarray
    ep: np.ndarray
    sp: np.ndarray  # bool
    vpp: np.ndarray
    recompute: np.ndarray  # str

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Rows:
        missing = [c for c in PLAYBOOK_LAYOUT_COLUMNS if c not in frame]  # the others default
        if missing:
            raise ValueError(f"throughput model: plan rows lack column(s) {missing}")
        dp, tp, pp, mbs, grad_acc = (frame[c].to_numpy(dtype=float)
                                     for c in ("dp", "tp", "pp", "mbs", "grad_acc"))
        return cls(dp, tp, pp, mbs, grad_acc, frame["zero_stage"].to_numpy(dtype=int),
                   cp=_column(frame, "cp", 1).astype(float), ep=_column(frame, "ep", 1).astype(float),
                   sp=_column(frame, "sp", True).astype(bool),
                   vpp=_column(frame, "vpp", 1).astype(float),
                   recompute=_column(frame, "recompute", "none").astype(str))

    def tokens(self, work: Workload) -> np.ndarray:
        """Tokens of one micro-batch (all CP ranks together)."""
        return self.mbs * work.seq_len

    @property
    def slots(self) -> np.ndarray:
        """Micro-batch slots of the busiest stage, the pipeline's bubble included."""
        return self.grad_acc + (self.pp - 1) / self.vpp


# ---------------------------------------------------------------- the pipeline stage that paces a step

def _stage_counts(shape: ModelShape, pp: int, split: str) -> np.ndarray:
    """Decoder layers on each pipeline stage, as the framework splits them."""
    return np.asarray([layers for layers, _ in split_stages(shape, pp, split)], dtype=float)


@dataclass(frozen=True, eq=False)
class _Traffic:
    """Memory-bound bytes per row, by its recomputation mode (`sweep.models.traffic`)."""

    per_token_layer: np.ndarray  # per token and decoder layer
    per_token_head: np.ndarray  # per token outside the layers (the logits and the loss)
    per_layer_parameter: np.ndarray  # per parameter of a layer and micro-batch
    per_head_parameter: np.ndarray  # per embedding/LM head parameter and micro-batch


def _traffic(work: Workload, recompute: np.ndarray) -> _Traffic:
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

    return _Traffic(column([c.per_token_layer(shape.hidden_size, shape.q_dim, ffn) for c in counts]),
                    column([c.per_token_head(shape.hidden_size, shape.vocab_size) for c in counts]),
                    column([c.layer_param for c in counts]), column([c.head_param for c in counts]))


@dataclass(frozen=True, eq=False)
class _PacingStage:
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
                 seconds_per_byte: float = 0.0) -> _PacingStage:
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
    return _PacingStage(stage_f, total, stage_layers, stage_params, stage_b, total_b)


def _pacing_stage(rows: _Rows, work: Workload, traffic: _Traffic) -> _PacingStage:
    hbm = work.gpu.hbm_GBps * 1e9
    return _stage_split(work.shape, work.seq_len, rows.pp, rows.recompute, work.stage_split,
                        traffic.per_token_layer, traffic.per_token_head,
                        Coefficients.compute / work.peak, 1.0 / hbm if hbm > 0 else 0.0)


# ---------------------------------------------------------------- the terms that follow the micro-batches

def _compute(rows: _Rows, work: Workload, stage: _PacingStage) -> np.ndarray:
    """1F1B: the busiest stage sets the pace of the m micro-batches; filling and draining the
    pipeline costs the *other* stages' work once: (m − 1)·t_max + Σ_s t_s (with vpp virtual
    stages, that fill shrinks vpp-fold); (m + pp − 1)·t_max would overcharge unbalanced splits."""
    work_slots = rows.grad_acc * stage.flops + (stage.total_flops - stage.flops) / rows.vpp
    return rows.tokens(work) * work_slots / (rows.tp * rows.cp) / work.peak


def _memory_traffic(rows: _Rows, work: Workload, stage: _PacingStage, traffic: _Traffic
                    ) -> np.ndarray:
    """The pacing stage's memory-bound bytes at the HBM rate, in the same 1F1B form as
    `_compute` (its layers' and, on the last stage, the logits'), and per micro-batch the bytes
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


def _layer_passes(rows: _Rows, work: Workload, stage: _PacingStage) -> np.ndarray:
    """Layer passes in the same form, by the stage with the most layers: (m − 1)·layers_max + L."""
    return rows.grad_acc * stage.layers + (work.shape.num_layers - stage.layers) / rows.vpp


@dataclass(frozen=True, eq=False)
class _Collectives:
    """Per layer pass: the seconds of a layer's collectives and their latency steps, each inside
    a node and across nodes."""

    intra: np.ndarray
    inter: np.ndarray
    hops_intra: np.ndarray
    hops_inter: np.ndarray

    @classmethod
    def of(cls, group: _Group, seconds: np.ndarray, hops: np.ndarray) -> _Collectives:
        return cls(*group.split(seconds), *group.split(hops))

    def __add__(self, other: _Collectives) -> _Collectives:
        return _Collectives(self.intra + other.intra, self.inter + other.inter,
                            self.hops_intra + other.hops_intra, self.hops_inter + other.hops_inter)


def _activation_bytes(rows: _Rows, work: Workload) -> np.ndarray:
    """Bytes of one micro-batch's hidden states on one CP rank."""
    return rows.tokens(work) / rows.cp * work.shape.hidden_size * DTYPE_BYTES.get(work.dtype, 2)


def _tp_collectives(rows: _Rows, work: Workload, fabric: _Fabric) -> _Collectives:
    """SP: 4 all-gathers + 4 reduce-scatters per layer, fwd + bwd; without SP 4 all-reduces of the
    same volume. Latency: the ring's hops of each."""
    tp = rows.tp
    group = fabric.group(tp, np.ones_like(tp))
    return _Collectives.of(group, 8 * _ring_time(tp, _activation_bytes(rows, work), group.bandwidth),
                           np.where(tp > 1, np.where(rows.sp, 8, 4) * _ring_steps(tp), 0.0))


def _cp_ring_exchange(rows: _Rows, work: Workload, fabric: _Fabric) -> _Collectives:
    """Context parallelism passes each CP rank's K/V around the ring, forward and backward."""
    cp = rows.cp
    kv_bytes = 2 * rows.tokens(work) / cp * work.shape.kv_dim * DTYPE_BYTES.get(work.dtype, 2)
    group = fabric.group(cp, rows.tp)
    return _Collectives.of(group, 2 * (cp - 1) * kv_bytes / group.bandwidth, 2 * _steps(cp))


def _ep_all_to_all(rows: _Rows, work: Workload, fabric: _Fabric) -> _Collectives:
    """Expert parallelism: 4 all-to-alls of the routed tokens per layer (dispatch and combine,
    fwd + bwd); none for a dense model."""
    shape, ep = work.shape, rows.ep
    if not shape.is_moe:
        zero = np.zeros_like(rows.tp)
        return _Collectives(zero, zero, zero, zero)
    a2a_bytes = (rows.tokens(work) / rows.cp * shape.hidden_size * DTYPE_BYTES.get(work.dtype, 2)
                 * shape.experts_per_token)
    group = fabric.group(ep, rows.tp * rows.cp * rows.dp)
    return _Collectives.of(group, 4 * _ring_time(ep, a2a_bytes, group.bandwidth),
                           np.where(ep > 1, 4 * _steps(ep), 0.0))


def _layer_collectives(rows: _Rows, work: Workload, fabric: _Fabric) -> _Collectives:
    """The per-layer collectives on the critical path: TP, CP, EP."""
    return (_tp_collectives(rows, work, fabric) + _cp_ring_exchange(rows, work, fabric)
            + _ep_all_to_all(rows, work, fabric))


@dataclass(frozen=True, eq=False)
class _PointToPoint:
    """Pipeline point-to-point: activations forward, their gradients backward, per micro-batch."""

    seconds: np.ndarray
    hops_intra: np.ndarray
    hops_inter: np.ndarray


def _point_to_point(rows: _Rows, work: Workload, fabric: _Fabric) -> _PointToPoint:
    tp, pp = rows.tp, rows.pp
    activations = _activation_bytes(rows, work)
    p2p_bytes = np.where(rows.sp, activations / tp, activations)
    spans = tp * rows.cp * rows.dp >= work.gpus_per_node
    group = _Group(np.where(spans, fabric.inter[0], work.gpu.intra_node_GBps * 1e9), spans)
    seconds = np.where(pp > 1, rows.slots * 2 * p2p_bytes / group.bandwidth, 0.0)
    return _PointToPoint(seconds, *group.split(np.where(pp > 1, rows.slots * 2, 0.0)))


def _pipe_tp_sync(rows: _Rows, stage: _PacingStage) -> np.ndarray:
    """Pipeline runs only: per micro-batch of the busiest stage, a cost for every layer after the
    first of a stage (of each virtual chunk), growing with the TP ring (tp − 1 positions); see
    the module docstring (`pipe_tp_sync`)."""
    return np.where(rows.pp > 1, rows.grad_acc * np.maximum(stage.layers - rows.vpp, 0.0)
                    * (rows.tp - 1.0), 0.0)


# ---------------------------------------------------------------- data-parallel synchronisation

@dataclass(frozen=True, eq=False)
class _GradientSync:
    """Data-parallel synchronisation of this GPU's parameter shard, in seconds per step: the
    gradients' reduction and the parameters' gathers, over the DP group."""

    reduce: np.ndarray
    gather: np.ndarray
    group: _Group


def _parameter_shard(rows: _Rows, stage: _PacingStage) -> np.ndarray:
    """Parameters of this GPU's share of the largest stage (TP-sharded)."""
    return stage.params / rows.tp


def _gradient_sync(rows: _Rows, work: Workload, fabric: _Fabric, stage: _PacingStage
                   ) -> _GradientSync:
    """All-reduce (ZeRO-0), reduce-scatter + all-gather (ZeRO-1/2), plus per-micro-batch
    gathers (ZeRO-3)."""
    replicas, zero, m = rows.dp * rows.ep, rows.zero_stage, rows.grad_acc
    shard = _parameter_shard(rows, stage)
    group = fabric.group(replicas, rows.tp * rows.cp)
    rs = _ring_time(replicas, shard * work.grad_reduce_bytes, group.bandwidth)
    ag = _ring_time(replicas, shard * DTYPE_BYTES.get(work.dtype, 2), group.bandwidth)
    return _GradientSync(reduce=np.select([zero == 0, zero == 3], [2 * rs, m * (rs + ag)], rs),
                         gather=np.select([zero == 0, zero == 3], [0.0, m * ag], ag), group=group)


def _dp_latency_steps(rows: _Rows, work: Workload, stage: _PacingStage) -> np.ndarray:
    """Latency steps of the gradient buckets, which overlap with the backward pass: a term of
    its own."""
    replicas, zero = rows.dp * rows.ep, rows.zero_stage
    buckets = np.ceil(_parameter_shard(rows, stage) * work.grad_reduce_bytes / work.bucket_bytes)
    return np.where(replicas > 1, np.where(zero == 3, 3 * rows.grad_acc, 2) * buckets
                    * _steps(replicas), 0.0)


def _dp_exposed(rows: _Rows, work: Workload, stage: _PacingStage, sync: _GradientSync
                ) -> np.ndarray:
    """Only the last micro-batch's backward (2/3 of its compute, at the prior efficiency) can
    hide the gradient reduction; ZeRO's parameter gather after the step hides behind nothing."""
    window = ((2 / 3) * rows.tokens(work) * stage.flops / (rows.tp * rows.cp) / work.peak
              * Coefficients.compute)
    return np.maximum(sync.reduce - window, 0.0) + sync.gather


def _optimizer(rows: _Rows, stage: _PacingStage) -> np.ndarray:
    """Parameters this GPU updates, after ZeRO sharding."""
    shard = _parameter_shard(rows, stage)
    return np.where(rows.zero_stage >= 1, shard / (rows.dp * rows.ep), shard)


# ---------------------------------------------------------------- the feature matrix

def features(frame: pd.DataFrame, work: Workload, inter_scaling: float = 0.0) -> pd.DataFrame:
    """The feature matrix (one row per plan row, columns FEATURES)."""
    rows = _Rows.of(frame)
    fabric = _Fabric(work, inter_scaling, _inter_node_bandwidth(frame, work))
    traffic = _traffic(work, rows.recompute)
    stage = _pacing_stage(rows, work, traffic)
    passes = _layer_passes(rows, work, stage)
    layer = _layer_collectives(rows, work, fabric)
    p2p = _point_to_point(rows, work, fabric)
    sync = _gradient_sync(rows, work, fabric, stage)
    dp_intra, dp_inter = sync.group.split(sync.reduce + sync.gather)
    # Latency: ring hops of every collective; inter-node hops slow down with scale like bandwidth.
    nodes = np.maximum(1.0, world_size(frame) / work.gpus_per_node)
    congestion = nodes ** inter_scaling
    columns = {
        "compute": _compute(rows, work, stage), "layer_passes": passes,
        "layer_comm": passes * layer.intra, "layer_comm_inter": passes * layer.inter,
        "dp_comm": dp_intra, "dp_comm_inter": dp_inter, "pp_comm": p2p.seconds,
        "latency": passes * layer.hops_intra + p2p.hops_intra,
        "latency_inter": passes * layer.hops_inter * congestion,
        "p2p_inter": p2p.hops_inter * congestion,
        "dp_latency": (_dp_latency_steps(rows, work, stage)
                       * np.where(sync.group.inter, congestion, 1.0)),
        "dp_exposed": _dp_exposed(rows, work, stage, sync),
        "slot_sync": rows.slots * (nodes - 1.0),
        "optimizer": _optimizer(rows, stage), "step_overhead": np.ones_like(rows.tp),
        "pipe_tp_sync": _pipe_tp_sync(rows, stage),
        "memory_traffic": _memory_traffic(rows, work, stage, traffic),
    }
    return pd.DataFrame({k: np.asarray(v, dtype=float) for k, v in columns.items()},
                        index=frame.index)


def tokens_per_step(frame: pd.DataFrame, work: Workload) -> np.ndarray:
    dp, mbs, m = (frame[c].to_numpy(dtype=float) for c in ("dp", "mbs", "grad_acc"))
    return dp * _column(frame, "ep", 1).astype(float) * mbs * m * work.seq_len


def world_size(frame: pd.DataFrame) -> np.ndarray:
    size = frame["dp"].to_numpy(dtype=float) * frame["tp"].to_numpy(dtype=float)
    size = size * frame["pp"].to_numpy(dtype=float)
    return size * _column(frame, "cp", 1).astype(float) * _column(frame, "ep", 1).astype(float)


# The per-layer-pass work splits over two queues that run side by side. The GPU's: the kernels'
# own time (GEMMs and the rest, TP and pipeline bytes on the wire: with
# CUDA_DEVICE_MAX_CONNECTIONS=1 nanotron's NCCL kernels share the compute queue). The host's:
# issuing those kernels from Python (a fixed cost per layer pass), the synchronised hops of each
# TP collective, the blocking pipeline hand-offs. When the GPU is busier the host runs ahead and
# its time is hidden; when the host is (small micro-batches, narrow TP shards: 1B at tp = 8 runs
# ~4.6 ms per layer and micro-batch for mbs 1 to 4, 8B ~4.4 ms at mbs 1, whatever the FLOPs),
# the GPU idles and its time is. A sum charges both, so a fit on a model whose layers are mostly
# GPU-bound (8B) sets the host cost near zero and one on a mostly host-bound model (1B) charges
# it on top of 8B's GEMMs.
GPU_STREAM: Final = ("compute", "layer_comm", "layer_comm_inter", "pp_comm", "memory_traffic")
HOST_FLOOR: Final = ("layer_passes", "latency", "pipe_tp_sync", "p2p_inter")
_GPU = np.array([name in GPU_STREAM for name in FEATURES])
_HOST = np.array([name in HOST_FLOOR for name in FEATURES])


def step_time(scaled: np.ndarray, power: float) -> tuple[np.ndarray, np.ndarray]:
    """Step time from the terms' times (rows × FEATURES: feature × coefficient), and the weight
    of each term in it (d step / d term; 1 for every term when power is 0).

    step = Σ other terms + (gpu^p + host^p)^(1/p), gpu and host the sums of GPU_STREAM and
    HOST_FLOOR: p → ∞ is max(gpu, host) (perfect overlap), p = 1 or 0 their sum (none); a
    finite p rounds the corner, as layers and micro-batches differ in which queue binds. Every
    term scales with its coefficient, so the step time stays 1-homogeneous in them."""
    scaled = np.atleast_2d(scaled)
    weights = np.ones_like(scaled)
    if not power:
        return scaled.sum(axis=1), weights
    gpu = np.maximum(scaled[:, _GPU].sum(axis=1), 1e-15)
    host = np.maximum(scaled[:, _HOST].sum(axis=1), 1e-15)
    total = gpu ** power + host ** power
    both = total ** (1.0 / power)
    weights[:, _GPU] = (both / total * gpu ** (power - 1.0))[:, None]
    weights[:, _HOST] = (both / total * host ** (power - 1.0))[:, None]
    return scaled[:, ~(_GPU | _HOST)].sum(axis=1) + both, weights


def predict_step(feats: np.ndarray, coeffs: Coefficients) -> np.ndarray:
    """Predicted step time (seconds) of a feature matrix (rows × FEATURES)."""
    return step_time(np.asarray(feats, dtype=float) * coeffs.vector(), coeffs.overlap_power)[0]


def predict(frame: pd.DataFrame, work: Workload, coeffs: Coefficients = Coefficients()
            ) -> pd.DataFrame:
    """Predicted step time, tokens/s/GPU and MFU, with the time of every term (`t_<feature>`;
    with overlap, the GPU and host terms shrink in proportion to what the overlap hides, so they
    still add up to the step time)."""
    feats = features(frame, work, coeffs.inter_scaling)
    parts = feats.to_numpy() * coeffs.vector()
    step, _ = step_time(parts, coeffs.overlap_power)
    if coeffs.overlap_power:
        queued = parts[:, _GPU | _HOST].sum(axis=1)
        hidden = step - parts[:, ~(_GPU | _HOST)].sum(axis=1)
        parts[:, _GPU | _HOST] *= (hidden / np.maximum(queued, 1e-15))[:, None]
    tps_gpu = tokens_per_step(frame, work) / (step * world_size(frame))
    out = pd.DataFrame({f"t_{name}": parts[:, i] for i, name in enumerate(FEATURES)},
                       index=frame.index)
    out.insert(0, "pred_step_time_s", step)
    out.insert(1, "pred_tokens_per_s_per_gpu", tps_gpu)
    fpt = flops_per_token(work.shape, work.seq_len, work.flops_convention)
    out.insert(2, "pred_mfu", tps_gpu * fpt / work.peak if work.has_peak else np.nan)
    return out


__all__ = ["Coefficients", "FEATURES", "GPU_STREAM", "HOST_FLOOR", "Workload", "features",
           "predict", "predict_step", "step_time", "tokens_per_step", "world_size"]
