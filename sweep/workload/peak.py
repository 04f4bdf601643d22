"""The dense peak FLOP/s that MFU divides by.

GPUs: the catalog's dense peak for the run's dtype. CPU has no catalogue peak, so the workload
times a square matmul on each rank (all ranks at once, with the threads each rank trains with,
so they contend as in training) and uses the mean; records say `measured:cpu-matmul-<dtype>`.
"""

from __future__ import annotations

import time

import torch

from sweep.catalog import get_gpu

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
