"""`sweep render SPEC [--out DIR] [--plan FILE]`: write the run folders of a spec's kept runs.

The plan comes from `--plan`, else from DIR/plan.parquet when `sweep plan` wrote it for this very
spec (DIR/spec.yaml carries the spec hash), else the spec is planned now and the plan written
as `sweep plan` would, so that a sweep folder always holds the plan its runs came from.
`sweep.search.render_sweep.render_sweep` is that whole step; `sweep run` and `sweep submit SPEC` call
it too.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sweep.search.render_sweep import render_sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the sweep spec (YAML)")
    parser.add_argument("--out", type=Path,
                        help="the sweep folder (default: results/<spec name>)")
    parser.add_argument("--plan", type=Path,
                        help="a plan.parquet to render (default: the sweep folder's, if current)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    rendered = render_sweep(args.spec, args.out, args.plan)
    print(f"rendered {rendered.counts} of {len(rendered.plan)} candidate(s) from "
          f"{rendered.plan_source} into {rendered.out / 'runs'} in "
          f"{time.perf_counter() - started:.1f} s")
    return 0
