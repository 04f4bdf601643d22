"""Fit the throughput model's coefficients to measured step times.

The model is linear in its coefficients (`sweep.models.throughput`) but for two, inter_scaling
(how the inter-node bandwidth per GPU falls with the nodes a group spans) and overlap_power (how
the GPU's and the host's queues combine). The fit minimises a robust (pseudo-Huber) loss of the
log error, log(predicted / measured step time): over- and under-prediction weigh the same, and
the few runs that a sick node or a congested fabric slowed down tenfold cannot pull every
coefficient towards them, as they would under squared relative error. It fits each coefficient
as its prior times exp(φ), so every coefficient stays positive (each term is a time), with a weak
ridge that keeps a term the runs cannot see at its physical prior, and solves to the minimum
itself, so a fit reproduces on another machine. inter_scaling and overlap_power come from grids,
by the one-standard-error rule (`simplest_within_one_error`).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from sweep.models.throughput import (
    FEATURES,
    Coefficients,
    features,
    predict,
    predict_step,
)
from sweep.models.throughput import (
    step_time as combine_terms,
)
from sweep.models.throughput_inputs import Workload

MIN_ROWS = 3
INTER_SCALING_GRID = (0.0, 0.5, 1.0, 1.5, 2.0)
# How the GPU's and the host's queues combine (`sweep.models.throughput.step_time`): 0 adds them.
OVERLAP_POWER_GRID = (0.0, 2.0, 4.0, 8.0, 16.0)
# Terms kept at their physical prior by every fit: within one model the memory-bound bytes grow
# with the tokens per GPU exactly as the FLOPs do (only the logits' share differs), so a fit on
# one model cannot tell them from the GEMMs' efficiency; what tells them apart is h (and V)
# across models, which is what a fit on one model must carry to the next.
PHYSICAL_FEATURES: Final = ("memory_traffic",)


ADAM_ITERATIONS: Final = 300
PHI_BOUND: Final = 20.0  # θ within e^±20 of its prior
NEWTON_STEPS: Final = 100
NEWTON_TOLERANCE: Final = 1e-13  # largest step in φ (log θ) at which the minimum is reached
NEWTON_MAX_STEP: Final = 1.0  # at most a factor e per coefficient and step: a few runs leave
# directions the ridge alone curves, where a full Newton step overshoots


# What `fit` does, in words, for the provenance of the files that record a fit.
FIT_DESCRIPTION: Final = (
    "sweep.calibration.throughput_fit.fit: mean pseudo-Huber loss (delta 0.05) of log(predicted / measured) step "
    "time, ridge 1e-4 towards the physical prior, memory_traffic kept at its prior, solved to "
    "its minimum (300 Adam steps, then Newton's method until no step moves a coefficient by "
    "1e-13); inter_scaling and overlap_power from their grids by the one-standard-error rule "
    "(the least overlap, then the least congestion, within one standard error of the best "
    "median error)")


@dataclass(frozen=True)
class Fit:
    coefficients: Coefficients
    rows: int
    median_abs_error: float  # of tokens/s/GPU, as a fraction, on the rows fitted
    p90_abs_error: float


def fit_matrix(feats: np.ndarray, step_time: np.ndarray, prior: Coefficients = Coefficients(),
               fixed: tuple[str, ...] = PHYSICAL_FEATURES, iterations: int = ADAM_ITERATIONS,
               delta: float = 0.05, ridge: float = 1e-4, inter_scaling: float = 0.0,
               overlap_power: float = 0.0) -> Coefficients:
    """Coefficients for a feature matrix and measured step times (seconds).

    Minimises the mean pseudo-Huber loss of log(predicted / measured) over θ = prior · exp(φ):
    the loss is symmetric in over- and under-prediction, robust to the runs that a sick node or
    a congested fabric slowed down tenfold, and θ stays positive (every term is a time). `fixed`
    features keep their prior. A weak ridge on φ keeps a term the data cannot see (say, no PP
    runs) at its physical prior instead of letting it drift.

    Adam (`iterations` steps) brings φ near the minimum from the prior's scale; Newton's method
    then solves for the minimum itself (`_newton`). Adam alone stops wherever its last step left it:
    on the playbook's runs 3,000 steps left some coefficients 0.4 % from the minimum, and a
    change of one unit in the last place of the inputs (another CPU's exp and log, another
    NumPy) moved them by as much, so the committed fit could not be reproduced elsewhere. The
    minimum does not depend on the path (200 to 3,000 Adam steps reach the same one), so the
    fit reproduces to about 1e-13.
    """
    if len(step_time) < MIN_ROWS:
        raise ValueError(f"calibration needs at least {MIN_ROWS} completed runs, "
                         f"got {len(step_time)}")
    if not np.all(np.isfinite(step_time)) or np.any(step_time <= 0):
        raise ValueError("calibration: step times must be positive and finite")
    prior_v = prior.vector()
    if np.any(prior_v <= 0):
        raise ValueError("calibration: prior coefficients must be positive")
    free = np.array([name not in fixed for name in FEATURES], dtype=float)
    loss = _Loss(feats * prior_v, np.log(step_time), free, overlap_power, delta, ridge)
    phi = np.zeros(len(FEATURES))
    # Start from the best common scale of the prior, so Adam begins near the data.
    start, _ = combine_terms(loss.x, overlap_power)
    phi += free * float(np.median(loss.log_t - np.log(np.maximum(start, 1e-12))))
    m = np.zeros_like(phi)
    v = np.zeros_like(phi)
    rate, beta1, beta2 = 0.05, 0.9, 0.999
    for step in range(1, iterations + 1):
        grad = loss.gradient(phi)
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad * grad
        phi -= rate * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + 1e-12)
        phi = np.clip(phi, -PHI_BOUND, PHI_BOUND)
    phi = _newton(loss, phi)
    return Coefficients.from_vector(prior_v * np.exp(phi), inter_scaling, overlap_power)


@dataclass(frozen=True)
class _Loss:
    """The fit's objective in φ = log(θ / prior): mean √(r² + δ²) over the runs, r the log
    error of the predicted step time, plus ridge · |φ|² (free terms only; fixed ones stay 0)."""

    x: np.ndarray  # features × prior, rows × FEATURES
    log_t: np.ndarray  # log measured step time
    free: np.ndarray  # 1.0 for a fitted term, 0.0 for a fixed one
    power: float
    delta: float
    ridge: float

    def value(self, phi: np.ndarray) -> float:
        r = self._residuals(phi)[0]
        return float(np.mean(np.sqrt(r * r + self.delta * self.delta))
                     + self.ridge * np.sum(phi * phi))

    def gradient(self, phi: np.ndarray) -> np.ndarray:
        r, scaled, weights, predicted = self._residuals(phi)
        psi = r / np.sqrt(r * r + self.delta * self.delta)  # derivative of the loss in r
        grad = ((psi[:, None] * scaled * weights / predicted[:, None]).mean(axis=0)
                + 2 * self.ridge * phi)
        return grad * self.free

    def _residuals(self, phi: np.ndarray) -> tuple[np.ndarray, ...]:
        scaled = self.x * np.exp(phi)
        predicted, weights = combine_terms(scaled, self.power)
        predicted = np.maximum(predicted, 1e-12)
        return np.log(predicted) - self.log_t, scaled, weights, predicted


def _newton(loss: _Loss, phi: np.ndarray) -> np.ndarray:
    """The minimum of `loss` near `phi`, by Newton's method on the free terms with a
    backtracking line search (`_step_length`)."""
    index = np.flatnonzero(loss.free)
    if not len(index):
        return phi
    for _ in range(NEWTON_STEPS):
        step = _newton_direction(loss, phi, index)
        t = _step_length(loss, phi, step, index)
        if t is None:
            break  # no step descends: φ is the minimum to the loss's rounding
        phi = np.clip(phi + t * step, -PHI_BOUND, PHI_BOUND)
        if np.max(np.abs(t * step)) <= NEWTON_TOLERANCE:
            break
    return phi


def _newton_direction(loss: _Loss, phi: np.ndarray, index: np.ndarray) -> np.ndarray:
    """−H⁻¹g on the free terms, at most `NEWTON_MAX_STEP` in any. H is the central difference
    of the exact gradient: its accuracy sets how fast Newton converges, the gradient's zero sets
    where. Where H is not positive definite it is shifted until it is, so the step descends."""
    grad = loss.gradient(phi)[index]
    h = 1e-5
    hess = np.empty((len(index), len(index)))
    for j, k in enumerate(index):
        e = np.zeros_like(phi)
        e[k] = h
        hess[:, j] = (loss.gradient(phi + e)[index] - loss.gradient(phi - e)[index]) / (2 * h)
    hess = (hess + hess.T) / 2
    shift = 0.0
    while True:
        try:
            np.linalg.cholesky(hess + shift * np.eye(len(index)))
            break
        except np.linalg.LinAlgError:
            shift = max(2 * shift, 1e-8)
    step = np.zeros_like(phi)
    step[index] = -np.linalg.solve(hess + shift * np.eye(len(index)), grad)
    return step * min(1.0, NEWTON_MAX_STEP / max(float(np.max(np.abs(step))), 1e-300))


def _step_length(loss: _Loss, phi: np.ndarray, step: np.ndarray, index: np.ndarray
                 ) -> float | None:
    """The first of 1, 1/2, 1/4, … whose step lowers the loss enough (Armijo), or None. Near
    the minimum the loss changes by less than its rounding, so a tiny full step is also taken
    where it shrinks the gradient."""
    current = loss.value(phi)
    slope = float(loss.gradient(phi)[index] @ step[index])
    if np.max(np.abs(step)) < 1e-6 and (np.max(np.abs(loss.gradient(phi + step)[index]))
                                         < np.max(np.abs(loss.gradient(phi)[index]))):
        return 1.0
    t = 1.0
    while t > 1e-12:
        value = loss.value(phi + t * step)
        if np.isfinite(value) and value <= current + 1e-4 * t * slope:
            return t
        t /= 2
    return None


def observed_step_time(frame: pd.DataFrame, seq_len: int, tokens_per_s_per_gpu: str) -> np.ndarray:
    """Seconds per optimizer step implied by a measured tokens/s/GPU."""
    from sweep.models.throughput import world_size

    tokens = (frame["dp"] * frame.get("ep", 1) * frame["mbs"] * frame["grad_acc"]).to_numpy(float)
    return tokens * seq_len / (frame[tokens_per_s_per_gpu].to_numpy(float) * world_size(frame))


def fit(groups: list[tuple[pd.DataFrame, Workload]], column: str = "tokens_per_s_per_gpu",
        prior: Coefficients = Coefficients(), fixed: tuple[str, ...] = PHYSICAL_FEATURES,
        inter_scaling: tuple[float, ...] = INTER_SCALING_GRID,
        overlap_power: tuple[float, ...] = OVERLAP_POWER_GRID) -> Fit:
    """Fit one set of coefficients to completed runs of several (model, hardware) groups.

    The linear coefficients come from `fit_matrix`; the two non-linear ones (inter_scaling,
    overlap_power) are chosen from their grids by `simplest_within_one_error`.
    """
    groups = [(f, w) for f, w in groups if len(f)]
    if not groups:
        raise ValueError("calibration needs completed runs; none were given")
    times = np.concatenate([observed_step_time(f, w.seq_len, column) for f, w in groups])
    candidates: list[tuple[Fit, float]] = []
    for gamma in inter_scaling:
        mats = np.vstack([features(f, w, gamma).to_numpy() for f, w in groups])
        for power in overlap_power:
            coeffs = fit_matrix(mats, times, prior, fixed, inter_scaling=gamma,
                                overlap_power=power)
            errors = np.abs(times / predict_step(mats, coeffs) - 1.0)  # of tokens/s/GPU
            candidates.append((Fit(coeffs, len(errors), float(np.median(errors)),
                                   float(np.quantile(errors, 0.9))), median_standard_error(errors)))
    return simplest_within_one_error(candidates)


def median_standard_error(errors: np.ndarray) -> float:
    """Distribution-free standard error of the median of `errors`: half the distance between
    the order statistics n/2 ± √n/2 (the binomial 68 % interval of the median)."""
    e = np.sort(np.asarray(errors, dtype=float))
    n = len(e)
    half = 0.5 * np.sqrt(n)
    lo = int(np.clip(np.floor(n / 2 - half), 0, n - 1))
    hi = int(np.clip(np.ceil(n / 2 + half), 0, n - 1))
    return float(e[hi] - e[lo]) / 2.0


def simplest_within_one_error(candidates: list[tuple[Fit, float]]) -> Fit:
    """The candidate of least overlap power, then least inter_scaling, whose median error is
    within one standard error of the best candidate's (Breiman's one-standard-error rule).

    Why not the best median: on one model it barely moves between overlap powers 4 and 16 (1B:
    7.7 % / 7.5 %, a quarter of a point, within its ~0.5-point standard error), yet the stronger
    overlap hides the host's queue wherever it about equals the GPU's: fitted on 1B, p = 16
    predicted 8B's tp 2-4, mbs 1-2 layouts 10-15 % fast and ranked 8B's 16-node best tenth. The
    data cannot choose between them, so the choice falls to the simpler model (p = 0 adds the two
    queues; γ = 0 charges no congestion)."""
    best, error = min(candidates, key=lambda c: c[0].median_abs_error)
    limit = best.median_abs_error + error
    eligible = [fit for fit, _ in candidates if fit.median_abs_error <= limit]
    return min(eligible, key=lambda f: (f.coefficients.overlap_power,
                                        f.coefficients.inter_scaling))


def stale_pipeline_runs(table: pd.DataFrame) -> pd.Series:
    """Rows of nanotron's results table that it flags as pipeline runs made before a fix to its
    1F1B engine (`after_pp_fix = False`): they ran 2-10x slower than the same layouts after it
    (median 3x), a bug, not a cost of the layout. Other tables carry no flag: nothing is stale."""
    if {"after_pp_fix", "pp"} <= set(table):
        return (table.pp > 1) & ~table.after_pp_fix.astype(bool)
    return pd.Series(False, index=table.index)


INTRA_NODE_BUSBW: Final = "AR Intra-node (GB/s)"  # nanotron's all-reduce test inside a node


def sick_node_runs(table: pd.DataFrame) -> pd.Series:
    """Rows of nanotron's results table whose job measured, before it ran, an all-reduce inside
    one node at less than half the table's median: a node whose NVLink was degraded (the
    playbook's jobs 14098548-14098922: ~45 GB/s where the others measured ~450; all ran at least
    1.9x slower than the same layouts elsewhere). A fault of the machine, not a cost of the
    layout, so the throughput fit leaves them out as it leaves out stale pipeline runs. Tables
    without the measurement: none."""
    if INTRA_NODE_BUSBW not in table:
        return pd.Series(False, index=table.index)
    measured = pd.to_numeric(table[INTRA_NODE_BUSBW], errors="coerce")
    return (measured < 0.5 * measured.median()).fillna(False).astype(bool)


STALE_PIPELINE: Final = "pipeline runs made before nanotron's pipeline fix (after_pp_fix = False)"
SICK_NODE: Final = "runs on a node whose NVLink all-reduce measured under half the table's median"
FIT_EXCLUSION: Final = "throughput_fit_exclusion"  # runs.parquet: the reason, recorded at import


def fit_exclusion_reasons(table: pd.DataFrame) -> pd.Series:
    """Per row, why the throughput model is not fitted or scored on it (None: it counts): the
    reason a runs.parquet recorded (`throughput_fit_exclusion`, written by `sweep
    import-playbook`), else what a published table's own columns say (`stale_pipeline_runs`,
    then `sick_node_runs`)."""
    reasons = np.full(len(table), None, dtype=object)
    for reason, excluded in ((SICK_NODE, sick_node_runs(table)),
                             (STALE_PIPELINE, stale_pipeline_runs(table))):
        reasons[excluded.to_numpy(bool)] = reason  # the stale flag wins where both hold
    if FIT_EXCLUSION in table:
        recorded = table[FIT_EXCLUSION].to_numpy(object)
        given = pd.notna(recorded)
        reasons[given] = recorded[given]
    return pd.Series(reasons, index=table.index, dtype=object)


def without_fit_exclusions(table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows of a runs table the throughput model is fitted and scored on, and how many were
    left out, by reason (`fit_exclusion_reasons`; a row counts once)."""
    reasons = fit_exclusion_reasons(table)
    counts = reasons.dropna().value_counts()
    order = [STALE_PIPELINE, SICK_NODE, *sorted(set(counts.index) - {STALE_PIPELINE, SICK_NODE})]
    left_out = {str(reason): int(counts[reason]) for reason in order if reason in counts}
    return table[reasons.isna().to_numpy()], left_out


def error_summary(errors: np.ndarray) -> dict[str, float]:
    """Median and 90th percentile of |predicted / measured − 1|, and the count."""
    errors = np.abs(np.asarray(errors, dtype=float))
    if not len(errors):
        return {"runs": 0.0, "median_abs_error": float("nan"), "p90_abs_error": float("nan")}
    return {"runs": float(len(errors)), "median_abs_error": float(np.median(errors)),
            "p90_abs_error": float(np.quantile(errors, 0.9))}


def relative_errors(frame: pd.DataFrame, work: Workload, coeffs: Coefficients,
                    column: str = "tokens_per_s_per_gpu") -> np.ndarray:
    """predicted / measured − 1 of tokens/s/GPU, per row."""
    predicted = predict(frame, work, coeffs)["pred_tokens_per_s_per_gpu"].to_numpy()
    return predicted / frame[column].to_numpy(float) - 1.0


__all__ = ["FIT_DESCRIPTION", "Fit", "error_summary", "fit", "fit_exclusion_reasons", "fit_matrix", "observed_step_time", "relative_errors", "sick_node_runs", "stale_pipeline_runs", "without_fit_exclusions"]
