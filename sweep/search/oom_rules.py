"""What an observed OOM rules out, told apart as a proof or a heuristic (`sweep.search.strategies`'s
searches skip by it).

The proof (``pruned:oom_monotonic``) compares a candidate only with a run of the same cell,
parallel layout and schedule, through settings that can only add memory when they grow
(`memory_order`). Comparing *different* layouts needs a memory model, and the proxy here
(`memory_components`) is not exact: replaying nanotron's results table it skipped 22 runs that
completed (high TP shards less of the activations than it assumes), so that rule is a heuristic
(``heuristic:oom_dominated``), off unless asked for. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

from sweep.core.layout import CELL, MEMORY_SAVINGS, PARALLEL_DEGREES, PIPELINE_SCHEDULE
from sweep.models.throughput_inputs import Workload

# A layout apart from its micro-batching (the split of the global batch) and its pipeline schedule.
LAYOUT_KEY: Final = (*PARALLEL_DEGREES, *MEMORY_SAVINGS)
# What the OOM proof holds fixed: the parallel degrees and the schedule. Everything else a
# candidate may differ in (its micro-batching and memory savings) has a memory order
# (`memory_order`).
PROOF_BASE: Final = (*PARALLEL_DEGREES, *PIPELINE_SCHEDULE)
PROOF: Final = "pruned:"  # a skip that an OOM proves
HEURISTIC: Final = "heuristic:"  # a skip that a proxy or a guess suggests
# The planner's per-component estimate (`sweep.models.memory`), when the candidates carry it.
PLANNER_MEMORY: Final = tuple(f"mem_{c}_bytes" for c in ("weights", "gradients", "optimizer",
                                                         "activations", "logits"))


def joined_key(frame: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """Per row, the string values of `columns` joined by "|": one hashable key per row.

    Built column by column, not with a row-wise ``agg("|".join, axis=1)``, which builds a Series
    per row: over a 13,000-candidate plan that was a second per call, and a replay calls it for
    every search it runs."""
    if not columns:
        raise ValueError("a key needs at least one column")
    key = frame[columns[0]].astype(str)
    for column in columns[1:]:
        key = key + "|" + frame[column].astype(str)
    return key


def cell_keys(frame: pd.DataFrame) -> pd.Series:
    """Per candidate, its cell as one key: "model|nodes"."""
    return joined_key(frame, CELL)


def memory_components(frame: pd.DataFrame, work: Workload) -> pd.DataFrame:
    """Per-GPU memory by component, in relative units, for the dominance rule.

    Uses the planner's `mem_<component>_bytes` columns when present; otherwise monotone proxies:
    model states (weights + fp32 gradients + Adam, ZeRO-sharded), activations in flight on the
    first stage, and logits on the last. Only their ordering matters: "needs more on every
    component".
    """
    if all(c in frame for c in PLANNER_MEMORY):
        return frame[list(PLANNER_MEMORY)].astype(float)
    shape, s = work.shape, work.seq_len
    dp, tp, pp, mbs, m = (frame[c].to_numpy(float) for c in ("dp", "tp", "pp", "mbs", "grad_acc"))
    cp = frame["cp"].to_numpy(float) if "cp" in frame else np.ones(len(frame))
    zero = frame["zero_stage"].to_numpy(int)
    layers = np.ceil(shape.num_layers / pp)
    per_layer = 12 * shape.hidden_size**2 + 3 * shape.hidden_size * shape.ffn_hidden_size
    params = (layers * per_layer + shape.vocab_size * shape.hidden_size) / tp
    states = params * (2 + np.where(zero >= 2, 4 / dp, 4) + np.where(zero >= 1, 12 / dp, 12))
    in_flight = np.minimum(pp, m)
    activations = mbs * s / cp * shape.hidden_size * layers * in_flight / tp
    logits = mbs * s / cp * shape.vocab_size / tp
    return pd.DataFrame({"mem_states": states, "mem_activations": activations,
                         "mem_logits": logits}, index=frame.index)


def layout_keys(frame: pd.DataFrame) -> pd.Series:
    """Per candidate, its cell and layout apart from the micro-batch split (`LAYOUT_KEY`)."""
    cols = [c for c in LAYOUT_KEY if c in frame]
    return joined_key(frame, [*CELL, *cols])


# Least memory first: recomputing more keeps fewer activations; sequence parallelism shards what
# TP alone replicates (norms, dropout); a higher ZeRO stage shards more states.
RECOMPUTE_MEMORY: Final = {"full": 0, "selective": 1, "none": 2}


def memory_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Per candidate, the settings that can only add memory when they grow, all other things
    equal: micro-batch size, sequences in flight on the first pipeline stage (min(pp, m)·mbs
    under 1F1B; a table may hold runs of another global batch), −ZeRO stage, less
    recomputation, sequence parallelism off."""
    n = len(frame)
    recompute = frame["recompute"].astype(str) if "recompute" in frame else pd.Series(
        "none", index=frame.index)
    sp = frame["sp"].astype(bool) if "sp" in frame else pd.Series(True, index=frame.index)
    return pd.DataFrame({
        "mbs": frame["mbs"].to_numpy(float),
        "in_flight": (np.minimum(frame["pp"].to_numpy(float), frame["grad_acc"].to_numpy(float))
                      * frame["mbs"].to_numpy(float)),
        "zero": -frame["zero_stage"].to_numpy(float),
        "recompute": recompute.map(RECOMPUTE_MEMORY).fillna(2).to_numpy(float),
        "no_sp": (~sp).to_numpy(float) if n else np.zeros(0),
    }, index=frame.index)


class OomRules:
    """Skip what an observed OOM rules out.

    The proof (``pruned:oom_monotonic``): same cell, same dp, tp, pp, cp, ep and schedule, and at
    least as much of every setting in `memory_order`. Per GPU, weights, gradients and optimizer
    states then stay or grow (ZeRO shards less), and so do activations: a micro-batch holds more
    sequences and the first stage at least as many in flight (min(pp, m)·mbs, also compared, as
    a table may mix global batches). Tested against every shared table's real outcomes, not
    against a model of them. The heuristic (``heuristic:oom_dominated``, only with `dominance`):
    another layout of the cell that the memory proxy says needs more on every component.
    """

    def __init__(self, candidates: pd.DataFrame, memory: pd.DataFrame,
                 dominance: bool = False) -> None:
        base = [c for c in PROOF_BASE if c in candidates]
        self.base = joined_key(candidates, [*CELL, *base])
        self.order = memory_order(candidates)
        self.mbs = candidates["mbs"]
        self.cells = cell_keys(candidates)
        self.memory = memory
        self.dominance = dominance

    def skipped_by(self, oom: int, untried: pd.Index, proof: bool = True) -> dict[int, str]:
        """Untried candidates that candidate `oom` (an OOM, or with `proof` false a failure
        treated as one) rules out, with the reason."""
        out: dict[int, str] = {}
        prefix = PROOF if proof else HEURISTIC
        what = "OOMed" if proof else "failed (taken for an OOM)"
        same = untried[(self.base[untried] == self.base[oom]).to_numpy()]
        if len(same):
            more = (self.order.loc[same] >= self.order.loc[oom].to_numpy()).all(axis=1)
            for c in same[more.to_numpy()]:
                out[int(c)] = (f"{prefix}oom_monotonic (run {oom} {what} at mbs "
                               f"{self.mbs[oom]}; same layout, no less memory)")
        if not self.dominance:
            return out
        cell = untried[(self.cells[untried] == self.cells[oom]).to_numpy()]
        if len(cell):
            dominated = (self.memory.loc[cell] >= self.memory.loc[oom].to_numpy()).all(axis=1)
            for c in cell[dominated.to_numpy()]:
                out.setdefault(int(c), f"{HEURISTIC}oom_dominated (the memory proxy says it "
                                       f"needs more than run {oom} on every component)")
        return out


__all__ = ["CELL", "HEURISTIC", "LAYOUT_KEY", "PLANNER_MEMORY", "PROOF", "PROOF_BASE",
           "OomRules", "cell_keys", "joined_key", "layout_keys", "memory_components", "memory_order"]
