"""`sweep resume DIR [--only CLASSES]`: submit again the runs whose latest attempt failed.

Default: every failure class except oom (a configuration that does not fit will not fit next
time either), and every run never submitted (a submit that was killed midway). A completed run,
or one pending or running, is never submitted again, so resume twice in a row is safe.

A one-round sweep is first re-planned from its own attempts (`sweep.search.round_calibration`; off with
--no-calibrate): the memory model is refitted on them, and the runs the re-plan keeps for the
first time are rendered and submitted with the rest. A detached search (`sweep submit --strategy
pruned|adaptive|shortlist`) is resumed by its driver, which recalibrates before its first round:
when the recorded driver died before the search ended, resume submits a new one, which adopts the
runs in flight; while a driver is live, resume leaves the sweep to it. After the search, resume
reruns failed runs only (a run the search skipped is not a failure). Under a GPU-hour cap
(--max-gpu-hours, or the spec's max_gpu_hours) nothing is submitted that could exceed it. When it
resubmits runs, a report job collects and reports again after them (`--no-report`: none).

A search whose submit was stopped before its driver started (its strategy is recorded in
driver.json from the submit's start) is resumed as that search: resume starts its driver.
The budget is the submit's rule (sweep.backends.slurm.budget_gate): the same estimate of what
it will submit, the same cap (by default the one the sweep was submitted with), the same
confirmation above the threshold, and `--yes`. Like submit, it notes and ignores a SIGHUP, and
says where a SIGTERM or Ctrl-C stopped it (sweep.backends.slurm.submit_record).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.commands._shared import add_submit_options
from sweep.core.errors import UserError
from sweep.search.driver import read_progress, read_record, report_after

if TYPE_CHECKING:
    from sweep.backends.slurm.submit_record import SubmitSession
    from sweep.backends.slurm.tracker import Tracker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sweep.backends.slurm.submission import NEVER_SUBMITTED, OUTCOMES

    parser.add_argument("sweep_dir", type=Path, help="the sweep folder")
    choices = [c for c in (*OUTCOMES, NEVER_SUBMITTED) if c != "completed"]
    parser.add_argument("--only", type=classes(choices), default=None, metavar="CLASSES",
                        help=f"comma-separated classes to resubmit, of: {', '.join(choices)} "
                             "(default: all but oom)")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="do not refit the memory model on the sweep's attempts and "
                             "re-plan before resubmitting (sweep.search.round_calibration)")
    add_submit_options(parser)


def classes(allowed: list[str]):  # noqa: ANN201 - an argparse type
    def parse(text: str) -> list[str]:
        chosen = [c.strip() for c in text.split(",") if c.strip()]
        wrong = [c for c in chosen if c not in allowed]
        if wrong or not chosen:
            raise argparse.ArgumentTypeError(
                f"{','.join(wrong) or text!r}: not a class to resume; choose from "
                f"{','.join(allowed)}")
        return chosen
    return parse


def run(args: argparse.Namespace) -> int:
    from sweep.backends.slurm.submit_record import run_in_session

    return run_in_session("resume", lambda session: _run(args, session), folder=args.sweep_dir)


def _run(args: argparse.Namespace, session: SubmitSession) -> int:
    from sweep.backends.slurm.budget_gate import sweep_cap
    from sweep.backends.slurm.tracker import Tracker

    if not (args.sweep_dir / "runs").is_dir():
        raise UserError(f"{args.sweep_dir}: no runs/ folder; pass the sweep folder that "
                        "`sweep submit` or `sweep render` wrote")
    tracker = Tracker(args.sweep_dir)
    cap = sweep_cap(tracker.dir, args.max_gpu_hours)
    record = read_record(tracker.dir)
    searched = (record.get("options") or {}).get("strategy")
    if not args.dry_run:
        session.attach(tracker.dir, max_gpu_hours=cap, strategy=searched or "exhaustive")
    if not (args.dry_run or args.no_preflight):
        from sweep.backends.slurm.preflight import ensure_passed

        session.enter("preflight")  # remembered once passed: a submit stopped in it runs it now
        ensure_passed(args.sweep_dir, args.preflight_timeout,
                      say=lambda line: print(line, flush=True))
    if searched and not _search_over(tracker, record, cap):
        code = _resume_search(tracker, record, cap, args, session)
    else:
        if not searched and not args.dry_run:
            session.enter("recalibrating")
            _recalibrate(tracker.dir, enabled=not args.no_calibrate)
        session.enter("submitting")
        code = _resume_runs(tracker, cap, args, skip_never_submitted=bool(searched))
    if not args.dry_run:
        session.done()
    return code


def _recalibrate(folder: Path, *, enabled: bool) -> None:
    """A one-round sweep learns from its attempts here: collect, refit the memory model on them,
    re-plan, and render what the re-plan keeps for the first time; those runs are then never
    submitted, so `_resume_runs` submits them (sweep.search.round_calibration)."""
    import pandas as pd

    from sweep.collect.attempts import update_runs
    from sweep.plan.plan_file import PLAN_FILE, SPEC_COPY
    from sweep.plan.spec import load_spec
    from sweep.search.round_calibration import for_search

    if not enabled or not (folder / PLAN_FILE).is_file() or not (folder / SPEC_COPY).is_file():
        return
    update_runs(folder)
    calibration, line = for_search(folder, load_spec(folder / SPEC_COPY),
                                   pd.read_parquet(folder / PLAN_FILE))
    if calibration is None:
        print(line)
        return
    before = set(calibration.initially_kept)
    verdict = calibration.replan("resume")
    record = calibration.rounds[-1]
    if not record.get("calibrated"):
        reason = str(record.get("reason", "")).removeprefix(f"{folder / 'runs.parquet'}: ")
        print(f"self-calibration: nothing to learn from yet ({reason.split(';')[0]})")
        return
    new = len(set(verdict.eligible) - before)
    print(f"self-calibration: reserved peak × {record['memory']['factor']:.3f} from "
          f"{record['memory']['n_completed']} completed and {record['memory']['n_oom']} OOM "
          f"attempt(s); {new} run(s) the re-plan keeps for the first time are rendered and "
          f"submitted as never submitted, {record['held_back']} kept before are pruned now")


def _search_over(tracker: Tracker, record: dict[str, Any], cap: float | None) -> bool:
    """Whether the recorded search ended: done, or stopped at a budget that was not raised."""
    progress = read_progress(tracker.dir)
    if progress.get("phase") == "done":
        return True
    old_cap = (record.get("options") or {}).get("max_gpu_hours")
    return progress.get("phase") == "budget" and (cap is None or old_cap is None or cap <= old_cap)


def _resume_search(tracker: Tracker, record: dict[str, Any], cap: float | None,
                   args: argparse.Namespace, session: SubmitSession) -> int:
    """A new driver for a search whose driver died, or never started (UserError while the old
    one is live), with the recorded strategy, under the one budget rule."""
    from sweep.backends.slurm.budget_gate import announce_budget
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.submission import latest_tasks
    from sweep.plan.plan_file import driver_settings
    from sweep.search.driver import SearchOptions, start_driver

    recorded = SearchOptions(**record["options"])
    options = replace(recorded, max_gpu_hours=cap,
                      max_running=args.max_running or recorded.max_running)
    seen = latest_tasks(tracker.submissions())
    announce_budget(tracker, [r for r in tracker.run_ids() if r not in seen], cap,
                    dry_run=args.dry_run, yes=args.yes, verb="resume")
    before = (f"driver job {record['job_id']} is over" if record.get("job_id") else
              "the submit stopped before it started one")
    if args.dry_run:
        print(f"would submit a new {options.strategy} search driver ({before}); it adopts the "
              "runs in flight")
        return 0
    session.enter("starting the driver")
    try:
        job_id = start_driver(tracker, driver_settings(tracker.dir), options)
    except SlurmError as error:
        raise UserError(str(error)) from None
    took = (f"takes over from job {record['job_id']}" if record.get("job_id") else
            "starts the search that its submit left (stopped before its driver started)")
    print(f"search driver: job {job_id} {took}; it adopts the runs in flight and goes on with "
          f"the {options.strategy} search (`sweep status {tracker.dir}`)")
    return 0


def _resume_runs(tracker: Tracker, cap: float | None, args: argparse.Namespace, *,
                 skip_never_submitted: bool) -> int:
    """Resubmit the failed runs of the chosen classes, under the cap."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.submission import NEVER_SUBMITTED, counts_by, resumable
    from sweep.backends.slurm.tracker import LEFT_OUT_FILE, submit_runs

    try:
        with tracker.lock():
            subs = tracker.reconcile(write=not args.dry_run)
            observed = tracker.observe(subs)
            todo = resumable(observed.states, args.only)
            if skip_never_submitted and not args.only:
                never = {s.run_id for s in observed.states if s.state == NEVER_SUBMITTED}
                todo = [r for r in todo if r not in never]
            from sweep.backends.slurm.budget_gate import announce_budget

            announce_budget(tracker, todo, cap, dry_run=args.dry_run, yes=args.yes,
                            verb="resume")
            fit = tracker.fit_budget(todo, cap, observed, write=not args.dry_run)
            report = submit_runs(tracker, fit.chosen, max_running=args.max_running,
                                 hold=args.hold, dry_run=args.dry_run, exclude=observed.excluded)
            report_job_id = (None if args.dry_run or args.no_report
                             else report_after(tracker.dir, tracker, report))
    except SlurmError as error:
        raise UserError(str(error)) from None
    for line in report.lines(args.dry_run):
        print(line)
    chosen = counts_by(s for s in observed.states if s.run_id in set(fit.chosen))
    what = ", ".join(f"{n} {state}" for state, n in sorted(chosen.items())) or "nothing to resume"
    verb = "would resubmit" if args.dry_run else "resubmitted"
    print(f"{verb} {len(fit.chosen) - len(report.left_over)} run(s): {what}")
    if fit.left_out:
        print(f"{len(fit.left_out)} run(s) left out by the budget of {cap:g} GPU-hours"
              + ("" if args.dry_run else f": listed in {tracker.dir / LEFT_OUT_FILE}"))
    if report_job_id:
        print(f"report job {report_job_id} collects and reports again after the rerun runs end "
              f"(→ {tracker.dir / 'report' / 'index.html'})")
    return 0
