"""How fast `sweep collect` turns attempt folders into runs.parquet. Target: 4,000 attempts < 10 s.

Writes N synthetic attempt folders (run.json, status.json, env.json, a 10-step metrics.jsonl
with its summary; a share of them failed, truncated or without status), then times:
- cold: the first `sweep collect` (every row computed, parquet written);
- warm: a second `sweep collect` with nothing changed (every row reused by fingerprint).
Usage: python benchmarks/collect_speed.py [N]
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sweep.cli import main
from sweep.core import catalog
from sweep.core.layout import Layout
from sweep.core.runconfig import RunConfig
from sweep.job.provenance import collect as provenance

MODELS = ("playbook-1b", "playbook-3b", "playbook-8b", "playbook-80b")
NODES = (1, 2, 4, 8, 16, 32, 64)
SEQUENCES = 256


def synthetic_configs(count: int) -> Iterator[RunConfig]:
    """Distinct playbook-like configurations: dp·tp·pp = GPUs, dp·mbs·grad_acc = 256."""
    produced = 0
    for mbs, zero in itertools.product((1, 2, 4, 8, 16), (0, 1)):
        for model, nodes in itertools.product(MODELS, NODES):
            gpus = nodes * 8
            for tp, pp in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32)):
                dp, rest = divmod(gpus, tp * pp)
                if rest or dp == 0 or SEQUENCES % (dp * mbs):
                    continue
                layout = Layout(dp=dp, tp=tp, pp=pp, mbs=mbs, grad_acc=SEQUENCES // (dp * mbs),
                                zero_stage=zero, sp=tp > 1)
                yield RunConfig(sweep="bench", framework="builtin", model=catalog.get_model(model),
                                layout=layout, nodes=nodes, gpus_per_node=8, gpu="h100-sxm",
                                dtype="bf16", seq_len=4096, global_batch_sequences=SEQUENCES,
                                settings={"steps": 10, "warmup_steps": 3},
                                predicted={"mem_allocated_bytes": 4e10, "mem_reserved_bytes": 4.5e10,
                                           "mem_total_bytes": 5e10})
                produced += 1
                if produced == count:
                    return
    raise SystemExit(f"only {produced} distinct configurations; ask for fewer")


def write_attempt(run_dir: Path, config: RunConfig, rng: random.Random, env: dict) -> None:
    attempt = run_dir / "attempts" / "1"
    attempt.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(config.to_json()))
    (attempt / "env.json").write_text(json.dumps(env))
    kind = rng.random()
    steps = 10 if kind < 0.7 else rng.randint(1, 9)
    tokens = SEQUENCES * 4096
    lines = []
    for step in range(1, steps + 1):
        step_time = rng.uniform(1.0, 3.0)
        lines.append(json.dumps({"kind": "step", "step": step, "time": 1e9 + step, "step_time_s": step_time,
                                 "tokens": tokens, "tokens_per_sec": tokens / step_time,
                                 "tokens_per_sec_per_gpu": tokens / step_time / config.world_size,
                                 "loss": 10.0 / step, "mem_allocated_bytes": 4e10,
                                 "mem_reserved_bytes": 5e10, "mem_source": "cuda"}))
    if kind < 0.7:
        lines.append(json.dumps({"kind": "summary", "steps": 10, "warmup_steps_skipped": 3,
                                 "step_time_mean_s": 2.0, "step_time_std_s": 0.1, "step_time_n": 7,
                                 "tokens_per_sec": tokens / 2.0,
                                 "tokens_per_sec_per_gpu": tokens / 2.0 / config.world_size,
                                 "mfu_pct": 30.0, "peak_flops": 989.5e12,
                                 "mem_allocated_bytes": 4e10, "mem_reserved_bytes": 5e10,
                                 "mem_source": "cuda", "ended_by": "step_budget", "final_loss": 1.0}))
    (attempt / "metrics.jsonl").write_text("\n".join(lines) + "\n" + ('{"kind": "st' if kind > 0.95 else ""))
    if kind < 0.9:
        outcome = "completed" if kind < 0.7 else "oom"
        (attempt / "status.json").write_text(json.dumps({
            "run_id": config.run_id, "attempt": 1, "outcome": outcome, "reason": outcome,
            "rule": "bench", "evidence": [] if outcome == "completed" else ["CUDA out of memory"],
            "last_step": steps, "exit_codes": {"node0": 0}, "started_at": 1e9, "ended_at": 1e9 + 60,
            "nodes": ["node1"], "slurm_job_id": "1", "hostname": "node1"}))


def main_benchmark(count: int) -> None:
    rng = random.Random(0)
    env = provenance(None, None, ["node1"], environ={"SLURM_JOB_ID": "1"})
    with tempfile.TemporaryDirectory(prefix="collect-speed-") as tmp:
        sweep_dir = Path(tmp)
        started = time.perf_counter()
        for config in synthetic_configs(count):
            write_attempt(sweep_dir / "runs" / config.run_id, config, rng, env)
        setup = time.perf_counter() - started
        timings, cpu = {}, {}
        for label in ("cold", "warm"):
            started, started_cpu = time.perf_counter(), time.process_time()
            assert main(["collect", str(sweep_dir)]) == 0
            timings[label] = time.perf_counter() - started
            cpu[label] = time.process_time() - started_cpu
        print(f"setup (writing {count} attempt folders): {setup:.2f} s")
    print(f"attempts={count} collect_cold_s={timings['cold']:.2f} collect_cold_cpu_s={cpu['cold']:.2f} "
          f"collect_warm_s={timings['warm']:.2f} collect_warm_cpu_s={cpu['warm']:.2f} "
          f"target_s=10 within_target={timings['cold'] < 10}")


if __name__ == "__main__":
    main_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
