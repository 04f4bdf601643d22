"""Render the full playbook spec (every kept run: run.json, job.sbatch, the framework's launch
files) into a fresh folder, then again (idempotent: nothing rewritten), for each framework.
Target: < 10 s per framework.

The playbook spec is nanotron's; for another framework it is the same sweep with `framework`
swapped. torchtitan is measured in both its forms: `torchtitan` is the default version, 0.3 (a
Python config module per run, the playbook's own models by their dimensions), and
`torchtitan-0.2` the JobConfig TOML (run.framework_version: v0.2, with the Llama 3 models 0.2
defines, since it cannot build the playbook's shapes; its capability rules prune the rest, as they
would for a user).

Planning is timed separately (benchmarks/plan_speed.py measures it); the render figure is the
time of `render_runs` alone, wall clock and CPU (its forked workers' included). The CPU time is
the steadier figure on a shared machine; the wall time includes the disk and the parallelism.

    .venv/bin/python benchmarks/render_speed.py [--spec examples/playbook.yaml] [--repeat 3]
                                                [--framework all|nanotron|megatron|torchtitan|torchtitan-0.2|builtin]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sweep.plan import space
from sweep.plan.render import render_runs
from sweep.plan.spec import Spec, parse_spec

REPO = Path(__file__).resolve().parents[1]


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (render forks workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def timed(function, *args):  # noqa: ANN001, ANN202 - a tiny timing helper
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = function(*args)
    return result, time.perf_counter() - wall, cpu_seconds() - cpu


FRAMEWORK_ZERO = {"nanotron": "[0, 1]", "megatron": "[0, 1]", "torchtitan": "[0, 2, 3]",
                  "torchtitan-0.2": "[0, 2, 3]", "builtin": "[0, 1, 2, 3]"}
VERSION = {"torchtitan-0.2": "v0.2"}  # the others: the adapter's default version


def spec_for(text: str, name: str) -> Spec:
    """The playbook sweep for the framework `name` names (see the module docstring)."""
    framework = name.split("-")[0]
    if framework != "nanotron":
        text = text.replace("framework: nanotron", f"framework: {framework}")
        text = text.replace("framework_version: playbook-e24d2483",
                            f"framework_version: {VERSION.get(name, 'null')}")
        text = text.replace("zero_stage: [0, 1]", f"zero_stage: {FRAMEWORK_ZERO[name]}")
    if name == "torchtitan-0.2":
        text = text.replace("models: [playbook-1b, playbook-3b, playbook-8b, playbook-80b]",
                            "models: [llama-3.1-8b, llama-3.1-70b]")
    return parse_spec(text, f"playbook ({name})")


def bench(spec: Spec, repeat: int) -> dict[str, float | int | bool]:
    plan, plan_wall, _ = timed(space.plan, spec)
    firsts, firsts_cpu, agains = [], [], []
    runs = files = 0
    unchanged = True
    for _ in range(repeat):
        out = Path(tempfile.mkdtemp(prefix="render-speed-"))
        try:
            dirs, wall, cpu = timed(render_runs, spec, plan, out)
            firsts.append(wall)
            firsts_cpu.append(cpu)
            stamps = {p: p.stat().st_mtime_ns for d in dirs for p in d.rglob("*") if p.is_file()}
            _, again, _ = timed(render_runs, spec, plan, out)
            agains.append(again)
            unchanged = unchanged and all(p.stat().st_mtime_ns == t for p, t in stamps.items())
            runs, files = len(dirs), len(stamps)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return {"candidates": len(plan), "plan_s": plan_wall, "runs": runs, "files": files,
            "best": min(firsts), "median": statistics.median(firsts), "cpu": min(firsts_cpu),
            "again": min(agains), "unchanged": unchanged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "playbook.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--framework", default="all",
                        choices=["all", *FRAMEWORK_ZERO])
    args = parser.parse_args()
    text = args.spec.read_text(encoding="utf-8")
    frameworks = list(FRAMEWORK_ZERO) if args.framework == "all" else [args.framework]
    summary = []
    for framework in frameworks:
        figures = bench(spec_for(text, framework), args.repeat)
        print(f"{framework}: {figures['candidates']} candidates planned in "
              f"{figures['plan_s']:.2f} s; {figures['runs']} runs, {figures['files']} files "
              f"rendered in {figures['best']:.2f} s best, {figures['median']:.2f} s median "
              f"({figures['cpu']:.2f} s CPU); again {figures['again']:.2f} s, files unchanged: "
              f"{figures['unchanged']}")
        key = framework.replace("-", "_").replace(".", "")
        summary.append(f"{key}_runs={figures['runs']} {key}_render_s={figures['best']:.2f}")
    print(" ".join(summary) + " target_s=10")


if __name__ == "__main__":
    main()
