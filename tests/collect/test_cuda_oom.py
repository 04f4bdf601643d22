"""The figures in PyTorch's CUDA out-of-memory message: what the run needed at least, and what the
process held outside the caching allocator."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.collect import cuda_oom
from sweep.core.units import GiB, MiB

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"

# Our own runs on an H200 (tests/fixtures/cuda/README.md), verbatim: the 3B at micro-batch 4, and
# the 1B capped at half its peak with rank_memory_limit_mb (PyTorch 2.11).
H200, H200_CAPPED = (Path(__file__).parents[1] / "fixtures" / "cuda" / "h200_oom_messages.txt"
                     ).read_text().splitlines()
# PyTorch 2.0's wording (c10/cuda/CUDACachingAllocator.cpp, v2.0.0), with figures of our own.
TORCH_2_0 = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; "
             "79.15 GiB total capacity; 76.25 GiB already allocated; 1.02 GiB free; 77.80 GiB "
             "reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
             "max_split_size_mb to avoid fragmentation.")


def test_the_newer_wording_gives_the_need_and_the_memory_outside_the_allocator() -> None:
    figures = cuda_oom.parse(H200)
    assert figures is not None
    assert figures.needed_bytes == round(131.85 * GiB) + 8 * GiB
    assert figures.outside_allocator_bytes == round(134.88 * GiB) - round(131.85 * GiB) - round(1.74 * GiB)
    capped = cuda_oom.parse(H200_CAPPED)
    assert capped is not None and capped.requested_bytes == 256 * MiB
    assert capped.outside_allocator_bytes == pytest.approx(1.21 * GiB, rel=0.01)


def test_the_older_wording_gives_the_need_only() -> None:
    figures = cuda_oom.parse(TORCH_2_0)
    assert figures is not None
    assert figures.needed_bytes == round(76.25 * GiB) + round(1.5 * GiB)
    assert figures.outside_allocator_bytes is None


@pytest.mark.parametrize("name", ["fail_cuda_oom_1.log", "fail_cuda_oom_2.log", "fail_cuda_oom_3.log"])
def test_every_published_oom_log_gives_its_figures(name: str) -> None:
    """Real logs (B200 and H100, other processes on the GPU, 'capacty', '0 bytes memory in use',
    CUDA-graph pools): each gives a need at least its allocation, and never a negative outside."""
    lines = [line for line in (LOGS / name).read_text().splitlines() if "Tried to allocate" in line]
    figures = cuda_oom.largest(lines)
    assert figures is not None
    assert figures.needed_bytes > figures.allocated_bytes > 0
    outside = figures.outside_allocator_bytes
    assert outside is None or 0 < outside < 4 * GiB


def test_text_that_is_not_an_oom_gives_nothing() -> None:
    assert cuda_oom.parse("RuntimeError: CUDA error: an illegal memory access was encountered") is None
    assert cuda_oom.largest(["NCCL watchdog timeout", ""]) is None
