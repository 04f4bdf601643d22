"""`sweep resume DIR [--only CLASSES]`: submit again the runs whose latest attempt failed.

Default: every failure class except oom (a configuration that does not fit will not fit next
time either), and every run never submitted (a submit that was killed midway). A completed run,
or one pending or running, is never submitted again, so resume twice in a row is safe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sweep.cli import UserError
from sweep.commands.submit import add_submit_options, ensure_preflight, print_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sweep.submission import NEVER_SUBMITTED, OUTCOMES

    parser.add_argument("sweep_dir", type=Path, help="the sweep folder")
    choices = [c for c in (*OUTCOMES, NEVER_SUBMITTED) if c != "completed"]
    parser.add_argument("--only", type=classes(choices), default=None, metavar="CLASSES",
                        help=f"comma-separated classes to resubmit, of: {','.join(choices)} "
                             "(default: all but oom)")
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
    from sweep.slurm import SlurmError
    from sweep.submission import counts_by, resumable
    from sweep.tracker import Tracker, submit_runs

    tracker = Tracker(args.sweep_dir)
    ensure_preflight(args.sweep_dir, args)
    try:
        with tracker.lock():
            subs = tracker.reconcile(write=not args.dry_run)
            observed = tracker.observe(subs)
            todo = resumable(observed.states, args.only)
            report = submit_runs(tracker, todo, max_running=args.max_running, hold=args.hold,
                                 dry_run=args.dry_run, exclude=observed.excluded)
    except SlurmError as error:
        raise UserError(str(error)) from None
    print_report(report, args.dry_run)
    chosen = counts_by(s for s in observed.states if s.run_id in set(todo))
    what = ", ".join(f"{n} {state}" for state, n in sorted(chosen.items())) or "nothing to resume"
    verb = "would resubmit" if args.dry_run else "resubmitted"
    print(f"{verb} {len(todo) - len(report.left_over)} run(s): {what}")
    return 0
