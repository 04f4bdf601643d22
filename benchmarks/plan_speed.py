"""Planner speed: the full playbook spec, and a large spec (Llama-405B + Mixtral, 8–1,024 nodes).

Targets (issue 2): the playbook plan in under 2 s; the large spec at >= 200,000 candidates/s.
The large spec runs under the built-in workload's rules (ZeRO 0–3; it has no expert
parallelism, so its ep > 1 candidates are pruned by `ep_experts`); the same spec under
torchtitan (ZeRO 0/2/3, real EP for Mixtral) is timed too, as `large_torchtitan`.
Each spec is planned `--repeat` times (default 3) and the fastest run is reported, because the
machine is shared; the load average is printed beside the figures. The time covers everything
`sweep plan` computes: enumeration, every rule, the memory model and the run ids (not the
parquet write). The last line holds the headline figures as key=value pairs.

    python benchmarks/plan_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sweep.plan import space
from sweep.plan.spec import Spec, load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPECS = {"playbook": EXAMPLES / "playbook.yaml", "large": EXAMPLES / "llama405b-large.yaml"}


def torchtitan_variant(spec: Spec) -> Spec:
    data = spec.model_dump()
    data["framework"] = "torchtitan"
    data["axes"]["zero_stage"] = [0, 2, 3]
    return Spec.model_validate(data)


def best_time(spec: Spec, repeat: int) -> tuple[float, int, int]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        frame = space.plan(spec)
        times.append(time.perf_counter() - start)
    return min(times), len(frame), int((frame["status"] == space.KEPT).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, str] = {}
    specs = {name: load_spec(path) for name, path in SPECS.items()}
    specs["large_torchtitan"] = torchtitan_variant(specs["large"])
    for name, spec in specs.items():
        seconds, candidates, kept = best_time(spec, args.repeat)
        rate = candidates / seconds
        print(f"{name:<17} {spec.framework:<11} {candidates:>9} candidates {kept:>8} kept "
              f"{seconds:7.3f} s  {rate:>10,.0f} candidates/s")
        figures.update({f"{name}_s": f"{seconds:.3f}", f"{name}_candidates": str(candidates),
                        f"{name}_kept": str(kept), f"{name}_candidates_per_s": f"{rate:.0f}"})
    figures["playbook_under_2s"] = str(float(figures["playbook_s"]) < 2.0).lower()
    figures["large_over_200k_per_s"] = str(float(figures["large_candidates_per_s"])
                                           >= 200_000).lower()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; best of "
          f"{args.repeat} runs")
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
