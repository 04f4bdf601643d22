"""One interface for where a sweep's runs execute, and the one round loop every search runs on.

A search strategy (sweep.search.strategies, through sweep.search.live_search) asks for a batch of runs and waits
for their outcomes, round after round. Where they run differs: `sweep run` emulates Slurm on
this machine (sweep.backends.local.backend.LocalBackend), `sweep submit --foreground` and the detached search
driver submit job arrays to Slurm (sweep.backends.slurm.backend.SlurmBackend). Both offer the same three
verbs, in the spirit of submitit's `Executor` (submit, then poll the job handles' states, or
cancel them):

- `submit(run_dirs)`: launch the runs that are not launched yet; say which were launched, which
  were already there (adopted: an interrupted search's runs, waited for and never run twice),
  and which a GPU-hour cap left out;
- `in_flight(run_ids)`: which of them are still queued or running (for the local backend this
  also advances its emulated cluster, as slurmctld does for Slurm);
- `cancel()`: stop what is in flight.

plus `finished(run_dir)`: whether a run already has a verdict, so a search started again does
not run it again. `Rounds` turns a backend into the executor a search calls: one round is
submit, then poll until none of the round is in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sweep.plan.budget import BudgetReached


@dataclass(frozen=True)
class Submitted:
    """What a backend did with one round's runs (run ids)."""

    launched: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)  # launched before; waited for, not again
    left_out: list[str] = field(default_factory=list)  # kept out by a GPU-hour cap
    cap_gpu_hours: float | None = None


class Backend(Protocol):
    """Where runs execute: submit a batch, observe which are in flight, cancel."""

    def submit(self, run_dirs: Sequence[Path]) -> Submitted: ...

    def in_flight(self, run_ids: Collection[str]) -> set[str]: ...

    def finished(self, run_dir: Path) -> bool: ...

    def cancel(self) -> object: ...


RoundHook = Callable[["Rounds", Sequence[Path], Submitted], None]


class Rounds:
    """A search's executor on any backend: each call is one round (submit the batch, then poll
    every `poll_s` until none of it is in flight). Under a GPU-hour cap, the runs of a round
    that do not fit yet (spent + in flight at its time limit + each new run at its time limit
    would exceed the cap) wait: once what did fit has ended, and counts at what it spent, they
    are submitted again, as many as now fit, until the whole round has run; the search then
    goes on with its later rounds. Only when nothing of the round fits with nothing in flight
    does the cap end the search, with BudgetReached. Counts what it launched and adopted, for
    the search's summary and `sweep status`."""

    def __init__(self, backend: Backend, *, poll_s: float,
                 on_round: RoundHook | None = None) -> None:
        self.backend, self.poll_s, self.on_round = backend, poll_s, on_round
        self.rounds = 0  # rounds that asked for runs, in this process
        self.launched: list[str] = []
        self.adopted: list[str] = []

    def finished(self, run_dir: Path) -> bool:
        return self.backend.finished(run_dir)

    def __call__(self, run_dirs: Sequence[Path]) -> None:
        if not run_dirs:
            return
        self.rounds += 1
        wanted = {d.name for d in run_dirs}
        waiting = list(run_dirs)
        while waiting:
            submitted = self.backend.submit(waiting)
            self.launched += submitted.launched
            self.adopted += submitted.adopted
            if self.on_round is not None:
                self.on_round(self, run_dirs, submitted)
            while self.backend.in_flight(wanted):
                time.sleep(self.poll_s)
            if not submitted.left_out:
                return
            if not submitted.launched and not submitted.adopted:
                raise BudgetReached(submitted.left_out, submitted.cap_gpu_hours or 0.0)
            left_out = set(submitted.left_out)
            waiting = [d for d in run_dirs if d.name in left_out]
