"""Which candidates a framework's capability table rejects, over the planner's vectorised columns.

Apart from `sweep.frameworks.base` so that what the job loads of an adapter (its parser, its
version check) never loads numpy: the watchdog lives in the job's small memory cgroup.
"""

from __future__ import annotations

import numpy as np

from sweep.frameworks.base import CapabilityContext, Columns, FrameworkAdapter


def capability_failures(adapter: FrameworkAdapter, columns: Columns,
                        ctx: CapabilityContext) -> tuple[np.ndarray, np.ndarray]:
    """(failed, rule index): which candidates a capability rule of `adapter` rejects, and the
    first rule each fails (-1 where none does)."""
    n = len(columns["tp"])
    first = np.full(n, -1, dtype=np.int16)
    for index, rule in enumerate(adapter.capabilities):
        mask = np.asarray(rule.fails(columns, ctx), dtype=bool)
        if mask.shape != (n,):
            mask = np.broadcast_to(mask, (n,))
        first[(first == -1) & mask] = index
    return first >= 0, first
