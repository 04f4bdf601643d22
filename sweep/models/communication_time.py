"""The communication a training step's layout costs, vectorised over plan rows: the seconds and
latency steps of its collectives (per layer pass: TP, CP ring exchange, EP all-to-all; per step: the
data-parallel gradient synchronisation; per micro-batch: the pipeline's point-to-point transfers),
each split into the part inside a node and the part across nodes, which the model charges with
different coefficients (sweep.models.throughput); and the fixed cost of TP collectives in pipeline
runs (``pipe_tp_sync``, whose form sweep.models.throughput's docstring explains).

Bandwidth of a group: inside one node, the catalog's NVLink figure; across nodes, the per-GPU
network link times the group's ranks on one node (hierarchical collectives use every rail), capped
by NVLink, and divided by (nodes spanned / the job's nodes)^inter_scaling. The figure is taken as
what a group over all of the job's nodes gets: a bandwidth the job measured over all its nodes
(`MEASURED_INTER_NODE`) holds that congestion already, and the catalog's figure is treated the
same way (the fitted constants were fitted so), so a group over fewer nodes gets more. The
NVLink cap applies before that scaling, not after it: a group over a quarter of the job's nodes
gets twice its capped figure at inter_scaling 0.5, which can exceed NVLink (the constants were
fitted with it so; capping after would need a refit). Inter-node latency is multiplied by
nodes^inter_scaling, the job's nodes. Rank order is tp (innermost), cp, dp, pp (outermost), as
in Megatron and nanotron.

Latency: NCCL runs the per-layer all-gathers and reduce-scatters as rings (n − 1 steps); the
other collectives count 1 + log2 n steps, which fitted the playbook's runs better than a ring's.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sweep.models.pacing_stage import PacingStage, parameter_shard
from sweep.models.throughput_inputs import MEASURED_INTER_NODE, Rows, Workload
from sweep.models.traffic import DTYPE_BYTES

# ---------------------------------------------------------------- rings, groups and the fabric

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
class Group:
    """Where a communication group sits: its bandwidth and whether it leaves the node."""

    bandwidth: np.ndarray  # bytes/s
    inter: np.ndarray  # bool: the group spans nodes

    def split(self, seconds: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(intra-node part, inter-node part) of a time computed with this group's bandwidth."""
        seconds = np.broadcast_to(seconds, self.inter.shape)
        return np.where(self.inter, 0.0, seconds), np.where(self.inter, seconds, 0.0)


def inter_node_bandwidth(frame: pd.DataFrame, work: Workload, job_nodes: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU inter-node bandwidth in bytes/s, per row: the catalog's figure, unless the row
    carries the all-reduce bus bandwidth its job measured over all its nodes
    (`MEASURED_INTER_NODE`, GB/s, shared by a node's GPUs). The same GPUs deliver very different
    fabrics: in the playbook's table ~180 GB/s at 8-64 nodes in some campaigns and ~800 / nodes
    in others (13 GB/s at 64 nodes), which no constant of the model can hold. A plan has no such
    column: it is predicted with the catalog.

    Also the node count that figure holds the fabric's congestion at: the job's nodes
    (`job_nodes`), for a measured figure (an all-reduce over all of them) and for the catalog's
    alike. `_group` scales by (nodes spanned / that)^inter_scaling, so a measured figure is not
    charged the job's congestion a second time."""
    inter = np.full(len(frame), work.gpu.inter_node_GBps * 1e9)
    reference = job_nodes
    if MEASURED_INTER_NODE in frame:
        measured = pd.to_numeric(frame[MEASURED_INTER_NODE], errors="coerce").to_numpy(float)
        per_gpu = measured * 1e9 / work.gpus_per_node
        known = np.isfinite(per_gpu) & (per_gpu > 0)
        inter = np.where(known, per_gpu, inter)
    return inter, reference


def _group(size: np.ndarray, stride: np.ndarray, work: Workload, scaling: float,
           inter: tuple[np.ndarray, np.ndarray]) -> Group:
    """A collective over `size` ranks placed `stride` apart (tp innermost, pp outermost), across
    nodes over `inter` bytes/s per GPU (`inter_node_bandwidth`)."""
    g = work.gpus_per_node
    intra = work.gpu.intra_node_GBps * 1e9
    spans = size * stride > g
    local = np.clip(g // np.maximum(stride, 1), 1, np.maximum(size, 1))
    nodes = np.maximum(1.0, size * stride / g)
    per_gpu, reference = inter
    across = np.minimum(intra, local * per_gpu) / (nodes / reference) ** scaling
    return Group(np.where(spans, across, intra), spans)


@dataclass(frozen=True, eq=False)
class Fabric:
    """The links the rows' collectives run over: the catalog's, with the inter-node bandwidth per
    row (`inter_node_bandwidth`) and its congestion exponent (`Coefficients.inter_scaling`)."""

    work: Workload
    scaling: float
    inter: tuple[np.ndarray, np.ndarray]

    def group(self, size: np.ndarray, stride: np.ndarray) -> Group:
        return _group(size, stride, self.work, self.scaling, self.inter)


# ---------------------------------------------------------------- the collectives of a layer pass

@dataclass(frozen=True, eq=False)
class Collectives:
    """Per layer pass: the seconds of a layer's collectives and their latency steps, each inside
    a node and across nodes."""

    intra: np.ndarray
    inter: np.ndarray
    hops_intra: np.ndarray
    hops_inter: np.ndarray

    @classmethod
    def of(cls, group: Group, seconds: np.ndarray, hops: np.ndarray) -> Collectives:
        return cls(*group.split(seconds), *group.split(hops))

    def __add__(self, other: Collectives) -> Collectives:
        return Collectives(self.intra + other.intra, self.inter + other.inter,
                           self.hops_intra + other.hops_intra, self.hops_inter + other.hops_inter)


def _activation_bytes(rows: Rows, work: Workload) -> np.ndarray:
    """Bytes of one micro-batch's hidden states on one CP rank."""
    return rows.tokens(work) / rows.cp * work.shape.hidden_size * DTYPE_BYTES.get(work.dtype, 2)


def _tp_collectives(rows: Rows, work: Workload, fabric: Fabric) -> Collectives:
    """SP: 4 all-gathers + 4 reduce-scatters per layer, fwd + bwd; without SP 4 all-reduces of the
    same volume. Latency: the ring's hops of each."""
    tp = rows.tp
    group = fabric.group(tp, np.ones_like(tp))
    return Collectives.of(group, 8 * _ring_time(tp, _activation_bytes(rows, work), group.bandwidth),
                          np.where(tp > 1, np.where(rows.sp, 8, 4) * _ring_steps(tp), 0.0))


def _cp_ring_exchange(rows: Rows, work: Workload, fabric: Fabric) -> Collectives:
    """Context parallelism passes each CP rank's K/V around the ring, forward and backward."""
    cp = rows.cp
    kv_bytes = 2 * rows.tokens(work) / cp * work.shape.kv_dim * DTYPE_BYTES.get(work.dtype, 2)
    group = fabric.group(cp, rows.tp)
    return Collectives.of(group, 2 * (cp - 1) * kv_bytes / group.bandwidth, 2 * _steps(cp))


def _ep_all_to_all(rows: Rows, work: Workload, fabric: Fabric) -> Collectives:
    """Expert parallelism: 4 all-to-alls of the routed tokens per layer (dispatch and combine,
    fwd + bwd); none for a dense model."""
    shape, ep = work.shape, rows.ep
    if not shape.is_moe:
        zero = np.zeros_like(rows.tp)
        return Collectives(zero, zero, zero, zero)
    a2a_bytes = (rows.tokens(work) / rows.cp * shape.hidden_size * DTYPE_BYTES.get(work.dtype, 2)
                 * shape.experts_per_token)
    group = fabric.group(ep, rows.tp * rows.cp * rows.dp)
    return Collectives.of(group, 4 * _ring_time(ep, a2a_bytes, group.bandwidth),
                          np.where(ep > 1, 4 * _steps(ep), 0.0))


def layer_collectives(rows: Rows, work: Workload, fabric: Fabric) -> Collectives:
    """The per-layer collectives on the critical path: TP, CP, EP."""
    return (_tp_collectives(rows, work, fabric) + _cp_ring_exchange(rows, work, fabric)
            + _ep_all_to_all(rows, work, fabric))


@dataclass(frozen=True, eq=False)
class PointToPoint:
    """Pipeline point-to-point: activations forward, their gradients backward, per micro-batch."""

    seconds: np.ndarray
    hops_intra: np.ndarray
    hops_inter: np.ndarray


def point_to_point(rows: Rows, work: Workload, fabric: Fabric) -> PointToPoint:
    tp, pp = rows.tp, rows.pp
    activations = _activation_bytes(rows, work)
    p2p_bytes = np.where(rows.sp, activations / tp, activations)
    spans = tp * rows.cp * rows.dp >= work.gpus_per_node
    group = Group(np.where(spans, fabric.inter[0], work.gpu.intra_node_GBps * 1e9), spans)
    seconds = np.where(pp > 1, rows.slots * 2 * p2p_bytes / group.bandwidth, 0.0)
    return PointToPoint(seconds, *group.split(np.where(pp > 1, rows.slots * 2, 0.0)))


def pipe_tp_sync(rows: Rows, stage: PacingStage) -> np.ndarray:
    """Pipeline runs only: per micro-batch of the busiest stage, a cost for every layer after the
    first of a stage (of each virtual chunk), growing with the TP ring (tp − 1 positions); why
    this form, sweep.models.throughput's docstring (`pipe_tp_sync`)."""
    return np.where(rows.pp > 1, rows.grad_acc * np.maximum(stage.layers - rows.vpp, 0.0)
                    * (rows.tp - 1.0), 0.0)


# ---------------------------------------------------------------- data-parallel synchronisation

@dataclass(frozen=True, eq=False)
class GradientSync:
    """Data-parallel synchronisation of this GPU's parameter shard, in seconds per step: the
    gradients' reduction and the parameters' gathers, over the DP group."""

    reduce: np.ndarray
    gather: np.ndarray
    group: Group


def gradient_sync(rows: Rows, work: Workload, fabric: Fabric, stage: PacingStage
                  ) -> GradientSync:
    """All-reduce (ZeRO-0), reduce-scatter + all-gather (ZeRO-1/2), plus per-micro-batch
    gathers (ZeRO-3)."""
    replicas, zero, m = rows.dp * rows.ep, rows.zero_stage, rows.grad_acc
    shard = parameter_shard(rows, stage)
    group = fabric.group(replicas, rows.tp * rows.cp)
    rs = _ring_time(replicas, shard * work.grad_reduce_bytes, group.bandwidth)
    ag = _ring_time(replicas, shard * DTYPE_BYTES.get(work.dtype, 2), group.bandwidth)
    return GradientSync(reduce=np.select([zero == 0, zero == 3], [2 * rs, m * (rs + ag)], rs),
                        gather=np.select([zero == 0, zero == 3], [0.0, m * ag], ag), group=group)


def dp_latency_steps(rows: Rows, work: Workload, stage: PacingStage) -> np.ndarray:
    """Latency steps of the gradient buckets, which overlap with the backward pass: a term of
    its own."""
    replicas, zero = rows.dp * rows.ep, rows.zero_stage
    buckets = np.ceil(parameter_shard(rows, stage) * work.grad_reduce_bytes / work.bucket_bytes)
    return np.where(replicas > 1, np.where(zero == 3, 3 * rows.grad_acc, 2) * buckets
                    * _steps(replicas), 0.0)


def dp_exposed(rows: Rows, work: Workload, stage: PacingStage, sync: GradientSync,
               prior_compute: float) -> np.ndarray:
    """Only the last micro-batch's backward (2/3 of its compute, at the prior efficiency: the
    `compute` coefficient's prior, `prior_compute`) can hide the gradient reduction; ZeRO's
    parameter gather after the step hides behind nothing."""
    window = ((2 / 3) * rows.tokens(work) * stage.flops / (rows.tp * rows.cp) / work.peak
              * prior_compute)
    return np.maximum(sync.reduce - window, 0.0) + sync.gather


__all__ = ["Collectives", "Fabric", "GradientSync", "Group", "PointToPoint", "dp_exposed",
           "dp_latency_steps", "gradient_sync", "inter_node_bandwidth", "layer_collectives",
           "pipe_tp_sync", "point_to_point"]
