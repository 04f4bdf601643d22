"""Leave-one-model-out validation of the throughput model and the model-guided searches
(`adaptive`, `shortlist`).

Every figure fitted on a model and scored on the same model flatters the code: a user's model is
never one we fitted on. Here, for each model M of a published sweep in turn, the throughput
coefficients are fitted on the other models' completed runs, the strategy's settings (the
adaptive floor and band, or the shortlist's length) are chosen on replays of the other models
only, and M is then replayed from those coefficients with those settings. Its prediction error
and its economy are reported beside the in-sample ones (coefficients and settings chosen on
every model, M included).

How settings are chosen (`choose_params`), on a set of training models: every entry of the
strategy's grid (`GRIDS`) is replayed on each training model alone, starting from coefficients
fitted on the *other* training models (the physical prior when there are none, so the choice is
itself made out of sample); the chosen entry finds every training cell within 2 % of its best
with the fewest runs (else the most cells, then the fewest runs; ties go to the earlier, cheaper
entry).
The defaults of `sweep.search.strategies.Params` are this choice on the playbook's charts table with the
physical prior (`default_settings`, for each strategy; a test reproduces them).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Final

import numpy as np
import pandas as pd

from sweep.calibration.runs_table import normalise_runs
from sweep.calibration.throughput_fit import error_summary, fit, relative_errors, without_fit_exclusions
from sweep.models.throughput import Coefficients
from sweep.models.throughput_inputs import Workload
from sweep.plan.predictions import model_names_for, workloads_for
from sweep.plan.spec import Spec
from sweep.search.search_report import score
from sweep.search.strategies import Params, search
from sweep.validation.replay_tables import Replay


@dataclass(frozen=True)
class Settings:
    """The adaptive settings that the choice ranges over: the floor (completed runs a cell
    measures before it may close) and the optimism of the band (quantile of the sweep's own
    residuals)."""

    min_cell_runs: int
    quantile: float

    def apply(self, params: Params) -> Params:
        return replace(params, min_cell_runs=self.min_cell_runs, quantile=self.quantile)


@dataclass(frozen=True)
class ShortlistSettings:
    """The shortlist's one setting: completed runs per cell, best predicted first."""

    top: int

    def apply(self, params: Params) -> Params:
        return replace(params, top=self.top)


# Cheapest first: a tie goes to the smaller floor, then to the narrower band.
SETTINGS_GRID: Final = tuple(Settings(floor, q) for floor in (3, 8, 16, 32) for q in (0.9, 1.0))
SHORTLIST_GRID: Final = tuple(ShortlistSettings(top) for top in (3, 5, 8, 12, 16))
GRIDS: Final[Mapping[str, Sequence[Settings | ShortlistSettings]]] = {
    "adaptive": SETTINGS_GRID, "shortlist": SHORTLIST_GRID}
TOLERANCE: Final = 0.02


def completed_rows(table: pd.DataFrame, source: str, workloads: Mapping[str, Workload],
                   names: Mapping[str, str]) -> dict[str, pd.DataFrame]:
    """Per model, the completed runs the throughput model is fitted and scored on: positive
    throughput, and none that `sweep.calibration.throughput_fit.without_fit_exclusions` leaves out (nanotron's
    pre-fix pipeline runs, runs on a sick node)."""
    table, _ = without_fit_exclusions(table)
    rows = normalise_runs(table, source, workloads)
    rows = rows.assign(model=rows.model.astype(str).map(dict(names)))
    rows = rows[rows.model.notna() & (rows.status == "completed")
                & (pd.to_numeric(rows.tokens_per_s_per_gpu, errors="coerce") > 0)]
    return {str(m): g.reset_index(drop=True) for m, g in rows.groupby("model")}


def completed_rows_for_spec(table: pd.DataFrame, source: str, spec: Spec
                            ) -> tuple[dict[str, pd.DataFrame], dict[str, Workload]]:
    """`completed_rows` of a published table whose model labels are mapped to the spec's models
    (catalog names or aliases), with the spec's workloads."""
    workloads = workloads_for(spec)
    labels = sorted(set(normalise_runs(table, source, workloads).model.astype(str)))
    return completed_rows(table, source, workloads, model_names_for(spec, labels)), workloads


def fit_on(models: Sequence[str], rows: Mapping[str, pd.DataFrame],
           workloads: Mapping[str, Workload]) -> Coefficients:
    """Coefficients fitted on the completed runs of `models`; the physical prior for none."""
    groups = [(rows[m], workloads[m]) for m in models if m in rows and len(rows[m])]
    return fit(groups).coefficients if groups else Coefficients()


def replay_once(replay: Replay, workloads: Mapping[str, Workload], prior: Coefficients,
                params: Params, strategy: str = "adaptive"
                ) -> tuple[dict[str, float], pd.DataFrame]:
    """The replay of `replay` under `strategy` from `prior` with `params`, scored (headline,
    cells)."""
    result = search(replay.candidates, replay.outcomes, strategy, workloads, prior, params)
    return score(result, replay.outcomes, replay.candidates, replay.published_runs,
                 replay.published_gpu_hours, TOLERANCE)


@dataclass(frozen=True)
class Choice:
    """The settings chosen and what every entry of the grid scored (summed over models)."""

    params: Params
    entry: int  # its index in the grid
    trials: pd.DataFrame  # one row per grid entry
    headlines: dict[tuple[int, str], dict[str, float]]  # (grid entry, model) → headline


def choose_params(replays: Mapping[str, Replay], workloads: Mapping[str, Workload],
                  priors: Mapping[str, Coefficients], base: Params = Params(),
                  grid: Sequence[Settings | ShortlistSettings] | None = None,
                  strategy: str = "adaptive") -> Choice:
    """The grid entry (`GRIDS[strategy]` unless given) that finds every cell of every replay
    within 2 % with the fewest runs (else the most cells within, then the fewest runs); each
    model is replayed alone from its own prior."""
    grid = GRIDS[strategy] if grid is None else grid
    rows, headlines = [], {}
    for i, settings in enumerate(grid):
        params = settings.apply(base)
        launched = published = within = total = 0.0
        for model, replay in replays.items():
            head, _ = replay_once(replay, workloads, priors[model], params, strategy)
            headlines[(i, model)] = head
            launched += head["runs_launched"]
            published += replay.published_runs
            within += head["cells_within_2pct"]
            total += head["cells_total"]
        rows.append({"entry": i, **asdict(settings), "runs_launched_frac": launched / published,
                     "cells_within_2pct": within, "cells_total": total})
    trials = pd.DataFrame(rows)
    ranked = trials.assign(missed=trials.cells_total - trials.cells_within_2pct).sort_values(
        ["missed", "runs_launched_frac", "entry"], kind="stable")
    best = int(ranked.entry.iloc[0])
    return Choice(grid[best].apply(base), best, trials, headlines)


def left_out_priors(models: Sequence[str], rows: Mapping[str, pd.DataFrame],
            workloads: Mapping[str, Workload]) -> dict[str, Coefficients]:
    """For each model, coefficients fitted on the other models of `models` only."""
    return {m: fit_on([o for o in models if o != m], rows, workloads) for m in models}


@dataclass(frozen=True)
class Fold:
    """One model's figures, fitted either on every model (`in-sample`) or on the others."""

    model: str
    mode: str  # "in-sample" or "held-out"
    throughput: dict[str, float]  # runs, median_abs_error, p90_abs_error
    economy: dict[str, float]  # sweep.search.search_report.score's headline, against this model's runs
    params: Params
    cells: pd.DataFrame
    errors: np.ndarray  # |predicted / measured − 1| per completed run


def leave_one_model_out(replay: Replay, rows: Mapping[str, pd.DataFrame],
                        workloads: Mapping[str, Workload], base: Params = Params(),
                        grid: Sequence[Settings | ShortlistSettings] | None = None,
                        strategy: str = "adaptive") -> list[Fold]:
    """In-sample and held-out figures for every model of `replay` that has completed runs,
    searched by `strategy` (adaptive or shortlist) with settings from `grid`
    (`GRIDS[strategy]` unless given)."""
    models = sorted(set(replay.by_model) & {m for m, r in rows.items() if len(r)})
    if len(models) < 2:
        raise ValueError(f"leave-one-model-out needs runs of at least two models; this table "
                         f"has completed runs of {models or 'none'}")
    alone = {m: replay.only({m}) for m in models}
    folds: list[Fold] = []
    everything = fit_on(models, rows, workloads)
    chosen = choose_params(alone, workloads, dict.fromkeys(models, everything), base, grid,
                           strategy)
    for m in models:
        errors = np.abs(relative_errors(rows[m], workloads[m], everything))
        _, cells = replay_once(alone[m], workloads, everything, chosen.params, strategy)
        folds.append(Fold(m, "in-sample", error_summary(errors), chosen.headlines[(chosen.entry, m)],
                          chosen.params, cells, errors))
    for m in models:
        train = [o for o in models if o != m]
        coeffs = fit_on(train, rows, workloads)
        inner = choose_params({o: alone[o] for o in train}, workloads,
                              left_out_priors(train, rows, workloads), base, grid, strategy)
        errors = np.abs(relative_errors(rows[m], workloads[m], coeffs))
        head, cells = replay_once(alone[m], workloads, coeffs, inner.params, strategy)
        folds.append(Fold(m, "held-out", error_summary(errors), head, inner.params, cells,
                          errors))
    return folds


def summary(folds: Sequence[Fold]) -> dict[str, float]:
    """Pooled figures per mode: throughput error over every model's runs, runs launched over
    every model's published runs, cells within 2 % and the worst regret."""
    out: dict[str, float] = {}
    for mode, key in (("in-sample", "in_sample"), ("held-out", "held_out")):
        chosen = [f for f in folds if f.mode == mode]
        errors = error_summary(np.concatenate([f.errors for f in chosen]))
        launched = sum(f.economy["runs_launched"] for f in chosen)
        published = sum(f.economy["runs_launched"] / f.economy["runs_launched_frac"]
                        for f in chosen)
        out.update({
            f"{key}_tput_median": errors["median_abs_error"],
            f"{key}_tput_p90": errors["p90_abs_error"],
            f"{key}_runs_launched_frac": launched / published,
            f"{key}_cells_within_2pct": sum(f.economy["cells_within_2pct"] for f in chosen),
            f"{key}_cells_total": sum(f.economy["cells_total"] for f in chosen),
            f"{key}_max_regret": max(f.economy["max_regret"] for f in chosen),
            f"{key}_forced_by_floor": sum(f.economy["launches_forced_by_floor"] for f in chosen),
            f"{key}_chosen_by_model": sum(f.economy["launches_chosen_by_model"] for f in chosen),
        })
    return out


def default_settings(replay: Replay, workloads: Mapping[str, Workload],
                     strategy: str = "adaptive") -> Params:
    """What `Params`' defaults for `strategy` are: the choice on every model of `replay` (the
    playbook's charts table), each replayed alone from the physical prior, as a live sweep
    starts (the weakest prior a plan can start from: the shortlist's length must hold there)."""
    models = sorted(replay.by_model)
    alone = {m: replay.only({m}) for m in models}
    return choose_params(alone, workloads, dict.fromkeys(models, Coefficients()),
                         strategy=strategy).params


__all__ = ["GRIDS", "SETTINGS_GRID", "SHORTLIST_GRID", "Choice", "Fold", "Settings",
           "ShortlistSettings", "choose_params", "completed_rows", "completed_rows_for_spec",
           "default_settings", "fit_on", "leave_one_model_out", "left_out_priors", "replay_once",
           "summary"]
