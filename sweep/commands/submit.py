"""`sweep submit SPEC|DIR [--dry-run] [--max-running N] [--hold]`: rendered runs → Slurm job arrays.

SPEC is planned and rendered first, exactly as `sweep render` does; DIR is a sweep folder
already rendered. Runs of one resource shape go into one array (split at MaxArraySize, capped
by MaxJobCount and MaxSubmitJobs); each task runs its run's own job.sbatch. Runs this sweep has
submitted before are never submitted again (that is `sweep resume`'s job, for failed ones).

With `--strategy pruned|adaptive` the search of sweep.economy picks the runs: submit stays in the
foreground, submits a round, waits for it (polling as `sweep status` does), collects, and picks
the next; interrupted and started again, it waits for what is in flight and goes on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.cli import UserError
from sweep.economy import STRATEGIES

if TYPE_CHECKING:
    from sweep.tracker import SubmitReport, Tracker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", type=Path, help="a sweep spec (YAML) or a rendered sweep folder")
    parser.add_argument("--out", type=Path,
                        help="with SPEC: the sweep folder (default results/<name>)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="exhaustive",
                        help="which runs to submit (default %(default)s: every kept run at "
                             "once); pruned and adaptive submit round by round and wait")
    parser.add_argument("--poll-s", type=float, default=30.0,
                        help="with a strategy: seconds between polls of a round (default 30)")
    add_submit_options(parser)


def add_submit_options(parser: argparse.ArgumentParser) -> None:
    """Options shared with `sweep resume`."""
    parser.add_argument("--dry-run", action="store_true",
                        help="print the sbatch command lines; submit nothing")
    parser.add_argument("--max-running", type=positive, default=None, metavar="N",
                        help="at most N tasks of each array run at once (--array=...%%N); "
                             "default: no limit")
    parser.add_argument("--hold", action="store_true",
                        help="submit held (release with `scontrol release JOBID`)")
    parser.add_argument("--no-preflight", action="store_true",
                        help="skip the preflight job (sweep.preflight) that checks, before the "
                             "first array, that the runs' interpreter, framework, GPUs and the "
                             "shared sweep folder work on the target partition")
    parser.add_argument("--preflight-timeout", type=float, default=600.0, metavar="S",
                        help="give up on the preflight after S seconds, queue wait included "
                             "(default %(default)s)")


def ensure_preflight(folder: Path, args: argparse.Namespace) -> None:
    """Run the preflight once per sweep and settings, unless skipped or dry; UserError when it
    fails, before anything is submitted."""
    if args.dry_run or args.no_preflight:
        return
    from sweep.preflight import PreflightError, passed_before, run_preflight, target_of
    from sweep.render import run_dirs_of
    from sweep.state import read_json

    run_dirs = run_dirs_of(folder)
    if not run_dirs:
        return
    document = read_json(run_dirs[0] / "run.json")
    if not isinstance(document, dict) or "framework" not in document:
        return  # not a run `sweep render` wrote (a hand-made job.sbatch): nothing to check it by
    try:
        target = target_of(document)
    except ValueError as error:  # a framework or version this llm-sweep does not know
        raise UserError(f"preflight: {run_dirs[0] / 'run.json'}: {error}") from None
    if passed_before(folder, target):
        return
    print(f"preflight: one job on {dict(target.slurm).get('partition', 'the default partition')}"
          f" checks {target.python}, {target.framework} and the sweep folder ...", flush=True)
    try:
        result = run_preflight(folder, target, args.preflight_timeout)
    except PreflightError as error:
        raise UserError(f"preflight failed: {error}") from None
    print(f"preflight passed on {result['host']} in {result['seconds']:.1f} s "
          f"({result['framework']['found']})")


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def sweep_folder(target: Path, out: Path | None) -> Path:
    """The sweep folder of a SPEC (rendered now) or a DIR."""
    if target.is_dir():
        if out is not None:
            raise UserError(f"--out applies to a spec; {target} is already a sweep folder")
        return target
    if not target.is_file():
        raise UserError(f"{target}: no such spec file or sweep folder")
    from sweep.commands.render import render_sweep

    rendered = render_sweep(target, out)
    print(f"rendered {len(rendered.run_dirs)} run(s) from {rendered.plan_source} into "
          f"{rendered.out / 'runs'}")
    return rendered.out


def print_report(report: SubmitReport, dry_run: bool) -> None:
    if dry_run:
        for line in report.commands:
            print(line)
    for batch, job_id, tasks in report.submitted:
        print(f"batch {batch}: job array {job_id} ({tasks} task(s))")
    if report.excluded:
        print(f"excluding bad nodes: {','.join(report.excluded)}")
    if report.left_over:
        print(f"{len(report.left_over)} run(s) not submitted: no room under the cluster's job "
              "limits (MaxJobCount/MaxSubmitJobs); run `sweep resume` later")


def run(args: argparse.Namespace) -> int:
    from sweep.slurm import SlurmError
    from sweep.submission import latest_tasks
    from sweep.tracker import Tracker, submit_runs

    started = time.perf_counter()
    if args.strategy != "exhaustive" and (args.dry_run or args.hold):
        raise UserError(f"--strategy {args.strategy} waits for each round's results: it cannot "
                        "be combined with --dry-run or --hold")
    if args.poll_s <= 0:
        raise UserError(f"--poll-s: must be positive, got {args.poll_s}")
    folder = sweep_folder(args.target, args.out)
    tracker = Tracker(folder)
    ensure_preflight(folder, args)
    if args.strategy != "exhaustive":
        return _search(folder, tracker, args)
    try:
        with tracker.lock():
            subs = tracker.reconcile(write=not args.dry_run)
            seen = latest_tasks(subs)
            todo = [run_id for run_id in tracker.run_ids() if run_id not in seen]
            report = submit_runs(tracker, todo, max_running=args.max_running, hold=args.hold,
                                 dry_run=args.dry_run)
    except SlurmError as error:
        raise UserError(str(error)) from None
    print_report(report, args.dry_run)
    skipped = len(seen)
    tasks = sum(t for _, _, t in report.submitted)
    verb = "would submit" if args.dry_run else "submitted"
    print(f"{verb} {len(todo) - len(report.left_over)} run(s) in {len(report.commands)} "
          f"array(s)" + (f" ({tasks} tasks)" if not args.dry_run else "")
          + (f"; {skipped} run(s) submitted before (see `sweep status`)" if skipped else "")
          + f" in {time.perf_counter() - started:.1f} s")
    return 0


def _search(folder: Path, tracker: Tracker, args: argparse.Namespace) -> int:
    import pandas as pd

    from sweep.calibrate import workloads_for
    from sweep.commands.plan import PLAN_FILE, SPEC_COPY
    from sweep.live_search import search_sweep
    from sweep.slurm import SlurmError
    from sweep.spec import load_spec
    from sweep.submission import counts_by
    from sweep.tracker import Observation, SlurmRounds

    if not (folder / PLAN_FILE).is_file() or not (folder / SPEC_COPY).is_file():
        raise UserError(f"{folder}: --strategy needs the sweep's {PLAN_FILE} and {SPEC_COPY}; "
                        "submit the spec file, or run `sweep plan` and `sweep render` first")
    spec = load_spec(folder / SPEC_COPY)
    plan = pd.read_parquet(folder / PLAN_FILE)

    def report(observation: Observation) -> None:
        counts = counts_by(observation.states)
        print(time.strftime("%H:%M:%S"), ", ".join(f"{n} {state}" for state, n in
                                                   sorted(counts.items())), flush=True)

    rounds = SlurmRounds(tracker, max_running=args.max_running, poll_s=args.poll_s,
                         on_poll=report)
    try:
        search = search_sweep(folder, plan, args.strategy, workloads_for(spec), rounds,
                              rounds.finished)
    except SlurmError as error:
        raise UserError(str(error)) from None
    print(search.summary(folder))
    return 0
