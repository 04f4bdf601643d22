"""The built-in workload on a real CUDA GPU: the main job end to end, and the memory model against
the peaks `torch.cuda` measured.

Needs one CUDA GPU and no Slurm; CI has no GPU and never runs it. It writes a one-GPU spec (the
built-in workload, bf16, one node of one GPU, by default two models at the playbook's sequence
length, micro-batch 1 and 4, each recomputation mode), runs it with `sweep run` (the local
backend: every rendered job.sbatch under the watchdog, one job per free GPU, collect, report),
then `sweep memory-check` on the sweep's runs.parquet. It prints, per run, the memory model's
allocated and reserved peaks beside the measured ones (`torch.cuda.max_memory_allocated` and
`max_memory_reserved`, sampled at every step), the steady-state step time and MFU. Then it runs
the first model's largest micro-batch again capped at half its measured peak
(`rank_memory_limit_mb`: it must end `oom`, with the allocator's message as evidence), and one
step of it, with and without recomputation, under PyTorch's MemTracker (the peak per category).

It also measures what the memory model adds outside the caching allocator (`cuda_context_bytes`
and `nccl_bytes_per_group` of sweep.models.memory_profiles): a fresh process brings up a one-rank NCCL
group, runs an all-reduce, a bf16 GEMM and flash attention, and reports the device memory in use
(cudaMemGetInfo) less what the allocator reserved. With one rank NCCL sets up no peer
connections, so this is a lower bound of a multi-GPU job's overhead.

    python benchmarks/cuda_workload.py [--out DIR] [--models playbook-1b ...] [--gpu-memory-gb 200]
        [--alloc-conf expandable_segments:True] [--no-capped] [--no-memtrack]

Per run it also prints the step time the throughput model predicts (the physical prior with the
built-in's counted memory-bound bytes, what `sweep plan` starts from), the start-up and
model-build seconds (rank 0's `done` line), the memory
the run measured outside the allocator at its steps, and how often the caching allocator had to
release its cache and retry (`mem_alloc_retries`). `--gpu-memory-gb 200` lifts the planner's limit
so that the device, not the memory model, decides what fits: how a run near the line ends is the
measurement. It first measures the GPU's memory bandwidth (a device-to-device copy and a bf16
add, bytes read plus written) beside the catalog's `hbm_GBps`, the rate the throughput model
charges memory-bound bytes at.

The last line holds the headline figures as key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
GIB = float(1 << 30)

OUTSIDE_ALLOCATOR_PROBE = textwrap.dedent("""
    import json, os, torch, torch.distributed as dist
    import torch.nn.functional as F
    torch.cuda.set_device(0)
    free0, total = torch.cuda.mem_get_info()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    dist.all_reduce(x)
    y = x @ x
    q = torch.randn(1, 32, 4096, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    print(json.dumps({"device_used_before_bytes": total - free0, "device_used_bytes": total - free,
                      "reserved_bytes": reserved, "outside_allocator_bytes": total - free - reserved,
                      "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}))
    dist.destroy_process_group()
""")


HBM_PROBE = textwrap.dedent("""
    import json, torch
    n = 1 << 30  # elements: 2 GiB of bf16 per tensor
    a = torch.empty(n, device="cuda", dtype=torch.bfloat16).uniform_()
    b, out = torch.empty_like(a).uniform_(), torch.empty_like(a)
    def rate(fn, moved):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        return moved * 20 / (start.elapsed_time(end) / 1e3) / 1e9
    copy = rate(lambda: out.copy_(a), 2 * a.nbytes)
    add = rate(lambda: torch.add(a, b, out=out), 3 * a.nbytes)
    print(json.dumps({"copy_GBps": copy, "add_GBps": add, "device": torch.cuda.get_device_name(0)}))
""")


def hbm_bandwidth() -> dict[str, float]:
    """Bytes read plus written per second by two memory-bound kernels (mean of 20 after 3 warm-ups)."""
    done = subprocess.run([sys.executable, "-c", HBM_PROBE], text=True, capture_output=True,
                          check=False, timeout=300)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def catalog_gpu() -> str:
    """The catalog name of GPU 0, so that MFU divides by its dense peak."""
    import torch

    from sweep.core.catalog import device_gpu

    if not torch.cuda.is_available():
        sys.exit(f"cuda_workload: needs a CUDA GPU; torch {torch.__version__} sees none")
    device = torch.cuda.get_device_name(0)
    found = device_gpu(device)
    if found is None:
        sys.exit(f"cuda_workload: GPU {device!r} is not in sweep/core/catalog/gpus.yaml; pass --gpu NAME")
    return found.name


def write_spec(path: Path, args: argparse.Namespace, gpu: str, *, models: list[str] | None = None,
               mbs: list[int] | None = None, recompute: list[str] | None = None,
               overrides: list[dict[str, object]] | None = None) -> None:
    spec: dict[str, object] = {
        "name": path.stem,
        "framework": "builtin",
        "gpu": gpu,
        "gpus_per_node": 1,
        "dtype": args.dtype,
        "models": models or args.models,
        "nodes": [1],
        "seq_len": args.seq_len,
        "global_batch": {"sequences": args.global_batch},
        "axes": {"tp": [1], "pp": [1], "mbs": mbs or args.mbs, "zero_stage": [0],
                 "recompute": recompute or args.recompute},
        "run": {"steps": args.steps, "warmup_steps": args.warmup, "time_limit": "00:06:00",
                "startup_timeout_s": 240, "hang_timeout_s": 180, "signal_before_s": 20,
                "exclusive": False},
    }
    if args.gpu_memory_gb:
        spec["gpu_memory_gb"] = args.gpu_memory_gb
    if args.alloc_conf:
        spec["run"]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": args.alloc_conf}  # type: ignore[index]
    if overrides:
        spec["overrides"] = overrides
    import yaml

    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")


def sweep_cli(*argv: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sweep.cli", *argv]
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=REPO, text=True, check=False,
                          capture_output=capture)


def outside_allocator() -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", OUTSIDE_ALLOCATOR_PROBE], text=True,
                          capture_output=True, check=False, timeout=300)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


DONE_LINE = re.compile(r"sweep\.workload: done run_id=(\S+) .*?startup_s=([\d.]+) .*?build_s=([\d.]+)")


def start_up(sweep_dir: Path) -> pd.DataFrame:
    """Per run: the workload's start-up and model build seconds (rank 0's `done` line)."""
    found = []
    for log in sorted(sweep_dir.glob("runs/*/attempts/*/logs/node0.out")):
        for match in DONE_LINE.finditer(log.read_text(errors="replace")):
            found.append({"run_id": match[1], "startup_s": float(match[2]), "build_s": float(match[3])})
    return pd.DataFrame(found, columns=["run_id", "startup_s", "build_s"]).drop_duplicates("run_id", keep="last")


def predicted_step(runs: pd.DataFrame, spec_path: Path) -> pd.Series:
    """The step time `sweep plan` predicts for each run: the physical throughput prior with the
    built-in's counted memory-bound bytes (`sweep.models.traffic`) on the spec's GPU."""
    from sweep.models.throughput import Coefficients, predict
    from sweep.plan.predictions import workloads_for
    from sweep.plan.spec import load_spec

    work = workloads_for(load_spec(spec_path))
    out = pd.Series(np.nan, index=runs.index)
    for name, group in runs.groupby("model"):
        if name in work:
            out[group.index] = predict(group, work[name], Coefficients())["pred_step_time_s"]
    return out


def per_run(runs: pd.DataFrame, timings: pd.DataFrame, spec_path: Path) -> pd.DataFrame:
    runs = runs.merge(timings, on="run_id", how="left")
    def column(name: str) -> pd.Series:
        return runs[name] if name in runs else pd.Series(np.nan, index=runs.index)

    outside = column("mem_outside_allocator_bytes")
    table = pd.DataFrame({
        "model": runs["model"], "mbs": runs["mbs"], "grad_acc": runs["grad_acc"],
        "recompute": runs["recompute"], "outcome": runs["outcome"],
        "alloc_pred_gib": runs["mem_predicted_allocated_bytes"] / GIB,
        "alloc_meas_gib": runs["mem_allocated_bytes"] / GIB,
        "resv_pred_gib": runs["mem_predicted_reserved_bytes"] / GIB,
        "resv_meas_gib": runs["mem_reserved_bytes"] / GIB,
        "step_s": runs["step_time_mean_s"], "step_pred_s": predicted_step(runs, spec_path),
        "steps_avg": runs["step_time_n"],
        "tok_s_gpu": runs["tokens_per_sec_per_gpu"], "mfu": runs["mfu_full_attention"],
        "outside_gib": outside / GIB, "alloc_retries": column("mem_alloc_retries"),
        "startup_s": runs["startup_s"], "build_s": runs["build_s"],
    })
    table["alloc_err"] = table.alloc_pred_gib / table.alloc_meas_gib - 1.0
    table["resv_err"] = table.resv_pred_gib / table.resv_meas_gib - 1.0
    table["step_err"] = table.step_pred_s / table.step_s - 1.0
    return table.sort_values(["model", "recompute", "mbs"]).reset_index(drop=True)


def capped_run(args: argparse.Namespace, gpu: str, table: pd.DataFrame) -> dict[str, object]:
    """The largest micro-batch of the first model, capped at half its measured allocated peak
    (`rank_memory_limit_mb`: the caching allocator's per-process fraction): it must end `oom`,
    with the allocator's own message as evidence."""
    model, mbs = args.models[0], max(args.mbs)
    row = table[(table.model == model) & (table.mbs == mbs) & (table.recompute == "none")]
    if row.empty or not np.isfinite(row.alloc_meas_gib.iloc[0]):
        return {"skipped": f"no measured peak of {model} mbs {mbs} recompute none"}
    cap_mb = int(row.alloc_meas_gib.iloc[0] * 1024 / 2)
    spec = args.out / "cuda-capped.yaml"
    write_spec(spec, args, gpu, models=[model], mbs=[mbs], recompute=["none"],
               overrides=[{"where": {"model": model}, "set": {"rank_memory_limit_mb": cap_mb}}])
    sweep_cli("run", str(spec), "--out", str(args.out / "capped"))
    runs_file = args.out / "capped" / "runs.parquet"
    if not runs_file.is_file():
        return {"error": f"no {runs_file}"}
    capped = pd.read_parquet(runs_file).iloc[0]
    return {"cap_mb": cap_mb, "outcome": capped["outcome"], "reason": capped["reason"],
            "rule": capped["rule"], "evidence": list(capped["evidence"])[:3]}


def memtrack_breakdowns(args: argparse.Namespace, runs: pd.DataFrame) -> dict[str, object]:
    """One step of the first model's largest micro-batch (no recomputation, and full) under
    PyTorch's MemTracker: the peak per category (parameters, gradients, optimizer state,
    activations, temporaries), to set beside the memory model's components."""
    model, mbs = args.models[0], max(args.mbs)
    found: dict[str, object] = {}
    for recompute in ("none", "full"):
        pick = runs[(runs.model == model) & (runs.mbs == mbs) & (runs.recompute == recompute)]
        if pick.empty:
            continue
        run_id = str(pick.run_id.iloc[0])
        source = json.loads((args.out / "sweep" / "runs" / run_id / "run.json").read_text())
        source["settings"].update(steps=2, warmup_steps=0)
        run_dir = args.out / "memtrack" / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(source), encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "sweep.workload", "--run-dir", str(run_dir),
                               "--memtrack"], cwd=REPO, text=True, capture_output=True,
                              check=False, timeout=600)
        tracked = run_dir / "memtrack.json"
        if done.returncode != 0 or not tracked.is_file():
            found[recompute] = {"error": done.stderr[-2000:]}
            continue
        found[recompute] = {"run_id": run_id, **json.loads(tracked.read_text())}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "cuda-workload")
    parser.add_argument("--gpu", default=None, help="catalog GPU name (default: GPU 0's)")
    parser.add_argument("--models", nargs="+", default=["llama-3.2-1b", "playbook-3b"])
    parser.add_argument("--mbs", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--recompute", nargs="+", default=["none", "selective", "full"])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--global-batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gpu-memory-gb", type=float, default=None,
                        help="the planner's memory limit (GiB) instead of the GPU's: above it, "
                             "the device decides what fits")
    parser.add_argument("--alloc-conf", default=None,
                        help="PYTORCH_CUDA_ALLOC_CONF for the runs, e.g. expandable_segments:True")
    parser.add_argument("--no-capped", action="store_true", help="skip the run capped to OOM")
    parser.add_argument("--no-memtrack", action="store_true", help="skip the MemTracker breakdowns")
    args = parser.parse_args(argv)
    gpu = args.gpu or catalog_gpu()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.out / "cuda-workload.yaml"
    write_spec(spec, args, gpu)
    # first: seconds each, and nothing else on the GPU
    outside = outside_allocator() if gpu != "cpu" else {}
    bandwidth = hbm_bandwidth() if gpu != "cpu" else {}
    from sweep.core.catalog import get_gpu

    bandwidth["catalog_hbm_GBps"] = get_gpu(gpu).hbm_GBps or float("nan")
    print("hbm:", json.dumps(bandwidth), flush=True)
    began = time.perf_counter()
    sweep_cli("run", str(spec), "--out", str(args.out / "sweep"))
    sweep_s = time.perf_counter() - began
    runs_file = args.out / "sweep" / "runs.parquet"
    if not runs_file.is_file():
        print(f"cuda_workload: no {runs_file}; the sweep did not collect", file=sys.stderr)
        return 1
    check = sweep_cli("memory-check", str(runs_file), "--spec", str(spec), "--json", capture=True)
    print(check.stdout, check.stderr, sep="\n")
    scores = json.loads(check.stdout) if check.returncode == 0 and check.stdout.strip() else {}
    runs = pd.read_parquet(runs_file)
    table = per_run(runs, start_up(args.out / "sweep"), spec)
    oom = {"skipped": "--no-capped"} if args.no_capped else capped_run(args, gpu, table)
    breakdown = {"skipped": "--no-memtrack"} if args.no_memtrack else memtrack_breakdowns(args, runs)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    print(json.dumps({"hbm": bandwidth, "outside_allocator": outside, "memory_check": scores, "capped_run": oom,
                      "memtrack": breakdown}, indent=1))
    (args.out / "summary.json").write_text(json.dumps({
        "gpu": gpu, "torch": runs["torch_version"].dropna().unique().tolist(),
        "runs": table.to_dict(orient="records"), "hbm": bandwidth, "outside_allocator": outside,
        "memory_check": scores, "capped_run": oom, "memtrack": breakdown, "sweep_s": sweep_s},
        indent=1, default=float), encoding="utf-8")
    done = table[table.outcome == "completed"]
    alloc, resv = done.alloc_err.abs(), done.resv_err.abs()
    headline = {
        "gpu": gpu, "runs": len(table), "completed": len(done),
        "alloc_median_abs_err": float(np.median(alloc)) if len(done) else float("nan"),
        "alloc_max_abs_err": float(alloc.max()) if len(done) else float("nan"),
        "reserved_median_abs_err": float(np.median(resv)) if len(done) else float("nan"),
        "reserved_max_abs_err": float(resv.max()) if len(done) else float("nan"),
        "mfu_best": float(done.mfu.max()) if len(done) else float("nan"),
        "step_median_abs_err": float(np.median(done.step_err.abs())) if len(done) else float("nan"),
        "outside_allocator_gib": outside.get("outside_allocator_bytes", float("nan")) / GIB,
        "outside_in_runs_max_gib": float(done.outside_gib.max()) if len(done) else float("nan"),
        "build_s_median": float(done.build_s.median()) if len(done) else float("nan"),
        "retried_runs": int((table.alloc_retries.fillna(0) > 0).sum()),
        "hbm_copy_GBps": bandwidth.get("copy_GBps", float("nan")),
        "hbm_catalog_GBps": bandwidth["catalog_hbm_GBps"],
        "sweep_s": sweep_s,
    }
    print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in headline.items()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
