"""Throughput self-calibration on a model the prior was not fitted on: what a first round of N
completed runs does to the predictions for the rest of that model's runs.

For each model M of nanotron's full 1B/8B results table, two priors stand in for what a user
brings to a new sweep: the physical prior (`Coefficients()`, what `sweep plan` uses without a
`throughput.json` for every framework but nanotron on H100) and the coefficients fitted on the
other model's runs (the leave-one-model-out fold of `sweep replay --cv model`: what a nanotron
sweep on H100 starts from, `sweep.plan.predictions.default_prior`, without the model left out). A first round of N of M's completed runs, drawn at random, then calibrates, and the rest
of M's runs are scored: the median and 90th percentile of |predicted / measured − 1| of
tokens/s/GPU (nanotron's pre-fix pipeline runs and the sick-node runs left out, as every
throughput figure). Each figure is the mean over seeds.

Three ways to use the first round:
- `prior`: none (the prior's own error on the rest);
- `full refit`: every coefficient fitted on the round from the physical prior, as `sweep plan
  --calibrate-from` did before `sweep.calibration.throughput_self_calibration` (`sweep.calibration.throughput_fit.fit`);
- `self-calibration`: `sweep.calibration.throughput_self_calibration.self_calibrate` on the prior (scaled or
  refitted around the scaled prior, whichever cross-validates better on the round).

    SWEEP_REFDATA=DIR .venv/bin/python benchmarks/throughput_self_calibration.py [--seeds 8]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sweep.calibration.throughput_fit import fit, relative_errors
from sweep.calibration.throughput_self_calibration import self_calibrate
from sweep.models.throughput import Coefficients
from sweep.models.throughput_inputs import Workload
from sweep.plan.spec import load_spec
from sweep.validation.cross_validation import completed_rows_for_spec, left_out_priors
from sweep.validation.refdata import refdata_dir

REPO = Path(__file__).resolve().parents[1]
TABLE = "playbook_bench_full_1B_8B.csv"
SIZES = (3, 8, 16, 64)
METHODS = ("prior", "full refit", "self-calibration")


def scores(rest: pd.DataFrame, work: Workload, coeffs: Coefficients) -> tuple[float, float]:
    errors = np.abs(relative_errors(rest, work, coeffs))
    return float(np.median(errors)), float(np.quantile(errors, 0.9))


def first_round(rows: pd.DataFrame, work: Workload, prior: Coefficients, n: int, seed: int
                ) -> tuple[dict[str, tuple[float, float]], str]:
    """The three methods' (median, p90) on the runs a first round of n did not include, and
    the method the self-calibration chose."""
    pick = np.random.default_rng(seed).choice(len(rows), n, replace=False)
    first, rest = rows.iloc[pick], rows.drop(rows.index[pick])
    calibrated = self_calibrate([(first, work)], prior)
    return {"prior": scores(rest, work, prior),
            "full refit": scores(rest, work, fit([(first, work)]).coefficients),
            "self-calibration": scores(rest, work, calibrated.coefficients)}, calibrated.method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    started = time.perf_counter()
    spec = load_spec(REPO / "examples" / "playbook.yaml")
    path = refdata_dir() / TABLE
    rows, workloads = completed_rows_for_spec(pd.read_csv(path), str(path), spec)
    fitted_without = left_out_priors(sorted(rows), rows, workloads)
    models = sorted(rows)
    headline: dict[str, list[float]] = {}
    print(f"{'left out':<13}{'prior':<13}{'N':>4}  " + "".join(f"{m:>22}" for m in METHODS)
          + "  refitted")
    for model in models:
        priors = {"physical": Coefficients(),
                  "other model": fitted_without[model]}
        for prior_name, prior in priors.items():
            for n in SIZES:
                draws = [first_round(rows[model], workloads[model], prior, n, seed)
                         for seed in range(args.seeds)]
                mean = {m: np.mean([d[m] for d, _ in draws], axis=0) for m in METHODS}
                refits = sum(method == "refitted" for _, method in draws)
                print(f"{model:<13}{prior_name:<13}{n:>4}  " + "".join(
                    f"{mean[m][0]:>11.1%} / {mean[m][1]:>6.1%}" for m in METHODS)
                    + f"  {refits}/{args.seeds}")
                if prior_name == "other model" and n in (8, 16):
                    for m, key in (("full refit", "full"), ("self-calibration", "self")):
                        headline.setdefault(f"{key}_n{n}_median", []).append(mean[m][0])
                        headline.setdefault(f"{key}_n{n}_p90", []).append(mean[m][1])
    print("(median / p90 of |predicted / measured - 1| of tokens/s/GPU on the rest of the "
          f"model's runs, mean over {args.seeds} seeds; refitted: draws where the "
          "self-calibration chose the refit over the scale)")
    figures = {key: float(np.mean(values)) for key, values in headline.items()}
    figures["seconds"] = time.perf_counter() - started
    print(" ".join(f"{k}={v:.4f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
