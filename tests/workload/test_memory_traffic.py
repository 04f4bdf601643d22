"""The throughput model's memory-bound bytes for the built-in workload are what its step moves.

A dispatch mode adds up, for every operator of one training step but the matmuls and attention,
the bytes of the tensors it reads and writes (views move nothing and are skipped). That is what
an eager step streams through memory, one kernel per operator, on CPU as on CUDA. The `builtin`
counts of `sweep.traffic` were read off such counts on three small shapes; here they must give
the bytes of another shape, with other widths, vocabulary and depth, for each precision and
recomputation mode. On GPUs the same bytes explain why an H100 runs the built-in's steps 8-23 %
longer than an H200 with the same peak FLOPs (tests/test_throughput_on_cuda.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sweep.catalog import get_model
from sweep.model import ModelShape, count_parameters
from sweep.traffic import BUILTIN
from sweep.workload.model import build, cross_entropy
from sweep.workload.parallel import apply_recompute

# compute-bound operators: their time is the FLOP count's, not the bytes'
COMPUTE = {"mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
           "_scaled_dot_product_flash_attention_for_cpu_backward", "_unsafe_view"}
# other widths than the counts were read from, and a query wider than the hidden size
SHAPE = dataclasses.replace(get_model("tiny-4l"), num_layers=3, hidden_size=384, num_attention_heads=8,
                            num_kv_heads=8, head_dim=64, ffn_hidden_size=1536, vocab_size=1536)
MBS, SEQ, GRAD_ACC = 2, 96, 2


class BytesMoved(TorchDispatchMode):
    """Bytes read and written by the memory-bound operators run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_operator: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        returns = func._schema.returns
        if name in COMPUTE or any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # a matmul, attention, or a view
        read = sum(t.nbytes for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor))
        written = sum(t.nbytes for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        self.by_operator[name] += read + written
        return out


def counted(shape: ModelShape, recompute: str, mixed: bool) -> int:
    """Bytes of the forward and backward passes of one step (the optimizer is a term of its own)."""
    model = build(shape, 1)
    apply_recompute(model, recompute)
    tokens = torch.randint(0, shape.vocab_size, (MBS, SEQ), generator=torch.Generator().manual_seed(0))

    def micro_batch() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            loss = cross_entropy(model(tokens), tokens)
        (loss / GRAD_ACC).backward()

    micro_batch()  # the gradients exist from here on, as in every step but a run's first
    for param in model.parameters():
        param.grad = None
    moved = BytesMoved()
    with moved:
        for _ in range(GRAD_ACC):
            micro_batch()
    return sum(moved.by_operator.values())


def predicted(shape: ModelShape, recompute: str, mixed: bool) -> float:
    c = BUILTIN.counts("bf16" if mixed else "fp32", recompute)
    params = count_parameters(shape)
    head_params = params.embedding + params.lm_head
    per_token = (shape.num_layers * c.per_token_layer(shape.hidden_size, shape.q_dim, shape.ffn_hidden_size)
                 + c.per_token_head(shape.hidden_size, shape.vocab_size))
    per_micro = (MBS * SEQ * per_token
                 + (params.total - head_params) * c.layer_param + head_params * c.head_param)
    return GRAD_ACC * per_micro


@pytest.mark.parametrize("mixed", [True, False], ids=["bf16-autocast", "fp32"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_builtin_counts_give_the_bytes_of_a_shape_they_were_not_read_from(recompute: str,
                                                                              mixed: bool) -> None:
    measured, model = counted(SHAPE, recompute, mixed), predicted(SHAPE, recompute, mixed)
    assert model == pytest.approx(measured, rel=0.03), f"counted {measured:,} B, sweep.traffic says {model:,.0f}"


def test_eager_kernels_move_several_times_what_fused_ones_do() -> None:
    """Why the built-in needs its own counts: per token and layer it moves 5-8 times the fused
    kernels' 3 · act · (18h + 3F) at the playbook's 3B widths."""
    shape = get_model("playbook-3b")
    fused = 3 * 2 * (18 * shape.hidden_size + 3 * shape.ffn_hidden_size)
    for recompute in ("none", "full"):
        eager = BUILTIN.counts("bf16", recompute).per_token_layer(shape.hidden_size, shape.q_dim,
                                                                  shape.ffn_hidden_size)
        assert 4.0 < eager / fused < 8.0
