"""What a search did and what it found, per (model, nodes) cell: the progress a live report
shows (`progress`, without knowing the answer), and the score of a replay against the whole
published sweep (`score`: runs and GPU-hours spent, cells found within a tolerance of their
best, skips that were proofs or heuristics and how many of each had completed). Pure."""

from __future__ import annotations

import pandas as pd

from sweep.search.oom_rules import CELL, HEURISTIC, PROOF, cell_keys
from sweep.search.strategies import Search


def cell_order(frame: pd.DataFrame) -> list[str]:
    """Cell keys by model, then nodes as numbers (not as text: 2 before 16)."""
    cells = frame[list(CELL)].drop_duplicates()
    cells = cells.assign(_m=cells.model.astype(str)).sort_values(["_m", "nodes"])
    return list(cell_keys(cells))


def progress(result: Search, candidates: pd.DataFrame) -> pd.DataFrame:
    """Per-cell progress of a search, without knowing the answer (what a live report shows):
    candidates, runs launched / completed / failed, skipped by rule, best tokens/s/GPU so far,
    rounds, and (adaptive) the round the cell closed, its regret bound then (1 − best / the
    highest optimistic throughput left untried; 0 once nothing is left) and the launches the
    floor forced."""
    cells = cell_keys(candidates)
    launched = result.launched.assign(cell=cells[result.launched.candidate].to_numpy())
    skipped = result.skipped.assign(cell=cells[result.skipped.candidate].to_numpy(),
                                    rule=result.skipped.reason.str.replace(r" \(.*", "",
                                                                           regex=True))
    table = pd.DataFrame({"candidates": cells.groupby(cells).size()}).reindex(
        cell_order(candidates))
    by = launched.groupby("cell")
    table["launched"] = by.size()
    table["completed"] = by.status.apply(lambda s: int((s == "completed").sum()))
    table["failed"] = table.launched - table.completed
    table["best_tokens_per_s_per_gpu"] = launched[launched.status == "completed"].groupby(
        "cell").tokens_per_s_per_gpu.max()
    table["rounds"] = by["round"].max()
    table["closed_at_round"] = pd.Series(result.closed_at, dtype="float64")
    table["regret_bound_at_close"] = pd.Series(result.regret_bound, dtype="float64")
    table["forced_by_floor"] = pd.Series(result.forced, dtype="float64")
    if len(skipped):
        table = table.join(skipped.groupby(["cell", "rule"]).size().unstack(fill_value=0)
                           .add_prefix("skipped:"))
    counts = [c for c in table if c in ("launched", "completed", "failed", "forced_by_floor")
              or c.startswith("skipped:")]
    table[counts] = table[counts].fillna(0).astype(int)
    return table


def score(result: Search, outcomes: pd.DataFrame, candidates: pd.DataFrame,
          published_runs: int, published_gpu_hours: float, tolerance: float = 0.02
          ) -> tuple[dict[str, float], pd.DataFrame]:
    """Headline figures against the whole published sweep, and the per-cell progress table."""
    cells = cell_keys(candidates)
    ok = outcomes[outcomes.status == "completed"]
    truth = ok.tokens_per_s_per_gpu.groupby(cells[ok.index]).max()
    launched = result.launched.assign(cell=cells[result.launched.candidate].to_numpy())
    found = launched[launched.status == "completed"].groupby("cell").tokens_per_s_per_gpu.max()
    truth = truth.reindex([c for c in cell_order(candidates) if c in truth.index])
    table = pd.DataFrame({"best": truth, "found": found.reindex(truth.index)})
    table["regret"] = 1 - table.found.fillna(0) / table.best
    table["within"] = table.regret <= tolerance
    table["launched"] = launched.groupby("cell").size().reindex(truth.index).fillna(0).astype(int)
    table["candidates"] = cells.groupby(cells).size().reindex(truth.index)
    table["rounds"] = launched.groupby("cell")["round"].max().reindex(truth.index)
    table["gpu_hours"] = launched.groupby("cell").gpu_hours.sum().reindex(truth.index)
    table["forced_by_floor"] = pd.Series(result.forced, dtype="float64").reindex(
        truth.index).fillna(0).astype(int)
    table["regret_bound_at_close"] = pd.Series(result.regret_bound, dtype="float64").reindex(
        truth.index)
    reasons = result.skipped.reason
    completed = outcomes.status.reindex(result.skipped.candidate).to_numpy() == "completed"
    proofs, guesses = reasons.str.startswith(PROOF), reasons.str.startswith(HEURISTIC)
    forced = float(sum(result.forced.values()))
    headline = {
        "runs_launched": float(len(launched)),
        "runs_launched_frac": len(launched) / published_runs,
        "gpu_hours": float(launched.gpu_hours.sum()),
        "gpu_hours_frac": float(launched.gpu_hours.sum() / published_gpu_hours),
        "cells_within_2pct": float(table.within.sum()),
        "cells_total": float(len(table)),
        "max_regret": float(table.regret.max()),
        "mean_regret": float(table.regret.mean()),
        "rounds": float(result.rounds),
        # Proofs: an OOM rules them out. A proof that skipped a run that completed is a bug.
        "pruned_skipped": float(proofs.sum()),
        "pruned_but_completed": float((proofs & completed).sum()),
        # Heuristics: named as such, and what they cost counted.
        "heuristic_skipped": float(guesses.sum()),
        "heuristic_but_completed": float((guesses & completed).sum()),
        "launches_forced_by_floor": forced,
        "launches_chosen_by_model": (float(len(launched)) - forced
                                     if result.strategy in ("adaptive", "shortlist") else 0.0),
    }
    return headline, table


__all__ = ["cell_order", "progress", "score"]
