"""The dense peak FLOP/s that MFU divides by.

GPUs: the catalog's dense peak for the run's dtype. CPU has no catalogue peak, so the workload
times a square matmul on each rank (all ranks at once, with the threads each rank trains with,
so they contend as in training) and uses the mean; records say `measured:cpu-matmul-<dtype>`.

A peak measured inside every run is noise: two runs of one sweep on one host divided by peaks
that differed by 2× under contention, and MFU above 100 % followed. So the first run of a sweep
on a host measures it and stores it in `<sweep>/peaks/` (keyed by host, dtype, ranks per node and
threads per rank); every later run of the sweep on that host divides by the same number.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch

from sweep.core.catalog import get_gpu

CPU_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def catalog_peak(gpu: str, dtype: str) -> tuple[float, str]:
    spec = get_gpu(gpu)
    return spec.dense_peak(dtype), f"catalog:{spec.name}:{dtype}"


def measure_cpu_matmul_peak(dtype: str, seconds: float = 0.15, size: int = 512) -> tuple[float, str]:
    """Achieved FLOP/s of repeated size×size matmuls on this process's threads."""
    torch_dtype = CPU_DTYPES.get(dtype, torch.float32)
    a = torch.randn(size, size).to(torch_dtype)
    b = torch.randn(size, size).to(torch_dtype)
    torch.mm(a, b)  # warm-up: thread pool, packing buffers
    count, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    name = "fp32" if torch_dtype == torch.float32 else dtype
    return 2.0 * size ** 3 * count / elapsed, f"measured:cpu-matmul-{name}"


def peak_file(sweep_dir: Path, dtype: str, ranks_per_node: int, threads: int) -> Path:
    """Where the sweep keeps this host's CPU peak for runs of this shape."""
    host = "".join(c if c.isalnum() or c in "-._" else "_" for c in socket.gethostname())
    return sweep_dir / "peaks" / f"{host}-{dtype}-{ranks_per_node}x{threads}.json"


def read_stored_peak(path: Path) -> tuple[float, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return float(data["peak_flops"]), str(data["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_peak(path: Path, value: float, source: str) -> tuple[float, str]:
    """Keep the first peak stored for this host and shape (two runs measuring at once: the first
    to link its file wins, and both use the winner's); returns the peak to use."""
    stored_source = f"{source} (once per host per sweep: peaks/{path.name})"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"peak_flops": value, "source": stored_source,
                               "host": socket.gethostname(), "measured_at": time.time()}))
    try:
        os.link(tmp, path)  # atomic create-if-absent, also on NFS
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_stored_peak(path) or (value, stored_source)
