"""How fast `sweep export` sends a sweep to a local MLflow server. Target: 4,000 attempts < 60 s.

Writes a synthetic runs.parquet of N attempts in the real schema (sweep.collect.schema: the
layout, the settings, the figures, the outcome with its rule and evidence; a share of them
failed), starts a real `mlflow server` (SQLite backend store, local artifact root, a free port),
then times:
- first: `sweep export DIR --to mlflow:URI` into an empty server (every run created);
- again: the same command once more (every run found by one search and left unchanged).
The synthetic table has no attempt folders, so no files are uploaded (the tests cover files).
It also counts the CPU time each side spent on the first export: the server's (every process of
its session, from /proc) and the exporter's (this process). The server's CPU seconds against
60 s times the machine's cores say whether the target can be met on this machine at all,
whatever the exporter does. STORE_DIR (e.g. a folder under /dev/shm) puts the server's store
elsewhere than the temporary folder.
Usage: python benchmarks/export_speed.py [N] [STORE_DIR]
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the server fixture

from sweep.cli import main  # noqa: E402
from sweep.collect.schema import to_table  # noqa: E402
from tests.export.mlflow_server import mlflow_server  # noqa: E402

TARGET_S = 60.0
OUTCOMES = ("completed",) * 8 + ("oom", "hang")


def synthetic_row(index: int, rng: random.Random) -> dict[str, Any]:
    """One attempt as collect writes it: a distinct layout per row, figures where it completed."""
    nodes = 2 ** (index % 6)
    tp, pp = 2 ** (index % 4), 2 ** ((index // 4) % 3)
    dp = max(1, nodes * 8 // (tp * pp))
    outcome = OUTCOMES[index % len(OUTCOMES)]
    done = outcome == "completed"
    step = rng.uniform(0.5, 5.0)
    return {
        "schema_version": 1, "sweep": "bench", "run_id": f"llama-8b-n{nodes}-{index:06x}",
        "attempt": 1 + index % 2, "attempt_dir": None, "source": "collect",
        "framework": "megatron", "model": "llama-3.1-8b", "model_params": 8_030_261_248,
        "nodes": nodes, "gpus_per_node": 8, "world_size": nodes * 8, "gpu": "h100-sxm",
        "dtype": "bf16", "seq_len": 4096, "global_batch_sequences": 256,
        "global_batch_tokens": 256 * 4096, "dp": dp, "tp": tp, "pp": pp, "cp": 1, "ep": 1,
        "mbs": 1 + index % 4, "grad_acc": 4, "zero_stage": index % 2, "recompute": "selective",
        "sp": tp > 1, "pp_schedule": "1f1b", "vpp": 1, "layout_label": f"DP{dp} TP{tp} PP{pp}",
        "steps": 20, "warmup_steps": 5,
        "settings_json": json.dumps({"steps": 20, "warmup_steps": 5, "time_limit": "00:30:00",
                                     "partition": "gpu", "seed": 1234}),
        "outcome": outcome, "reason": "cuda_oom" if outcome == "oom" else outcome,
        "rule": "exit-zero" if done else f"{outcome}-rule",
        "evidence": [] if done else ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
        "status_source": "status.json", "last_step": 20 if done else 3,
        "step_time_mean_s": step if done else None, "step_time_std_s": step * 0.01 if done else None,
        "step_time_n": 15 if done else None,
        "tokens_per_sec": 256 * 4096 / step if done else None,
        "tokens_per_sec_per_gpu": 256 * 4096 / step / (nodes * 8) if done else None,
        "mfu_megatron": rng.uniform(0.2, 0.5) if done else None,
        "mfu_full_attention": rng.uniform(0.2, 0.5) if done else None,
        "mfu_6N": rng.uniform(0.2, 0.5) if done else None,
        "mem_allocated_bytes": rng.uniform(2e10, 7e10), "mem_reserved_bytes": rng.uniform(2e10, 8e10),
        "framework_version": "core_r0.13.0", "node_list": f"gpu[{index % 90:03d}-{index % 90 + nodes:03d}]",
        "hostname": f"gpu{index % 90:03d}", "slurm_job_id": f"{1000 + index}_{index % 50}",
        "started_at": 1.79e9 + index * 60, "ended_at": 1.79e9 + index * 60 + 300,
        "elapsed_s": 300.0, "gpu_hours": 300.0 * nodes * 8 / 3600,
    }


def server_cpu_s(port: str) -> float:
    """CPU seconds (user + system) of every process in the session of the `mlflow server`
    listening on `port`: the launcher and its uvicorn worker(s)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[pid] = (cmdline, int(fields[3]), int(fields[11]) + int(fields[12]))
    sessions = {session for cmdline, session, _ in stats.values()
                if b"server" in cmdline and f"--port\0{port}\0".encode() in cmdline}
    return sum(cpu for _, session, cpu in stats.values() if session in sessions) / tick


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main_benchmark(count: int, store_dir: Path | None = None) -> None:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="export-speed-") as tmp, \
            tempfile.TemporaryDirectory(prefix="export-speed-store-", dir=store_dir) as store:
        sweep_dir = Path(tmp) / "bench"
        sweep_dir.mkdir()
        pq.write_table(to_table(synthetic_row(i, rng) for i in range(count)),
                       sweep_dir / "runs.parquet")
        with mlflow_server(Path(store) / "mlflow") as uri:
            port = uri.rsplit(":", 1)[1]
            timings, server_cpu, client_cpu = {}, {}, {}
            for label in ("first", "again"):
                server_before, client_before = server_cpu_s(port), own_cpu_s()
                started = time.perf_counter()
                assert main(["export", str(sweep_dir), "--to", f"mlflow:{uri}"]) == 0
                timings[label] = time.perf_counter() - started
                server_cpu[label] = server_cpu_s(port) - server_before
                client_cpu[label] = own_cpu_s() - client_before
    cores = os.cpu_count() or 1
    # The least wall time the server's own work allows on this machine: its CPU seconds spread
    # perfectly over every core, the exporter taking none.
    server_floor_s = server_cpu["first"] / cores
    print(f"attempts={count} export_s={timings['first']:.1f} reexport_s={timings['again']:.1f} "
          f"per_attempt_ms={timings['first'] / count * 1000:.0f} "
          f"server_cpu_s={server_cpu['first']:.1f} exporter_cpu_s={client_cpu['first']:.1f} "
          f"server_ms_per_attempt={server_cpu['first'] / count * 1000:.1f} "
          f"exporter_ms_per_attempt={client_cpu['first'] / count * 1000:.1f} cores={cores} "
          f"server_floor_s={server_floor_s:.1f} store={store_dir or 'tmp'} "
          f"target_s={TARGET_S:.0f} within_target={timings['first'] < TARGET_S} "
          f"target_reachable_here={server_floor_s < TARGET_S}")


if __name__ == "__main__":
    main_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 4000,
                   Path(sys.argv[2]) if len(sys.argv) > 2 else None)
