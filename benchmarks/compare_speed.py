"""How fast `sweep compare` gates a sweep. Target: two runs tables of 4,000 rows each < 2 s.

Builds two synthetic runs.parquet files in the collect schema (sweep.collect.schema.to_table):
a baseline of N attempts (distinct playbook-like configurations; a share of them failed, some
with a second attempt), and a current sweep of the same configurations with the step times
redrawn around the same means, a few slowed by 30 %, a few newly failing and a few missing.
Then times `sweep compare BASELINE CURRENT` in this process (the first call imports the analysis
and matplotlib, as a fresh `sweep compare` does), and a second call.
Usage: python benchmarks/compare_speed.py [N]
"""

from __future__ import annotations

import itertools
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from sweep.cli import main
from sweep.collect.schema import to_table

MODELS = ("playbook-1b", "playbook-3b", "playbook-8b", "playbook-80b")
NODES = (1, 2, 4, 8, 16, 32, 64)
SEQUENCES = 256


def baseline_rows(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """`count` attempts of distinct configurations (dp·tp·pp = 8·nodes), 80 % completed; every
    tenth configuration has a failed first attempt before its completed second one."""
    rows: list[dict[str, Any]] = []
    layouts = itertools.product(("none", "selective", "full"), (1, 2, 4, 8), (1, 2, 4, 8, 16),
                                (1, 2, 4), (0, 1), MODELS, NODES)
    for index, (recompute, tp, pp, mbs, zero, model, nodes) in enumerate(layouts):
        dp = max(nodes * 8 // (tp * pp), 1)
        mean = rng.uniform(0.5, 5.0)
        common = {"schema_version": 1, "sweep": "bench", "run_id": f"{model}-n{nodes}-{index:05d}",
                  "source": "collect", "framework": "builtin", "model": model, "nodes": nodes,
                  "gpus_per_node": 8, "world_size": 8 * nodes, "gpu": "h100-sxm", "dtype": "bf16",
                  "seq_len": 4096, "global_batch_sequences": SEQUENCES, "dp": dp, "tp": tp,
                  "pp": pp, "cp": 1, "ep": 1, "mbs": mbs, "grad_acc": max(SEQUENCES // (dp * mbs), 1),
                  "zero_stage": zero, "recompute": recompute, "sp": tp > 1, "pp_schedule": "1f1b",
                  "vpp": 1, "layout_label": f"DP{dp} TP{tp} PP{pp} MBS{mbs} ZeRO-{zero}"}
        if index % 10 == 0 and len(rows) < count - 1:
            rows.append({**common, "attempt": 1, "outcome": "node_fail"})
        completed = rng.random() < 0.8
        rows.append({**common, "attempt": 2 if index % 10 == 0 else 1,
                     "outcome": "completed" if completed else "oom",
                     **(_steps(mean, rng) if completed else {})})
        if len(rows) >= count:
            return rows[:count]
    raise SystemExit(f"only {len(rows)} rows; ask for fewer")


def _steps(mean: float, rng: random.Random) -> dict[str, Any]:
    std, n = mean * rng.uniform(0.005, 0.03), rng.randint(10, 40)
    tokens = SEQUENCES * 4096
    return {"step_time_mean_s": mean, "step_time_std_s": std, "step_time_n": n,
            "tokens_per_sec": tokens / mean, "tokens_per_sec_per_gpu": tokens / mean / 8}


def current_rows(baseline: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """The same sweep rerun: the same means redrawn within 1 %; 1 % of the completed runs 30 %
    slower, 1 % failing now, 1 % missing."""
    rows = []
    for row in baseline:
        kind = rng.random()
        if kind < 0.01:
            continue
        if row["outcome"] != "completed":
            rows.append(row)
        elif kind < 0.02:
            rows.append({**row, "outcome": "hang", **dict.fromkeys(_steps(1.0, rng))})
        else:
            mean = row["step_time_mean_s"] * (1.3 if kind < 0.03 else rng.uniform(0.99, 1.01))
            rows.append({**row, **_steps(mean, rng)})
    return rows


def main_benchmark(count: int) -> None:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="compare-speed-") as tmp:
        base, cur = Path(tmp) / "baseline", Path(tmp) / "current"
        base.mkdir()
        cur.mkdir()
        rows = baseline_rows(count, rng)
        to_table(rows).to_pandas().to_parquet(base / "runs.parquet")
        to_table(current_rows(rows, rng)).to_pandas().to_parquet(cur / "runs.parquet")
        timings, cpu, codes = [], [], []
        for label in ("first", "second"):
            started, started_cpu = time.perf_counter(), time.process_time()
            codes.append(main(["compare", str(base), str(cur), "--out", str(Path(tmp) / label)]))
            timings.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        compared = pd.read_csv(Path(tmp) / "first" / "compare.csv")
        counts = compared["status"].value_counts().to_dict()
    print(f"statuses: {counts}; exit codes {codes}")
    print(f"runs={count} compare_s={timings[0]:.2f} compare_cpu_s={cpu[0]:.2f} "
          f"compare_second_s={timings[1]:.2f} compare_second_cpu_s={cpu[1]:.2f} "
          f"configurations={len(compared)} slower={counts.get('slower', 0)} "
          f"newly_failing={counts.get('newly failing', 0)} exit_code={codes[0]} target_s=2 "
          f"within_target={timings[0] < 2}")


if __name__ == "__main__":
    main_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
