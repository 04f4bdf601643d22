"""`sweep submit SPEC|DIR [--dry-run] [--max-running N] [--hold]`: rendered runs → Slurm job arrays.

SPEC is planned and rendered first, exactly as `sweep render` does; DIR is a sweep folder
already rendered. Runs of one resource shape go into one array (split at MaxArraySize, capped
by MaxJobCount and MaxSubmitJobs); each task runs its run's own job.sbatch. Runs this sweep has
submitted before are never submitted again (that is `sweep resume`'s job, for failed ones).

With `--strategy pruned|adaptive|shortlist` the search of sweep.search.strategies picks the runs, round by
round.
Detached (the default for a search), a small CPU job on the cluster runs it (`sweep.search.driver`) and
this command exits in seconds; `--foreground` runs it here: submits a round, waits for it
(polling as `sweep status` does), collects, and picks the next; interrupted and started again, it
waits for what is in flight and goes on. A one-round (exhaustive) sweep gets a report job that
collects and reports after its arrays (`--no-report`: none).

Before anything is submitted the sweep's estimated and worst-case GPU-hours are printed;
`--max-gpu-hours` (or the spec's `max_gpu_hours`) caps them, and a worst case above
sweep.plan.budget.CONFIRM_ABOVE_GPU_HOURS asks first (`--yes`: do not ask); `sweep resume` and
the driver apply the same rule (sweep.backends.slurm.budget_gate).

`--fabric-check` runs the fabric check after the preflight (sweep.backends.slurm.fabric_check,
as `sweep nodes --check`): the nodes whose all-reduce bus bandwidth is below the stated
fraction of the median are excluded before the first array, whatever the strategy.

Nothing of it depends on the login shell (sweep.backends.slurm.submit_record): a SIGHUP during
the preflight, the submission or the driver's start is noted and ignored; SIGTERM or Ctrl-C stop
it with a line that says where, and `sweep status` then shows the sweep as half-submitted with
the command that finishes it (`sweep resume DIR`). A foreground search stops on any of the three,
and leaves its arrays with an afterany report job.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.commands._fabric import add_fabric_options, check_fabric
from sweep.commands._shared import add_submit_options, add_top_argument, shortlist_top
from sweep.core.errors import UserError
from sweep.plan.plan_file import driver_settings
from sweep.search.strategies import STRATEGIES

if TYPE_CHECKING:
    from sweep.backends.slurm.submit_record import SubmitSession
    from sweep.backends.slurm.tracker import Tracker
    from sweep.search.driver import SearchOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", type=Path, help="a sweep spec (YAML) or a rendered sweep folder")
    parser.add_argument("--out", type=Path,
                        help="with SPEC: the sweep folder (default results/<name>)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="exhaustive",
                        help="which runs to submit (default %(default)s: every kept run at "
                             "once); pruned, adaptive and shortlist submit round by round")
    add_top_argument(parser)
    parser.add_argument("--poll-s", type=float, default=30.0,
                        help="with a strategy: seconds between polls of a round (default 30)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--detach", dest="detach", action="store_true", default=None,
                      help="run the search in a small CPU job on the cluster (spec: driver) and "
                           "exit; the default for a search (pruned, adaptive, shortlist)")
    mode.add_argument("--foreground", dest="detach", action="store_false",
                      help="run the search in this process, which must live until it ends")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="a search: keep the plan's memory verdicts instead of "
                             "refitting the memory model on the sweep's attempts after every "
                             "round (sweep.search.round_calibration)")
    parser.add_argument("--fabric-check", action="store_true",
                        help="before the first array, run the fabric check (`sweep nodes "
                             "--check`): an all_reduce job per node and per pair of nodes; the "
                             "nodes below --fabric-fraction of the median bus bandwidth are "
                             "excluded")
    add_fabric_options(parser, prefix="fabric-")
    add_submit_options(parser)


def sweep_folder(target: Path, out: Path | None) -> Path:
    """The sweep folder of a SPEC (rendered now) or a DIR."""
    if target.is_dir():
        if out is not None:
            raise UserError(f"--out applies to a spec; {target} is already a sweep folder")
        return target
    if not target.is_file():
        raise UserError(f"{target}: no such spec file or sweep folder")
    from sweep.search.render_sweep import render_sweep

    rendered = render_sweep(target, out)
    print(f"rendered {rendered.counts} from {rendered.plan_source} into "
          f"{rendered.out / 'runs'}")
    return rendered.out


def run(args: argparse.Namespace) -> int:
    from sweep.backends.slurm.submit_record import run_in_session

    return run_in_session("submit", lambda session: _run(args, session))


def _run(args: argparse.Namespace, session: SubmitSession) -> int:
    started = time.perf_counter()
    detach = args.detach if args.detach is not None else args.strategy != "exhaustive"
    if args.strategy != "exhaustive" and (args.hold or (args.dry_run and not detach)):
        raise UserError(f"--strategy {args.strategy} waits for each round's results: it cannot "
                        "be combined with --hold, nor --dry-run in the foreground (--detach "
                        "--dry-run shows the driver it would submit)")
    if args.poll_s <= 0:
        raise UserError(f"--poll-s: must be positive, got {args.poll_s}")
    from sweep.backends.slurm.budget_gate import sweep_cap
    from sweep.backends.slurm.tracker import Tracker

    folder = sweep_folder(args.target, args.out)
    tracker = Tracker(folder)
    cap = sweep_cap(folder, args.max_gpu_hours)
    announce_budget(tracker, cap, args)
    options = None if args.strategy == "exhaustive" else search_options(args, cap)
    if not args.dry_run:
        session.attach(folder, max_gpu_hours=cap, strategy=args.strategy)
        if options is not None:
            from sweep.search.driver import record_search

            record_search(folder, options)  # `sweep resume` restarts this search, whatever stops us
    if not (args.dry_run or args.no_preflight):
        from sweep.backends.slurm.preflight import ensure_passed

        session.enter("preflight")
        ensure_passed(folder, args.preflight_timeout, say=lambda line: print(line, flush=True))
    if args.fabric_check and args.dry_run:
        print("--dry-run: the fabric check would run here (it submits jobs, so not now)")
    elif args.fabric_check:
        session.enter("fabric check")
        check_fabric(tracker, args, prefix="fabric-")
    if options is None:
        session.enter("submitting")
        code = _submit_all(folder, tracker, cap, args, started)
    elif detach:
        session.enter("starting the driver")
        code = _detach(folder, tracker, options, args.dry_run, started)
    else:
        session.hangup_stops = True
        session.enter("searching")
        code = _foreground(folder, tracker, options, session)
    if not args.dry_run and session.phase != "searching":
        session.done()
    return code


def search_options(args: argparse.Namespace, cap: float | None) -> SearchOptions:
    from sweep.search.driver import SearchOptions

    return SearchOptions(strategy=args.strategy, top=shortlist_top(args),
                         max_running=args.max_running,
                         poll_s=args.poll_s,
                         max_gpu_hours=cap, report=not args.no_report,
                         calibrate=not getattr(args, "no_calibrate", False))


# -- the budget -----------------------------------------------------------------------------------

def announce_budget(tracker: Tracker, cap: float | None, args: argparse.Namespace) -> None:
    """The runs not submitted yet, through the one budget rule (budget_gate.announce_budget)."""
    from sweep.backends.slurm.budget_gate import announce_budget as announce
    from sweep.backends.slurm.submission import latest_tasks

    seen = latest_tasks(tracker.submissions())
    announce(tracker, [r for r in tracker.run_ids() if r not in seen], cap,
             dry_run=args.dry_run, yes=getattr(args, "yes", False))


# -- the three ways to submit -------------------------------------------------------------------

def _submit_all(folder: Path, tracker: Tracker, cap: float | None, args: argparse.Namespace,
                started: float) -> int:
    """One round: every run not submitted before, under the cap, then the report job."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.submission import latest_tasks
    from sweep.backends.slurm.tracker import LEFT_OUT_FILE, submit_runs
    from sweep.search.driver import report_after

    try:
        with tracker.lock():
            subs = tracker.reconcile(write=not args.dry_run)
            seen = latest_tasks(subs)
            todo = [run_id for run_id in tracker.run_ids() if run_id not in seen]
            fit = tracker.fit_budget(todo, cap, write=not args.dry_run)
            report = submit_runs(tracker, fit.chosen, max_running=args.max_running,
                                 hold=args.hold, dry_run=args.dry_run)
            report_job_id = (None if args.dry_run or args.no_report
                             else report_after(folder, tracker, report))
    except SlurmError as error:
        raise UserError(str(error)) from None
    for line in report.lines(args.dry_run):
        print(line)
    skipped = len(seen)
    tasks = sum(t for _, _, t in report.submitted)
    verb = "would submit" if args.dry_run else "submitted"
    print(f"{verb} {len(fit.chosen) - len(report.left_over)} run(s) in {len(report.commands)} "
          f"array(s)" + (f" ({tasks} tasks)" if not args.dry_run else "")
          + (f"; {skipped} run(s) submitted before (see `sweep status`)" if skipped else "")
          + f" in {time.perf_counter() - started:.1f} s")
    if fit.left_out:
        print(f"{len(fit.left_out)} run(s) left out by the budget of {cap:g} GPU-hours"
              + ("" if args.dry_run else f": listed in {folder / LEFT_OUT_FILE}"))
    if report_job_id:
        print(f"report job {report_job_id} collects and reports after the arrays end "
              f"(→ {folder / 'report' / 'index.html'})")
    return 0


def _detach(folder: Path, tracker: Tracker, options: SearchOptions, dry_run: bool,
            started: float) -> int:
    """Submit the search driver and say how to follow it."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.search.driver import DRIVER_DIR, start_driver

    settings = driver_settings(folder)
    where = settings.partition or "the default partition"
    if dry_run:
        print(f"would submit the {options.strategy} search driver: 1 CPU job on {where} "
              f"({settings.cpus} CPU, {settings.mem}, {settings.time_limit} per stint, requeued "
              f"at its limit); nothing submitted")
        return 0
    try:
        job_id = start_driver(tracker, settings, options)
    except SlurmError as error:
        raise UserError(str(error)) from None
    print(f"search driver: job {job_id} on {where} ({options.strategy}) in "
          f"{time.perf_counter() - started:.1f} s; you may log out.\n"
          f"  sweep status {folder}        # driver state, round, runs, GPU-hours\n"
          f"  squeue -j {job_id}; logs in {folder / DRIVER_DIR}\n"
          + ("" if not options.report else
             f"  report when it ends: {folder / 'report' / 'index.html'}\n")
          + f"  sweep cancel {folder}        # stops the driver and its runs")
    return 0


def _foreground(folder: Path, tracker: Tracker, options: SearchOptions,
                session: SubmitSession) -> int:
    """The search in this process (the same code the driver runs); as before detached sweeps,
    it neither collects nor reports at the end. Stopped by a signal (SIGHUP too: its terminal
    is gone), it says why, and leaves the runs in flight with an afterany report job."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.observation import Observation
    from sweep.backends.slurm.submission import counts_by
    from sweep.backends.slurm.submit_record import Stopped
    from sweep.search.driver import search_on_slurm

    def report(observation: Observation) -> None:
        counts = counts_by(observation.states)
        print(time.strftime("%H:%M:%S"), ", ".join(f"{n} {state}" for state, n in
                                                   sorted(counts.items())), flush=True)

    try:
        end = search_on_slurm(folder, options, on_poll=report)
    except SlurmError as error:
        raise UserError(str(error)) from None
    except Stopped as stop:
        session.ignore_signals()
        left = _leave_in_flight(folder, tracker, report=options.report)
        session.stopped(stop, left=left)
        print(f"sweep submit --foreground: stopped by {stop.name} during the {options.strategy} "
              f"search; {left}; `sweep resume {folder}` goes on with the search in a driver job",
              file=sys.stderr, flush=True)
        return stop.exit_code
    print(end.summary)
    session.done()
    return 0


def _leave_in_flight(folder: Path, tracker: Tracker, *, report: bool) -> str:
    """After a stop of the foreground search: the arrays still in Slurm's queue are left to
    run, with a report job that collects and reports after them (afterany), as a one-round
    submit leaves its arrays. Says what it left."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.plan.plan_file import driver_settings
    from sweep.search.driver import submit_report_job

    try:
        with tracker.lock():
            masters = sorted({s.job_id for s in tracker.reconcile(write=True) if s.job_id})
            live = sorted({e.job_id.split("_")[0] for e in tracker.slurm.queue(masters)}) \
                if masters else []
            if not live or not report:
                return (f"{len(live)} array(s) left running" if live else
                        "nothing in flight")
            job = submit_report_job(folder, driver_settings(folder), live, tracker.sweep_name())
    except (SlurmError, UserError) as error:
        return f"the arrays in flight are left running; no report job ({error})"
    return (f"{len(live)} array(s) left running ({', '.join(live)}); report job {job} collects "
            f"and reports after them (→ {folder / 'report' / 'index.html'})")
