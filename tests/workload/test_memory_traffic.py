"""The throughput model's memory-bound bytes for the built-in workload are what its step moves.

`sweep.workload.bytes_moved` adds up, for every operator of a training step but the matmuls and
attention, the bytes of the tensors it reads and writes (views move nothing): what an eager step
streams through memory, one kernel per operator, on CPU as on CUDA. `scripts/count_traffic.py`
reads the `builtin` counts of `sweep.models.traffic` off such steps on small shapes; here they must be
what it reads, and must give the bytes of another shape, with other widths, vocabulary and
depth and a query wider than the hidden size, for each precision and recomputation mode. On GPUs
the same bytes explain why an H100 runs the built-in's steps 8-15 % longer than an H200 with the
same peak FLOPs (tests/models/test_throughput_on_cuda.py).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from sweep.core.catalog import get_model
from sweep.core.model import ModelShape, count_parameters
from sweep.models.traffic import BUILTIN
from sweep.workload.bytes_moved import step_bytes

REPO = Path(__file__).resolve().parents[2]
# other widths than the counts were read from, and a query wider than the hidden size
SHAPE = dataclasses.replace(get_model("tiny-4l"), num_layers=3, hidden_size=384, num_attention_heads=8,
                            num_kv_heads=8, head_dim=64, ffn_hidden_size=1536, vocab_size=1536)
MBS, SEQ, GRAD_ACC = 2, 96, 2


def counted(shape: ModelShape, recompute: str, mixed: bool) -> int:
    return step_bytes(shape, mbs=MBS, seq_len=SEQ, grad_acc=GRAD_ACC, recompute=recompute, mixed=mixed)


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
    assert model == pytest.approx(measured, rel=0.03), f"counted {measured:,} B, sweep.models.traffic says {model:,.0f}"


def test_the_committed_counts_are_what_the_counting_script_reads() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    import count_traffic

    assert count_traffic.differences() == []


def test_eager_kernels_move_several_times_what_fused_ones_do() -> None:
    """Why the built-in needs its own counts: per token and layer it moves 5-8 times the fused
    kernels' 3 · act · (18h + 3F) at the playbook's 3B widths."""
    shape = get_model("playbook-3b")
    fused = 3 * 2 * (18 * shape.hidden_size + 3 * shape.ffn_hidden_size)
    for recompute in ("none", "full"):
        eager = BUILTIN.counts("bf16", recompute).per_token_layer(shape.hidden_size, shape.q_dim,
                                                                  shape.ffn_hidden_size)
        assert 4.0 < eager / fused < 8.0
