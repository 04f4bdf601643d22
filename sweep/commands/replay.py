"""`sweep replay RUNS --spec SPEC --strategy S [--json]`: replay a published sweep under a strategy.

The published outcomes are the oracle: the strategy asks for runs and gets the published result
(failed, or the throughput). Each distinct configuration is one candidate (a published repeat
answers with its first outcome). It reports the runs and GPU-hours spent against the whole
published sweep, and per (model, nodes) cell whether the best tokens/s/GPU was found within 2 %.
A run's GPU-hours are its GPUs × (startup + steps × its step time); a failed run costs startup
plus one step. Skips are counted as proofs (`pruned:`, an OOM rules them out) or heuristics
(`heuristic:`), with how many of each the published sweep shows completed; adaptive replays
also count the launches its floor forced and the ones its model chose.

With `--cv model`, leave-one-model-out (`sweep.validation.cross_validation`): for each model in turn, the
throughput model is fitted and the search's settings (adaptive: floor and band; `--strategy
shortlist`: its length) are chosen on the other models only, and the model is replayed from
them; its prediction error (median and p90 of |pred − meas| / meas over completed runs;
nanotron's pre-fix pipeline runs left out) and its economy are printed beside the in-sample ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pandas as pd

from sweep.calibration.runs_table import normalise_runs, read_runs_frame
from sweep.calibration.throughput_coefficients import load_coefficients
from sweep.commands._shared import add_top_argument, shortlist_top
from sweep.core.errors import UserError
from sweep.models.throughput import Coefficients
from sweep.models.throughput_inputs import Workload
from sweep.plan.predictions import model_names_for, workloads_for
from sweep.plan.spec import load_spec
from sweep.search.search_report import score
from sweep.search.strategies import STRATEGIES, Params, search
from sweep.validation.cross_validation import completed_rows, leave_one_model_out, summary
from sweep.validation.replay_tables import Replay, replay_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, help="published runs: CSV or runs.parquet")
    parser.add_argument("--spec", type=Path, required=True, help="the sweep spec (models, GPU)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="exhaustive")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--coefficients", type=Path, default=None,
                        help="start from a `sweep calibrate` file instead of the physical prior")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run for GPU-hours (default: the spec's run.steps)")
    parser.add_argument("--startup-s", type=float, default=60.0,
                        help="seconds a run spends before its first step (default: 60)")
    parser.add_argument("--failed-is-oom", action="store_true",
                        help="heuristic: treat unclassified failures as OOMs in the skipping rules")
    parser.add_argument("--heuristic-skips", action="store_true",
                        help="heuristic: also skip layouts the memory proxy says need more "
                             "memory than an OOMed one (counted apart from the proofs)")
    parser.add_argument("--cv", choices=("model",), default=None,
                        help="leave-one-model-out: fit and choose the search's settings on the "
                             "other models, replay each model, report it beside in-sample "
                             "(adaptive, or shortlist with --strategy shortlist)")
    defaults = Params()
    parser.add_argument("--k", type=int, default=defaults.k,
                        help=f"adaptive: runs per open cell per round (default {defaults.k})")
    parser.add_argument("--epsilon", type=float, default=defaults.epsilon,
                        help=f"adaptive: closing margin (default {defaults.epsilon})")
    parser.add_argument("--min-cell-runs", type=int, default=defaults.min_cell_runs,
                        help=f"adaptive: completed runs in a cell before it may close "
                             f"(default {defaults.min_cell_runs})")
    add_top_argument(parser)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    for name in ("k", "min_cell_runs", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be at least 1, got {value}")
    if not 0 <= args.epsilon < 1 or not math.isfinite(args.startup_s) or args.startup_s < 0:
        raise UserError("--epsilon must be in [0, 1) and --startup-s a non-negative number")
    workloads = workloads_for(spec)
    table = read_runs_frame(args.runs)
    try:
        labels = sorted(set(normalise_runs(table, str(args.runs), workloads).model.astype(str)))
        replay = replay_table(table, str(args.runs), model_names_for(spec, labels), workloads,
                              args.steps or spec.run.steps, args.startup_s)
    except ValueError as error:
        raise UserError(str(error)) from None
    params = dataclasses.replace(
        Params.with_top(shortlist_top(args)), k=args.k, epsilon=args.epsilon,
        min_cell_runs=args.min_cell_runs, failed_is_oom=args.failed_is_oom,
        heuristic_skips=args.heuristic_skips)
    if args.cv:
        if args.coefficients:
            raise UserError("--cv model fits its own coefficients; leave out --coefficients")
        return cross_validate(args, table, replay, workloads, model_names_for(spec, labels),
                              params)
    prior = load_coefficients(args.coefficients) if args.coefficients else Coefficients()
    result = search(replay.candidates, replay.outcomes, args.strategy, workloads, prior, params)
    headline, cells = score(result, replay.outcomes, replay.candidates, replay.published_runs,
                            replay.published_gpu_hours)
    reasons = result.skipped.reason.str.replace(r" \(.*", "", regex=True).value_counts().to_dict()
    if args.json:
        print(json.dumps({
            "strategy": args.strategy, "source": str(args.runs), **headline,
            "published_runs": replay.published_runs,
            "published_gpu_hours": replay.published_gpu_hours,
            "params": dataclasses.asdict(params), "skipped": reasons,
            "cells": cells.reset_index(names="cell").to_dict(orient="records"),
            "coefficients": result.coefficients.to_dict() if result.coefficients else None,
        }, indent=2, default=float))
        return 0
    # adaptive: launches the floor forced, and the regret bound at closing (1 − best / highest
    # optimistic throughput left untried; 0 when the cell ran out of candidates).
    print(f"{'cell':<22}{'candidates':>11}{'launched':>9}{'floor':>6}{'rounds':>7}"
          f"{'best tok/s/GPU':>16}{'found':>10}{'regret':>8}{'bound':>8}  within 2 %")
    for cell, row in cells.iterrows():
        found = "-" if math.isnan(row.found) else f"{row.found:.0f}"
        bound = "-" if math.isnan(row.regret_bound_at_close) else f"{row.regret_bound_at_close:.1%}"
        print(f"{cell:<22}{row.candidates:>11}{row.launched:>9}{row.forced_by_floor:>6}"
              f"{row.rounds:>7.0f}{row.best:>16.0f}{found:>10}{row.regret:>8.1%}{bound:>8}  "
              f"{'yes' if row.within else 'NO'}")
    for reason, count in reasons.items():
        print(f"skipped {count} candidates: {reason}")
    print(" ".join(f"{k}={v:.4g}" for k, v in headline.items()))
    return 0


def cross_validate(args: argparse.Namespace, table: pd.DataFrame, replay: Replay,
                   workloads: dict[str, Workload], names: dict[str, str], params: Params) -> int:
    """`--cv model`: the in-sample and held-out figures of every model, then the pooled ones."""
    strategy = "shortlist" if args.strategy == "shortlist" else "adaptive"
    try:
        rows = completed_rows(table, str(args.runs), workloads, names)
        folds = leave_one_model_out(replay, rows, workloads, params, strategy=strategy)
    except ValueError as error:
        raise UserError(f"{args.runs}: {error}") from None
    pooled = summary(folds)
    if args.json:
        print(json.dumps({
            "source": str(args.runs), "cv": "model", "strategy": strategy, **pooled,
            "folds": [{"model": f.model, "mode": f.mode, "throughput": f.throughput,
                       "economy": f.economy, "params": dataclasses.asdict(f.params),
                       "cells": f.cells.reset_index(names="cell").to_dict(orient="records")}
                      for f in folds],
        }, indent=2, default=float))
        return 0
    settings = f"{'top':>5}" if strategy == "shortlist" else f"{'floor':>7}{'q':>5}"
    print(f"{'model':<14}{'fit':<11}{'runs':>6}{'median':>8}{'p90':>8}{'launched':>10}"
          f"{'cells':>8}{'regret':>8}{'floor/model':>13}{settings}")
    for f in folds:
        e, t = f.economy, f.throughput
        chosen = (f"{f.params.top:>5}" if strategy == "shortlist"
                  else f"{f.params.min_cell_runs:>7}{f.params.quantile:>5.2f}")
        print(f"{f.model:<14}{f.mode:<11}{t['runs']:>6.0f}{t['median_abs_error']:>8.1%}"
              f"{t['p90_abs_error']:>8.1%}{e['runs_launched_frac']:>10.1%}"
              f"{e['cells_within_2pct']:>4.0f}/{e['cells_total']:<3.0f}{e['max_regret']:>8.1%}"
              f"{e['launches_forced_by_floor']:>7.0f}/{e['launches_chosen_by_model']:<5.0f}"
              f"{chosen}")
    print(" ".join(f"{k}={v:.4g}" for k, v in pooled.items()))
    return 0
