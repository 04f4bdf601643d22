"""The dense peak MFU divides by: the catalog on GPUs, a measured matmul on CPU."""

from __future__ import annotations

from sweep.catalog import get_gpu
from sweep.workload.peak import catalog_peak, measure_cpu_matmul_peak


def test_gpu_peaks_come_from_the_catalog() -> None:
    value, source = catalog_peak("h100-sxm", "bf16")
    assert value == get_gpu("h100-sxm").dense_peak("bf16")
    assert source == "catalog:h100-sxm:bf16"


def test_the_cpu_peak_is_measured_and_says_so() -> None:
    value, source = measure_cpu_matmul_peak("fp32", seconds=0.05, size=128)
    assert source == "measured:cpu-matmul-fp32"
    assert 1e8 < value < 1e13  # between a very busy core and a very large CPU
