"""`sweep render SPEC [--out DIR] [--plan FILE]`: write the run folders of a spec's kept runs.

The plan comes from `--plan`, else from DIR/plan.parquet when `sweep plan` wrote it for this very
spec (DIR/spec.yaml carries the spec hash), else the spec is planned now and the plan written
as `sweep plan` would, so that a sweep folder always holds the plan its runs came from.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sweep.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the sweep spec (YAML)")
    parser.add_argument("--out", type=Path,
                        help="the sweep folder (default: results/<spec name>)")
    parser.add_argument("--plan", type=Path,
                        help="a plan.parquet to render (default: the sweep folder's, if current)")


def planned_hash(spec_copy: Path) -> str | None:
    """The spec hash in the header of a sweep folder's spec.yaml (None: not planned)."""
    try:
        first = spec_copy.read_text(encoding="utf-8").splitlines()[0]
    except (FileNotFoundError, IndexError):
        return None
    return first.removeprefix("# spec_hash: ").strip() if first.startswith("# spec_hash:") else None


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from sweep import space
    from sweep.commands.plan import PLAN_FILE, SPEC_COPY, write_plan
    from sweep.render import render_runs
    from sweep.spec import load_spec

    spec = load_spec(args.spec)
    out = args.out or Path("results") / spec.name
    started = time.perf_counter()
    plan_file = args.plan
    if plan_file is None and planned_hash(out / SPEC_COPY) == spec.spec_hash() \
            and (out / PLAN_FILE).is_file():
        plan_file = out / PLAN_FILE
    if plan_file is not None:
        try:
            plan = pd.read_parquet(plan_file)
        except (OSError, ValueError) as error:
            raise UserError(f"--plan: cannot read {plan_file}: {error}") from None
    else:
        try:
            plan = space.plan(spec)
        except space.PlanError as error:
            raise UserError(f"{args.spec}: {error}") from None
        write_plan(out, spec, args.spec, plan)
    run_dirs = render_runs(spec, plan, out, spec_dir=args.spec.resolve().parent)
    source = f"plan {plan_file}" if plan_file else f"a new plan ({out / PLAN_FILE})"
    print(f"rendered {len(run_dirs)} run(s) of {len(plan)} candidate(s) from {source} into "
          f"{out / 'runs'} in {time.perf_counter() - started:.1f} s")
    return 0
