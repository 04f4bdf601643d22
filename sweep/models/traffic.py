"""Memory-bound bytes per framework: what a training step moves through HBM that no FLOP count
sees (norms, residual adds, rotary, SwiGLU, casts, the loss, gradient accumulation).

The throughput model charges these bytes at the GPU's HBM rate (`sweep.models.throughput`, the
``memory_traffic`` term). How many there are depends on how a framework's kernels are written,
not on the model alone:

- fused kernels (nanotron, Megatron-LM, torchtitan): about 3 · act · (18h + 3F) per token and
  layer, and nanotron's fp32 loss, 60 bytes per logit (`sweep.models.pacing_stage` says where from);
  nothing per parameter beyond the optimizer (its own term).
- the built-in workload (`sweep.workload`) is eager PyTorch: fp32 norms in several kernels, an
  fp32 residual stream, autocast casting every weight to bf16 in each micro-batch's forward (and
  again where layers are recomputed), the gradients cast back to fp32 and accumulated in fp32,
  K/V repeated to the query heads. Its bytes are counted, not estimated: `scripts/count_traffic.py`
  runs small training steps on CPU under a dispatch mode that adds up the bytes read and written
  by every operator but the matmuls and attention (`sweep.workload.bytes_moved`) and reads these
  figures off them; `tests/workload/test_memory_traffic.py` checks them, and checks them on a
  shape they were not read from. They are 5-8 times the fused count per token; on the same runs an H100's
  slower HBM made the built-in's steps 8-23 % longer than an H200's (docs/workload.md, "Checks on a real GPU").

Pure data; `Workload.traffic` carries one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

# Bytes of one activation element by compute dtype.
DTYPE_BYTES: Final = {"bf16": 2, "fp16": 2, "fp8": 1, "tf32": 4, "fp32": 4}


@dataclass(frozen=True)
class TrafficCounts:
    """Bytes moved per unit of work, forward and backward of one micro-batch."""

    hidden: float  # per token, layer and hidden element
    query: float  # per token, layer and query element (attention's inputs and outputs)
    ffn: float  # per token, layer and FFN element
    fixed: float  # per token and layer, whatever the width (rotary tables, per-head statistics)
    outside: float  # per token and hidden element outside the layers (embedding, final norm)
    logit: float  # per token and vocabulary entry (the LM head's output and the loss)
    layer_param: float  # per layer parameter and micro-batch (casts, gradient accumulation)
    head_param: float  # per embedding and LM-head parameter and micro-batch

    def per_token_layer(self, hidden_size: int, q_dim: int, ffn_hidden_size: int) -> float:
        return self.hidden * hidden_size + self.query * q_dim + self.ffn * ffn_hidden_size + self.fixed

    def per_token_head(self, hidden_size: int, vocab_size: int) -> float:
        return self.outside * hidden_size + self.logit * vocab_size


def _fused(act: float) -> TrafficCounts:
    return TrafficCounts(hidden=54.0 * act, query=0.0, ffn=9.0 * act, fixed=0.0, outside=0.0,
                         logit=60.0, layer_param=0.0, head_param=0.0)


@dataclass(frozen=True)
class Traffic:
    """A framework's memory-bound bytes: counted tables by precision ("mixed": bf16/fp16 under
    autocast; "full": fp32/tf32) and by whether layers are recomputed ("none", "recomputed": full
    or selective), or, with no tables, the fused kernels' count at the dtype's activation width
    (recomputation re-reads nothing there that the count includes)."""

    name: str
    mixed: dict[str, TrafficCounts] = field(default_factory=dict)
    full: dict[str, TrafficCounts] = field(default_factory=dict)

    def counts(self, dtype: str, recompute: str) -> TrafficCounts:
        if not self.mixed:
            return _fused(DTYPE_BYTES.get(dtype, 2))
        table = self.full if dtype in ("fp32", "tf32") else self.mixed
        return table["none" if recompute == "none" else "recomputed"]


FUSED: Final = Traffic(name="fused")

# Counted on CPU (torch 2.13) by scripts/count_traffic.py (`sweep.workload.bytes_moved`,
# TrafficCounts fields in order), rounded to 0.1 byte: bf16 autocast ("mixed")
# and fp32; recomputation re-runs every element-wise operator of the layer (selective keeps only
# matmul and attention outputs, so it moves the same bytes as full). K/V are repeated to the
# query heads, so attention's bytes follow the query width, not the KV width.
BUILTIN: Final = Traffic(
    name="builtin",
    mixed={"none": TrafficCounts(400.0, 232.0, 28.0, 1476.0, 144.5, 44.0, 18.0, 16.0),
           "recomputed": TrafficCounts(496.0, 328.0, 38.0, 2368.0, 144.5, 44.0, 24.0, 16.0)},
    full={"none": TrafficCounts(332.0, 184.0, 56.0, 1476.0, 132.5, 32.0, 6.0, 10.0),
          "recomputed": TrafficCounts(400.0, 256.0, 76.0, 2368.0, 132.5, 32.0, 6.0, 10.0)},
)


def traffic_for(kernels: str) -> Traffic:
    """The counts of a framework's kernels (`FrameworkAdapter.kernels`): PyTorch's eager
    operators, as the built-in workload runs them, or the frameworks' fused ones."""
    if kernels not in ("fused", "eager"):
        raise ValueError(f"unknown kernels {kernels!r}: 'fused' or 'eager'")
    return BUILTIN if kernels == "eager" else FUSED
