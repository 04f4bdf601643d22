"""The throughput prior a plan starts from, on a model it was not fitted on: the physical prior
against the fit to nanotron's published H100 runs (what `sweep.plan.predictions.default_prior` gives a
nanotron sweep on H100).

For each model M of nanotron's full 1B/8B results table, the fitted prior is refitted on the
other model's completed runs only (the leave-one-model-out fold of `sweep replay --cv model`),
and both priors predict every completed run of M (pre-fix pipeline runs and sick-node runs left
out, as every throughput figure). Reported: the median and 90th percentile of |predicted /
measured − 1| of tokens/s/GPU; per cell (M × nodes), how far the completed run predicted
fastest, and the best of the five predicted fastest, fall short of the cell's best measured run;
and the mean rank correlation of predicted and measured throughput within a cell. Only completed
runs are ranked: this scores how well each prior orders what ran. What a search that follows
the ranking costs and finds, failures included, is `sweep replay --strategy shortlist`
(benchmarks/sweep_economy.py).

Then the model sizes no fit saw: the playbook heatmap's 3B and 80B winners (`sweep.validation.unseen_models`),
predicted by the shipped prior (fitted on 1B and 8B) and by the physical prior: the median and
largest |error| below 64 nodes (the 64-node cells ran on a degraded fabric), and the worst
predicted rank of a winner in its cell (the shortlist runs the eight best).

    SWEEP_REFDATA=DIR .venv/bin/python benchmarks/throughput_prior.py
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from sweep.models.throughput import Coefficients, predict, world_size
from sweep.models.throughput_inputs import Workload
from sweep.plan.predictions import default_prior
from sweep.plan.spec import load_spec
from sweep.validation.cross_validation import completed_rows_for_spec, left_out_priors
from sweep.validation.refdata import refdata_dir
from sweep.validation.unseen_models import HEATMAP_FILE, score, summary

REPO = Path(__file__).resolve().parents[1]
TABLE = "playbook_bench_full_1B_8B.csv"
TOP = 5


def scored(rows: pd.DataFrame, work: Workload, prior: Coefficients) -> dict[str, float]:
    predicted = predict(rows, work, prior)["pred_tokens_per_s_per_gpu"].to_numpy()
    measured = rows["tokens_per_s_per_gpu"].to_numpy(float)
    errors = np.abs(predicted / measured - 1.0)
    frame = pd.DataFrame({"cell": world_size(rows), "pred": predicted, "meas": measured})
    top1, top5, rho = [], [], []
    for _, cell in frame.groupby("cell"):
        best = cell.meas.max()
        top1.append(1.0 - cell.meas[cell.pred.idxmax()] / best)
        top5.append(1.0 - cell.nlargest(TOP, "pred").meas.max() / best)
        if len(cell) > 3:
            rho.append(cell.pred.rank().corr(cell.meas.rank()))
    return {"median": float(np.median(errors)), "p90": float(np.quantile(errors, 0.9)),
            "top1_worst": max(top1), "top5_worst": max(top5),
            "top5_cells_missed": float(sum(r > 0 for r in top5)), "cells": float(len(top5)),
            "rank_corr": float(np.mean(rho))}


def main() -> None:
    started = time.perf_counter()
    spec = load_spec(REPO / "examples" / "playbook.yaml")
    path = refdata_dir() / TABLE
    rows, workloads = completed_rows_for_spec(pd.read_csv(path), str(path), spec)
    fitted_without = left_out_priors(sorted(rows), rows, workloads)
    headline: dict[str, float] = {}
    print(f"{'left out':<13}{'prior':<26}{'median':>8}{'p90':>8}{'top-1 worst':>13}"
          f"{'top-5 worst':>13}{'cells missed by top 5':>23}{'rank corr':>11}")
    for model in sorted(rows):
        priors = {"physical": Coefficients(),
                  "fitted on the other model": fitted_without[model]}
        for name, prior in priors.items():
            s = scored(rows[model], workloads[model], prior)
            print(f"{model:<13}{name:<26}{s['median']:>8.1%}{s['p90']:>8.1%}"
                  f"{s['top1_worst']:>13.1%}{s['top5_worst']:>13.1%}"
                  f"{int(s['top5_cells_missed']):>19} of {int(s['cells'])}{s['rank_corr']:>11.3f}")
            key = f"{model.removeprefix('playbook-')}_{'physical' if name == 'physical' else 'fitted'}"
            headline[f"{key}_median"] = s["median"]
            headline[f"{key}_top5_missed"] = s["top5_cells_missed"]
    heatmap = pd.read_csv(refdata_dir() / HEATMAP_FILE)
    print(f"\n{'never fitted':<13}{'prior':<26}{'cells':>6}{'median':>8}{'max':>8}"
          f"{'median signed':>15}{'worst rank':>12}")
    priors = {"physical": Coefficients(), "shipped (1B + 8B)": default_prior(spec)}
    for name, prior in priors.items():
        winners = score(heatmap, HEATMAP_FILE, spec, prior)
        figures = summary(winners)
        for model in ("playbook-3b", "playbook-80b"):
            f = figures.loc[model]
            cells = winners[(winners.model == model) & ~winners.inflated_mfu]
            print(f"{model:<13}{name:<26}{int(f.cells):>6}{f.median_abs_error:>8.1%}"
                  f"{f.max_abs_error:>8.1%}{f.median_signed_error:>+15.1%}"
                  f"{int(cells.pred_rank.max()):>12}")
            if name != "physical":
                key = model.removeprefix("playbook-")
                headline[f"heatmap_{key}_median"] = f.median_abs_error
                headline[f"heatmap_{key}_max"] = f.max_abs_error
                headline[f"heatmap_{key}_worst_rank"] = float(cells.pred_rank.max())
    headline["seconds"] = time.perf_counter() - started
    print(" ".join(f"{k}={v:.4f}" for k, v in headline.items()))


if __name__ == "__main__":
    main()
