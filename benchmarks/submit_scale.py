"""Submission at scale against a real Slurm: 4,000 runs, held, then status, then cancel.

Targets: submit ≤ 10 sbatch calls and ≤ 30 s; status ≤ 2 s and ≤ 4 Slurm commands.
Writes N synthetic run folders (run.json and a job.sbatch whose #SBATCH header has the
template's shape: 4 shapes, 1/2/4 nodes and two time limits, so 4 arrays), submits them with
`--hold` through the code `sweep submit` runs, runs `sweep status`'s poll over them, checks that
every run is pending, then cancels them (`sweep cancel`). Needs the local cluster
(scripts/local-slurm.sh start; MaxArraySize=5001) or any Slurm whose limits allow 4,000 jobs.
Usage: python benchmarks/submit_scale.py [N]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from sweep.backends.slurm.client import Slurm
from sweep.backends.slurm.tracker import Tracker, submit_runs
from sweep.cli import main

SHAPES = (("1", "00:10:00"), ("2", "00:10:00"), ("4", "00:10:00"), ("1", "00:20:00"))
JOB = """#!/bin/bash
# synthetic run {run_id} of sweep bench-submit (benchmarks/submit_scale.py)
#SBATCH --job-name=bench-submit.{run_id}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --time={time}
#SBATCH --output={run_dir}/attempts/slurm-%j.out
#SBATCH --error={run_dir}/attempts/slurm-%j.err
#SBATCH --signal=B:USR1@60
#SBATCH --no-requeue
sleep 1
"""


def synthesise(root: Path, count: int) -> None:
    for i in range(count):
        nodes, limit = SHAPES[i % len(SHAPES)]
        run_id = f"bench-n{nodes}-{i:05d}"
        run_dir = root / "runs" / run_id
        (run_dir / "attempts").mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps(
            {"run_id": run_id, "sweep": "bench-submit", "nodes": int(nodes), "gpus_per_node": 8,
             "model": {"name": "bench-8b"}, "settings": {"time_limit": limit}}))
        (run_dir / "job.sbatch").write_text(JOB.format(run_id=run_id, nodes=nodes, time=limit,
                                                       run_dir=run_dir))


def main_(count: int) -> int:
    with tempfile.TemporaryDirectory(prefix="submit-scale-") as tmp:
        root = Path(tmp) / "bench-submit"
        started = time.perf_counter()
        synthesise(root, count)
        write_s = time.perf_counter() - started

        slurm = Slurm()
        tracker = Tracker(root, slurm)
        started = time.perf_counter()
        with tracker.lock():
            tracker.reconcile(write=True)
            report = submit_runs(tracker, tracker.run_ids(), hold=True)
        submit_s = time.perf_counter() - started
        submit_calls = dict(slurm.calls)
        tasks = sum(t for _, _, t in report.submitted)
        try:
            print(f"submit: {tasks} runs in {len(report.submitted)} arrays, "
                  f"{submit_calls.get('sbatch', 0)} sbatch calls, {submit_s:.2f} s "
                  f"(all Slurm calls: {submit_calls}); {count} run folders written in {write_s:.1f} s")
            poll = Tracker(root, Slurm())
            started = time.perf_counter()
            observation = poll.observe()
            status_s = time.perf_counter() - started
            status_calls = sum(observation.slurm_calls.values())
            pending = sum(1 for s in observation.states if s.state == "pending")
            print(f"status: {len(observation.states)} runs, {pending} pending, {status_s:.2f} s, "
                  f"Slurm calls {observation.slurm_calls}")
        finally:
            started = time.perf_counter()
            main(["cancel", str(root)])
            cancel_s = time.perf_counter() - started
        ok = (pending == count and submit_calls.get("sbatch", 0) <= 10 and submit_s <= 30
              and status_s <= 2 and status_calls <= 4)
        print(f"runs={count} arrays={len(report.submitted)} sbatch_calls={submit_calls.get('sbatch', 0)} "
              f"submit_s={submit_s:.2f} status_s={status_s:.2f} status_slurm_calls={status_calls} "
              f"pending={pending} cancel_s={cancel_s:.2f} targets_met={ok}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main_(int(sys.argv[1]) if len(sys.argv) > 1 else 4000))
