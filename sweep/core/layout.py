"""One parallel layout of a training run, the vocabulary of its axes, and the columns that hold it.

Semantics (documented in docs/planning.md, "The rules"):
- world size = dp · tp · pp · cp · ep. Expert parallelism is a dimension of its own: dense and
  attention layers see dp · ep data-parallel replicas, experts are sharded over ep and
  replicated dp times (Megatron's expert-data-parallel size is dp).
- sequences per optimizer step = dp · ep · mbs · grad_acc. Context parallelism splits each
  sequence over cp ranks; it adds no replica.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

FRAMEWORKS: Final = ("megatron", "nanotron", "torchtitan", "builtin")
RECOMPUTE_MODES: Final = ("none", "selective", "full")
PP_SCHEDULES: Final = ("1f1b", "gpipe", "interleaved_1f1b")
ZERO_STAGES: Final = (0, 1, 2, 3)
DTYPES: Final = ("bf16", "fp16", "fp8", "tf32", "fp32")

# ---------------------------------------------------------------- the layout's columns
# A plan, a runs table and the memory model hold a layout as one column per field of `Layout`,
# named as the field, in the field's order (the order of a plan's and of a runs table's columns).
# By what they decide:
PARALLEL_DEGREES: Final = ("dp", "tp", "pp", "cp", "ep")  # the mesh: the world size is their product
MICRO_BATCHING: Final = ("mbs", "grad_acc")  # how a replica's share of the global batch is cut
MEMORY_SAVINGS: Final = ("zero_stage", "recompute", "sp")  # what each GPU shards or recomputes
PIPELINE_SCHEDULE: Final = ("pp_schedule", "vpp")
LAYOUT_COLUMNS: Final = (*PARALLEL_DEGREES, *MICRO_BATCHING, *MEMORY_SAVINGS, *PIPELINE_SCHEDULE)

# The columns that are not counts: a mode's name, or (sp) a switch; the others are integers.
LAYOUT_MODE_COLUMNS: Final = ("recompute", "sp", "pp_schedule")
LAYOUT_INT_COLUMNS: Final = tuple(c for c in LAYOUT_COLUMNS if c not in LAYOUT_MODE_COLUMNS)

# What every runs table records of a layout, the Ultra-Scale Playbook's published tables
# included. Those tables have none of the others: their runs used cp = ep = vpp = 1, no
# recomputation and 1F1B, and each reader says what it takes for sp.
PLAYBOOK_LAYOUT_COLUMNS: Final = ("dp", "tp", "pp", "mbs", "grad_acc", "zero_stage")
LAYOUT_COLUMNS_BEYOND_PLAYBOOK: Final = tuple(c for c in LAYOUT_COLUMNS
                                              if c not in PLAYBOOK_LAYOUT_COLUMNS)

# One model at one node count: where a sweep compares layouts. A plan row, or a run, is a layout
# in its cell: two plans of one spec list the same rows.
CELL: Final = ("model", "nodes")
ROW_KEY: Final = (*CELL, *LAYOUT_COLUMNS)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    cp: int = 1
    ep: int = 1
    mbs: int = 1
    grad_acc: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sp: bool = False
    pp_schedule: str = "1f1b"
    vpp: int = 1  # virtual stages per pipeline rank (interleaved 1F1B)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp * self.ep

    @property
    def data_replicas(self) -> int:
        return self.dp * self.ep

    @property
    def sequences_per_step(self) -> int:
        return self.data_replicas * self.mbs * self.grad_acc

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        """The playbook's annotation: DP/TP/PP/GAS/MBS/ZeRO (plus CP/EP/recompute when used)."""
        parts = [f"DP{self.dp}", f"TP{self.tp}", f"PP{self.pp}"]
        parts += [f"CP{self.cp}"] if self.cp > 1 else []
        parts += [f"EP{self.ep}"] if self.ep > 1 else []
        parts += [f"GAS{self.grad_acc}", f"MBS{self.mbs}", f"ZeRO-{self.zero_stage}"]
        parts += [f"AC-{self.recompute}"] if self.recompute != "none" else []
        return " ".join(parts)
