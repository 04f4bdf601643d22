"""`sweep export SWEEP_DIR|RUNS.parquet [--to mlflow[:URI] | wandb[:ENTITY/PROJECT]]...`: every
attempt of a sweep to experiment trackers (docs/trackers.md).

Without --to, the trackers of the spec's `export:` section (the sweep folder's spec.yaml).
Idempotent: run it again and it updates what changed and adds nothing twice. A tracker that does
not answer is said on stderr and the exit code is 1; the others are still exported, and running
the command again later sends what was missed. Credentials come from the environment or the
tracker's own login file, never from the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sweep.core.errors import UserError
from sweep.core.trackers import FORMS, TrackerTarget, parse_target


def _target(text: str) -> TrackerTarget:
    try:
        return parse_target(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a sweep folder (its runs.parquet) or a runs.parquet")
    parser.add_argument("--to", type=_target, action="append", default=None, metavar="TRACKER",
                        help=f"{FORMS}; repeat for several (default: the spec's export.to)")


def run(args: argparse.Namespace) -> int:
    from sweep.export.sweep_export import export_sweep

    targets = args.to or spec_targets(args.source)
    failed = 0
    for outcome in export_sweep(args.source, targets):
        if outcome.ok:
            print(outcome.line())
            continue
        failed += 1
        print(f"sweep export: {outcome.line()}; nothing is lost: run `sweep export {args.source} "
              f"--to {outcome.target}` again once the tracker answers", file=sys.stderr)
    return 1 if failed else 0


def spec_targets(source: Path) -> list[TrackerTarget]:
    """The trackers of the sweep's spec.yaml `export.to`, or a UserError naming the fix."""
    from sweep.plan.plan_file import planned_spec

    folder = source if source.is_dir() else source.parent
    spec = planned_spec(folder)
    if spec is None or spec.export is None:
        raise UserError(f"{folder}: its spec has no export: section; name the trackers with "
                        f"--to ({FORMS})")
    return [parse_target(text) for text in spec.export.to]
