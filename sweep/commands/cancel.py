"""`sweep cancel DIR [--only pending,running] [--run RUN_ID ...]`: cancel a sweep's jobs.

Cancels the sweep's job arrays (one scancel per 1,000 arrays), or only their tasks in the given
states, or only the given runs' tasks. Cancelled runs show as `cancelled`; `sweep resume
--only cancelled` submits them again.

A detached sweep's driver and report job are cancelled first (all of the sweep, not with --only
or --run), and waited for until they have left the queue, so that no driver submits a round
after its arrays were cancelled. Then it waits (at most ACCOUNTING_WAIT_S) until Slurm's
accounting has recorded the end of every cancelled task, so that a `sweep status` right after
says `cancelled`, not `running`, while Slurm is still killing the tasks' processes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sweep.core.errors import UserError

if TYPE_CHECKING:
    from sweep.backends.slurm.tracker import Tracker

DRIVER_GONE_WAIT_S: Final = 60.0
ACCOUNTING_WAIT_S: Final = 15.0  # for slurmdbd to record the cancel that slurmctld has made

STATES = {"pending": "PENDING", "running": "RUNNING", "suspended": "SUSPENDED"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", type=Path, help="the sweep folder")
    parser.add_argument("--only", default=None, metavar="STATES",
                        help=f"comma-separated task states to cancel, of: {','.join(STATES)}")
    parser.add_argument("--run", action="append", default=[], metavar="RUN_ID",
                        help="cancel only this run's task (repeatable)")


def stop_driver(tracker: Tracker, wait_s: float = DRIVER_GONE_WAIT_S) -> list[str]:
    """scancel the sweep's driver and report job when Slurm still holds them, then wait until
    they have left the queue (the driver ignores SIGTERM until Slurm's KillWait sends SIGKILL).
    Callers hold the submit lock, which a dying driver cannot take to submit a round."""
    from sweep.search.driver import read_record

    record = read_record(tracker.dir)
    jobs = [str(record[k]) for k in ("job_id", "report_job") if record.get(k)]
    live = [e.job_id for e in tracker.slurm.queue(jobs)] if jobs else []
    if not live:
        return []
    tracker.slurm.cancel(live)
    deadline = time.monotonic() + wait_s
    while tracker.slurm.queue(live) and time.monotonic() < deadline:
        time.sleep(1.0)
    return live


def run(args: argparse.Namespace) -> int:
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.submission import latest_tasks
    from sweep.backends.slurm.tracker import Tracker

    states = [s.strip() for s in (args.only or "").split(",") if s.strip()]
    wrong = [s for s in states if s not in STATES]
    if wrong:
        raise UserError(f"--only {','.join(wrong)}: not a state to cancel; choose from "
                        f"{','.join(STATES)}")
    tracker = Tracker(args.sweep_dir)
    stopped: list[str] = []
    try:
        with tracker.lock():
            if not args.run and not states:
                stopped = stop_driver(tracker)
            subs = tracker.reconcile(write=True)
            masters = sorted({s.job_id for s in subs if s.job_id})
            queued = tracker.slurm.queue(masters) if masters else []
            live = [entry.job_id for entry in queued]
            if args.run:
                latest = latest_tasks(subs)
                unknown = [r for r in args.run if r not in latest]
                if unknown:
                    raise UserError(f"--run {unknown[0]}: this sweep never submitted that run "
                                    f"(see `sweep status {args.sweep_dir}`)")
                targets = [latest[r].task_id for r in args.run if latest[r].task_id in live]
                ending = targets
            else:  # only arrays with a task in the queue: the others are over
                targets = sorted({job.split("_")[0] for job in live})
                chosen = {STATES[s] for s in states}
                ending = [entry.job_id for entry in queued if not chosen or entry.state in chosen]
            if targets:
                tracker.slurm.cancel(targets, states=[STATES[s] for s in states])
    except SlurmError as error:
        raise UserError(str(error)) from None
    unrecorded: list[str] = []
    unconfirmed = ""
    try:  # the cancels are made: accounting that cannot answer must not undo the report of them
        unrecorded = tracker.observer.await_accounting(ending, ACCOUNTING_WAIT_S) if targets else []
    except SlurmError as error:
        unconfirmed = str(error)
    if stopped:
        print(f"stopped the sweep's driver/report job(s): {', '.join(stopped)}")
    scope = f" in state {','.join(states)}" if states else ""
    print(f"cancelled {len(targets)} {'task(s)' if args.run else 'job array(s)'}{scope} "
          f"of {tracker.dir.name}")
    if unrecorded:
        print(f"Slurm's accounting has not yet recorded the end of {len(unrecorded)} task(s) "
              f"({', '.join(unrecorded[:5])}{' ...' if len(unrecorded) > 5 else ''}): "
              f"`sweep status` shows them in flight until it does")
    if unconfirmed:
        print(f"could not confirm the cancels in Slurm's accounting ({unconfirmed}); `sweep "
              "status` may show them in flight until it answers")
    return 0
