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

Bandwidth of a group: the catalog's NVLink figure inside one node; across nodes, the network
link per GPU (or the one the run's job measured, `MEASURED_INTER_NODE`) divided by (nodes
spanned / the job's nodes)^inter_scaling (sweep.models.communication_time says how). The
congestion factor nodes^inter_scaling, over the job's nodes, multiplies inter-node latency.

The features come from small pure functions, each named for its term, of the plan rows' layouts
(`Rows`, sweep.models.throughput_inputs), the stage that paces their pipeline
(sweep.models.pacing_stage: ``compute``, ``memory_traffic``, ``layer_passes``, ``optimizer``) and
the links their collectives use (sweep.models.communication_time: the ``*_comm``, latency,
``dp_exposed`` and ``pipe_tp_sync`` terms); `features` lays them out in FEATURES order.

Pure: no I/O. Coefficients are fitted by `sweep.calibration.throughput_fit`; how well the model predicts, in
sample and on a model it was not fitted on, is measured by `sweep calibrate`, `sweep replay --cv
model` and the benchmarks, and reported in docs/search.md ("Sweep economy").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Final

import numpy as np
import pandas as pd

from sweep.models.communication_time import (
    Fabric,
    dp_exposed,
    dp_latency_steps,
    gradient_sync,
    inter_node_bandwidth,
    layer_collectives,
    pipe_tp_sync,
    point_to_point,
)
from sweep.models.flops import flops_per_token
from sweep.models.pacing_stage import (
    compute,
    layer_passes,
    memory_bound_bytes,
    memory_traffic,
    optimizer,
    pacing_stage,
)
from sweep.models.throughput_inputs import Rows, Workload, column_or_default

FEATURES: Final = ("compute", "layer_passes", "layer_comm", "layer_comm_inter", "dp_comm",
                   "dp_comm_inter", "pp_comm", "latency", "latency_inter", "p2p_inter",
                   "dp_latency", "dp_exposed", "slot_sync", "optimizer", "step_overhead",
                   "pipe_tp_sync", "memory_traffic")


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
    # Not linear: inter-node bandwidth per GPU scales as (nodes spanned / job nodes)^-inter_scaling.
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


# ---------------------------------------------------------------- the feature matrix

def features(frame: pd.DataFrame, work: Workload, inter_scaling: float = 0.0) -> pd.DataFrame:
    """The feature matrix (one row per plan row, columns FEATURES)."""
    rows = Rows.of(frame)
    nodes = np.maximum(1.0, world_size(frame) / work.gpus_per_node)
    fabric = Fabric(work, inter_scaling, inter_node_bandwidth(frame, work, nodes))
    traffic = memory_bound_bytes(work, rows.recompute)
    # The busiest stage and the exposed DP window are judged at the prior GEMM efficiency, so
    # that the features stay linear in the fitted coefficients.
    stage = pacing_stage(rows, work, traffic, Coefficients.compute)
    passes = layer_passes(rows, work, stage)
    layer = layer_collectives(rows, work, fabric)
    p2p = point_to_point(rows, work, fabric)
    sync = gradient_sync(rows, work, fabric, stage)
    dp_intra, dp_inter = sync.group.split(sync.reduce + sync.gather)
    # Latency: ring hops of every collective; inter-node hops slow down with scale like bandwidth.
    congestion = nodes ** inter_scaling
    columns = {
        "compute": compute(rows, work, stage), "layer_passes": passes,
        "layer_comm": passes * layer.intra, "layer_comm_inter": passes * layer.inter,
        "dp_comm": dp_intra, "dp_comm_inter": dp_inter, "pp_comm": p2p.seconds,
        "latency": passes * layer.hops_intra + p2p.hops_intra,
        "latency_inter": passes * layer.hops_inter * congestion,
        "p2p_inter": p2p.hops_inter * congestion,
        "dp_latency": (dp_latency_steps(rows, work, stage)
                       * np.where(sync.group.inter, congestion, 1.0)),
        "dp_exposed": dp_exposed(rows, work, stage, sync, Coefficients.compute),
        "slot_sync": rows.slots * (nodes - 1.0),
        "optimizer": optimizer(rows, stage), "step_overhead": np.ones_like(rows.tp),
        "pipe_tp_sync": pipe_tp_sync(rows, stage),
        "memory_traffic": memory_traffic(rows, work, stage, traffic),
    }
    return pd.DataFrame({k: np.asarray(v, dtype=float) for k, v in columns.items()},
                        index=frame.index)


def tokens_per_step(frame: pd.DataFrame, work: Workload) -> np.ndarray:
    dp, mbs, m = (frame[c].to_numpy(dtype=float) for c in ("dp", "mbs", "grad_acc"))
    return dp * column_or_default(frame, "ep", 1).astype(float) * mbs * m * work.seq_len


def world_size(frame: pd.DataFrame) -> np.ndarray:
    size = frame["dp"].to_numpy(dtype=float) * frame["tp"].to_numpy(dtype=float)
    size = size * frame["pp"].to_numpy(dtype=float)
    return size * column_or_default(frame, "cp", 1).astype(float) * column_or_default(frame, "ep", 1).astype(float)


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


__all__ = ["Coefficients", "FEATURES", "GPU_STREAM", "HOST_FLOOR", "features",
           "predict", "predict_step", "step_time", "tokens_per_step", "world_size"]
