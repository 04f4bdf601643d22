"""A published sweep as a replay: its table normalised to candidates and outcomes, so that
`sweep.search.strategies.search` can run on it with the table as the oracle (`sweep replay`,
`sweep calibrate`, and the leave-one-model-out of `sweep.validation.cross_validation`).

Pure: tables in, tables out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sweep.calibration.runs_table import normalise_runs
from sweep.core.layout import CELL, LAYOUT_COLUMNS_BEYOND_PLAYBOOK, PLAYBOOK_LAYOUT_COLUMNS
from sweep.models.throughput import tokens_per_step
from sweep.models.throughput_inputs import Workload


@dataclass(frozen=True)
class Replay:
    """A published sweep as an oracle: unique candidates, their first published outcome."""

    candidates: pd.DataFrame
    outcomes: pd.DataFrame
    published_runs: int
    published_gpu_hours: float
    # model → (published runs, their GPU-hours), repeats included: what a replay of one model
    # alone is measured against.
    by_model: Mapping[str, tuple[int, float]] = field(default_factory=dict)

    def only(self, models: set[str]) -> Replay:
        """The replay of some models alone (the others' runs unseen)."""
        keep = self.candidates.model.astype(str).isin(models).to_numpy()
        runs = sum(self.by_model[m][0] for m in models if m in self.by_model)
        hours = sum(self.by_model[m][1] for m in models if m in self.by_model)
        return Replay(self.candidates[keep], self.outcomes[keep], runs, float(hours),
                      {m: v for m, v in self.by_model.items() if m in models})


def replay_table(runs: pd.DataFrame, source: str, model_names: Mapping[str, str],
                 workloads: Mapping[str, Workload], steps: int, startup_s: float) -> Replay:
    """Candidates and outcomes of a published sweep.

    `model_names` maps the table's model labels to workload names. A run's GPU-hours are its GPUs
    times (startup + steps × step time); a failed run is charged startup plus one step at its
    cell's median completed step time (it dies at its first step).
    """
    rows = normalise_runs(runs, source, workloads)
    model_names = {**{name: name for name in workloads}, **model_names}
    unknown = sorted(set(rows.model.astype(str)) - set(model_names))
    if unknown:
        raise ValueError(f"{source}: model label(s) {unknown} are not in the spec's models "
                         f"({', '.join(sorted(model_names))})")
    bad = rows.status.isna()
    if bad.any():
        raise ValueError(f"{source}: row {int(np.flatnonzero(bad)[0]) + 2}: unknown status")
    rows["model"] = rows.model.astype(str).map(dict(model_names))
    for col in ("nodes", *PLAYBOOK_LAYOUT_COLUMNS):
        rows[col] = rows[col].astype(int)
    rows.loc[rows.status != "completed", "tokens_per_s_per_gpu"] = np.nan
    gpus = (rows.dp * rows.tp * rows.pp * rows.get("cp", 1) * rows.get("ep", 1)).to_numpy(float)
    tokens = pd.concat([pd.Series(tokens_per_step(g, workloads[m]), index=g.index)
                        for m, g in rows.groupby("model")]).reindex(rows.index)
    step = tokens / (rows.tokens_per_s_per_gpu * gpus)
    cell_step = step.groupby([rows.model, rows.nodes]).transform("median").fillna(0.0)
    seconds = np.where(rows.status == "completed", startup_s + steps * step, startup_s + cell_step)
    rows["gpu_hours"] = gpus * seconds / 3600.0
    if "gpu_hours_measured" in rows:  # a collected sweep knows what each run really cost
        measured = pd.to_numeric(rows.gpu_hours_measured, errors="coerce")
        rows["gpu_hours"] = measured.where(np.isfinite(measured), rows.gpu_hours)
    layout = [*CELL, *PLAYBOOK_LAYOUT_COLUMNS]
    layout += [c for c in LAYOUT_COLUMNS_BEYOND_PLAYBOOK if c in rows]
    unique = rows.drop_duplicates(layout).reset_index(drop=True)
    per_model = rows.groupby("model").gpu_hours.agg(["size", "sum"])
    by_model = {str(m): (int(r["size"]), float(r["sum"])) for m, r in per_model.iterrows()}
    return Replay(unique[layout], unique[["status", "tokens_per_s_per_gpu", "gpu_hours"]],
                  len(rows), float(rows.gpu_hours.sum()), by_model)


__all__ = ["Replay", "normalise_runs", "replay_table"]
