"""The watchdog's own cost and speed, measured on real processes.

1. CPU: the watchdog supervises a run of `--duration` seconds (60 by default) whose launcher
   writes a step every 0.5 s plus 20 lines/s of log chatter. Measured twice: the built-in
   workload's metrics.jsonl path, and the torchtitan path where every log line goes through
   the step parser. The figure is the watchdog process's own CPU time (/proc/<pid>/schedstat,
   ns resolution; psutil ticks are 10 ms) between the first step and the last one, over that
   wall time.
   Target: < 1 % of a core.
2. Hang detection: the launcher writes 3 steps, then stops. Latency = time of the watchdog's
   `hang` event - time of the last step record; the target is at most the hang timeout + 5 s.
   Also reported: how long stopping the tree took.

Usage: python benchmarks/watchdog_overhead.py [--duration 60] [--hang-timeout 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from sweep.core.layout import Layout
from sweep.core.model import ModelShape
from sweep.core.runconfig import RunConfig
from sweep.core.state import atomic_write_json, new_attempt_dir, read_jsonl

REPO = Path(__file__).resolve().parents[1]
TINY = ModelShape(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                  ffn_hidden_size=128, vocab_size=256, tie_word_embeddings=True)
TITAN = ("[rank0]:[titan] 2025-03-12 11:10:21,511 - root - INFO - step: {step}  loss:  6.2250  "
         "memory:  1.41GiB(1.79%)  tps: 193,831  tflops: 18.36  mfu: 1.86%")
LAUNCHER = """
import json, os, sys, time
steps, gap = int(sys.argv[1]), float(sys.argv[2])
titan, hang = sys.argv[3] == "titan", sys.argv[4] == "hang"
path = os.path.join(os.environ["SWEEP_ATTEMPT_DIR"], "metrics.jsonl")
for step in range(1, steps + 1):
    for _ in range(int(gap * 20)):
        print("INFO some log chatter from the data loader and the profiler", flush=True)
        time.sleep(0.05)
    if titan:
        print(TITAN.format(step=step), flush=True)
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "step", "step": step, "time": time.time()}) + "\\n")
if hang:
    time.sleep(3600)
"""


def make_run(root: Path, framework: str, hang_timeout_s: int) -> tuple[Path, Path]:
    config = RunConfig(sweep="bench", framework=framework, model=TINY,
                       layout=Layout(dp=1, tp=1, pp=1),
                       nodes=1, gpus_per_node=1, gpu="cpu", dtype="fp32", seq_len=32,
                       global_batch_sequences=random.randrange(1, 1 << 30),  # a tag of its own
                       settings={"startup_timeout_s": 60, "hang_timeout_s": hang_timeout_s})
    run_dir = root / framework / config.run_id
    atomic_write_json(run_dir / "run.json", config.to_json())
    return run_dir, new_attempt_dir(run_dir)


def supervise(root: Path, framework: str, steps: int, gap: float, hang: bool,
              hang_timeout_s: int) -> tuple[Path, psutil.Process, subprocess.Popen[bytes]]:
    run_dir, attempt = make_run(root, framework, hang_timeout_s)
    script = root / "launcher.py"
    script.write_text(f"TITAN = {TITAN!r}\n" + LAUNCHER)
    argv = [sys.executable, "-m", "sweep.job.watchdog", "--run-dir", str(run_dir), "--attempt-dir",
            str(attempt), "--node-wait-s", "0", "--shm-dir", str(root / "shm"),
            "--tmp-dir", str(root / "tmp"),
            "--", sys.executable, str(script), str(steps), str(gap),
            "titan" if framework == "torchtitan" else "plain", "hang" if hang else "done"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL)
    return attempt, psutil.Process(proc.pid), proc


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.05)


def cpu_seconds(process: psutil.Process) -> float:
    """Nanosecond-resolution CPU time from /proc/<pid>/schedstat; psutil's ticks are 10 ms."""
    try:
        return int(Path(f"/proc/{process.pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return sum(process.cpu_times()[:2])


def cpu_share(root: Path, framework: str, duration: float) -> float:
    gap = 0.5
    steps = int(duration / gap)
    attempt, watchdog, proc = supervise(root, framework, steps, gap, hang=False, hang_timeout_s=300)
    wait_for(attempt / "metrics.jsonl")
    t0, c0 = time.monotonic(), cpu_seconds(watchdog)
    while sum(1 for _ in read_jsonl(attempt / "metrics.jsonl")) < steps:
        if proc.poll() is not None:
            raise SystemExit(f"{framework}: the watchdog exited early ({proc.returncode}); "
                             f"see {attempt}")
        time.sleep(0.25)
    t1, c1 = time.monotonic(), cpu_seconds(watchdog)
    proc.wait(timeout=120)
    status = json.loads((attempt / "status.json").read_text())
    if status["outcome"] != "completed" or status["last_step"] != steps:
        raise SystemExit(f"{framework}: unexpected status {status['outcome']} "
                         f"/ {status['last_step']}")
    share = 100 * (c1 - c0) / (t1 - t0)
    print(f"{framework:>10}: watchdog CPU {c1 - c0:.3f} s over {t1 - t0:.1f} s supervised "
          f"= {share:.3f} % of one core")
    return share


def hang_latency(root: Path, hang_timeout_s: int) -> tuple[float, float]:
    attempt, _, proc = supervise(root, "builtin", 3, 0.2, hang=True, hang_timeout_s=hang_timeout_s)
    proc.wait(timeout=hang_timeout_s + 120)
    last_step = max(r["time"] for r in read_jsonl(attempt / "metrics.jsonl"))
    events = list(read_jsonl(attempt / "watchdog.jsonl"))
    kinds = {e["event"]: e for e in events}
    if "hang" not in kinds or "stopped" not in kinds:
        raise SystemExit(f"no hang detected; watchdog events: {[e['event'] for e in events]}, "
                         f"exit code {proc.returncode}")
    hang, stopped = kinds["hang"], kinds["stopped"]
    if stopped["survivors"]:
        raise SystemExit(f"processes survived the stop: {stopped['survivors']}")
    latency = hang["time"] - last_step
    print(f"    hang: detected {latency:.2f} s after the last step (timeout {hang_timeout_s} s), "
          f"tree stopped in {stopped['seconds']:.2f} s")
    return latency, stopped["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--hang-timeout", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"cores={os.cpu_count()} load1={os.getloadavg()[0]:.2f} python={sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="wd-bench-") as tmp:
        root = Path(tmp)
        shares = {fw: cpu_share(root / f"cpu-{fw}", fw, args.duration)
                  for fw in ("builtin", "torchtitan")}
        hangs = [hang_latency(root / f"hang-{i}", args.hang_timeout) for i in range(args.repeats)]
    latencies, stops = zip(*hangs)
    worst = max(latencies)
    print(f"cpu_pct_builtin={shares['builtin']:.3f} cpu_pct_torchtitan={shares['torchtitan']:.3f} "
          f"supervised_s={args.duration:.0f} hang_timeout_s={args.hang_timeout} "
          f"hang_latency_max_s={worst:.2f} hang_over_timeout_max_s={worst - args.hang_timeout:.2f} "
          f"stop_max_s={max(stops):.2f} repeats={args.repeats}")


if __name__ == "__main__":
    main()
