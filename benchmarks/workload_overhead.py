"""Overhead of the built-in workload: a 5-step, 2-rank (DDP) run of the tiny CPU model.

Launched two ways: by the workload's own launcher (`python -m sweep.workload --nproc-per-node 2`,
what launch/builtin.sh runs: the headline) and, for comparison, by torchrun. Prints, per repeat:
wall time (launch to exit), start-up (launch to the first step: interpreter and torch imports,
gloo rendezvous, mesh, model, peak measurement), steady step time, and the share of the timed
loop spent writing metrics.jsonl. The last line holds the median figures as key=value pairs,
then the best ones, then torchrun's medians (prefixed torchrun_).

Targets (issue 3): wall <= 10 s, of which start-up <= 4 s; metrics writing < 1 % of step time.

Usage: .venv/bin/python benchmarks/workload_overhead.py [--repeats 3] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweep.core.catalog import get_model  # noqa: E402
from sweep.core.layout import Layout  # noqa: E402
from sweep.core.runconfig import RunConfig  # noqa: E402
from sweep.core.state import atomic_write_json, read_jsonl  # noqa: E402

LAUNCHERS = {
    "builtin": lambda run_dir: [sys.executable, "-m", "sweep.workload", "--run-dir", str(run_dir),
                                "--nproc-per-node=2"],
    "torchrun": lambda run_dir: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node=2", "-m", "sweep.workload", "--run-dir", str(run_dir)],
}


def one_run(root: Path, seq_len: int, launcher: str) -> dict[str, float]:
    layout = Layout(dp=2, tp=1, pp=1, mbs=2)
    cfg = RunConfig(sweep="bench", framework="builtin", model=get_model("tiny-4l"), layout=layout,
                    nodes=1, gpus_per_node=2, gpu="cpu", dtype="fp32", seq_len=seq_len,
                    global_batch_sequences=4, settings={"steps": 5, "warmup_steps": 1, "seed": 1234})
    run_dir = root / cfg.run_id
    atomic_write_json(run_dir / "run.json", cfg.to_json())
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("SWEEP_ATTEMPT_DIR", None)
    launched = time.time()
    proc = subprocess.run(LAUNCHERS[launcher](run_dir), capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.time() - launched
    if proc.returncode != 0:
        raise SystemExit(f"{launcher}: workload failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    done = dict(re.findall(r"(\w+)=(\S+)", proc.stdout.split("sweep.workload: done", 1)[1]))
    records = list(read_jsonl(run_dir / "metrics.jsonl"))
    summary = records[-1]
    return {"wall_s": wall, "startup_s": float(done["loop_started_at"]) - launched,
            "steady_step_s": summary["step_time_mean_s"],
            "metrics_share_pct": float(done["metrics_share_pct"]),
            "metrics_write_ms_per_line": 1000 * float(done["metrics_write_s"]) / len(records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="workload-bench-") as tmp:
        for index in range(args.repeats):
            for name in LAUNCHERS:  # interleaved, so that both see the same machine load
                figures = one_run(Path(tmp) / f"{name}-{index}", args.seq_len, name)
                runs[name].append(figures)
                print(json.dumps({"launcher": name, "repeat": index + 1,
                                  **{k: round(v, 4) for k, v in figures.items()}}))
    ours = runs["builtin"]
    median = {key: statistics.median(r[key] for r in ours) for key in ours[0]}
    best = {"best_wall_s": min(r["wall_s"] for r in ours), "best_startup_s": min(r["startup_s"] for r in ours)}
    torchrun = {f"torchrun_{key}": statistics.median(r[key] for r in runs["torchrun"])
                for key in ("wall_s", "startup_s")}
    # Other jobs share this machine: the load average says how much the figures are inflated.
    load = {"load_avg_1m": os.getloadavg()[0], "cores": float(os.cpu_count() or 0)}
    print(f"# {args.repeats} repeats (median, and best) per launcher, tiny-4l, dp2 (DDP), seq {args.seq_len}, "
          f"global batch 4, 5 steps; headline: the built-in launcher; targets: wall<=10 s, startup<=4 s, metrics<1 %")
    print(" ".join(f"{k}={v:.4f}" for k, v in (median | best | torchrun | load).items()))


if __name__ == "__main__":
    main()
