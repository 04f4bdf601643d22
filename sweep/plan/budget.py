"""GPU-hour budgets: what a sweep is expected to cost, what it can cost at worst, and which runs
still fit under a cap. Pure functions over numbers, so that the login-node command, the search
driver and `sweep resume` apply one rule, and the rule is tested without a cluster.

A run's upper bound is its time limit × its GPUs: Slurm kills it there, so no run can cost more.
Its expected cost uses the plan's predicted step time where there is one (startup + steps × step
time, never above the limit); without a prediction the limit is all we know.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

# Seconds a run spends before its first step (scheduling on its nodes, interpreter and framework
# start, process groups): what the plan's step-time prediction does not cover.
STARTUP_S: Final = 120.0
# Worst-case GPU-hours above which the login-node command asks before it submits.
CONFIRM_ABOVE_GPU_HOURS: Final = 1000.0


@dataclass(frozen=True)
class RunCost:
    """One run's cost inputs: its GPUs (nodes × GPUs per node), its time limit, and the time it
    is expected to take."""

    run_id: str
    gpus: int
    time_limit_s: float
    expected_s: float

    @property
    def upper_gpu_hours(self) -> float:
        return self.gpus * self.time_limit_s / 3600

    @property
    def expected_gpu_hours(self) -> float:
        return self.gpus * min(self.expected_s, self.time_limit_s) / 3600


@dataclass(frozen=True)
class Estimate:
    """A set of runs' expected and worst-case GPU-hours, and how many had a prediction."""

    runs: int
    predicted: int
    expected_gpu_hours: float
    worst_gpu_hours: float

    def describe(self) -> str:
        basis = (f"{self.predicted} from the plan's predicted step time, the rest at their time "
                 "limit" if self.predicted < self.runs else "from the plan's predicted step time")
        return (f"GPU-hours: about {self.expected_gpu_hours:,.2f} expected for {self.runs} "
                f"run(s) ({basis}); worst case {self.worst_gpu_hours:,.2f} (every run at its "
                "time limit)")


@dataclass(frozen=True)
class Fit:
    """Which candidate runs fit under a cap, in order, and which were left out."""

    chosen: list[str]
    left_out: list[str]
    committed_gpu_hours: float  # spent + in flight at the upper bound, before the candidates


@dataclass(frozen=True)
class Spend:
    """What one run of the sweep has cost or may still cost: its GPUs, the elapsed time of its
    latest attempt (None: never ran), its time limit, and whether it is pending or running."""

    gpus: int
    elapsed_s: float | None
    time_limit_s: float
    in_flight: bool


def committed_gpu_hours(spends: Iterable[Spend]) -> float:
    """GPU-hours spent plus those in flight at their upper bound: a running run may still use
    its whole time limit, so a cap is only safe if it is counted there."""
    total = 0.0
    for spend in spends:
        seconds = spend.time_limit_s if spend.in_flight else (spend.elapsed_s or 0.0)
        total += spend.gpus * seconds / 3600
    return total


def expected_seconds(time_limit_s: float, steps: int | None, step_time_s: float | None,
                     startup_s: float = STARTUP_S) -> float:
    """Startup + steps × the predicted step time, capped at the time limit; the time limit when
    there is no usable prediction."""
    if steps is None or step_time_s is None or not math.isfinite(step_time_s) or step_time_s <= 0:
        return float(time_limit_s)
    return min(float(time_limit_s), startup_s + steps * step_time_s)


def estimate(costs: Sequence[RunCost], predicted: int | None = None) -> Estimate:
    """Expected and worst-case GPU-hours of `costs`; `predicted`: how many had a prediction."""
    return Estimate(runs=len(costs),
                    predicted=len(costs) if predicted is None else predicted,
                    expected_gpu_hours=sum(c.expected_gpu_hours for c in costs),
                    worst_gpu_hours=sum(c.upper_gpu_hours for c in costs))


def fit_budget(candidates: Sequence[RunCost], committed_gpu_hours: float,
               cap_gpu_hours: float | None) -> Fit:
    """The candidates, in order, that can be launched without the sweep ever exceeding the cap:
    what it spent plus what is in flight (counted at its upper bound, `committed_gpu_hours`)
    plus each chosen run at its upper bound stays ≤ cap. A candidate that does not fit is left
    out, and a later, smaller one may still fit. No cap: every candidate."""
    if cap_gpu_hours is None:
        return Fit([c.run_id for c in candidates], [], committed_gpu_hours)
    chosen, left_out = [], []
    total = committed_gpu_hours
    for cost in candidates:
        if total + cost.upper_gpu_hours <= cap_gpu_hours + 1e-9:
            total += cost.upper_gpu_hours
            chosen.append(cost.run_id)
        else:
            left_out.append(cost.run_id)
    return Fit(chosen, left_out, committed_gpu_hours)


Decision = Literal["go", "ask", "refuse"]


def confirmation(worst_gpu_hours: float, *, yes: bool, interactive: bool,
                 threshold: float = CONFIRM_ABOVE_GPU_HOURS) -> Decision:
    """Whether a submission of this worst case may go ahead: at or under the threshold, or with
    --yes, it goes; above it, a terminal is asked, and with no terminal (a script, a cron job)
    it is refused, since nobody could have agreed to it."""
    if worst_gpu_hours <= threshold or yes:
        return "go"
    return "ask" if interactive else "refuse"


def capped_worst(worst_gpu_hours: float, cap_gpu_hours: float | None) -> float:
    """The most the sweep can spend: its worst case, or the cap when that is lower."""
    return worst_gpu_hours if cap_gpu_hours is None else min(worst_gpu_hours, cap_gpu_hours)


class BudgetReached(Exception):
    """The search asked for runs that the GPU-hour cap leaves no room for (`left_out`); what
    did fit was launched and waited for."""

    def __init__(self, left_out: Sequence[str], cap_gpu_hours: float) -> None:
        self.left_out, self.cap_gpu_hours = list(left_out), cap_gpu_hours
        super().__init__(f"{len(left_out)} run(s) left out: they would take the sweep over its "
                         f"budget of {cap_gpu_hours:g} GPU-hours")
