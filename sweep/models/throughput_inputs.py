"""The throughput model's inputs: what every plan row of one (model, hardware) group shares
(`Workload`: the model's shape, the GPU and its links, the framework's precision, pipeline split and
kernels) and each row's layout as arrays (`Rows`), read once from the plan's table.

The model (sweep.models.throughput) and the terms it sums (sweep.models.communication_time,
sweep.models.pacing_stage) all read these two, so they sit below all three. A layout column the
table leaves out takes its default (cp = ep = vpp = 1, sequence parallelism on, no recomputation).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from sweep.core.hardware import GpuSpec
from sweep.core.layout import PLAYBOOK_LAYOUT_COLUMNS
from sweep.core.model import ModelShape
from sweep.models.flops import DEFAULT_CONVENTION
from sweep.models.traffic import FUSED, Traffic

# Optional column: the all-reduce bus bandwidth (GB/s) a run's job measured across its nodes.
MEASURED_INTER_NODE: Final = "inter_node_busbw_GBps"


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


def column_or_default(frame: pd.DataFrame, name: str, default: float | str | bool) -> np.ndarray:
    """A column of the plan rows, or `default` for every row where the table leaves it out."""
    if name in frame:
        return frame[name].to_numpy()
    return np.full(len(frame), default)


@dataclass(frozen=True, eq=False)
class Rows:
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
    def of(cls, frame: pd.DataFrame) -> Rows:
        missing = [c for c in PLAYBOOK_LAYOUT_COLUMNS if c not in frame]  # the others default
        if missing:
            raise ValueError(f"throughput model: plan rows lack column(s) {missing}")
        dp, tp, pp, mbs, grad_acc = (frame[c].to_numpy(dtype=float)
                                     for c in ("dp", "tp", "pp", "mbs", "grad_acc"))
        return cls(dp, tp, pp, mbs, grad_acc, frame["zero_stage"].to_numpy(dtype=int),
                   cp=column_or_default(frame, "cp", 1).astype(float),
                   ep=column_or_default(frame, "ep", 1).astype(float),
                   sp=column_or_default(frame, "sp", True).astype(bool),
                   vpp=column_or_default(frame, "vpp", 1).astype(float),
                   recompute=column_or_default(frame, "recompute", "none").astype(str))

    def tokens(self, work: Workload) -> np.ndarray:
        """Tokens of one micro-batch (all CP ranks together)."""
        return self.mbs * work.seq_len

    @property
    def slots(self) -> np.ndarray:
        """Micro-batch slots of the busiest stage, the pipeline's bubble included."""
        return self.grad_acc + (self.pp - 1) / self.vpp


__all__ = ["MEASURED_INTER_NODE", "Rows", "Workload", "column_or_default"]
