"""`sweep render SPEC [--out DIR] [--plan FILE]`: write the run folders of a spec's kept runs."""

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
                        help="a plan.parquet to render (default: plan the spec now)")


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from sweep import space
    from sweep.render import render_runs
    from sweep.spec import load_spec

    spec = load_spec(args.spec)
    out = args.out or Path("results") / spec.name
    started = time.perf_counter()
    if args.plan is not None:
        try:
            plan = pd.read_parquet(args.plan)
        except (OSError, ValueError) as error:
            raise UserError(f"--plan: cannot read {args.plan}: {error}") from None
    else:
        plan = space.plan(spec)
    run_dirs = render_runs(spec, plan, out, spec_dir=args.spec.resolve().parent)
    print(f"rendered {len(run_dirs)} run(s) of {len(plan)} candidate(s) into {out / 'runs'} "
          f"in {time.perf_counter() - started:.1f} s")
    return 0
