"""Accelerator descriptions. Pure: the catalog (sweep.core.catalog) loads them from YAML."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int | None  # None: no fixed ceiling (CPU runs)
    peak_flops: dict[str, float] = field(hash=False)  # DENSE peak FLOP/s per dtype
    intra_node_GBps: float = 0.0
    inter_node_GBps: float = 0.0
    hbm_GBps: float = 0.0  # HBM bandwidth; 0: unknown (no memory-bound term)
    gpus_per_node: int = 8
    source: str = field(default="", compare=False)

    def dense_peak(self, dtype: str) -> float:
        try:
            return self.peak_flops[dtype]
        except KeyError:
            known = ", ".join(sorted(self.peak_flops)) or "none"
            raise KeyError(
                f"GPU {self.name!r} has no dense peak for dtype {dtype!r} (known: {known})") from None
