"""The figures in PyTorch's CUDA out-of-memory message.

An OOM ends a run before its memory peak, so the run's sampled peaks understate what it needed
(on an H200, a 3B run's last sample was step 1's peak, before the optimizer state existed). The
allocator's message says more, in one of two wordings:

- PyTorch 2.1 and later: "Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 139.80 GiB of
  which 4.92 GiB is free. [Process N has X memory in use.] Including non-PyTorch memory, this
  process has 134.88 GiB memory in use. Of the allocated memory 131.85 GiB is allocated by
  PyTorch, [with M allocated in private pools (e.g., CUDA Graphs),] and 1.74 GiB is reserved by
  PyTorch but unallocated." (2.1 spells "capacty"; a per-process cap adds "N GiB allowed;");
- PyTorch 2.0 and earlier: "Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity;
  77.54 GiB already allocated; 1.25 MiB free; 78.13 GiB reserved in total by PyTorch)".

From it: a lower bound of the peak the run needed (allocated + the request that failed), and,
in the newer wording, the memory the process held outside the caching allocator (CUDA context,
kernels and libraries, NCCL): what the memory model's `cuda_context_bytes` and
`nccl_bytes_per_group` assume. Pure: text in, numbers out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from sweep.core.units import GiB, KiB, MiB, TiB

_UNITS: Final = {"B": 1, "bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}
_SIZE: Final = r"([0-9]+(?:\.[0-9]+)?) (B|bytes|KiB|MiB|GiB|TiB)"
_REQUESTED: Final = re.compile(rf"Tried to allocate {_SIZE}")
_IN_USE: Final = re.compile(rf"this process has {_SIZE} memory in use")
_ALLOCATED: Final = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch")
_UNALLOCATED: Final = re.compile(rf"and {_SIZE} is reserved by PyTorch but unallocated")
_OLD_ALLOCATED: Final = re.compile(rf"; {_SIZE} already allocated;")


@dataclass(frozen=True)
class OomFigures:
    requested_bytes: int  # the allocation that failed
    allocated_bytes: int  # live tensors the caching allocator held when it failed
    outside_allocator_bytes: int | None  # held by the process beyond the allocator; None: unknown

    @property
    def needed_bytes(self) -> int:
        """A lower bound of the peak the run needed: what it held and what it asked for."""
        return self.allocated_bytes + self.requested_bytes


def _bytes(match: re.Match[str] | None) -> int | None:
    return None if match is None else round(float(match.group(1)) * _UNITS[match.group(2)])


def parse(message: str) -> OomFigures | None:
    """The figures of one CUDA OOM message (either wording), or None when it is not one."""
    requested = _bytes(_REQUESTED.search(message))
    allocated = _bytes(_ALLOCATED.search(message) or _OLD_ALLOCATED.search(message))
    if requested is None or allocated is None:
        return None
    in_use = _bytes(_IN_USE.search(message))
    unallocated = _bytes(_UNALLOCATED.search(message))
    outside = None
    if in_use and unallocated is not None and in_use > allocated + unallocated:
        outside = in_use - allocated - unallocated  # "0 bytes in use" (seen): unknown, not negative
    return OomFigures(requested, allocated, outside)


def largest(lines: Iterable[str]) -> OomFigures | None:
    """Over every OOM message among `lines` (one per failing rank, often repeated): the largest
    need and the largest memory outside the allocator, as one OomFigures."""
    found = [f for f in (parse(line) for line in lines) if f is not None]
    if not found:
        return None
    worst = max(found, key=lambda f: f.needed_bytes)
    outside = [f.outside_allocator_bytes for f in found if f.outside_allocator_bytes is not None]
    return OomFigures(worst.requested_bytes, worst.allocated_bytes, max(outside, default=None))
