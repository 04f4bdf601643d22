"""How fast `sweep report` draws every figure and table. Target: 4,000 rows < 10 s.

Builds a runs.parquet of N synthetic attempts (4 playbook models × 7 node counts, 70 % completed
with random throughput, the rest OOM or crashed), then times `sweep report RUNS.parquet` end to end
(process already started: reading the parquet, ranking, flags, 4 figures × 3 formats, tables, HTML).
Usage: python benchmarks/report_speed.py [N]
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from collect_speed import synthetic_configs  # benchmarks/ is on sys.path when run as a script

from sweep.cli import main
from sweep.collect.attempts import write_runs
from sweep.collect.rows import config_columns, dense_peak, mfu_columns
from sweep.collect.schema import SCHEMA_VERSION, to_table


def synthetic_rows(count: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for config in synthetic_configs(count):
        row = config_columns(config)
        draw = rng.random()
        outcome = "completed" if draw < 0.7 else ("oom" if draw < 0.9 else "crashed")
        per_token = mfu_columns(config.model, config.seq_len, None, None)["flops_per_token_full_attention"]
        tps_gpu = rng.uniform(0.01, 0.5) * 989.5e12 / per_token if outcome == "completed" else None
        row.update({"schema_version": SCHEMA_VERSION, "attempt": 1, "outcome": outcome,
                    "attempt_dir": f"runs/{config.run_id}/attempts/1", "source": "collect",
                    "tokens_per_sec_per_gpu": tps_gpu,
                    "tokens_per_sec": tps_gpu * config.world_size if tps_gpu else None,
                    "mem_reserved_bytes": rng.uniform(1e10, 8e10) if tps_gpu else None})
        row.update(mfu_columns(config.model, config.seq_len, tps_gpu, dense_peak("h100-sxm", "bf16")))
        if tps_gpu:
            row["mfu_reported"], row["mfu_reported_convention"] = row["mfu_full_attention"], "full_attention"
        rows.append(row)
    return rows


def main_benchmark(count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="report-speed-") as tmp:
        path = Path(tmp) / "runs.parquet"
        write_runs(to_table(synthetic_rows(count)), path)
        import analysis.report  # noqa: F401 - import cost (matplotlib) counted apart, like a CLI start

        timings, cpu = [], []
        for _ in range(2):
            started, started_cpu = time.perf_counter(), time.process_time()
            assert main(["report", str(path), "--out", str(Path(tmp) / "report")]) == 0
            timings.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    print(f"rows={count} report_wall_s={min(timings):.2f} report_cpu_s={min(cpu):.2f} "
          f"(best of 2; wall of each: {', '.join(f'{t:.2f}' for t in timings)}) "
          f"target_s=10 within_target={min(timings) < 10}")


if __name__ == "__main__":
    main_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
