"""Slurm as a search backend (sweep.backends.base.Backend): each round's runs go out as job arrays
through the sweep's Tracker, and are observed with one squeue and one sacct per 1,000 arrays.

Used by `sweep submit --strategy … --foreground` and by the detached search driver. Runs this
sweep submitted before, say by an interrupted search or a driver that died, are adopted (waited
for, never submitted again): the ledger, read under the sweep's submit lock, says which. Under a
GPU-hour cap, runs that could take the sweep over it are left out, not launched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from sweep.backends.base import Submitted
from sweep.backends.slurm.observation import Observation
from sweep.backends.slurm.submission import NEVER_SUBMITTED, RunState, latest_tasks
from sweep.backends.slurm.tracker import Tracker, submit_runs


class SlurmBackend:
    """The sweep's runs on Slurm: submit arrays, observe their states, cancel them."""

    def __init__(self, tracker: Tracker, *, max_running: int | None = None,
                 max_gpu_hours: float | None = None,
                 on_poll: Callable[[Observation], None] | None = None) -> None:
        self.tracker, self.max_running, self.max_gpu_hours = tracker, max_running, max_gpu_hours
        self.on_poll = on_poll
        self._observed: dict[str, RunState] | None = None  # the latest observation, by run id

    def submit(self, run_dirs: Sequence[Path]) -> Submitted:
        """Submit the runs this sweep never submitted, those that fit under the cap."""
        wanted = sorted({d.name for d in run_dirs})
        with self.tracker.lock():
            seen = latest_tasks(self.tracker.reconcile(write=True))
            todo = [r for r in wanted if r not in seen]
            fit = self.tracker.fit_budget(todo, self.max_gpu_hours)
            report = submit_runs(self.tracker, fit.chosen, max_running=self.max_running)
        self._observed = None
        left_over = set(report.left_over)  # no room under the job limits: the next round
        return Submitted(launched=[r for r in fit.chosen if r not in left_over],
                         adopted=[r for r in wanted if r in seen], left_out=fit.left_out,
                         cap_gpu_hours=self.max_gpu_hours)

    def in_flight(self, run_ids: Collection[str]) -> set[str]:
        observation = self.tracker.observe()
        self._observed = {s.run_id: s for s in observation.states}
        if self.on_poll is not None:
            self.on_poll(observation)
        return {s.run_id for s in observation.states if s.in_flight and s.run_id in run_ids}

    def finished(self, run_dir: Path) -> bool:
        """Whether the run has a verdict: submitted before, and no longer in flight (from the
        latest observation; one is made when there is none since the last submit)."""
        if self._observed is None:
            self._observed = {s.run_id: s for s in self.tracker.observe().states}
        state = self._observed.get(run_dir.name)
        return state is not None and not state.in_flight and state.state != NEVER_SUBMITTED

    def cancel(self) -> None:
        """scancel the sweep's arrays that Slurm still holds (one call per 1,000 arrays)."""
        with self.tracker.lock():
            masters = sorted({s.job_id for s in self.tracker.reconcile(write=True) if s.job_id})
            live = [entry.job_id for entry in self.tracker.slurm.queue(masters)] if masters else []
            if live:
                self.tracker.slurm.cancel(live)
