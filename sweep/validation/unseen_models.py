"""The throughput model on model sizes no fit has seen: the playbook heatmap's winning runs.

The shipped prior (`sweep/models/fitted_throughput.py`) is fitted on nanotron's 1B and 8B runs, and
leave-one-model-out (`sweep replay --cv model`) can only trade one of those two for the other.
The playbook's best-configuration heatmap also publishes the 3B and 80B models: for each
(model, nodes) cell, the layout that won and its MFU. Those two models are in no table any
constant was fitted on, and the 80B is ten times the largest that was, so their cells are the
closest thing in the reference data to a user's new model: `score` predicts each winner with
given coefficients, compares, and says where the plan ranks it in its cell (`pred_rank`, the
order the shortlist search runs candidates in).

The heatmap reports MFU, not throughput. It is turned back into tokens/s/GPU on the playbook's own
FLOPs basis (`playbook_flops_per_token`): 6N + 12·L·h·s (`sweep.models.flops`' ``full_attention``), where
the tied-embedding models' pipeline runs (pp > 1) count the vocabulary matrix twice, which is how
the reference data's README explains their 16.7 % (1B) and 9.5 % (3B) higher implied FLOPs. On
nanotron's 1B/8B table the formula matches every successful run's implied FLOPs per token
(MFU × 989.5e12 / tokens/s/GPU) within 0.2 % (tests/validation/test_unseen_models.py).

Each cell is one published run: the figures are per cell, no averaging over steps beyond what
the playbook averaged. The 64-node cells ran on the degraded fabric that `sweep.models.throughput`
describes (their inter-node bandwidth is not in the heatmap), so they are reported apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from sweep.core.layout import PLAYBOOK_LAYOUT_COLUMNS
from sweep.core.model import ModelShape
from sweep.models.flops import flops_per_token
from sweep.models.throughput import Coefficients, predict
from sweep.plan import space
from sweep.plan.predictions import model_names_for, with_predictions, workloads_for
from sweep.plan.spec import Spec

HEATMAP_FILE: Final = "playbook_best_configs_heatmap.csv"
PLAYBOOK_PEAK: Final = 989.5e12  # the dense BF16 peak the playbook divides by
LAYOUT: Final = PLAYBOOK_LAYOUT_COLUMNS  # the heatmap's layout columns


def playbook_flops_per_token(shape: ModelShape, seq_len: int, pp: np.ndarray) -> np.ndarray:
    """FLOPs per token behind the playbook's MFU: ``full_attention``, plus the vocabulary matrix
    a second time in pipeline runs of a tied-embedding model (each end stage holds a copy)."""
    base = flops_per_token(shape, seq_len, "full_attention")
    twice = 6.0 * shape.vocab_size * shape.hidden_size if shape.tie_word_embeddings else 0.0
    return base + np.where(np.asarray(pp) > 1, twice, 0.0)


def score(heatmap: pd.DataFrame, source: str | Path, spec: Spec,
          coefficients: Coefficients) -> pd.DataFrame:
    """One row per non-empty heatmap cell of the spec's models: the layout, the measured and
    predicted tokens/s/GPU, predicted / measured − 1 (`rel_error`), and the winner in the spec's
    plan: `plan_status` (kept, pruned, or absent when the spec does not enumerate it) and
    `pred_rank` (1: the cell's fastest predicted; missing unless kept). `inflated_mfu`: the
    winner is a pipeline run of a tied-embedding model, picked by an MFU that counts the
    vocabulary twice; a pp = 1 run may have had more tokens/s/GPU (the reference data's README
    names seven such cells), so its rank says nothing about finding the fastest run."""
    missing = sorted({"model_label", "nodes", "mfu_pct", *LAYOUT} - set(heatmap))
    if missing:
        raise ValueError(f"{source}: not the playbook's heatmap table: lacks column(s) {missing}")
    cells = heatmap.dropna(subset=["dp", "mfu_pct"])
    names = model_names_for(spec, sorted(set(cells.model_label.astype(str))))
    workloads = workloads_for(spec)
    out = []
    for label, group in cells.groupby(cells.model_label.astype(str)):
        if label not in names:
            continue
        work = workloads[names[label]]
        layout = group[list(LAYOUT)].astype(int).reset_index(drop=True)
        fpt = playbook_flops_per_token(work.shape, work.seq_len, layout.pp.to_numpy())
        measured = group.mfu_pct.to_numpy(float) / 100.0 * PLAYBOOK_PEAK / fpt
        predicted = predict(layout, work, coefficients)["pred_tokens_per_s_per_gpu"].to_numpy()
        out.append(layout.assign(model=names[label], nodes=group.nodes.astype(int).to_numpy(),
                                 measured=measured, predicted=predicted,
                                 rel_error=predicted / measured - 1.0))
    if not out:
        raise ValueError(f"{source}: no cell of the spec's models "
                         f"({', '.join(m.name for m in spec.model_shapes)})")
    frame = pd.concat(out, ignore_index=True)
    plan = with_predictions(space.plan(spec), spec, coefficients)
    keys = ["model", "nodes", *LAYOUT]
    # the playbook's settings: no CP or EP, no recomputation, SP with TP, 1F1B (the ranks are
    # still among every candidate of the cell, whatever the spec's other axes hold)
    ran = (plan.cp.eq(1) & plan.ep.eq(1) & plan.recompute.eq("none") & plan.vpp.eq(1)
           & plan.pp_schedule.eq("1f1b") & (plan.sp.astype(bool) == (plan.tp > 1)))
    plan = plan[ran][[*keys, "status", "pred_rank"]]
    if plan.duplicated(keys).any():
        raise ValueError(f"{source}: the spec plans one heatmap layout more than once")
    frame = frame.merge(plan.astype({k: "int64" for k in keys[1:]}), on=keys, how="left")
    frame = frame.rename(columns={"status": "plan_status"}).fillna({"plan_status": "absent"})
    tied = frame.model.map({m.name: m.tie_word_embeddings for m in spec.model_shapes})
    frame["inflated_mfu"] = tied.astype(bool) & (frame.pp > 1)
    return frame[[*keys, "measured", "predicted", "rel_error", "plan_status", "pred_rank",
                  "inflated_mfu"]]


def summary(scored: pd.DataFrame, exclude_nodes: tuple[int, ...] = (64,)) -> pd.DataFrame:
    """Per model: cells, median and largest |error|, median signed error, over the cells outside
    `exclude_nodes` (the degraded-fabric 64-node cells by default)."""
    kept = scored[~scored.nodes.isin(exclude_nodes)]
    error = kept.rel_error.abs()
    return pd.DataFrame({"cells": kept.groupby("model").size(),
                         "median_abs_error": error.groupby(kept.model).median(),
                         "max_abs_error": error.groupby(kept.model).max(),
                         "median_signed_error": kept.rel_error.groupby(kept.model).median()})


__all__ = ["HEATMAP_FILE", "PLAYBOOK_PEAK", "playbook_flops_per_token", "score", "summary"]
