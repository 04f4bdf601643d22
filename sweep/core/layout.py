"""One parallel layout of a training run, and the vocabulary of its axes.

Semantics (documented in the README):
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
