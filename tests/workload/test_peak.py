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
    # Wide bounds: 8 engineers share 2 cores here (76 MFLOP/s was seen under load average 12).
    assert 1e7 < value < 1e13


def test_the_cpu_peak_names_a_half_precision_dtype() -> None:
    assert measure_cpu_matmul_peak("bf16", seconds=0.01, size=64)[1] == "measured:cpu-matmul-bf16"
    assert measure_cpu_matmul_peak("tf32", seconds=0.01, size=64)[1] == "measured:cpu-matmul-fp32"
