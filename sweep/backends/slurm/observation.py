"""One poll of a sweep on Slurm: every run's state, from the ledger, squeue, sacct and the
attempt folders.

`Observer.observe` joins, per run, its latest submission (the ledger, `sweep.backends.slurm.submission`), what
Slurm says of that array task (squeue while it is queued or running, sacct once it has ended;
each asked once per 1,000 array masters, not once per run) and the newest attempt folder that
task made (its status.json, or srun's blame of a node in its output), and decides the run's state
with `sweep.backends.slurm.submission.run_state`. Node failures go to the sweep's bad-node file
(`sweep.backends.slurm.bad_nodes`), which decides what later submissions exclude. `sweep.backends.slurm.tracker.Tracker`
submits; this module only reads Slurm and the folder (and writes bad_nodes.json).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.backends.slurm.client import AcctEntry, QueueEntry, Slurm, SlurmError
from sweep.backends.slurm.submission import (
    AttemptView,
    NodeFailure,
    RunState,
    SlurmView,
    Submission,
    TaskRef,
    expand_task_ids,
    latest_tasks,
    run_state,
)
from sweep.backends.slurm.sweep_folder import RunInfo, SweepFolder, read_json_safe
from sweep.core.hostlist import expand as expand_hosts
from sweep.core.slurm_states import has_ended, node_failures_in_srun_output
from sweep.core.state import ENV_FILE, STATUS_FILE, attempt_dirs
from sweep.job.progress import read_tail
from sweep.job.verdict import LOG_TAIL_BYTES, SRUN_BLAME_SETTLED, srun_node_failure
from sweep.plan.render import RUNS_DIR


@dataclass
class Observation:
    """One poll: every run's state, and what it cost."""

    states: list[RunState]
    infos: dict[str, RunInfo]
    failures: list[NodeFailure]
    excluded: list[str]
    slurm_calls: dict[str, int] = field(default_factory=dict)


class Observer:
    """Polls the runs of one sweep folder on Slurm."""

    def __init__(self, folder: SweepFolder, slurm: Slurm, bad_nodes: BadNodes) -> None:
        self.folder = folder
        self.slurm = slurm
        self.bad_nodes = bad_nodes

    def observe(self, subs: Sequence[Submission]) -> Observation:
        """Every run's state, from the ledger's submissions `subs`, squeue and sacct (each once
        per 1,000 array masters) and the attempt folders; merges the node failures it sees into
        the sweep's bad-node file."""
        before = dict(self.slurm.calls)
        latest = latest_tasks(subs)
        masters = sorted({task.job_id for task in latest.values()})
        views = self._slurm_views(masters) if masters else {}
        now = time.time()
        states: list[RunState] = []
        failures: list[NodeFailure] = []
        for run_id in self.folder.run_ids(refresh=True):
            task = latest.get(run_id)
            view = (views.get(task.task_id) or views.get(task.job_id)) if task else None
            attempt = self._attempt(run_id, task, view)
            state = run_state(run_id, task, view, attempt, now)
            states.append(state)
            failure = self._node_failure(state, view)
            if failure is not None:
                failures.append(failure)
        excluded = self.bad_nodes.merge(failures, self._unhealthy_nodes)
        calls = {k: v - before.get(k, 0) for k, v in self.slurm.calls.items()
                 if v - before.get(k, 0)}
        return Observation(states=states, infos=self.folder.run_info(), failures=failures,
                           excluded=excluded, slurm_calls=calls)

    def await_accounting(self, task_ids: Collection[str], wait_s: float) -> list[str]:
        """Poll sacct until it has recorded the end of every task in `task_ids` ("M_i"), for at
        most `wait_s`; the tasks it still has not recorded. slurmdbd learns of a cancel a moment
        after slurmctld, and a status read in between would call a cancelled task running."""
        masters = sorted({task.split("_")[0] for task in task_ids})
        deadline = time.monotonic() + wait_s
        while True:
            ended = {task for entry in self.slurm.accounting(masters) if has_ended(entry.state)
                     for task in _task_ids(entry.job_id)}
            waiting = sorted(set(task_ids) - ended)
            if not waiting or time.monotonic() >= deadline:
                return waiting
            time.sleep(0.2)

    def _slurm_views(self, masters: Sequence[str]) -> dict[str, SlurmView]:
        """Slurm's view by task id ("M_i"), and by array id ("M") for an array whose tasks were
        never split off (a held or pending array cancelled as a whole is one record "M").

        squeue's view wins over accounting's, except for a COMPLETING task whose accounting
        already holds its end: right after `scancel` a task sits in squeue as COMPLETING until
        its processes are gone (KillWait), while sacct already says CANCELLED. The task has
        ended, and `sweep status` says how."""
        views: dict[str, SlurmView] = {}
        for entry in self.slurm.accounting(masters):
            for task_id in _task_ids(entry.job_id):
                views[task_id] = _acct_view(entry)
        for queued in self.slurm.queue(masters):
            for task_id in _task_ids(queued.job_id):
                ended = views.get(task_id)
                if queued.state == "COMPLETING" and ended is not None and has_ended(ended.state):
                    continue
                views[task_id] = _queue_view(queued)
        return views

    def _attempt(self, run_id: str, task: TaskRef | None,
                 view: SlurmView | None) -> AttemptView | None:
        """The newest attempt folder of this run that the latest submission made (matched by
        job id); for a run never submitted through the ledger, its newest attempt."""
        attempts = attempt_dirs(self.folder.dir / RUNS_DIR / run_id)
        for folder in reversed(attempts[-3:]):
            status = read_json_safe(folder / STATUS_FILE)
            if task is not None:
                env = read_json_safe(folder / ENV_FILE) or {}
                ids = {str(status.get("slurm_job_id")) if status else None,
                       str(env.get("slurm_job_id")), str(env.get("slurm_array"))}
                if not ({task.task_id, view.raw_id if view else None} & ids - {None, "None", ""}):
                    continue
            return attempt_view(folder, status)
        return None

    def _node_failure(self, state: RunState, view: SlurmView | None) -> NodeFailure | None:
        if state.state == "node_fail":
            nodes = _expand(view.nodes) if view is not None else list(state.nodes)
            named = self._failed_nodes_in_output(state)
            kind = "node_fail"
        elif state.state in ("crashed", "hang") and "nccl" in state.reason.lower():
            nodes, named, kind = list(state.nodes), [], "nccl"
        else:
            return None
        chosen = [n for n in named if n in nodes] or nodes
        return NodeFailure(run_id=state.run_id, attempt=state.attempt, kind=kind,
                           nodes=tuple(n for n in chosen if n),
                           exact=kind != "node_fail" or bool(named) or len(chosen) <= 1,
                           ended_at=view.ended_at if view is not None else None)

    def _failed_nodes_in_output(self, state: RunState) -> list[str]:
        """The nodes srun blamed in the task's Slurm output (`Node failure on node2`, or a step
        launch that failed on it), when it did (a failed batch host leaves no such line: then
        every node of the job is suspect)."""
        if state.task is None:
            return []
        master, _, index = state.task.partition("_")
        attempts = self.folder.dir / RUNS_DIR / state.run_id / "attempts"
        text = "\n".join(read_tail(attempts / f"slurm-{master}_{index}.{suffix}", LOG_TAIL_BYTES)
                         for suffix in ("err", "out"))
        blamed = node_failures_in_srun_output(text)
        return list(blamed[1]) if blamed else []

    def _unhealthy_nodes(self) -> set[str]:
        """The nodes Slurm holds down, drained or not responding now (none if sinfo fails)."""
        try:
            return self.slurm.unhealthy_nodes()
        except SlurmError:
            return set()


def attempt_view(folder: Path, status: dict[str, Any] | None) -> AttemptView:
    """What one attempt folder says of its run: the outcome, reason, time and nodes its
    status.json holds, unless srun's output blames a node for a run that did not complete
    (then the attempt is a node failure on that node, whatever the job script recorded)."""
    status = status or {}
    elapsed = None
    start, end = status.get("started_at"), status.get("ended_at")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        elapsed = float(end - start)
    view = AttemptView(number=int(folder.name), outcome=status.get("outcome"),
                       reason=str(status.get("reason") or ""), elapsed_s=elapsed,
                       nodes=tuple(str(n) for n in status.get("nodes") or () if n))
    blamed = srun_node_failure(folder) if view.outcome not in SRUN_BLAME_SETTLED else None
    if blamed is None:
        return view
    return replace(view, outcome="node_fail", reason=f"{blamed[0]}: {','.join(blamed[1])}",
                   nodes=blamed[1])


def _task_ids(job_id: str) -> list[str]:
    """The task ids a squeue/sacct row stands for; a plain array id stands for itself."""
    expanded = expand_task_ids(job_id)
    if expanded:
        return [f"{expanded[0]}_{i}" for i in expanded[1]]
    return [job_id] if job_id.isdigit() else []


def _acct_view(entry: AcctEntry) -> SlurmView:
    return SlurmView(state=entry.state, live=False, raw_id=entry.job_id_raw,
                     exit_code=entry.exit_code, derived_exit_code=entry.derived_exit_code,
                     step_states=tuple(step.state for step in entry.steps), nodes=entry.nodes,
                     elapsed_s=entry.elapsed_s, ended_at=_epoch(entry.end))


def _epoch(stamp: str) -> float | None:
    """sacct's `2026-11-25T01:41:30` (the cluster's local time) as epoch seconds."""
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None  # "Unknown", "None": the job has not ended


def _queue_view(entry: QueueEntry) -> SlurmView:
    return SlurmView(state=entry.state, live=True, nodes=entry.nodes, reason=entry.reason)


def _expand(nodes: str) -> list[str]:
    if not nodes or nodes in ("None assigned", "(null)"):
        return []
    try:
        return expand_hosts(nodes)
    except ValueError:
        return [nodes]
