"""Self-calibration of the throughput model on a sweep's own completed runs.

A first round on a new cluster, framework or model tells the throughput model what the prior
got wrong there. How much it can tell depends on how many runs it has, so this module does not
simply refit every coefficient (what `sweep calibrate` does with a published table of hundreds
of runs). Measured on the playbook's runs of a model the prior was not fitted on
(`benchmarks/throughput_self_calibration.py`), a full refit on a first round of 8 runs predicts
the rest of that model worse than the prior alone: 16 coefficients from 8 runs. What a handful
of runs does pin down is one number, how much faster or slower this setup runs than the prior
says overall. So the calibration has three candidates:

1. **prior**: the prior as it is. A prior already within ~9 % of a model it was not fitted on
   (the fit to nanotron's runs, on the other playbook model) gains little from a scale that
   three or eight runs pin down only to their own scatter: measured on 8B, such a scale made
   the left-out median 11.7 % (8 runs) against the prior's 8.9 %; with the prior competing,
   10.9 %.
2. **scaled**: the prior × k, with k = exp(median log(measured / predicted step time)). The
   median, not the mean, so that one run on a sick node does not move it.
3. **refitted**: every linear coefficient refitted (`sweep.calibration.throughput_fit.fit_matrix`, its loss and
   ridge) around the scaled prior, keeping the prior's `inter_scaling` and `overlap_power`.

and keeps the one that predicts the sweep's own runs best out of sample: the smallest K-fold
cross-validated mean |log(predicted / measured)| (K = min(runs, 10), folds drawn by a fixed
seed; a tie goes to the simpler). Requiring a method to beat a simpler one by a standard error
(as the fit's non-linear choice does) kept the physical prior unscaled in 7 of 8 first rounds
of 8 runs, where the scale would have brought the rest from 35 % to 27 %: so the plain minimum. The prior and the scale compete from two runs, the refit only
when every training fold holds the `MIN_ROWS` runs a fit needs; a single run scales the prior,
with nothing to validate it against. With a good prior and few runs the prior or the scale wins;
with a poor prior (the physical one) and tens of runs the refit does: the data decides, not a
threshold chosen on the benchmark.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.calibration.throughput_fit import MIN_ROWS, fit_matrix, observed_step_time
from sweep.models.throughput import Coefficients, features, predict_step
from sweep.models.throughput_inputs import Workload

MAX_FOLDS: Final = 10
FOLD_SEED: Final = 0
METHODS: Final = ("prior", "scaled", "refitted")  # simplest first: a tie goes to the earlier


@dataclass(frozen=True)
class SelfCalibration:
    """The coefficients a sweep's own runs give, and how they were chosen."""

    coefficients: Coefficients
    prior: Coefficients
    method: str  # "scaled" or "refitted"
    factor: float  # k: the prior's step times × k match the runs' median
    rows: int
    cv_log_error: dict[str, float]  # per method competing: K-fold mean |log(pred / measured)|
    median_abs_error: float  # |predicted / measured − 1| of tokens/s/GPU, on the runs fitted
    p90_abs_error: float

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "factor": self.factor, "rows": self.rows,
                "cv_log_error": dict(self.cv_log_error),
                "median_abs_error": self.median_abs_error, "p90_abs_error": self.p90_abs_error,
                "coefficients": self.coefficients.to_dict(), "prior": self.prior.to_dict(),
                "rule": "the prior x k (k: median measured / predicted step time), or every "
                        "coefficient refitted around it, whichever has the smaller "
                        f"{MAX_FOLDS}-fold (at most) cross-validated mean |log error| on these "
                        "runs"}

    def describe(self) -> str:
        """One line for `sweep plan --calibrate-from`."""
        how = {"prior": f"the prior kept (the runs' median ratio × {self.factor:.3g} did not "
                        "cross-validate better)",
               "scaled": f"scaled × {self.factor:.3g}",
               "refitted": f"refitted around the prior × {self.factor:.3g}"}[self.method]
        scores = ", ".join(f"{m} {e:.3f}" for m, e in self.cv_log_error.items())
        return (f"throughput: {how} on {self.rows} completed run(s) (cross-validated mean "
                f"|log error|: {scores}); median |error| {self.median_abs_error:.1%}")


def scaled(prior: Coefficients, feats: np.ndarray, step_time: np.ndarray) -> Coefficients:
    """The prior × k, k the median ratio of measured to predicted step time."""
    return prior_times(prior, scale_factor(prior, feats, step_time))


def scale_factor(prior: Coefficients, feats: np.ndarray, step_time: np.ndarray) -> float:
    predicted = predict_step(feats, prior)
    return float(np.exp(np.median(np.log(step_time / predicted))))


def prior_times(prior: Coefficients, k: float) -> Coefficients:
    return Coefficients.from_vector(prior.vector() * k, prior.inter_scaling,
                                    prior.overlap_power)


def refitted(prior: Coefficients, feats: np.ndarray, step_time: np.ndarray) -> Coefficients:
    """Every linear coefficient refitted around the scaled prior (its inter_scaling kept)."""
    return fit_matrix(feats, step_time, scaled(prior, feats, step_time),
                      inter_scaling=prior.inter_scaling, overlap_power=prior.overlap_power)


def unchanged(prior: Coefficients, feats: np.ndarray, step_time: np.ndarray) -> Coefficients:
    """The prior as it is (the runs only score it)."""
    return prior


FITTERS: Final[dict[str, Callable[[Coefficients, np.ndarray, np.ndarray], Coefficients]]] = {
    "prior": unchanged, "scaled": scaled, "refitted": refitted}


def folds(n: int) -> np.ndarray:
    """The fold of each run: K = min(n, MAX_FOLDS) folds of a fixed random permutation."""
    k = min(n, MAX_FOLDS)
    order = np.random.default_rng(FOLD_SEED).permutation(n)
    fold = np.empty(n, dtype=np.int64)
    fold[order] = np.arange(n) % k
    return fold


def cross_validated_log_error(fitter: Callable[[Coefficients, np.ndarray, np.ndarray], Coefficients],
                              prior: Coefficients, feats: np.ndarray, step_time: np.ndarray
                              ) -> float:
    """Mean |log(predicted / measured)| of each run, predicted by a fit without its fold."""
    fold = folds(len(step_time))
    errors = np.empty(len(step_time))
    for f in np.unique(fold):
        test = fold == f
        coeffs = fitter(prior, feats[~test], step_time[~test])
        errors[test] = np.abs(np.log(predict_step(feats[test], coeffs) / step_time[test]))
    return float(np.mean(errors))


def competing(n: int) -> tuple[str, ...]:
    """The methods n runs can cross-validate: the prior and the scale need one run in each
    training fold (two runs in all), the refit MIN_ROWS."""
    if n < 2:
        return ()
    k = min(n, MAX_FOLDS)
    smallest_training_fold = n - -(-n // k)
    return METHODS if smallest_training_fold >= MIN_ROWS else ("prior", "scaled")


# Cross-validated errors closer than this are a tie (rounding, not evidence): runs that a scale
# of the prior explains exactly leave the scale and the refit both at about 1e-16.
TIE: Final = 1e-9


def _simplest_best(scores: dict[str, float]) -> str:
    """The simplest method (`METHODS` order) whose error is within `TIE` of the smallest."""
    best = min(scores.values())
    return next(m for m in METHODS if m in scores and scores[m] <= best + TIE)


def self_calibrate(groups: Sequence[tuple[pd.DataFrame, Workload]], prior: Coefficients,
                   column: str = "tokens_per_s_per_gpu") -> SelfCalibration:
    """Calibrate `prior` on the completed runs of `groups` (runs of each model with its
    workload). Raises ValueError when there is no run with a positive throughput."""
    groups = [(frame, work) for frame, work in groups if len(frame)]
    if not groups:
        raise ValueError("no completed run with a measured throughput")
    feats = np.vstack([features(frame, work, prior.inter_scaling).to_numpy()
                       for frame, work in groups])
    step_time = np.concatenate([observed_step_time(frame, work.seq_len, column)
                                for frame, work in groups])
    if not np.all(np.isfinite(step_time)) or np.any(step_time <= 0):
        raise ValueError("the runs' measured throughputs must be positive and finite")
    scores = {m: cross_validated_log_error(FITTERS[m], prior, feats, step_time)
              for m in competing(len(step_time))}
    method = _simplest_best(scores) if scores else "scaled"
    coefficients = FITTERS[method](prior, feats, step_time)
    errors = np.abs(step_time / predict_step(feats, coefficients) - 1.0)  # of tokens/s/GPU
    return SelfCalibration(coefficients, prior, method, scale_factor(prior, feats, step_time),
                           len(step_time), scores, float(np.median(errors)),
                           float(np.quantile(errors, 0.9)))


__all__ = ["FITTERS", "METHODS", "SelfCalibration", "competing", "cross_validated_log_error",
           "folds", "prior_times", "refitted", "scale_factor", "scaled", "self_calibrate",
           "unchanged"]
