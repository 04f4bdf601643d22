"""Self-calibration: correct the memory model with a sweep's own attempts, and re-plan.

The allocator constants of `sweep.models.fitted_memory` were fitted on nanotron runs of two models on
H100s. A user's first round on another cluster, framework or model measures what the planner only
predicted: each attempt's reserved and allocated peaks (runs.parquet `mem_reserved_bytes`,
`mem_allocated_bytes`, max over ranks) and its outcome. `sweep plan SPEC --calibrate-from RUNS`
turns that into the memory rule of the next plan; `calibration.json` in the sweep folder records
what the rule was based on (`Calibration.to_dict`).

**The rule, for small samples.** A first round holds a handful of attempts, often of one or two
layouts. That cannot separate the four allocator constants of `sweep.validation.memory_fit` (their grid fit needs
runs that vary the pipeline depth, the micro-batch and the vocabulary to tell the shares apart,
and its constraints are fractions of hundreds of runs), so this module fits one number: a factor
`k` on everything the memory model puts in the allocator (allocated tensors and fragmentation,
i.e. the predicted reserved peak). The runtime overhead outside it (CUDA context, libraries, NCCL
buffers) stays as predicted unless the attempts measured it (`mem_outside_allocator_bytes`): the
built-in workload samples it at every step on CUDA, and a CUDA OOM's message says what the
process held outside the allocator when it failed (sweep.collect.cuda_oom). Then every
prediction's overhead is raised by the largest excess measured over the predicted one, `d`
(on an H200 the context alone was 1.2-1.3 GiB against the 512 MiB assumed). A reading below the
prediction lowers nothing: an OOM can come before NCCL has set up its buffers. For attempt i with
predicted reserved peak r_i, overhead o_i + d and the memory limit L_i it ran under:

1. target: `t` = the geometric mean of `measured_i / r_i` over the completed attempts with a
   measured peak. The factor removes the model's bias on this cluster; the spread around it is
   the memory band's to cover (`sweep.plan.space.memory_over` keeps what the band straddles as a
   probe), so t is the central ratio, not the largest: the largest inflates every prediction by
   the worst-predicted attempt's error and prunes runs that fit.
   An attempt that fitted only because the caching allocator released its cache and retried
   (`mem_alloc_retries` > 0) is left out of t: its reserved peak is the card's limit, not what
   its configuration reserves (an H100 cut one from 79.2 to 75.3 GiB);
2. with a measured peak, k = t. The attempts' outcomes bound nothing then: each is the truth
   about its own configuration (`replan` never prunes a configuration that completed, and a
   search skips what an OOM proves), and as bounds on the factor they move every other
   prediction by the attempt furthest from the model's centre, as the largest ratio does;
3. with none, k is the prior (1) moved as little as it takes for every completed attempt to be
   predicted to fit, k·r_i + o_i + d <= L_i (an upper bound: a run that ran is proof its
   configuration fits), and every OOM not to, k·r_i + o_i + d > L_i (a lower bound): the
   outcomes are then all the round says about memory.

`benchmarks/self_calibration_transfer.py` measures the rules on a model the constants were not
fitted on (a first round of 8 to 64 of its attempts, scored on the rest of its runs): the
largest ratio keeps 2-4 % fewer of that model's successful runs than the geometric mean and
more than doubles the error of the reserved peaks; the geometric mean bounded by every outcome
(the rule until this release) kept fewer successful runs, pruned fewer OOMs and erred more
than the geometric mean alone, from every prior it was given (docs/validation.md,
"Self-calibration of the memory model").

The bounds are reported either way (calibration.json), with the conflicting evidence: an OOM
whose bound is at or above a completed attempt's, so that no k explains both, is settled for the
completed attempts and listed as `unexplained` (something the model does not hold ran out:
another process, a leak, a cap); it bounds nothing. Attempts without
a limit (no `gpu_memory_gb` on `gpu: cpu`) or run under their own cap (`rank_memory_limit_mb`,
which on CPU bounds address space, not the resident peak measured) give no bound; their peaks
still count towards t. An attempt is only evidence for a spec it can be judged under: rows of
another model, framework, sequence length, dtype or GPUs per node are left out and counted.

Pure, except `read_attempts` and `calibrate`, which read the runs file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.collect.attempts import unreadable_runs
from sweep.core.layout import LAYOUT_INT_COLUMNS, LAYOUT_MODE_COLUMNS
from sweep.core.state import file_sha256
from sweep.core.units import GiB
from sweep.models import memory
from sweep.plan import space
from sweep.plan.spec import Spec

CALIBRATION_FILE: Final = "calibration.json"
OUTCOMES: Final = ("completed", "oom")
REQUIRED_COLUMNS: Final = ("run_id", "attempt", "framework", "model", "gpus_per_node", "seq_len",
                           "dtype", *LAYOUT_INT_COLUMNS, *LAYOUT_MODE_COLUMNS, "outcome",
                           "mem_reserved_bytes", "mem_allocated_bytes", "mem_source",
                           "settings_json")
RULE: Final = (
    "k multiplies the predicted reserved peak (allocated + fragmentation; the CUDA/NCCL overhead "
    "stays as predicted, raised by the largest excess the attempts measured): k = the "
    "geometric mean of measured / predicted over completed attempts with a peak; without one, "
    "1 moved as little as needed so every completed attempt is predicted to fit and every OOM "
    "not to (an OOM no k can explain beside the completed attempts is listed as unexplained "
    "and bounds nothing); a configuration that completed is never pruned")
_STRICT: Final = 1e-9  # an OOM must be predicted strictly over its limit


class CalibrationError(ValueError):
    """A runs file that cannot calibrate this spec: names the file, what is missing, the fix."""


@dataclass(frozen=True)
class MemoryCorrection:
    """The fitted factor and what bounded it (lower/upper: None where nothing bounds)."""

    factor: float
    target: float  # what the measured peaks alone ask for (1.0: nothing measured)
    # the outcomes' bounds on k, applied only where no peak was measured (rule 3)
    lower: float | None  # from the OOMs the model explains
    upper: float | None  # from the completed attempts
    n_completed: int
    n_oom: int
    n_measured: int  # completed attempts with a measured reserved peak
    n_unbounded: int  # attempts with no limit to judge their outcome against
    unexplained_ooms: tuple[str, ...]  # run ids (attempt) of OOMs that bound nothing
    # added to every predicted overhead: the largest measured excess over it (0: none measured)
    overhead_delta_bytes: float = 0.0
    n_overhead_measured: int = 0  # attempts whose memory outside the allocator was measured
    # completed attempts that fitted only by flushing the allocator's cache: not in the target
    n_flushed: int = 0

    @property
    def bound_by(self) -> str:
        """What set the factor: the measured peaks, an OOM, a completed attempt, or the prior."""
        if self.n_measured:
            return "measured peaks"
        if self.lower is not None and self.factor > self.target:
            return "oom"
        if self.upper is not None and self.factor < self.target:
            return "completed"
        return "measured peaks" if self.n_measured else "prior"


@dataclass(frozen=True)
class Calibration:
    """What `sweep plan --calibrate-from` decided with, and from what (calibration.json)."""

    source: str
    source_sha256: str
    spec_name: str
    spec_hash: str
    memory: MemoryCorrection
    residuals: tuple[dict[str, Any], ...]  # per attempt: measured, prior and calibrated prediction
    left_out: dict[str, int]  # rows not used, by reason

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "source_sha256": self.source_sha256,
                "spec": self.spec_name, "spec_hash": self.spec_hash, "rule": RULE,
                "function": "sweep.calibration.memory_self_calibration.fit_correction",
                "memory": {**asdict(self.memory), "bound_by": self.memory.bound_by,
                           "unexplained_ooms": list(self.memory.unexplained_ooms)},
                "residuals": list(self.residuals), "left_out": self.left_out}


# Reading ------------------------------------------------------------------------------------------

def fitted_by_flushing(runs: pd.DataFrame) -> pd.Series:
    """The attempts that fitted only because the caching allocator released its cache and
    retried (`mem_alloc_retries` > 0): their reserved peak is set by the card, not by their
    configuration, so it is no measure of the model's reserve (their outcome still is)."""
    if "mem_alloc_retries" not in runs:
        return pd.Series(False, index=runs.index)
    return pd.to_numeric(runs["mem_alloc_retries"]).fillna(0) > 0


def read_attempts(path: Path) -> pd.DataFrame:
    """runs.parquet as `sweep collect` writes it, or a CalibrationError that names the file."""
    if not path.is_file():
        raise CalibrationError(f"{path}: no such file; give the runs.parquet that `sweep run` or "
                               "`sweep collect DIR` wrote (DIR/runs.parquet)")
    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise CalibrationError(unreadable_runs(path, error)) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise CalibrationError(f"{path}: not a runs.parquet of `sweep collect`: no column(s) "
                               f"{missing}; run `sweep collect DIR` to write one")
    return table


def usable(table: pd.DataFrame, spec: Spec) -> tuple[pd.DataFrame, dict[str, int]]:
    """The completed and OOM attempts this spec can judge, and how many rows were left out why."""
    models = {m.name for m in spec.model_shapes}
    reasons = {
        "outcome not completed or oom": ~table["outcome"].isin(OUTCOMES),
        "model not in the spec": ~table["model"].isin(models),
        "another framework": table["framework"] != spec.framework,
        "another seq_len, dtype or gpus_per_node": (
            (table["seq_len"] != spec.seq_len) | (table["dtype"] != spec.dtype)
            | (table["gpus_per_node"] != spec.gpus_per_node_resolved)),
    }
    dropped = pd.Series(False, index=table.index)
    left_out: dict[str, int] = {}
    for reason, mask in reasons.items():
        new = mask & ~dropped
        if new.any():
            left_out[reason] = int(new.sum())
        dropped |= mask
    return table[~dropped].reset_index(drop=True), left_out


# Judging ------------------------------------------------------------------------------------------

def _cap_mb(settings_json: object) -> float | None:
    try:
        value = json.loads(str(settings_json)).get("rank_memory_limit_mb")
    except (ValueError, AttributeError):
        return None
    return float(value) if value else None


def evidence(attempts: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """Per attempt: the prior's reserved peak and overhead for the most loaded rank (the runs
    record the max over ranks), and the limit its outcome is judged against (NaN: none)."""
    out = attempts[["run_id", "attempt", "model", "outcome"]].copy()
    out["measured_reserved"] = attempts["mem_reserved_bytes"].astype("float64")
    out["measured_outside"] = (attempts["mem_outside_allocator_bytes"].astype("float64")
                               if "mem_outside_allocator_bytes" in attempts else np.nan)
    out["flushed"] = fitted_by_flushing(attempts)
    out["pred_reserved"] = np.nan
    out["pred_overhead"] = np.nan
    budget = space.memory_budget_bytes(spec)
    for name, group in attempts.groupby("model", sort=False):
        model = next(m for m in spec.model_shapes if m.name == name)
        columns: dict[str, np.ndarray] = {
            k: group[k].to_numpy(np.int64) for k in LAYOUT_INT_COLUMNS}
        columns["sp"] = group["sp"].to_numpy(bool)
        columns["recompute"] = group["recompute"].astype(str).to_numpy()
        columns["pp_schedule"] = group["pp_schedule"].astype(str).to_numpy()
        predicted = memory.estimate_columns(model, columns, seq_len=spec.seq_len,
                                            dtype=spec.dtype, profile=spec.memory_profile)
        out.loc[group.index, "pred_reserved"] = predicted["mem_reserved_bytes"].astype(float)
        out.loc[group.index, "pred_overhead"] = predicted["mem_overhead_bytes"].astype(float)
    capped = attempts["settings_json"].map(_cap_mb).notna()
    out["limit"] = np.nan if budget is None else float(budget)
    out.loc[capped, "limit"] = np.nan  # its own cap, not the budget the planner judges
    return out


def geometric_mean(ratios: np.ndarray) -> float:
    """The central measured / predicted ratio: memory errors are multiplicative (a share of the
    activations, a share of the weights), so their centre is taken in log space."""
    return float(np.exp(np.mean(np.log(ratios))))


def into_bounds(factor: float, lower: float | None, upper: float | None) -> float:
    """`factor` moved as little as it takes to be strictly over `lower` (every OOM predicted
    not to fit) and at most `upper` (every completed attempt predicted to fit); None bounds
    nothing. Rule 3 of the module docstring; the benchmark applies it to measured targets too."""
    if lower is not None:
        factor = max(factor, lower * (1 + _STRICT) if lower > 0 else 0.0)
    if upper is not None:
        factor = min(factor, upper)
    return factor


def fit_correction(ev: pd.DataFrame,
                   target_of: Callable[[np.ndarray], float] = geometric_mean) -> MemoryCorrection:
    """The factor of the module docstring's rule, on `evidence` rows (pure). `target_of` turns
    the measured / predicted ratios into the target (the benchmark compares others)."""
    completed, oom = ev["outcome"] == "completed", ev["outcome"] == "oom"
    flushed = ev["flushed"].astype(bool) if "flushed" in ev else pd.Series(False, index=ev.index)
    measured = completed & (ev["measured_reserved"] > 0) & (ev["pred_reserved"] > 0)
    set_aside = measured & flushed  # their reserved peak is the card's: a bound, not a measure
    measured &= ~flushed
    ratios = (ev.loc[measured, "measured_reserved"] / ev.loc[measured, "pred_reserved"]).to_numpy()
    target = target_of(ratios) if len(ratios) else 1.0
    outside = ev["measured_outside"] if "measured_outside" in ev else pd.Series(np.nan, ev.index)
    excess = (outside - ev["pred_overhead"])[outside > 0]
    delta = max(0.0, float(excess.max())) if len(excess) else 0.0
    bounded = ev["limit"].notna() & (ev["pred_reserved"] > 0)
    edge = (ev["limit"] - ev["pred_overhead"] - delta) / ev["pred_reserved"]  # k that just fits
    uppers = edge[completed & bounded]
    upper = float(uppers.min()) if len(uppers) else None
    explained = oom & bounded
    unexplained = pd.Series(False, index=ev.index)
    if upper is not None:
        unexplained = explained & (edge >= upper)
        explained &= ~unexplained
    lower = float(edge[explained].max()) if explained.any() else None
    # with no measured peak the outcomes are all the round says about memory (rule 3)
    factor = target if measured.any() else into_bounds(target, lower, upper)
    ids = ev.loc[unexplained, "run_id"].astype(str) + "#" + ev.loc[unexplained, "attempt"].astype(str)
    return MemoryCorrection(
        factor=factor, target=target, lower=lower, upper=upper,
        n_completed=int(completed.sum()), n_oom=int(oom.sum()), n_measured=int(measured.sum()),
        n_unbounded=int((~bounded).sum()), unexplained_ooms=tuple(ids),
        overhead_delta_bytes=delta, n_overhead_measured=int(len(excess)),
        n_flushed=int(set_aside.sum()))


def residuals(ev: pd.DataFrame, factor: float) -> tuple[dict[str, Any], ...]:
    """Per attempt: measured and predicted reserved peaks (prior and calibrated) and the
    calibrated signed relative error, predicted / measured - 1 (None: no measured peak)."""
    rows = []
    for r in ev.itertuples():
        measured = float(r.measured_reserved) if r.measured_reserved > 0 else None
        calibrated = factor * float(r.pred_reserved)
        rows.append({"run_id": str(r.run_id), "attempt": int(r.attempt),
                     "outcome": str(r.outcome), "measured_reserved_bytes": measured,
                     "prior_reserved_bytes": float(r.pred_reserved),
                     "calibrated_reserved_bytes": round(calibrated),
                     "limit_bytes": None if pd.isna(r.limit) else float(r.limit),
                     "calibrated_rel_err": None if measured is None
                     else round(calibrated / measured - 1.0, 6)})
    return tuple(rows)


def calibrate(path: Path, spec: Spec) -> Calibration:
    """Read RUNS, keep what this spec can judge, fit the factor; refuse with no evidence."""
    table = read_attempts(path)
    attempts, left_out = usable(table, spec)
    if attempts.empty:
        why = ", ".join(f"{n} {reason}" for reason, n in left_out.items()) or "it has no rows"
        raise CalibrationError(
            f"{path}: no completed or OOM attempt of {spec.name}'s models to calibrate on "
            f"({why}); run a first round (`sweep run SPEC --out DIR`) and give DIR/runs.parquet")
    ev = evidence(attempts, spec)
    correction = fit_correction(ev)
    return Calibration(str(path), file_sha256(path), spec.name, spec.spec_hash(), correction,
                       residuals(ev, correction.factor), left_out)


# Re-planning --------------------------------------------------------------------------------------

PRIOR_TOTAL: Final = "mem_prior_total_bytes"


def completed_run_ids(residuals: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The run ids of the attempts that completed, from `residuals` rows (a Calibration's, or
    calibration.json's): configurations a re-plan must keep."""
    return frozenset(str(r["run_id"]) for r in residuals if r.get("outcome") == "completed")


def replan(frame: pd.DataFrame, spec: Spec, factor: float, overhead_delta: float = 0.0,
           completed: Collection[str] = frozenset()) -> pd.DataFrame:
    """The plan with the memory rule applied to the corrected estimate.

    Only candidates the memory rule decided (status kept or pruned:memory: they passed every
    earlier rule) can change, and none whose run id is in `completed`: a run that ran is proof
    that its configuration fits, whatever the factor predicts for it. Their allocator-side bytes (every mem_* column but the overhead)
    are scaled by `factor`, their overhead is raised by `overhead_delta` (what the attempts
    measured beyond it), the total is the scaled reserved peak plus the overhead, the prior
    total is kept in `mem_prior_total_bytes`, and a candidate newly kept gets its run id. The
    rule is the planner's (`sweep.plan.space.memory_over`), band and probes included: the factor
    corrects the point estimate, it does not make it certain.
    Scaling the reserved peak of both pipeline stages keeps the same stage the most loaded:
    both carry the same overhead.
    """
    memory_rule = f"pruned:{space.RULE_NAMES[-1]}"
    judged = frame["status"].isin([space.KEPT, memory_rule]) & frame["mem_total_bytes"].notna()
    out = frame.copy()
    prior_total = out["mem_total_bytes"].copy()
    scaled = [c for c in out.columns if c.startswith("mem_") and c.endswith("_bytes")
              and c not in ("mem_overhead_bytes", "mem_total_bytes")]
    for column in scaled:
        values = out.loc[judged, column].astype("float64") * factor
        out.loc[judged, column] = values.round().astype("int64")
    if overhead_delta:
        raised = out.loc[judged, "mem_overhead_bytes"].astype("float64") + overhead_delta
        out.loc[judged, "mem_overhead_bytes"] = raised.round().astype("int64")
    total = out["mem_reserved_bytes"].astype("Int64") + out["mem_overhead_bytes"].astype("Int64")
    out.loc[judged, "mem_total_bytes"] = total[judged]
    out[PRIOR_TOTAL] = prior_total
    budget = space.memory_budget_bytes(spec)
    over = judged & False
    if budget is not None:
        mem = {c: out[c].astype("float64").to_numpy() for c in
               ("mem_total_bytes", "mem_reserved_bytes", "mem_overhead_bytes")}
        over = judged & space.memory_over(mem, budget, probes=spec.constraints.memory_probes,
                                          band=spec.reserved_band)
        if completed and over.any():
            ran = pd.Series(space.run_ids(spec, out[over]), index=out.index[over]).isin(completed)
            over[ran[ran].index] = False
    was = out["status"].astype(str)
    out.loc[judged & over, "status"] = memory_rule
    out.loc[judged & ~over, "status"] = space.KEPT
    out.loc[judged & over, "prune_rule"] = space.RULE_NAMES[-1]
    out.loc[judged & ~over, "prune_rule"] = np.nan
    run_ids = out["run_id"].astype(object)
    newly_kept = judged & (was != space.KEPT) & ~over
    if newly_kept.any():
        run_ids[newly_kept] = space.run_ids(spec, out[newly_kept])
    run_ids[judged & over] = None
    out["run_id"] = pd.array(run_ids.tolist(), dtype=frame["run_id"].dtype)
    out["probe"] = space.is_probe(out, budget)
    return out


def changes(prior: pd.DataFrame, calibrated: pd.DataFrame) -> dict[str, int]:
    """How many candidates the calibration kept that the prior pruned, and the other way."""
    before = prior["status"].astype(str) == space.KEPT
    after = calibrated["status"].astype(str) == space.KEPT
    return {"pruned_to_kept": int((~before & after).sum()),
            "kept_to_pruned": int((before & ~after).sum())}


def describe(calibration: Calibration, changed: dict[str, int]) -> list[str]:
    """What `sweep plan` prints about the calibration it used."""
    m = calibration.memory
    lines = [f"memory calibrated from {calibration.source} (sha256 "
             f"{calibration.source_sha256[:12]}…): {m.n_completed} completed and {m.n_oom} OOM "
             f"attempt(s), {m.n_measured} with a measured peak"
             + (f" ({m.n_flushed} more fitted only by flushing the allocator's cache: their "
                f"reserved peak is the card's, so it bounds k and does not set it)"
                if m.n_flushed else ""),
             f"  reserved peak × {m.factor:.3f} (measured peaks ask × {m.target:.3f}; bounds "
             f"[{'–' if m.lower is None else f'{m.lower:.3f}'}, "
             f"{'–' if m.upper is None else f'{m.upper:.3f}'}]; set by {m.bound_by})"]
    errors = [r["calibrated_rel_err"] for r in calibration.residuals
              if r["calibrated_rel_err"] is not None]
    if errors:
        lines.append(f"  calibrated reserved-peak error over {len(errors)} attempt(s): median "
                     f"{np.median(errors):+.1%}, worst {max(errors, key=abs):+.1%}")
    if m.overhead_delta_bytes:
        lines.append(f"  overhead outside the allocator + {m.overhead_delta_bytes / GiB:.2f} GiB: "
                     f"the largest excess over the prediction among {m.n_overhead_measured} "
                     "attempt(s) that measured it (CUDA step samples, OOM messages)")
    if m.unexplained_ooms:
        lines.append(f"  {len(m.unexplained_ooms)} OOM(s) no factor explains beside the "
                     "completed runs (something the model does not hold ran out)"
                     + ("" if m.n_measured else ", left out of the bounds")
                     + f": {', '.join(m.unexplained_ooms)}")
    for reason, n in calibration.left_out.items():
        lines.append(f"  left out {n} row(s): {reason}")
    lines.append(f"  {changed['pruned_to_kept'] + changed['kept_to_pruned']} candidate(s) changed "
                 f"status: {changed['pruned_to_kept']} pruned → kept, "
                 f"{changed['kept_to_pruned']} kept → pruned")
    return lines
