"""Fit the memory model's allocator constants to measured runs, on a stated grid, by a stated objective.

The caching allocator's reserve beyond live tensors is modelled with four constants shared by every
memory profile (`sweep.models.memory_profiles`): a share of the activations of a micro-batch alone in
flight, a share of those a pipeline keeps in flight, a share of the logits, and a floor. They are
the only fitted constants of the memory model. `scripts/fit_memory.py` runs `fit_reference` on the
reference data and writes them, with their provenance, to `sweep/models/fitted_memory.py`;
tests/validation/test_memory_fit.py reruns it and compares.

Objective (`OBJECTIVE`), set before looking at any held-out figure. The constants serve two ends:
the planner's verdict (a run that ran must not be pruned, one that ran out of memory should be) and
the reserved-peak prediction. The verdict comes first, so it is a constraint: the planner's gates
(docs/planning.md, "The constants are fitted, not chosen": keep >= 99 % of the successful runs, prune >= 90 % of the OOM runs, where the table
tells OOMs apart) and every published llm-foundry configuration predicted to fit (it ran). Among
the grid points that meet them, the fit takes the smallest *mean* absolute relative error of the
reserved peak predicted for rank 0 (the first pipeline stage, the rank that was measured) over the
successful runs: an L1 loss, in which each run weighs in proportion to its error, so the tail
counts (a median objective ignores the worst half of the runs, and traded p90 for median).
Ties go to the earlier grid point. Where no grid point meets the gates (a table unlike the
playbook's), the fit takes the points that fall least short of them and reports `gates_met`
false instead of failing: a fold of leave-one-model-out or a user's table still gets figures.
The issue's stricter gates (99.5 % / 95 %) admit no grid point even in-sample on the playbook
table, so they are reported, not imposed.

Each run is judged exactly as `sweep.validation.memory_check.score` judges it; the fit only makes that cheap: the
fragmentation is linear in the four constants, so the memory model is evaluated once per basis
vector and every grid point is a weighted sum (equal to the real path up to rounding to whole
bytes; what is reported is `sweep.validation.memory_check` rescoring at the chosen point).

`cross_validate` refits on every model but one and scores the one left out (leave-one-model-out);
its pooled signed errors give the band of `sweep.models.memory.reserved_interval`.

Pure. The published configurations that must fit, and the fit that writes the committed
constants, read files: `sweep.validation.memory_reference`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.core.model import ModelShape
from sweep.core.units import MiB
from sweep.models import memory
from sweep.models.memory_profiles import Allocator, MemoryProfile
from sweep.plan import space
from sweep.plan.spec import ALLOCATOR_SHARE_MAX, FLOOR_MIB_MAX, Spec
from sweep.validation import memory_check

MIN_SUCCESS_KEPT: Final = 0.99
MIN_OOM_PRUNED: Final = 0.90
# The targets for the memory model, measured leave-one-model-out (reported, not fitted to)
# (the point estimate's verdicts; `success_lost_frac` is the first target read with the probes of
# sweep.plan.space.memory_over: a successful run is lost only when it is pruned without a probe).
TARGETS: Final = {"success_kept_frac": (">=", 0.995), "oom_pruned_frac": (">=", 0.95),
                  "reserved_median_abs_rel_err": ("<=", 0.07),
                  "reserved_p90_abs_rel_err": ("<=", 0.20),
                  "success_lost_frac": ("<=", 0.005)}
BAND_QUANTILES: Final = (0.05, 0.95)  # the interval: 90 % of held-out runs, by construction
OBJECTIVE: Final = (
    "minimise the mean |predicted - measured| / measured of the reserved peak of rank 0 (first "
    "pipeline stage) over the successful runs, subject to success_kept_frac >= "
    f"{MIN_SUCCESS_KEPT}, oom_pruned_frac >= {MIN_OOM_PRUNED} where the table tells OOMs apart, "
    "and every published llm-foundry H100/A100-80GB configuration predicted to fit; ties: the "
    "earlier grid point; where no grid point meets these gates, the points that fall least short "
    "of them (summed shortfall) instead")


def meets(value: float | None, op: str, bound: float) -> bool | None:
    """Whether a figure meets a target of `TARGETS` (None: the table cannot give the figure)."""
    if value is None:
        return None
    return value >= bound if op == ">=" else value <= bound


@dataclass(frozen=True)
class Grid:
    """Evenly spaced values of each constant; the fit searches their product."""

    sequential: tuple[float, ...]
    pipelined: tuple[float, ...]
    logits: tuple[float, ...]
    floor_mib: tuple[int, ...]

    def points(self) -> np.ndarray:
        """(n, 4) array: sequential, pipelined, logits, floor bytes; floor varies fastest."""
        pts = np.array(list(itertools.product(self.sequential, self.pipelined, self.logits,
                                              self.floor_mib)), dtype=np.float64)
        pts[:, 3] *= MiB
        return pts

    def describe(self) -> dict[str, dict[str, float]]:
        """Each axis as first, last, step and count (for the provenance)."""
        out = {}
        for name, values in asdict(self).items():
            step = values[1] - values[0] if len(values) > 1 else 0
            out[name] = {"first": values[0], "last": values[-1], "step": round(step, 6),
                         "count": len(values)}
        return out


def _steps(start: float, stop: float, step: float) -> tuple[float, ...]:
    n = int(round((stop - start) / step))
    return tuple(round(start + i * step, 6) for i in range(n + 1))


# Wide enough that no fit of `sweep memory-check --cv model` on the playbook tables lands on an
# edge (the 1B-out fold of the charts table takes logits 0.8; the full table alone, sequential 0.3).
GRID: Final = Grid(sequential=_steps(0.0, 0.50, 0.025), pipelined=_steps(0.0, 1.0, 0.05),
                   logits=_steps(0.0, 1.0, 0.05), floor_mib=tuple(range(0, 1025, 64)))
# A fit that lands on an axis's largest value has not found its optimum, only the grid's edge:
# `fit_basis` then widens that axis (another span of its values, at its step) and fits again, up
# to this many times and to the limits a spec accepts. Another cluster's stack can reserve more
# than the playbook's (our H200 runs: a floor past 1 GiB).
MAX_WIDENINGS: Final = 4
AXIS_LIMITS: Final = {"sequential": ALLOCATOR_SHARE_MAX, "pipelined": ALLOCATOR_SHARE_MAX,
                      "logits": ALLOCATOR_SHARE_MAX, "floor_mib": FLOOR_MIB_MAX}


def widened(grid: Grid, at_edge: Iterable[str], base: Grid = GRID) -> Grid | None:
    """`grid` with each named axis extended, at its own step, by as many values as `base`'s
    axis spans (so each widening costs the same), within `AXIS_LIMITS`; None when none of them
    can grow."""
    axes = asdict(grid)
    grown = False
    for name in at_edge:
        values = axes[name]
        if len(values) < 2:
            continue  # one value: the caller fixed it
        step = values[1] - values[0]
        more = [values[-1] + i * step for i in range(1, len(getattr(base, name)))]
        more = [v for v in more if v <= AXIS_LIMITS[name] + 1e-9]
        if more:
            kind = int if name == "floor_mib" else (lambda v: round(v, 6))
            axes[name] = tuple(values) + tuple(kind(v) for v in more)
            grown = True
    return Grid(**axes) if grown else None


@dataclass(frozen=True)
class Figures:
    """What the fit optimises and is constrained by, named as `sweep.validation.memory_check.MemoryCheck` names them."""

    success_kept_frac: float
    oom_pruned_frac: float | None
    reserved_mean_abs_rel_err: float
    reserved_median_abs_rel_err: float
    reserved_p90_abs_rel_err: float


@dataclass(frozen=True)
class AllocatorFit:
    allocator: Allocator
    figures: Figures  # at the chosen point, on the rows fitted (the fast path)
    rows: int  # successful runs with a measured reserved peak
    points: int  # grid points evaluated (on the last grid, `grid`)
    feasible_points: int  # of them, how many meet the constraints
    gates_met: bool = True  # False: no point met them; the closest was taken (`fit_basis`)
    grid: Grid = field(default_factory=lambda: GRID)  # the grid searched last (widened or not)
    widened: tuple[str, ...] = ()  # the axes `fit_basis` widened, in order, once per widening

    def at_edge(self) -> dict[str, float]:
        """The constants that lie on their axis's largest value of the grid searched: the
        objective's optimum may lie beyond. An axis of one value was not searched: never."""
        a = self.allocator
        values = {"sequential": a.sequential, "pipelined": a.pipelined, "logits": a.logits,
                  "floor_mib": round(a.floor_bytes / MiB)}
        return {name: value for name, value in values.items()
                if len(axis := getattr(self.grid, name)) > 1 and value >= axis[-1]}

    def to_dict(self) -> dict[str, Any]:
        """As a record; the grid and its widenings only where the fit widened it (a fit inside
        sweep.validation.memory_fit.GRID records what it recorded before widening existed)."""
        widened = {"grid": self.grid.describe(), "widened": list(self.widened)} \
            if self.widened else {}
        return {"allocator": asdict(self.allocator), "figures": asdict(self.figures),
                "rows": self.rows, "points": self.points, "feasible_points": self.feasible_points,
                "gates_met": self.gates_met, **widened}


# The linear basis ---------------------------------------------------------------------------------

_UNITS: Final = (Allocator(1.0, 0.0, 0.0, 0), Allocator(0.0, 1.0, 0.0, 0),
                 Allocator(0.0, 0.0, 1.0, 0))
_ZERO: Final = Allocator(0.0, 0.0, 0.0, 0)


@dataclass(frozen=True)
class Basis:
    """Per run: what the rules other than memory decided, and the memory model split into what
    the allocator constants do not touch and what each share multiplies, for both end stages
    (index 0: first stage, which holds rank 0; 1: last stage)."""

    rules_ok: np.ndarray  # bool: every rule but batch and memory passes
    estimated: np.ndarray  # bool: the memory rule applies (grad_acc >= 1)
    single: np.ndarray  # bool: pp == 1 (one stage)
    alloc: np.ndarray  # (2, n): allocated bytes
    total0: np.ndarray  # (2, n): total bytes with no fragmentation
    frag: np.ndarray  # (2, 3, n): fragmentation per unit of each share
    budget: float | np.ndarray  # bytes, scalar or per run; inf: no memory rule
    outcome: np.ndarray
    measured_reserved: np.ndarray  # bytes, NaN where unknown
    model: np.ndarray
    # Per run, whether its reserved peak was measured on the most loaded stage (a sweep that
    # measured every rank) rather than rank 0, the first stage; None: rank 0 for every run (the
    # playbook's tables). Which stage is the most loaded depends on the grid point.
    measured_loaded: np.ndarray | None = None

    def subset(self, mask: np.ndarray) -> Basis:
        budget = self.budget[mask] if isinstance(self.budget, np.ndarray) else self.budget
        stage = None if self.measured_loaded is None else self.measured_loaded[mask]
        return Basis(self.rules_ok[mask], self.estimated[mask], self.single[mask],
                     self.alloc[:, mask], self.total0[:, mask], self.frag[:, :, mask], budget,
                     self.outcome[mask], self.measured_reserved[mask], self.model[mask], stage)


def stage_terms(model: ModelShape, columns: dict[str, np.ndarray], profile: MemoryProfile,
                 seq_len: int, dtype: str = "bf16"
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """allocated (2, n), total without fragmentation (2, n), fragmentation per unit share (2, 3, n)."""
    n = len(columns["tp"])
    alloc, total0, frag = np.zeros((2, n)), np.zeros((2, n)), np.zeros((2, 3, n))
    for s, stage in enumerate(("first", "last")):
        def est(consts: Allocator, stage: str = stage) -> dict[str, np.ndarray]:
            return memory.estimate_columns(model, columns, seq_len=seq_len, dtype=dtype,
                                           profile=consts.apply(profile), stage=stage)
        base = est(_ZERO)
        alloc[s] = base["mem_allocated_bytes"]
        total0[s] = base["mem_total_bytes"]
        for k, unit in enumerate(_UNITS):
            frag[s, k] = est(unit)["mem_fragmentation_bytes"]
    return alloc, total0, frag


def basis(runs: memory_check.Runs, spec: Spec) -> Basis:
    """The basis of a runs table (`sweep.validation.memory_check.read_memory_runs`), judged under the spec."""
    frame = runs.frame
    n = len(frame)
    rules_ok, estimated = np.zeros(n, bool), np.zeros(n, bool)
    alloc, total0, frag = np.zeros((2, n)), np.zeros((2, n)), np.zeros((2, 3, n))
    budget = np.inf
    for name, group in frame.groupby("model"):
        model = next(m for m in spec.model_shapes if m.name == name)
        columns = memory_check.layout_columns(group, spec)
        ctx = space.RuleContext.from_spec(spec, model)
        if ctx.memory_budget_bytes is not None:
            budget = float(ctx.memory_budget_bytes)
        code, _ = space.evaluate(columns, ctx, skip=frozenset({"batch", "memory"}))
        idx = group.index.to_numpy()
        rules_ok[idx] = code < 0
        estimated[idx] = columns["grad_acc"] >= 1
        alloc[:, idx], total0[:, idx], frag[:, :, idx] = stage_terms(
            model, columns, ctx.memory_profile(), ctx.seq_len, ctx.dtype)
    loaded = (frame["measured_stage"].to_numpy() == "most_loaded"
              if "measured_stage" in frame else None)
    return Basis(rules_ok, estimated, frame["pp"].to_numpy() == 1, alloc, total0, frag, budget,
                 frame["outcome"].to_numpy(), frame["reserved_bytes"].to_numpy(np.float64),
                 frame["model"].to_numpy(), loaded)


def kept_mask(b: Basis, points: np.ndarray) -> np.ndarray:
    """(P, n) bool: kept by the planner at each grid point (the memory rule on the most loaded
    stage, as `sweep.plan.space.evaluate` applies it)."""
    shares, floor = points[:, :3], points[:, 3:4]
    t_first = b.total0[0] + shares @ b.frag[0] + floor
    t_last = b.total0[1] + shares @ b.frag[1] + floor
    total = np.where(~b.single & (t_last > t_first), t_last, t_first)
    return b.rules_ok & ~(b.estimated & (total > b.budget))


def _scored(b: Basis) -> np.ndarray:
    m = b.measured_reserved
    return (b.outcome == "success") & np.isfinite(m) & (m > 0) & b.estimated


def _measured_reserved(b: Basis, points: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(P, m): the reserved peak predicted for the measured rank of the masked runs: rank 0, the
    first stage, unless `Basis.measured_loaded` says the most loaded stage, which is chosen at
    each point as `sweep.models.memory` chooses it (the larger total, fragmentation included)."""
    shares, floor = points[:, :3], points[:, 3:4]
    frag_first, frag_last = shares @ b.frag[0][:, mask], shares @ b.frag[1][:, mask]
    first = b.alloc[0, mask] + frag_first + floor
    if b.measured_loaded is None or not b.measured_loaded[mask].any():
        return first
    last = b.alloc[1, mask] + frag_last + floor
    use_last = (b.measured_loaded[mask] & ~b.single[mask]
                & (b.total0[1, mask] + frag_last > b.total0[0, mask] + frag_first))
    return np.where(use_last, last, first)


def _evaluate(b: Basis, points: np.ndarray, errors: bool = True
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """Per grid point: success_kept_frac, oom_pruned_frac (None: no OOM labels), and the mean,
    median and p90 absolute relative error of rank 0's reserved peak (NaN unless `errors`)."""
    success, oom = b.outcome == "success", b.outcome == "oom"
    kept = kept_mask(b, points)
    nan = np.full(len(points), np.nan)
    kept_frac = kept[:, success].mean(axis=1) if success.any() else nan
    oom_pruned = (~kept[:, oom]).mean(axis=1) if oom.any() else None
    scored = _scored(b)
    if not errors or not scored.any():
        return kept_frac, oom_pruned, nan, nan.copy(), nan.copy()
    measured = b.measured_reserved[scored]
    err = np.abs(_measured_reserved(b, points, scored) - measured) / measured
    return (kept_frac, oom_pruned, err.mean(axis=1), np.median(err, axis=1),
            np.quantile(err, 0.9, axis=1))


def _mean_error(b: Basis, points: np.ndarray) -> np.ndarray:
    """The objective alone: per grid point, the mean absolute relative error of rank 0's reserved
    peak over the successful runs (as `_evaluate`, without sorting for the quantiles)."""
    scored = _scored(b)
    measured = b.measured_reserved[scored]
    return (np.abs(_measured_reserved(b, points, scored) - measured) / measured).mean(axis=1)


def _gate_shortfall(b: Basis, points: np.ndarray, must_fit: Basis | None) -> np.ndarray:
    """Per grid point, how far it falls short of the gates, summed over them: MIN_SUCCESS_KEPT
    − kept, MIN_OOM_PRUNED − pruned (each floored at 0) and the share of `must_fit` predicted
    not to fit. 0: every gate is met."""
    kept, oom, *_ = _evaluate(b, points, errors=False)
    short = np.maximum(MIN_SUCCESS_KEPT - kept, 0.0)
    if oom is not None:
        short += np.maximum(MIN_OOM_PRUNED - oom, 0.0)
    if must_fit is not None:
        short += 1.0 - kept_mask(must_fit, points).mean(axis=1)
    return short


def fit_basis(b: Basis, grid: Grid = GRID, must_fit: Basis | None = None,
              chunk: int = 2048, widen: bool = True) -> AllocatorFit:
    """The grid point `OBJECTIVE` picks, on the runs of a basis; every configuration of
    `must_fit` (published runs that ran) must be predicted to fit.

    When no grid point meets the gates (a table unlike the playbook's: another allocator, a
    framework that reserves differently), the fit does not fail: it takes the points closest to
    the gates (`_gate_shortfall`), the smallest error among them, and says so (`gates_met`). A
    user's own table, or a fold of leave-one-model-out, still gets constants and figures. A table
    with no successful run whose reserved peak was measured has nothing to fit: an error.

    With `widen`, a point on an axis's largest value is not taken as the answer: the axis is
    widened (`widened`) and the fit runs again on the wider grid, up to `MAX_WIDENINGS` times.
    A fit whose point is inside the grid is the same with and without."""
    fitted = _fit_on_grid(b, grid, must_fit, chunk)
    for _ in range(MAX_WIDENINGS if widen else 0):
        wider = widened(fitted.grid, fitted.at_edge(), base=grid)
        if wider is None:
            break
        grown = tuple(name for name in asdict(wider)
                      if getattr(wider, name) != getattr(fitted.grid, name))
        fitted = replace(_fit_on_grid(b, wider, must_fit, chunk), widened=fitted.widened + grown)
    return fitted


def _fit_on_grid(b: Basis, grid: Grid, must_fit: Basis | None, chunk: int) -> AllocatorFit:
    """`fit_basis` on one grid."""
    if not _scored(b).any():
        models = ", ".join(sorted({str(m) for m in b.model})) or "no model"
        raise ValueError(f"no successful run of {models} has a measured reserved peak (on a GPU): "
                         "nothing to fit the allocator constants to")
    points = grid.points()
    feasible = np.ones(len(points), bool)
    if must_fit is not None:  # cheap (one row per published configuration): it goes first
        for i in range(0, len(points), chunk):
            feasible[i:i + chunk] = kept_mask(must_fit, points[i:i + chunk]).all(axis=1)
    candidates = np.flatnonzero(feasible)
    for i in range(0, len(candidates), chunk):
        part = candidates[i:i + chunk]
        kept, oom, *_ = _evaluate(b, points[part], errors=False)
        ok = kept >= MIN_SUCCESS_KEPT
        if oom is not None:
            ok &= oom >= MIN_OOM_PRUNED
        feasible[part] = ok
    gates_met = bool(feasible.any())
    if not gates_met:
        shortfall = np.concatenate([_gate_shortfall(b, points[i:i + chunk], must_fit)
                                    for i in range(0, len(points), chunk)])
        feasible = shortfall <= shortfall.min() + 1e-12
    index = np.flatnonzero(feasible)
    mean = np.empty(len(index))
    for i in range(0, len(index), chunk):
        mean[i:i + chunk] = _mean_error(b, points[index[i:i + chunk]])
    best = int(index[int(np.argmin(mean))])  # argmin: the first of equal values, the earlier point
    kept_frac, oom_frac, err_mean, err_median, err_p90 = _evaluate(b, points[best:best + 1])
    s, p, lg, floor = points[best]
    figures = Figures(float(kept_frac[0]), None if oom_frac is None else float(oom_frac[0]),
                      float(err_mean[0]), float(err_median[0]), float(err_p90[0]))
    return AllocatorFit(Allocator(float(s), float(p), float(lg), int(round(floor))), figures,
                        int(_scored(b).sum()), len(points), len(index) if gates_met else 0,
                        gates_met, grid)


def fit_allocator(runs: memory_check.Runs, spec: Spec, grid: Grid = GRID,
                  must_fit: Basis | None = None) -> AllocatorFit:
    """Fit the four allocator constants to a runs table (`sweep.validation.memory_check.read_memory_runs`)."""
    return fit_basis(basis(runs, spec), grid, must_fit)


# Leave one model out ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldOut:
    """One fold: the constants fitted without a model, and that model scored with them and with
    the in-sample constants (`in_sample`: the committed ones unless the caller says otherwise)."""

    held_out: str
    trained_on: tuple[str, ...]
    allocator: Allocator  # fitted on the other models' runs
    cross_validated: memory_check.MemoryCheck  # the held-out model's runs, scored with that allocator
    in_sample: memory_check.MemoryCheck  # the same runs, scored with the in-sample constants
    gates_met: bool = True  # whether the fold's fit met the gates (`fit_basis`)

    def to_dict(self) -> dict[str, Any]:
        return {"held_out": self.held_out, "trained_on": list(self.trained_on),
                "allocator": asdict(self.allocator), "gates_met": self.gates_met,
                "cross_validated": self.cross_validated.to_dict(),
                "in_sample": self.in_sample.to_dict()}


@dataclass(frozen=True)
class CrossValidation:
    """Every fold, and the pooled figures: all runs, each scored by the fold that held it out
    (`cross_validated`) or by the in-sample constants (`in_sample`)."""

    folds: tuple[HeldOut, ...]
    in_sample_allocator: Allocator
    in_sample: memory_check.MemoryCheck
    cross_validated: memory_check.MemoryCheck
    signed_errors: np.ndarray  # held-out predicted / measured - 1 of rank 0's reserved peak

    def band(self, quantiles: tuple[float, float] = BAND_QUANTILES) -> tuple[float, float]:
        """The quantiles of the held-out signed relative error (the interval's band)."""
        lo, hi = np.quantile(self.signed_errors, quantiles)
        return float(lo), float(hi)

    def to_dict(self) -> dict[str, Any]:
        return {"in_sample_allocator": asdict(self.in_sample_allocator),
                "in_sample": self.in_sample.to_dict(),
                "cross_validated": self.cross_validated.to_dict(),
                "band": list(self.band()), "band_quantiles": list(BAND_QUANTILES),
                "folds": [fold.to_dict() for fold in self.folds]}


def subset(runs: memory_check.Runs, models: Iterable[str]) -> memory_check.Runs:
    keep = runs.frame["model"].isin(list(models))
    return memory_check.Runs(runs.format, runs.frame[keep].reset_index(drop=True), 0)


def cross_validate(runs: memory_check.Runs, spec: Spec, grid: Grid = GRID,
                   must_fit: Basis | None = None,
                   in_sample: Allocator | None = None) -> CrossValidation:
    """For each model of the runs: fit on the others' runs (and `must_fit`, which holds no run of
    these models), score on its own. `in_sample`: the constants the in-sample column uses (None:
    the spec framework's profile, i.e. the committed constants)."""
    models = sorted(set(runs.frame["model"]))
    if len(models) < 2:
        raise ValueError(f"leave-one-model-out needs runs of two models or more; got {models}")
    whole = basis(runs, spec)
    reference = in_sample if in_sample is not None else Allocator.of(spec.memory_profile)
    folds, cv_judged, in_judged = [], [], []
    for held in models:
        fold_fit = fit_basis(whole.subset(whole.model != held), grid, must_fit)
        fitted = fold_fit.allocator
        held_runs = subset(runs, [held])
        cv = memory_check.judge(held_runs, spec, fitted.apply(spec.framework))
        ins = memory_check.judge(held_runs, spec, reference.apply(spec.framework))
        cv_judged.append(cv)
        in_judged.append(ins)
        folds.append(HeldOut(held, tuple(m for m in models if m != held), fitted,
                             memory_check.score_judged(cv, runs.format),
                             memory_check.score_judged(ins, runs.format), fold_fit.gates_met))
    pooled_cv = pd.concat(cv_judged, ignore_index=True)
    pooled_in = pd.concat(in_judged, ignore_index=True)
    ok = ((pooled_cv["outcome"] == "success") & pooled_cv["pred_reserved_bytes"].notna()
          & (pooled_cv["reserved_bytes"] > 0))
    signed = (pooled_cv.loc[ok, "pred_reserved_bytes"] / pooled_cv.loc[ok, "reserved_bytes"]
              - 1.0).to_numpy(np.float64)
    return CrossValidation(tuple(folds), reference,
                           memory_check.score_judged(pooled_in, runs.format, runs.n_skipped),
                           memory_check.score_judged(pooled_cv, runs.format, runs.n_skipped), signed)


__all__ = ["Allocator", "AllocatorFit", "BAND_QUANTILES", "Basis", "CrossValidation", "Figures",
           "GRID", "Grid", "HeldOut", "MIN_OOM_PRUNED", "MIN_SUCCESS_KEPT", "OBJECTIVE", "TARGETS",
           "basis", "cross_validate", "fit_allocator", "fit_basis", "kept_mask", "meets",
           "stage_terms", "subset"]
