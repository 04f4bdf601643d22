"""Throughput self-calibration: a few runs scale the prior, many may refit it, and the runs
decide which by cross-validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweep.calibration.throughput_fit import fit, relative_errors
from sweep.calibration.throughput_self_calibration import competing, folds, self_calibrate
from sweep.models.throughput import Coefficients, predict
from sweep.plan.spec import load_spec
from sweep.validation.cross_validation import completed_rows_for_spec, left_out_priors
from tests.calibration.test_throughput_fit import WORK, layouts, with_throughput

PRIOR = Coefficients(compute=2.0, layer_passes=2e-4, step_overhead=0.1)


def runs_of(coeffs: Coefficients, rows: np.ndarray | None = None) -> pd.DataFrame:
    frame = layouts()
    if rows is not None:
        frame = frame.iloc[rows].reset_index(drop=True)
    return with_throughput(frame, predict(frame, WORK, coeffs)["pred_step_time_s"].to_numpy())


def scaled_prior(k: float) -> Coefficients:
    return Coefficients.from_vector(PRIOR.vector() * k, PRIOR.inter_scaling)


def test_a_cluster_that_runs_uniformly_slower_is_learned_from_a_handful_of_runs() -> None:
    runs = runs_of(scaled_prior(1.7), rows=np.arange(0, 40, 8))  # 5 runs
    result = self_calibrate([(runs, WORK)], PRIOR)
    assert result.method == "scaled"
    assert result.factor == pytest.approx(1.7, rel=1e-9)
    everything = runs_of(scaled_prior(1.7))
    assert np.abs(relative_errors(everything, WORK, result.coefficients)).max() < 1e-9


def test_one_run_on_a_sick_node_does_not_move_the_factor() -> None:
    runs = runs_of(scaled_prior(1.3), rows=np.arange(0, 60, 6))  # 10 runs
    runs.loc[0, "tokens_per_s_per_gpu"] /= 10  # ten times slower
    result = self_calibrate([(runs, WORK)], PRIOR)
    assert result.factor == pytest.approx(1.3, rel=0.02)


def test_runs_whose_terms_disagree_with_the_prior_are_refitted_when_there_are_enough() -> None:
    """The truth weighs communication and per-layer costs unlike the prior: no single factor
    explains it, and with every layout measured the refit cross-validates better."""
    truth = Coefficients(compute=2.1, layer_passes=8e-4, layer_comm=2.0, dp_comm=1.0,
                         step_overhead=0.02)
    runs = runs_of(truth)
    result = self_calibrate([(runs, WORK)], PRIOR)
    assert set(result.cv_log_error) == {"prior", "scaled", "refitted"}
    assert result.method == "refitted"
    assert result.cv_log_error["refitted"] < result.cv_log_error["scaled"]
    assert result.median_abs_error < 0.05
    scale_only = Coefficients.from_vector(PRIOR.vector() * result.factor, PRIOR.inter_scaling)
    assert result.median_abs_error < np.median(np.abs(relative_errors(runs, WORK, scale_only)))


def test_the_refit_competes_only_when_every_training_fold_can_be_fitted() -> None:
    assert competing(1) == ()
    assert competing(2) == competing(3) == ("prior", "scaled")  # a fit needs three runs
    assert competing(4) == ("prior", "scaled", "refitted")
    assert competing(200) == ("prior", "scaled", "refitted")


def test_folds_are_fixed_balanced_and_at_most_ten() -> None:
    assert list(folds(25)) == list(folds(25))
    assert sorted(np.bincount(folds(25))) == [2] * 5 + [3] * 5
    assert sorted(folds(4)) == [0, 1, 2, 3]


def test_no_completed_run_is_an_error_not_a_silent_prior() -> None:
    with pytest.raises(ValueError, match="no completed run"):
        self_calibrate([(runs_of(PRIOR).iloc[:0], WORK)], PRIOR)


def test_runs_that_scatter_around_a_good_prior_keep_it() -> None:
    """Runs the prior predicts to within their own scatter: a scale from them would only move
    the prior by that scatter, and the cross-validation keeps the prior."""
    runs = runs_of(PRIOR, rows=np.arange(0, 48, 6))  # 8 runs
    scatter = np.exp(np.random.default_rng(0).normal(0.0, 0.1, len(runs)))
    runs["tokens_per_s_per_gpu"] *= scatter
    result = self_calibrate([(runs, WORK)], PRIOR)
    assert result.method == "prior" and result.coefficients == PRIOR
    assert result.cv_log_error["prior"] <= result.cv_log_error["scaled"]
    assert "the prior kept" in result.describe()


def test_the_record_says_what_was_chosen_from_which_prior() -> None:
    result = self_calibrate([(runs_of(scaled_prior(0.8), rows=np.arange(10)), WORK)], PRIOR)
    record = result.to_dict()
    assert record["method"] == result.method and record["rows"] == 10
    assert Coefficients.from_dict(record["prior"]) == PRIOR
    assert Coefficients.from_dict(record["coefficients"]) == result.coefficients
    assert "throughput: scaled × 0.8 on 10 completed run(s)" in result.describe()


@pytest.mark.slow  # about 10 s: 16 fits on nanotron's results table
def test_on_a_model_it_was_not_fitted_on_a_first_round_stays_near_the_prior_where_a_refit_hurts(
        refdata: Path, repo_root: Path) -> None:
    """Real runs: the prior fitted on one playbook model, a first round of 8 runs of the other.
    Self-calibration predicts the rest of that model better than a full refit on the round
    (what `sweep plan --calibrate-from` did before) and close to the prior alone, on average
    over seeds. Close, not better: that prior is already within ~9 % there, and what is left is
    a bias per (tp, pp, ZeRO) family that no single scale removes, so the scale of eight random
    runs mostly moves it by their scatter. Measured over these four seeds: 1B 9.0 % against the
    prior's 8.7 %, 8B 10.9 % against 8.9 % (benchmarks/throughput_self_calibration.py has the
    full table, where from the physical prior the same round brings 35 % to about 27 %)."""
    spec = load_spec(repo_root / "examples" / "playbook.yaml")
    path = refdata / "playbook_bench_full_1B_8B.csv"
    rows, workloads = completed_rows_for_spec(pd.read_csv(path), str(path), spec)
    priors = left_out_priors(sorted(rows), rows, workloads)
    for model in rows:
        prior = priors[model]
        work, runs = workloads[model], rows[model]
        medians: dict[str, list[float]] = {"prior": [], "full": [], "self": []}
        for seed in range(4):
            pick = np.random.default_rng(seed).choice(len(runs), 8, replace=False)
            first, rest = runs.iloc[pick], runs.drop(runs.index[pick])
            for name, coeffs in (("prior", prior), ("full", fit([(first, work)]).coefficients),
                                 ("self", self_calibrate([(first, work)], prior).coefficients)):
                medians[name].append(float(np.median(np.abs(relative_errors(rest, work, coeffs)))))
        mean = {name: np.mean(values) for name, values in medians.items()}
        assert mean["self"] < 1.25 * mean["prior"], (model, mean)
        assert mean["self"] < mean["full"], (model, mean)
