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
sweep.plan.budget.CONFIRM_ABOVE_GPU_HOURS asks first (`--yes`: do not ask).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.commands._shared import add_submit_options, add_top_argument, shortlist_top
from sweep.core.errors import UserError
from sweep.plan.plan_file import budget_cap, driver_settings
from sweep.search.strategies import STRATEGIES

if TYPE_CHECKING:
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
    parser.add_argument("--yes", action="store_true",
                        help="submit without asking, however many GPU-hours the worst case is")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="a search: keep the plan's memory verdicts instead of "
                             "refitting the memory model on the sweep's attempts after every "
                             "round (sweep.search.round_calibration)")
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
    started = time.perf_counter()
    detach = args.detach if args.detach is not None else args.strategy != "exhaustive"
    if args.strategy != "exhaustive" and (args.hold or (args.dry_run and not detach)):
        raise UserError(f"--strategy {args.strategy} waits for each round's results: it cannot "
                        "be combined with --hold, nor --dry-run in the foreground (--detach "
                        "--dry-run shows the driver it would submit)")
    if args.poll_s <= 0:
        raise UserError(f"--poll-s: must be positive, got {args.poll_s}")
    from sweep.backends.slurm.tracker import Tracker

    folder = sweep_folder(args.target, args.out)
    tracker = Tracker(folder)
    cap = budget_cap(folder, args.max_gpu_hours)
    announce_budget(tracker, cap, args)
    if not (args.dry_run or args.no_preflight):
        from sweep.backends.slurm.preflight import ensure_passed

        ensure_passed(folder, args.preflight_timeout, say=lambda line: print(line, flush=True))
    if args.strategy == "exhaustive":
        return _submit_all(folder, tracker, cap, args, started)
    options = search_options(args, cap)
    if detach:
        return _detach(folder, tracker, options, args.dry_run, started)
    return _foreground(folder, options)


def search_options(args: argparse.Namespace, cap: float | None) -> SearchOptions:
    from sweep.search.driver import SearchOptions

    return SearchOptions(strategy=args.strategy, top=shortlist_top(args),
                         max_running=args.max_running,
                         poll_s=args.poll_s,
                         max_gpu_hours=cap, report=not args.no_report,
                         calibrate=not getattr(args, "no_calibrate", False))


# -- the budget -----------------------------------------------------------------------------------

def step_times(folder: Path) -> dict[str, float]:
    """The plan's predicted step time of each run (run id → seconds), where it has one."""
    import pandas as pd

    from sweep.plan.plan_file import PLAN_FILE

    path = folder / PLAN_FILE
    if not path.is_file():
        return {}
    plan = pd.read_parquet(path, columns=None)
    if "pred_step_time_s" not in plan or "run_id" not in plan:
        return {}
    known = plan.dropna(subset=["pred_step_time_s", "run_id"])
    return dict(zip(known["run_id"].astype(str), known["pred_step_time_s"].astype(float), strict=True))


def announce_budget(tracker: Tracker, cap: float | None, args: argparse.Namespace) -> None:
    """Print the GPU-hours of the runs not submitted yet (expected and worst case) and the cap;
    ask before a worst case above the confirmation threshold (UserError when declined, or with
    no terminal to ask and no --yes)."""
    import sys

    from sweep.backends.slurm.submission import latest_tasks
    from sweep.plan.budget import capped_worst, confirmation, estimate

    seen = latest_tasks(tracker.submissions())
    todo = [r for r in tracker.run_ids() if r not in seen]
    if not todo:
        return
    times = step_times(tracker.dir)
    found = estimate(tracker.run_costs(todo, times), predicted=sum(r in times for r in todo))
    print(found.describe() + (f"; capped at {cap:g} (--max-gpu-hours)" if cap is not None else ""))
    worst = capped_worst(found.worst_gpu_hours, cap)
    if args.dry_run:
        return
    decision = confirmation(worst, yes=getattr(args, "yes", False), interactive=sys.stdin.isatty())
    if decision == "refuse":
        raise UserError(f"this sweep may use up to {worst:,.0f} GPU-hours and there is no terminal "
                        "to confirm it: pass --yes to submit anyway, or --max-gpu-hours H to cap it")
    if decision == "ask":
        answer = input(f"this sweep may use up to {worst:,.0f} GPU-hours; submit? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise UserError("not submitted (answer y, or pass --yes)")


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


def _foreground(folder: Path, options: SearchOptions) -> int:
    """The search in this process (the same code the driver runs); as before detached sweeps,
    it neither collects nor reports at the end."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.observation import Observation
    from sweep.backends.slurm.submission import counts_by
    from sweep.search.driver import search_on_slurm

    def report(observation: Observation) -> None:
        counts = counts_by(observation.states)
        print(time.strftime("%H:%M:%S"), ", ".join(f"{n} {state}" for state, n in
                                                   sorted(counts.items())), flush=True)

    try:
        end = search_on_slurm(folder, options, on_poll=report)
    except SlurmError as error:
        raise UserError(str(error)) from None
    print(end.summary)
    return 0
