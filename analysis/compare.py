"""A performance-regression gate: what changed between a baseline and a current sweep.

A cluster team reruns the same sweep after every upgrade (drivers, NCCL, the framework, firmware)
and asks which configurations got slower. The baseline is either a runs table or a references
file (analysis.references); both become one frame of *expectations*, one row per configuration
(level "run") or per cell (level "cell", the cell's best), each with a metric, a reference value
and relative lower/upper tolerances (the ReFrame convention: null = unbounded on that side).

How runs are matched: by MATCH_KEY, the cell, the work per step (sequence length, global batch)
and the layout's columns, not by run_id, so a sweep re-planned from an edited spec still lines
up. runs.parquet holds one row per attempt: each configuration is represented by its latest
completed attempt, or by its latest attempt when none completed (a failure).

On a shared CPU host every step time moves with the machine's load, so there (normalize "auto")
each configuration is judged relative to the sweep's median change (host_shift): the baseline's
values are scaled by it first. On GPUs the values are judged as measured, so a change that
slows every configuration alike (a driver, NCCL) is caught.

When a change counts: a configuration is *slower* only when its change is beyond the tolerance
on the bad side AND Welch's t-test on the steady-state step times (analysis.welch) finds the
difference significant at `alpha`; beyond the tolerance but not significant is *within noise*.
Where the test cannot be made (fewer than 2 steps, no spread recorded, a metric other than step
time), the tolerance alone decides, and the `test` column says so. A configuration that
completed in the baseline and fails now is *newly failing*; both are regressions.

Pure: DataFrames in, DataFrames out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from analysis.welch import one_sided_p, welch_t
from sweep.core.layout import CELL, LAYOUT_COLUMNS

WORK_COLUMNS: Final = ("seq_len", "global_batch_sequences")
MATCH_KEY: Final = (*CELL, *WORK_COLUMNS, *LAYOUT_COLUMNS)
STEP_TIME: Final = "step_time_mean_s"
# The metrics a reference may name, and whether a larger value is better.
HIGHER_IS_BETTER: Final = {STEP_TIME: False, "tokens_per_sec_per_gpu": True, "tokens_per_sec": True}
HIGHER_BETTER_METRICS: Final = tuple(m for m, higher in HIGHER_IS_BETTER.items() if higher)
DEFAULT_METRIC: Final = STEP_TIME
DEFAULT_ALPHA: Final = 0.05
# Default relative tolerance by device (docs/compare.md says why): ±5 % on GPUs, the usual
# band of a cluster's regression suite; +400 % on CPU, where one configuration of two unchanged
# demo sweeps, run back to back on the shared 2-core machine, took 4.2 times as long as the
# rest of its sweep would have it (other work took the cores during that run).
DEFAULT_TOLERANCE_GPU: Final = 0.05
DEFAULT_TOLERANCE_CPU: Final = 4.0

# Every status, worst first; the first two are regressions.
SLOWER, NEWLY_FAILING = "slower", "newly failing"
MISSING, STILL_FAILING, WITHIN_NOISE = "missing", "still failing", "within noise"
WITHIN_TOLERANCE, FASTER, NOW_COMPLETING, NEW = "within tolerance", "faster", "now completing", "new"
STATUSES: Final = (SLOWER, NEWLY_FAILING, MISSING, STILL_FAILING, WITHIN_NOISE, WITHIN_TOLERANCE,
                   FASTER, NOW_COMPLETING, NEW)
REGRESSIONS: Final = (SLOWER, NEWLY_FAILING)
# Whether a configuration is judged on its own change or relative to the sweep's median change.
NORMALIZE: Final = ("auto", "none", "median")
MIN_SHIFT_PAIRS: Final = 3

EXPECTED_COLUMNS: Final = ("level", *MATCH_KEY, "run_id", "layout_label", "attempt", "outcome",
                           "metric", "value", "lower", "upper", "std", "n")
REQUIRED_RUN_COLUMNS: Final = (*MATCH_KEY, "run_id", "attempt", "outcome", STEP_TIME,
                               "step_time_std_s", "step_time_n")
PICKED: Final = ("each configuration's latest completed attempt (its latest attempt when none "
                 "completed)")


@dataclass(frozen=True)
class Comparison:
    """The verdicts: one row per configuration (`runs`) and per cell (`cells`), the test's
    significance level, and where each side came from."""

    runs: pd.DataFrame
    cells: pd.DataFrame
    alpha: float
    baseline: str
    current: str
    normalized: bool = False
    shift: float = 1.0  # the sweep's median step-time ratio, current / baseline (host_shift)

    @property
    def regressions(self) -> int:
        return int(self.runs["status"].isin(REGRESSIONS).sum()
                   + self.cells["status"].isin(REGRESSIONS).sum())

    def counts(self, level: str = "runs") -> dict[str, int]:
        """How many rows have each status, statuses in STATUSES order, absent ones left out."""
        frame = self.runs if level == "runs" else self.cells
        counted = frame["status"].value_counts()
        return {status: int(counted[status]) for status in STATUSES if status in counted}


def missing_columns(runs: pd.DataFrame) -> list[str]:
    """The columns compare needs that a runs table lacks."""
    return [c for c in REQUIRED_RUN_COLUMNS if c not in runs.columns]


def default_tolerance(runs: pd.DataFrame) -> pd.Series:
    """Each row's default relative tolerance: DEFAULT_TOLERANCE_CPU where `gpu` is "cpu",
    DEFAULT_TOLERANCE_GPU elsewhere."""
    cpu = runs["gpu"].astype("string").str.lower().eq("cpu").fillna(False) if "gpu" in runs \
        else pd.Series(False, index=runs.index)
    return pd.Series(np.where(cpu, DEFAULT_TOLERANCE_CPU, DEFAULT_TOLERANCE_GPU), index=runs.index)


def latest_attempts(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (MATCH_KEY): its latest completed attempt with a step time, or
    its latest attempt when none has one. Column `ok` says which."""
    ok = runs["outcome"].astype("string").eq("completed").fillna(False) & runs[STEP_TIME].notna()
    ordered = runs.assign(ok=ok.astype(bool)).sort_values(["ok", "attempt"], kind="stable")
    return ordered.drop_duplicates(list(MATCH_KEY), keep="last").reset_index(drop=True)


def expected_from_runs(runs: pd.DataFrame, tolerance: float | None = None) -> pd.DataFrame:
    """The expectations a baseline runs table sets, one per configuration: its step time, with
    ±`tolerance` (default: by device, default_tolerance) and its steps' spread and count."""
    latest = latest_attempts(runs)
    tol = default_tolerance(latest) if tolerance is None else pd.Series(tolerance, index=latest.index)
    ok = latest["ok"]
    return pd.DataFrame({
        "level": "run", **{c: latest[c] for c in MATCH_KEY}, "run_id": latest["run_id"],
        "layout_label": latest.get("layout_label", pd.Series(pd.NA, index=latest.index)),
        "attempt": latest["attempt"], "outcome": latest["outcome"], "metric": STEP_TIME,
        "value": latest[STEP_TIME].where(ok), "lower": -tol, "upper": tol,
        "std": latest["step_time_std_s"].where(ok), "n": latest["step_time_n"].where(ok),
    })[list(EXPECTED_COLUMNS)]


def compare(expected: pd.DataFrame, current: pd.DataFrame, alpha: float = DEFAULT_ALPHA,
            baseline_name: str = "baseline", current_name: str = "current",
            normalize: str = "auto") -> Comparison:
    """The verdict on every configuration and cell of `expected` (EXPECTED_COLUMNS) against the
    runs table `current`; configurations only `current` has are "new". `normalize` (NORMALIZE):
    "median" judges each configuration relative to the sweep's median step-time change (see
    host_shift), "none" on the values as measured, "auto" the first on CPU, the second on GPUs."""
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize={normalize!r}: one of {', '.join(NORMALIZE)}")
    latest = latest_attempts(current)
    run_refs = expected[expected["level"] == "run"]
    merged_runs = _merge(run_refs, latest, list(MATCH_KEY))
    normalized = normalize == "median" or (normalize == "auto" and _all_cpu(latest))
    median_ratio = host_shift(merged_runs)
    shift = median_ratio if normalized else 1.0
    runs = _verdicts(_scaled(merged_runs, shift), alpha)
    cell_refs = pd.concat([expected[expected["level"] == "cell"],
                           _best_per_cell(run_refs, expected)], ignore_index=True)
    cells = _verdicts(_scaled(_merge(cell_refs, _current_best(latest), list(CELL)), shift), alpha)
    cells = _with_run_counts(cells, runs)
    return Comparison(runs=_ordered(runs), cells=_ordered(cells), alpha=alpha,
                      baseline=baseline_name, current=current_name, normalized=normalized,
                      shift=median_ratio)


def host_shift(merged: pd.DataFrame) -> float:
    """The sweep-wide step-time ratio, current / baseline: the median over the configurations
    that completed on both sides with a step-time reference (1.0 with fewer than MIN_SHIFT_PAIRS
    of them). On a shared CPU host every step time moves with the host's load; a configuration
    that got slower by itself stands out from this median, the host's load does not."""
    both = (merged["_merge"] == "both") & merged["ref_metric"].eq(STEP_TIME).fillna(False) \
        & merged["cur_ok"].fillna(False).astype(bool)
    ratios = (pd.to_numeric(merged.loc[both, f"cur_{STEP_TIME}"], errors="coerce")
              / pd.to_numeric(merged.loc[both, "ref_value"], errors="coerce")).dropna()
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    return float(ratios.median()) if len(ratios) >= MIN_SHIFT_PAIRS else 1.0


def _all_cpu(latest: pd.DataFrame) -> bool:
    devices = latest["gpu"].astype("string").str.lower().dropna() if "gpu" in latest else []
    return len(devices) > 0 and bool((pd.Series(devices) == "cpu").all())


def _scaled(merged: pd.DataFrame, shift: float) -> pd.DataFrame:
    """The references moved by the sweep-wide `shift`: step times (and their spread) × shift,
    throughputs ÷ shift; `ref_measured` keeps the value as measured."""
    value = pd.to_numeric(merged["ref_value"], errors="coerce")
    higher = merged["ref_metric"].isin(HIGHER_BETTER_METRICS)
    return merged.assign(
        ref_measured=value,
        ref_value=np.where(higher, value / shift, value * shift),
        ref_std=np.where(higher, pd.to_numeric(merged["ref_std"], errors="coerce"),
                         pd.to_numeric(merged["ref_std"], errors="coerce") * shift))


def _best_per_cell(run_refs: pd.DataFrame, expected: pd.DataFrame) -> pd.DataFrame:
    """A cell expectation for every cell that has run expectations but no cell row of its own:
    its best configuration's (the lowest step time, the highest throughput), or, when none of
    its configurations has a value, a failing row."""
    explicit = set(map(tuple, expected.loc[expected["level"] == "cell", list(CELL)].to_numpy().tolist()))
    rows = run_refs[[tuple(k) not in explicit for k in run_refs[list(CELL)].to_numpy().tolist()]]
    if rows.empty:
        return rows.assign(level="cell")
    better_first = rows.assign(_key=np.where(rows["metric"].isin(HIGHER_BETTER_METRICS),
                                             -rows["value"], rows["value"]))
    best = better_first.sort_values("_key", na_position="last", kind="stable") \
        .drop_duplicates(list(CELL)).drop(columns="_key")
    return best.assign(level="cell")


def _current_best(latest: pd.DataFrame) -> pd.DataFrame:
    """Each cell's best current configuration (lowest step time among completed ones), or a
    failing row when none completed."""
    ordered = latest.sort_values(["ok", STEP_TIME], ascending=[False, True], kind="stable")
    return ordered.drop_duplicates(list(CELL)).reset_index(drop=True)


def _merge(refs: pd.DataFrame, latest: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    current = latest.rename(columns={c: f"cur_{c}" for c in latest.columns if c not in key})
    refs = refs.rename(columns={c: f"ref_{c}" for c in refs.columns if c not in key})
    return pd.merge(_typed_key(refs, key), _typed_key(current, key), on=key, how="outer",
                    indicator=True)


def _typed_key(frame: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """The key columns as strings (a references file's 1 and a runs table's int64 1 match; a
    null cp matches a null cp), so that the merge needs no dtype agreement."""
    frame = frame.copy()
    for column in key:
        values = frame[column]
        if values.dtype == bool or str(values.dtype) == "boolean":
            values = values.astype("boolean")
        elif pd.api.types.is_float_dtype(values) and values.dropna().mod(1).eq(0).all():
            values = values.astype("Int64")
        frame[column] = values.astype("string").fillna("")
    return frame


def _current_value(merged: pd.DataFrame) -> pd.Series:
    """The current value of each row's metric (rows name the metric of their reference)."""
    metric = merged["ref_metric"].fillna(STEP_TIME)
    value = pd.Series(np.nan, index=merged.index, dtype="float64")
    for name in HIGHER_IS_BETTER:
        column = f"cur_{name}"
        if column in merged:
            chosen = metric == name
            value[chosen] = pd.to_numeric(merged.loc[chosen, column], errors="coerce")
    return value


def _verdicts(merged: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Status, change and test of every merged row (vectorised)."""
    has_ref = merged["_merge"].isin(["both", "left_only"]).to_numpy()
    has_cur = merged["_merge"].isin(["both", "right_only"]).to_numpy()
    ref_value = pd.to_numeric(merged["ref_value"], errors="coerce").to_numpy(dtype=float)
    cur_value = _current_value(merged).to_numpy(dtype=float)
    ref_ok = has_ref & np.isfinite(ref_value)
    cur_ok = has_cur & merged["cur_ok"].fillna(False).astype(bool).to_numpy() & np.isfinite(cur_value)
    higher = merged["ref_metric"].isin(HIGHER_BETTER_METRICS).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.where(ref_ok & cur_ok, cur_value / ref_value - 1.0, np.nan)
    lower = pd.to_numeric(merged["ref_lower"], errors="coerce").to_numpy(dtype=float)
    upper = pd.to_numeric(merged["ref_upper"], errors="coerce").to_numpy(dtype=float)
    # The bounds as values, as ReFrame checks them: a change of exactly the tolerance is inside.
    above = np.isfinite(upper) & (cur_value > ref_value * (1.0 + upper))
    below = np.isfinite(lower) & (cur_value < ref_value * (1.0 + lower))
    worse, better = np.where(higher, below, above), np.where(higher, above, below)
    p_value, test = _significance(merged, ref_ok & cur_ok)
    significant = ~np.isfinite(p_value) | (p_value < alpha)
    status = np.select(
        [has_ref & ~has_cur, ~has_ref & has_cur, ref_ok & ~cur_ok, ~ref_ok & ~cur_ok,
         ~ref_ok & cur_ok, worse & significant, better & significant, worse | better],
        [MISSING, NEW, NEWLY_FAILING, STILL_FAILING, NOW_COMPLETING, SLOWER, FASTER, WITHIN_NOISE],
        default=WITHIN_TOLERANCE)
    return merged.assign(status=status, change=change, ref_value=ref_value, cur_value=cur_value,
                         ref_lower=lower, ref_upper=upper, p_value=p_value, test=test) \
        .drop(columns="_merge")


def _significance(merged: pd.DataFrame, both: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The one-sided Welch p-value of each compared row, in the direction of its change (NaN
    where the test cannot be made), and the `test` column: "welch", or why the tolerance alone
    decides."""
    def column(name: str) -> np.ndarray:
        return pd.to_numeric(merged[name], errors="coerce").to_numpy(dtype=float) \
            if name in merged else np.full(len(merged), np.nan)
    step_metric = merged["ref_metric"].eq(STEP_TIME).fillna(False).to_numpy()
    t, df = welch_t(column("ref_value"), column("ref_std"), column("ref_n"),
                    column(f"cur_{STEP_TIME}"), column("cur_step_time_std_s"),
                    column("cur_step_time_n"))
    increased = column(f"cur_{STEP_TIME}") > column("ref_value")
    p_value = np.where(increased, one_sided_p(t, df, greater=True),
                       one_sided_p(t, df, greater=False))
    testable = both & step_metric & np.isfinite(p_value)
    reasons = np.select(
        [~both, testable, ~step_metric],
        ["", "welch", "tolerance only: the metric is not the step time"],
        default="tolerance only: fewer than 2 steps or no spread on a side")
    return np.where(testable, p_value, np.nan), reasons


def _with_run_counts(cells: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Cells with, per status, how many of their configurations have it."""
    counts = runs.groupby([*CELL, "status"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=[s for s in STATUSES if s in counts.columns])
    counts.columns = [f"runs {s}" for s in counts.columns]
    return cells.merge(counts.reset_index(), on=list(CELL), how="left")


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Worst status first, then by cell and layout."""
    rank = frame["status"].map({s: i for i, s in enumerate(STATUSES)})
    return frame.assign(_rank=rank).sort_values(["_rank", *CELL], kind="stable") \
        .drop(columns="_rank").reset_index(drop=True)
