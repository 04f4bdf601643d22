"""Render the full playbook spec (every kept run: run.json, job.sbatch, nanotron YAML and
launcher) into a fresh folder, then again (idempotent: nothing rewritten). Target: < 10 s.

Planning is timed separately (benchmarks/plan_speed.py measures it); the render figure is the
time of `render_runs` alone, wall clock and CPU (its forked workers' included). The CPU time is
the steadier figure on a shared machine; the wall time includes the disk and the parallelism.

    .venv/bin/python benchmarks/render_speed.py [--spec examples/playbook.yaml] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sweep import space
from sweep.render import render_runs
from sweep.spec import load_spec

REPO = Path(__file__).resolve().parents[1]


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (render forks workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def timed(function, *args):  # noqa: ANN001, ANN202 - a tiny timing helper
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = function(*args)
    return result, time.perf_counter() - wall, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "playbook.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    plan, plan_wall, _ = timed(space.plan, spec)
    firsts, firsts_cpu, agains = [], [], []
    runs = files = 0
    for _ in range(args.repeat):
        out = Path(tempfile.mkdtemp(prefix="render-speed-"))
        try:
            dirs, wall, cpu = timed(render_runs, spec, plan, out)
            firsts.append(wall)
            firsts_cpu.append(cpu)
            stamps = {p: p.stat().st_mtime_ns for d in dirs for p in d.rglob("*") if p.is_file()}
            _, again, _ = timed(render_runs, spec, plan, out)
            agains.append(again)
            unchanged = all(p.stat().st_mtime_ns == t for p, t in stamps.items())
            runs, files = len(dirs), len(stamps)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        print(f"render: {runs} runs, {files} files in {wall:.2f} s wall ({cpu:.2f} s CPU); "
              f"again {again:.2f} s, files unchanged: {unchanged}")
    best, median = min(firsts), statistics.median(firsts)
    print(f"spec {args.spec.name}: {len(plan)} candidates planned in {plan_wall:.2f} s, "
          f"{runs} kept")
    print(f"runs={runs} files={files} render_s_best={best:.2f} render_s_median={median:.2f} "
          f"render_cpu_s={min(firsts_cpu):.2f} rerender_s={min(agains):.2f} "
          f"target_s=10 ok={best < 10}")


if __name__ == "__main__":
    main()
