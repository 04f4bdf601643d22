"""Sweep economy and throughput-model fidelity on the published playbook sweep, in sample and
leave-one-model-out (issue 17's targets).

1. Replay: each strategy with its default settings against `playbook_runs_1B_8B.csv` and
   nanotron's results table (which tells OOM apart): runs launched and GPU-hours against the
   whole published sweep, cells whose best tokens/s/GPU was found within 2 %, worst regret, the
   skips that were proofs and heuristics and how many of each the table shows completed, and the
   launches adaptive's floor forced against those its model chose.
2. Leave-one-model-out (`sweep replay --cv model`, for adaptive and for shortlist): per model,
   the throughput model fitted and the search's settings (adaptive: floor and band; shortlist:
   its length) chosen on the other model only, then that model replayed; throughput
   error (median, p90 of |pred − meas| / meas over completed runs, nanotron's pre-fix pipeline
   runs left out) and economy, beside the in-sample figures. Targets: median ≤ 10 %, p90 ≤ 40 %;
   ≤ 35 % of the runs launched with every cell within 2 %.

The last line holds the headline figures as key=value pairs.

    python benchmarks/sweep_economy.py
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from sweep.plan.predictions import workloads_for
from sweep.plan.spec import load_spec
from sweep.search.search_report import score
from sweep.search.strategies import Params, search
from sweep.validation.cross_validation import completed_rows, leave_one_model_out, summary
from sweep.validation.refdata import refdata_dir
from sweep.validation.replay_tables import replay_table

REPO = Path(__file__).resolve().parents[1]
REFDATA = refdata_dir()
LABELS = {"1B": "playbook-1b", "8B": "playbook-8b"}
TABLES = ("playbook_runs_1B_8B.csv", "playbook_bench_full_1B_8B.csv")


def main() -> None:
    spec = load_spec(REPO / "examples" / "playbook.yaml")
    workloads = workloads_for(spec)
    names = {**LABELS, **{m: m for m in workloads}}
    print(f"{'replay':<32}{'strategy':<11}{'runs':>7}{'GPU-h':>8}{'cells':>8}{'regret':>8}"
          f"{'proofs':>8}{'wrong':>6}{'heur.':>6}{'wrong':>6}{'floor':>6}{'model':>6}{'time':>7}")
    heads: dict[str, dict[str, float]] = {}
    for file in TABLES:
        replay = replay_table(pd.read_csv(REFDATA / file), file, LABELS, workloads,
                              spec.run.steps, 60.0)
        for strategy in ("exhaustive", "pruned", "adaptive", "shortlist"):
            start = time.perf_counter()
            result = search(replay.candidates, replay.outcomes, strategy, workloads,
                            params=Params())
            h, _ = score(result, replay.outcomes, replay.candidates, replay.published_runs,
                         replay.published_gpu_hours)
            heads[f"{file}:{strategy}"] = h
            print(f"{file:<32}{strategy:<11}{h['runs_launched_frac']:>7.1%}"
                  f"{h['gpu_hours_frac']:>8.1%}{h['cells_within_2pct']:>4.0f}/"
                  f"{h['cells_total']:<3.0f}{h['max_regret']:>8.1%}{h['pruned_skipped']:>8.0f}"
                  f"{h['pruned_but_completed']:>6.0f}{h['heuristic_skipped']:>6.0f}"
                  f"{h['heuristic_but_completed']:>6.0f}{h['launches_forced_by_floor']:>6.0f}"
                  f"{h['launches_chosen_by_model']:>6.0f}{time.perf_counter() - start:>6.1f}s")

    print("\nleave-one-model-out: throughput error and the economy of a model-guided search")
    print(f"{'table':<32}{'search':<10}{'model':<13}{'fit':<11}{'runs':>5}{'median':>8}{'p90':>8}"
          f"{'launched':>9}{'GPU-h':>7}{'cells':>7}{'regret':>8}{'floor':>6}{'model':>6}"
          f"{'settings':>10}")
    pooled: dict[str, dict[str, float]] = {}
    cv_seconds: dict[str, float] = {}
    for file in TABLES:
        table = pd.read_csv(REFDATA / file)
        replay = replay_table(table, file, LABELS, workloads, spec.run.steps, 60.0)
        rows = completed_rows(table, file, workloads, names)
        for strategy in ("adaptive", "shortlist"):
            start = time.perf_counter()
            folds = leave_one_model_out(replay, rows, workloads, strategy=strategy)
            for f in folds:
                e, t = f.economy, f.throughput
                settings = (f"top {f.params.top}" if strategy == "shortlist"
                            else f"{f.params.min_cell_runs}/{f.params.quantile}")
                print(f"{file:<32}{strategy:<10}{f.model:<13}{f.mode:<11}{t['runs']:>5.0f}"
                      f"{t['median_abs_error']:>8.1%}{t['p90_abs_error']:>8.1%}"
                      f"{e['runs_launched_frac']:>9.1%}{e['gpu_hours_frac']:>7.1%}"
                      f"{e['cells_within_2pct']:>3.0f}/{e['cells_total']:<3.0f}"
                      f"{e['max_regret']:>8.1%}{e['launches_forced_by_floor']:>6.0f}"
                      f"{e['launches_chosen_by_model']:>6.0f}{settings:>10}")
            pooled[f"{file}:{strategy}"] = summary(folds)
            cv_seconds[f"{file}:{strategy}"] = time.perf_counter() - start
            print("  pooled: " + " ".join(f"{k}={v:.4g}"
                                          for k, v in pooled[f"{file}:{strategy}"].items())
                  + f" ({time.perf_counter() - start:.0f} s)")

    a = heads["playbook_runs_1B_8B.csv:adaptive"]
    short = heads["playbook_runs_1B_8B.csv:shortlist"]
    charts = pooled["playbook_runs_1B_8B.csv:adaptive"]
    full = pooled["playbook_bench_full_1B_8B.csv:adaptive"]
    charts_short = pooled["playbook_runs_1B_8B.csv:shortlist"]
    full_short = pooled["playbook_bench_full_1B_8B.csv:shortlist"]
    print(f"adaptive_runs_frac={a['runs_launched_frac']:.4f} "
          f"adaptive_cells_within_2pct={a['cells_within_2pct']:.0f} "
          f"adaptive_forced_by_floor={a['launches_forced_by_floor']:.0f} "
          f"proof_skips_completed_full="
          f"{heads['playbook_bench_full_1B_8B.csv:pruned']['pruned_but_completed']:.0f} "
          f"cv_full_tput_median={full['held_out_tput_median']:.4f} "
          f"cv_full_tput_p90={full['held_out_tput_p90']:.4f} "
          f"cv_charts_tput_median={charts['held_out_tput_median']:.4f} "
          f"cv_charts_tput_p90={charts['held_out_tput_p90']:.4f} "
          f"cv_charts_runs_frac={charts['held_out_runs_launched_frac']:.4f} "
          f"cv_charts_cells_within_2pct={charts['held_out_cells_within_2pct']:.0f} "
          f"cv_full_runs_frac={full['held_out_runs_launched_frac']:.4f} "
          f"cv_full_cells_within_2pct={full['held_out_cells_within_2pct']:.0f} "
          f"shortlist_runs_frac={short['runs_launched_frac']:.4f} "
          f"shortlist_cells_within_2pct={short['cells_within_2pct']:.0f} "
          f"cv_full_shortlist_runs_frac={full_short['held_out_runs_launched_frac']:.4f} "
          f"cv_full_shortlist_cells_within_2pct={full_short['held_out_cells_within_2pct']:.0f} "
          f"cv_charts_shortlist_runs_frac={charts_short['held_out_runs_launched_frac']:.4f} "
          f"cv_charts_shortlist_cells_within_2pct="
          f"{charts_short['held_out_cells_within_2pct']:.0f} "
          f"cv_charts_shortlist_max_regret={charts_short['held_out_max_regret']:.4f} "
          f"cells_total={full['held_out_cells_total']:.0f} "
          f"cv_full_adaptive_seconds="
          f"{cv_seconds['playbook_bench_full_1B_8B.csv:adaptive']:.1f}")


if __name__ == "__main__":
    main()
