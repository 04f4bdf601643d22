"""A table of runs to fit the throughput model on or replay: runs.parquet or a published CSV.

`sweep calibrate` fits on one, `sweep plan --calibrate-from` calibrates on the sweep's own, and
`sweep replay` replays one. Reading it (with errors that name the file) and taking from it the
completed runs of each of a spec's models, less what the fit leaves out, is one job shared by
those commands, so it lives here rather than in one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from sweep.calibration.throughput_fit import without_fit_exclusions
from sweep.collect.attempts import unreadable_runs
from sweep.core.errors import UserError
from sweep.core.layout import CELL, LAYOUT_COLUMNS_BEYOND_PLAYBOOK, PLAYBOOK_LAYOUT_COLUMNS
from sweep.models.throughput_inputs import MEASURED_INTER_NODE, Workload
from sweep.plan.predictions import model_names_for, workloads_for
from sweep.plan.spec import Spec

INTER_NODE_BUSBW = "AllReduce (GB/s)"  # nanotron's all-reduce test over all of a job's nodes


def measured_inter_node(results: pd.DataFrame) -> pd.Series:
    """Per row of nanotron's results table, the all-reduce bus bandwidth (GB/s) its job measured
    across its nodes before it ran; NaN for one-node jobs (no network) and where it is missing."""
    if INTER_NODE_BUSBW not in results:
        return pd.Series(np.nan, index=results.index)
    return pd.to_numeric(results[INTER_NODE_BUSBW], errors="coerce").where(results.nodes > 1)


def normalise_runs(runs: pd.DataFrame, source: str, workloads: Mapping[str, Workload]
                   ) -> pd.DataFrame:
    """Map a runs table onto (model, nodes, layout, status, tokens_per_s_per_gpu).

    Reads the playbook's charts table, nanotron's results table (which tells OOM apart), and
    runs.parquet (`outcome`: completed, oom, anything else counts as failed)."""
    if {"outcome", "tokens_per_sec_per_gpu", "model"} <= set(runs):  # runs.parquet
        status = runs.outcome.map(lambda o: o if o in ("completed", "oom") else "failed")
        runs = runs.assign(status=status, tokens_per_s_per_gpu=runs.tokens_per_sec_per_gpu)
        runs = runs.assign(gpu_hours_measured=runs.get("gpu_hours", np.nan))
    elif {"model_label", "tokens_per_sec_per_gpu"} <= set(runs):  # playbook charts
        status = runs.status.map({"success": "completed", "failed": "failed"})
        return pd.DataFrame({"model": runs.model_label, "nodes": runs.nodes, "dp": runs.dp,
                             "tp": runs.tp, "pp": runs.pp, "mbs": runs.mbs,
                             "grad_acc": runs.grad_acc, "zero_stage": runs.zero_stage,
                             "status": status, "tokens_per_s_per_gpu": runs.tokens_per_sec_per_gpu})
    elif {"batch_accum", "tok/s/gpu", "hidden_size"} <= set(runs):  # nanotron's results table
        status = runs.status.map({"Success": "completed", "OOM": "oom", "Other": "failed"})
        by_shape = {(w.shape.hidden_size, w.shape.num_layers): name
                    for name, w in workloads.items()}
        model = [by_shape.get((h, n), f"hidden {h}, {n} layers")
                 for h, n in zip(runs.hidden_size, runs.num_layers, strict=True)]
        frame = pd.DataFrame({"model": model,
                              "nodes": runs.nodes, "dp": runs.dp, "tp": runs.tp, "pp": runs.pp,
                              "mbs": runs.mbs, "grad_acc": runs.batch_accum,
                              "zero_stage": runs.zero_stage, "status": status,
                              "tokens_per_s_per_gpu": runs["tok/s/gpu"]})
        if INTER_NODE_BUSBW in runs:
            frame[MEASURED_INTER_NODE] = measured_inter_node(runs)
        return frame
    needed = {*CELL, *PLAYBOOK_LAYOUT_COLUMNS, "status", "tokens_per_s_per_gpu"}
    missing = sorted(needed - set(runs))
    if missing:
        raise ValueError(f"{source}: not a playbook table nor a runs table: lacks column(s) "
                         f"{missing}")
    extra = [c for c in (*LAYOUT_COLUMNS_BEYOND_PLAYBOOK, "gpu_hours_measured",
                         MEASURED_INTER_NODE) if c in runs]
    return runs[sorted(needed) + extra].copy()


def read_runs_frame(path: Path) -> pd.DataFrame:
    """A runs table from parquet or CSV, or a UserError that names the file."""
    if not path.is_file():
        raise UserError(f"{path}: no such file; give runs.parquet or a runs CSV")
    if path.suffix == ".parquet":
        try:
            return pd.read_parquet(path)
        except (OSError, ValueError) as error:
            raise UserError(unreadable_runs(path, error)) from None
    try:
        return pd.read_csv(path, comment=None)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read it as {path.suffix.lstrip('.') or 'CSV'}: "
                        f"{error}") from None


def completed_groups(path: Path, spec: Spec, on_left_out: Callable[[str], None] | None = None
                     ) -> list[tuple[str, pd.DataFrame, Workload]]:
    """(model name, completed runs, workload) per spec model that has runs in the table.
    `on_left_out` is told, one line per reason, how many runs the fit leaves out
    (`sweep.calibration.throughput_fit.without_fit_exclusions`), as soon as they are counted."""
    workloads = workloads_for(spec)
    table = read_runs_frame(path)
    table, left_out = without_fit_exclusions(table)  # the charts table flags neither
    for reason, count in left_out.items():
        if on_left_out is not None:
            on_left_out(f"left out {count} {reason}")
    try:
        rows = normalise_runs(table, str(path), workloads)
    except ValueError as error:
        raise UserError(str(error)) from None
    names = model_names_for(spec, sorted(set(rows.model.astype(str))))
    if not names:
        raise UserError(f"{path}: none of its models ({', '.join(sorted(set(rows.model)))}) is "
                        f"a model of {spec.name}; list them under `models:` in the spec")
    rows = rows.assign(model=rows.model.astype(str).map(names))
    rows = rows[rows.model.notna() & (rows.status == "completed")
                & (rows.tokens_per_s_per_gpu > 0)]
    return [(name, group, workloads[name]) for name, group in rows.groupby("model")]
