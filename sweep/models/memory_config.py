"""A training configuration as the memory model's terms read it: one row per layout, vectorised.

`MemoryConfig` holds what every row shares (the model, the framework's memory profile, the sequence
length, the activation dtype) and the rows' layouts (`Layouts`: each parallelism degree and count as
float64 columns, one mask per recompute mode and pipeline schedule). Its properties are the per-rank
quantities that several terms derive alike, so that they agree: the tokens of one micro-batch on a
rank (CP splits the sequence), how many ways SP, TP and EP cut the activations and the expert
weights, and the embedding's or the LM head's share of the vocabulary matrix.

`fsdp_reduction_deferred` is here for the same reason: both the gradients a rank holds and what a
chunked loss keeps of the LM head's gradient depend on whether FSDP's reduce-scatter waits for the
step's last micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from sweep.core.layout import LAYOUT_INT_COLUMNS
from sweep.core.model import ModelShape
from sweep.models.memory_profiles import MemoryProfile

__all__ = ["Layouts", "MemoryConfig", "fsdp_reduction_deferred"]


@dataclass(frozen=True, eq=False)
class Layouts:
    """The rows' layouts: each count as float64 (`LAYOUT_INT_COLUMNS`), sp as booleans, and one
    boolean mask per recompute mode and pipeline schedule (the memory model checks the columns
    and makes them)."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    mbs: np.ndarray
    grad_acc: np.ndarray
    zero_stage: np.ndarray
    vpp: np.ndarray
    sp: np.ndarray
    modes: Mapping[str, np.ndarray]

    @classmethod
    def of(cls, columns: Mapping[str, np.ndarray], modes: Mapping[str, np.ndarray]) -> Layouts:
        counts = {k: np.asarray(columns[k], dtype=np.float64) for k in LAYOUT_INT_COLUMNS}
        return cls(**counts, sp=np.asarray(columns["sp"], dtype=bool), modes=modes)

    @cached_property
    def single_stage(self) -> np.ndarray:
        return self.pp == 1


@dataclass(frozen=True, eq=False)
class MemoryConfig:
    """One training configuration per row: what every row shares, and the rows' layouts."""

    model: ModelShape
    prof: MemoryProfile
    seq_len: int
    activation_bytes: float  # per activation element, by the run's dtype
    full_precision: bool  # fp32/tf32: the weights are the master copy, autocast casts nothing
    layouts: Layouts

    @cached_property
    def tokens(self) -> np.ndarray:
        """Tokens of one micro-batch on one rank: CP splits the sequence."""
        return self.layouts.mbs * self.seq_len / self.layouts.cp

    @cached_property
    def sequence_shards(self) -> np.ndarray:
        """How many ways the norm and linear inputs are sharded: SP shards them over TP."""
        return np.where(self.layouts.sp, self.layouts.tp, 1.0)

    @cached_property
    def expert_tp(self) -> np.ndarray | float:
        """How many ways TP shards each expert's weights: tp, or 1 where the profile keeps every
        expert whole on each TP rank (`MemoryProfile.experts_shard_over_tp`), or where EP is on
        and the profile's TP shards experts only without it (`expert_tp_only_without_ep`)."""
        if self.prof.experts_shard_over_tp and self.prof.expert_tp_only_without_ep:
            return np.where(self.layouts.ep > 1, 1.0, self.layouts.tp)
        return self.layouts.tp if self.prof.experts_shard_over_tp else 1.0

    @cached_property
    def mlp_shards(self) -> np.ndarray:
        """How many ways a rank's share of the MLP activations is cut: TP shards the FFN width,
        or, for experts kept whole on each TP rank, each rank runs them on the tokens it holds
        (SP's share of the sequence, or all of it)."""
        whole_experts = self.model.is_moe and not self.prof.experts_shard_over_tp
        return self.sequence_shards if whole_experts else self.layouts.tp

    @cached_property
    def vocabulary_matrix(self) -> np.ndarray:
        """The embedding's or the LM head's parameters on one rank (TP shards the vocabulary)."""
        return float(self.model.vocab_size) * float(self.model.hidden_size) / self.layouts.tp

    @property
    def residual_bytes(self) -> float:
        """Bytes per element of the residual stream: what the norms save, the layer input."""
        return max(self.prof.residual_bytes, self.activation_bytes)

    def in_weight_dtype(self, nbytes: float) -> float:
        """Bytes per parameter of a buffer kept in the weights' dtype: fp32 in fp32 runs."""
        return max(nbytes, 4.0) if self.full_precision and nbytes else nbytes


def fsdp_reduction_deferred(prof: MemoryProfile, zero_stage: ArrayLike, pp: ArrayLike,
                            grad_acc: ArrayLike) -> np.ndarray:
    """Where FSDP's reduce-scatter waits for the step's last micro-batch, so that a rank holds
    whole gradients until then, not its 1/(dp·cp) shard of them
    (`MemoryProfile.pipeline_defers_fsdp_reduction`, `grad_acc_defers_fsdp_reduction`)."""
    zero, stages, micro = (np.asarray(x, dtype=np.float64) for x in (zero_stage, pp, grad_acc))
    return (zero >= 2) & (((stages > 1) & prof.pipeline_defers_fsdp_reduction)
                          | ((micro > 1) & prof.grad_acc_defers_fsdp_reduction))
