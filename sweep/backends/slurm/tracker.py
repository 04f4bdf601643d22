"""A sweep folder as Slurm sees it: submit its runs as job arrays, under a GPU-hour cap.

The I/O side of `sweep.backends.slurm.submission` (which holds the rules). `Tracker` extends the folder's reader
(`sweep.backends.slurm.sweep_folder.SweepFolder`: run folders, the ledger) with submitting (task lists, the
array wrapper, sbatch under the sweep's lock, the ledger's intent before and job id after) and
the budget; one poll of the runs' states is `sweep.backends.slurm.observation.Observer`'s, and the failed nodes
are `sweep.backends.slurm.bad_nodes.BadNodes`'s file, both held here so that the commands (submit, status,
resume, cancel, nodes) need one object. Slurm is called through `sweep.backends.slurm.client.Slurm`; the round
loop of a search lives in `sweep.backends.slurm.backend`.

Files in the sweep folder:
  ledger.jsonl              intent (batch id, run ids) before each sbatch, the job id after
  batches/array-task.sh     the array wrapper: task i → the i-th run of the task list
  batches/<batch>/tasks.txt the batch's run ids, one per line (task i = line i + 1)
  batches/<batch>/<i>       a link to runs/<run id>/attempts, so that Slurm's own output file
                            (--output=batches/<batch>/%a/slurm-%A_%a.out) lands in the run
  budget_left_out.txt       runs the GPU-hour cap (max_gpu_hours) kept from being launched
  bad_nodes.json            node failures seen and the exclude list (sweep.backends.slurm.bad_nodes)
"""

from __future__ import annotations

import contextlib
import getpass
import secrets
import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.backends.slurm.client import Slurm, SlurmError, SlurmLimits
from sweep.backends.slurm.observation import Observation, Observer
from sweep.backends.slurm.submission import (
    Batch,
    NodeExclusions,
    NodeRecord,
    Submission,
    array_option,
    batch_in,
    job_comment,
    plan_batches,
    reconcile,
    shape_options,
)
from sweep.backends.slurm.sweep_folder import SweepFolder
from sweep.core.errors import UserError
from sweep.core.state import (
    LockHeld,
    append_jsonl,
    atomic_write_text,
    exclusive_lock,
    read_jsonl,
)
from sweep.plan.budget import Fit, Spend, committed_gpu_hours, fit_budget
from sweep.plan.render import RUNS_DIR

BATCHES_DIR: Final = "batches"
WRAPPER: Final = "array-task.sh"
TASKS_FILE: Final = "tasks.txt"
LOCK_FILE: Final = ".submit.lock"
LEFT_OUT_FILE: Final = "budget_left_out.txt"  # runs a GPU-hour cap kept from being launched
LOCK_WAIT_S: Final = 200.0  # longer than sbatch's own retries (120 s) when the queue is full
JOB_COUNT_MARGIN: Final = 0.02  # of MaxJobCount, left free for other users
_WRAPPER_TEXT: Final = """#!/bin/bash
# llm-sweep array task (written by `sweep submit`). Task i of a batch runs the run on line i+1 of
# the batch's task list through that run's own job.sbatch, unchanged (its environment contract:
# SWEEP_RUN_DIR names the run folder; the script makes its own attempt folder). The resource
# options (nodes, time, memory, ...) came from that job.sbatch's #SBATCH lines, on sbatch's
# command line. Usage: sbatch --array=... array-task.sh SWEEP_DIR TASK_LIST
set -euo pipefail
SWEEP_DIR=$1
TASKS=$2
: "${SLURM_ARRAY_TASK_ID:?run this as a Slurm array task}"
RUN_ID=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$TASKS")
if [[ ! $RUN_ID =~ ^[A-Za-z0-9._-]+$ || ! -f $SWEEP_DIR/runs/$RUN_ID/job.sbatch ]]; then
  echo "array-task.sh: task $SLURM_ARRAY_TASK_ID: no run '$RUN_ID' in $TASKS ($SWEEP_DIR/runs)" >&2
  exit 2
fi
export SWEEP_RUN_DIR=$SWEEP_DIR/runs/$RUN_ID
exec bash "$SWEEP_RUN_DIR/job.sbatch"
"""


class Tracker(SweepFolder):
    """One sweep folder and the Slurm jobs of its runs: what it reads of the folder
    (SweepFolder), submitting its runs as job arrays, and (through `observer` and `bad_nodes`)
    their states and the nodes they failed on."""

    def __init__(self, sweep_dir: Path, slurm: Slurm | None = None) -> None:
        super().__init__(sweep_dir)
        self.slurm = slurm or Slurm()
        self.batches = self.dir / BATCHES_DIR
        self.bad_nodes = BadNodes(self.dir)
        self.observer = Observer(self, self.slurm, self.bad_nodes)

    def fit_budget(self, run_ids: Sequence[str], cap_gpu_hours: float | None,
                   observation: Observation | None = None, write: bool = True) -> Fit:
        """The runs of `run_ids` that may be launched under the cap, counting what the sweep
        spent and what it has in flight (at its time limit); the others are left out and
        listed in budget_left_out.txt (when `write`)."""
        if cap_gpu_hours is None or not run_ids:
            return Fit(list(run_ids), [], 0.0)
        observation = observation or self.observe()
        committed = committed_gpu_hours(
            Spend(gpus=observation.infos[s.run_id].gpus, elapsed_s=s.elapsed_s,
                  time_limit_s=observation.infos[s.run_id].time_limit_s, in_flight=s.in_flight)
            for s in observation.states if s.run_id in observation.infos)
        fit = fit_budget(self.run_costs(run_ids), committed, cap_gpu_hours)
        if fit.left_out and write:
            atomic_write_text(self.dir / LEFT_OUT_FILE, "".join(f"{r}\n" for r in fit.left_out))
        elif write:  # the latest fit decides: what an earlier one left out has fitted since
            (self.dir / LEFT_OUT_FILE).unlink(missing_ok=True)
        return fit

    @contextlib.contextmanager
    def lock(self, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """One submitter per sweep at a time (two would submit the same runs). Every Slurm
        command inherits the lock, so an sbatch that outlives a killed submitter keeps it until
        its job is in the queue: the next submitter then sees that job, never submits again."""

        def tell() -> None:
            print(f"waiting for another submitter of {self.dir.name} to finish …",
                  file=sys.stderr)

        try:
            with exclusive_lock(self.dir / LOCK_FILE, wait_s, tell) as handle:
                self.slurm.inherit_fds = (handle.fileno(),)
                try:
                    yield
                finally:
                    self.slurm.inherit_fds = ()
        except LockHeld:
            raise UserError(f"{self.dir / LOCK_FILE}: another `sweep submit/resume/cancel` (or "
                            "its sbatch) still works on this sweep; wait for it, then try "
                            "again") from None

    def reconcile(self, write: bool) -> list[Submission]:
        """The ledger's submissions with dangling intents settled from the jobs' comments
        (written to the ledger when `write`)."""
        subs = self.submissions()
        open_ = [s for s in subs if s.job_id is None and s.failed is None]
        if not open_:
            return subs
        seen: dict[str, str] = {}
        for master, text in self.slurm.tagged_jobs(min(s.time for s in open_)):
            batch = batch_in(text)
            if batch and master.isdigit():
                seen.setdefault(batch, master)
        records = reconcile(subs, seen)
        if write:
            for record in records:
                append_jsonl(self.ledger, {**record, "time": time.time()})
        from sweep.backends.slurm.submission import submissions as settle

        return settle([*read_jsonl(self.ledger), *([] if write else records)])

    def capacity(self, limits: SlurmLimits) -> int:
        """Array tasks this sweep may add now: room under MaxJobCount (all users' jobs, the
        finished ones slurmctld still holds included) and under the user's MaxSubmitJobs."""
        room = int(limits.max_job_count * (1 - JOB_COUNT_MARGIN)) - self.slurm.job_count()
        user = getpass.getuser()
        max_submit = self.slurm.max_submit_jobs(user)
        if max_submit is not None:
            room = min(room, max_submit - self.slurm.job_count(user))
        return room

    def plan(self, run_ids: Sequence[str], capacity: int,
             max_array_size: int) -> tuple[list[Batch], list[str]]:
        known = {s.batch_id for s in self.submissions()}

        def new_id() -> str:
            while True:
                candidate = f"{int(time.time()) % 10**6:06d}{secrets.token_hex(2)}"
                if candidate not in known:
                    known.add(candidate)
                    return candidate

        return plan_batches(self.run_jobs(run_ids), max_array_size, capacity, new_id)

    def sbatch_command(self, batch: Batch, *, max_running: int | None, hold: bool,
                       exclude: Sequence[str]) -> tuple[list[str], list[str]]:
        """(sbatch options, script and its arguments) of one batch."""
        folder = self.batches / batch.batch_id
        name = self.sweep_name()
        options = [array_option(len(batch.run_ids), max_running),
                   f"--job-name={name}.{batch.batch_id}",
                   f"--comment={job_comment(name, batch.batch_id)}",
                   f"--output={folder}/%a/slurm-%A_%a.out",
                   f"--error={folder}/%a/slurm-%A_%a.err",
                   *(["--hold"] if hold else []),
                   *shape_options(batch.shape, exclude)]
        return options, [str(self.batches / WRAPPER), str(self.dir), str(folder / TASKS_FILE)]

    def command_line(self, batch: Batch, **kwargs: Any) -> str:
        options, script = self.sbatch_command(batch, **kwargs)
        return shlex.join(["sbatch", "--parsable", *options, *script])

    def _write_batch_files(self, batch: Batch) -> None:
        folder = self.batches / batch.batch_id
        folder.mkdir(parents=True, exist_ok=True)
        wrapper = self.batches / WRAPPER
        if not wrapper.is_file() or wrapper.read_text() != _WRAPPER_TEXT:
            atomic_write_text(wrapper, _WRAPPER_TEXT)
            wrapper.chmod(0o755)
        atomic_write_text(folder / TASKS_FILE, "".join(f"{r}\n" for r in batch.run_ids))
        for index, run_id in enumerate(batch.run_ids):
            (self.dir / RUNS_DIR / run_id / "attempts").mkdir(parents=True, exist_ok=True)
            link = folder / str(index)
            if not link.is_symlink():
                link.symlink_to(Path("..", "..", RUNS_DIR, run_id, "attempts"))

    def submit(self, batches: Sequence[Batch], *, max_running: int | None, hold: bool,
               exclude: Sequence[str]) -> list[tuple[Batch, str]]:
        """sbatch each batch, ledger intent before and job id after; returns (batch, job id).

        A definite refusal by sbatch is recorded as failed (its runs may go again); any other
        error leaves the intent open for reconciliation, so that a run is never sent twice."""
        done = []
        for batch in batches:
            self._write_batch_files(batch)
            options, script = self.sbatch_command(batch, max_running=max_running, hold=hold,
                                                  exclude=exclude)
            append_jsonl(self.ledger, {"event": "intent", "batch": batch.batch_id,
                                       "run_ids": list(batch.run_ids), "time": time.time(),
                                       "options": options})
            try:
                job_id = self.slurm.submit(script[0], options, script[1:])
            except SlurmError as error:
                if "submission failed" in str(error).lower():
                    append_jsonl(self.ledger, {"event": "failed", "batch": batch.batch_id,
                                               "error": str(error), "time": time.time()})
                raise UserError(f"batch {batch.batch_id} ({len(batch.run_ids)} runs): {error}; "
                                f"`sweep resume {self.dir}` submits what is left") from None
            append_jsonl(self.ledger, {"event": "submitted", "batch": batch.batch_id,
                                       "job_id": job_id, "time": time.time()})
            done.append((batch, job_id))
        return done

    def observe(self, subs: Sequence[Submission] | None = None) -> Observation:
        """Every run's state (`sweep.backends.slurm.observation`), from the ledger's submissions with dangling
        intents settled from the jobs' comments (not written: a poll only reads the ledger)."""
        return self.observer.observe(list(subs) if subs is not None
                                     else self.reconcile(write=False))

    def nodes(self) -> list[NodeRecord]:
        """Every node that failed or is excluded, as bad_nodes.json records it (no Slurm call)."""
        return self.bad_nodes.records()

    def change_exclusions(self, *, forgive: Sequence[str] = (), exclude: Sequence[str] = (),
                          reasons: Mapping[str, str] | None = None) -> NodeExclusions:
        """Forgive nodes (back into use; their failures so far stop counting) or exclude them
        (with a check's `reasons`), under the submit lock."""
        with self.lock():
            return self.bad_nodes.change(forgive=forgive, exclude=exclude, reasons=reasons)


@dataclass
class SubmitReport:
    """What one submit or resume did (or, dry, would do)."""

    commands: list[str] = field(default_factory=list)  # sbatch command lines
    submitted: list[tuple[str, str, int]] = field(default_factory=list)  # batch, job id, tasks
    left_over: list[str] = field(default_factory=list)  # no room under the job limits
    excluded: list[str] = field(default_factory=list)

    def lines(self, dry_run: bool) -> list[str]:
        """What to tell the user: the sbatch command lines (dry), the arrays submitted, the bad
        nodes excluded, and the runs left over for lack of room under the job limits."""
        lines = list(self.commands) if dry_run else []
        lines += [f"batch {batch}: job array {job_id} ({tasks} task(s))"
                  for batch, job_id, tasks in self.submitted]
        if self.excluded:
            lines.append(f"excluding bad nodes: {','.join(self.excluded)}")
        if self.left_over:
            lines.append(f"{len(self.left_over)} run(s) not submitted: no room under the "
                         "cluster's job limits (MaxJobCount/MaxSubmitJobs); run `sweep resume` "
                         "later")
        return lines


def submit_runs(tracker: Tracker, run_ids: Sequence[str], *, max_running: int | None = None,
                hold: bool = False, dry_run: bool = False,
                exclude: Sequence[str] | None = None) -> SubmitReport:
    """Group `run_ids` into arrays and submit them (or, dry, only say how)."""
    exclude = list(tracker.excluded() if exclude is None else exclude)
    report = SubmitReport(excluded=exclude)
    if not run_ids:
        return report
    limits = tracker.slurm.limits()
    capacity = len(run_ids) if dry_run else tracker.capacity(limits)
    batches, report.left_over = tracker.plan(run_ids, capacity, limits.max_array_size)
    options: dict[str, Any] = {"max_running": max_running, "hold": hold, "exclude": exclude}
    report.commands = [tracker.command_line(batch, **options) for batch in batches]
    if not dry_run:
        for batch, job_id in tracker.submit(batches, **options):
            report.submitted.append((batch.batch_id, job_id, len(batch.run_ids)))
    return report
