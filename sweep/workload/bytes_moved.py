"""The bytes a training step of the built-in workload moves through memory, operator by operator.

A `TorchDispatchMode` sees every ATen operator a step runs. For each one that is not a matmul or
attention (their time is the FLOP count's) and not a view (a view moves nothing), it adds the
bytes of the tensors it reads and writes. An eager step launches one kernel per operator, so
this is what it streams through memory, on CPU as on CUDA, up to what a cache keeps. The
throughput model's counts for the built-in workload (`sweep.models.traffic.BUILTIN`) are read off
these figures by `scripts/count_traffic.py`; tests/workload/test_memory_traffic.py checks them on
a shape they were not read from.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Final

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sweep.core.model import ModelShape, count_parameters
from sweep.workload.model import build, cross_entropy
from sweep.workload.parallel import apply_recompute

# compute-bound operators (their time is the FLOP count's), and `_unsafe_view`, a view the
# schema does not mark as one
NOT_MEMORY_BOUND: Final = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "_unsafe_view",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"})


class BytesMoved(TorchDispatchMode):
    """Bytes read and written by the memory-bound operators run under it, by operator."""

    def __init__(self) -> None:
        super().__init__()
        self.by_operator: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        views = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
        if name in NOT_MEMORY_BOUND or views:
            return out
        read = sum(t.nbytes for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor))
        written = sum(t.nbytes for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        self.by_operator[name] += read + written
        return out

    @property
    def total(self) -> int:
        return sum(self.by_operator.values())


def step_bytes(shape: ModelShape, *, mbs: int, seq_len: int, grad_acc: int, recompute: str,
               mixed: bool) -> int:
    """Bytes of the forward and backward passes of one step of `grad_acc` micro-batches, on CPU,
    with bf16 autocast (`mixed`) or in fp32; the gradients already exist, as in every step but a
    run's first (the optimizer step is a term of its own in the throughput model)."""
    model = build(shape, 1)
    apply_recompute(model, recompute)
    tokens = torch.randint(0, shape.vocab_size, (mbs, seq_len), generator=torch.Generator().manual_seed(0))

    def micro_batch() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            loss = cross_entropy(model(tokens), tokens)
        (loss / grad_acc).backward()

    micro_batch()
    for param in model.parameters():
        param.grad = None
    moved = BytesMoved()
    with moved:
        for _ in range(grad_acc):
            micro_batch()
    return moved.total


# The shapes the counts are read from: widths varied one at a time around a small Llama block
# (tiny-4l's, with a 1024-entry vocabulary), and the lengths the bytes are linear in.
_BASE: Final = {"hidden_size": 256, "num_attention_heads": 4, "num_kv_heads": 4, "head_dim": 64,
                "ffn_hidden_size": 1024, "vocab_size": 1024}
_WIDER: Final = {"ffn": {"ffn_hidden_size": 2048},
                 "query": {"num_attention_heads": 6, "num_kv_heads": 6},  # q = 384, h = 256
                 "hidden": {"hidden_size": 512, "num_attention_heads": 8, "num_kv_heads": 8}}
_MBS, _GRAD_ACC, _SEQS, _LAYERS, _VOCABS = 2, 2, (64, 128), (2, 4), (1024, 2048)


def count_builtin_traffic(base: ModelShape, mixed: bool, recompute: str) -> dict[str, float]:
    """The `sweep.models.traffic.TrafficCounts` fields of the built-in workload, read off `step_bytes`.

    The bytes of a step are linear in the layers, the tokens and the widths: per layer, tokens ×
    (hidden·h + query·q + ffn·F + fixed) + micro-batches × layer parameters × layer_param; outside
    the layers, tokens × (outside·h + logit·V) + micro-batches × (embedding + head parameters) ×
    head_param. Differences between two depths, two lengths, two vocabularies and one width at a
    time give each coefficient exactly (up to whole bytes)."""
    def shape(layers: int, **wider: int) -> ModelShape:
        widths: dict[str, Any] = {**_BASE, **wider, "num_layers": layers}
        return dataclasses.replace(base, **widths)

    def run(s: ModelShape, seq: int) -> int:
        return step_bytes(s, mbs=_MBS, seq_len=seq, grad_acc=_GRAD_ACC, recompute=recompute, mixed=mixed)

    def per_layer(**wider: int) -> tuple[float, float]:
        """Bytes per token and layer, and per layer parameter and micro-batch."""
        (short, long), tokens = _SEQS, [_GRAD_ACC * _MBS * s for s in _SEQS]
        deep, shallow = _LAYERS[1], _LAYERS[0]
        per = [(run(shape(deep, **wider), s) - run(shape(shallow, **wider), s)) / (deep - shallow)
               for s in (short, long)]
        per_token = (per[1] - per[0]) / (tokens[1] - tokens[0])
        params = count_parameters(shape(1, **wider)).per_layer
        return per_token, (per[0] - per_token * tokens[0]) / (_GRAD_ACC * params)

    base_token, layer_param = per_layer()
    ffn = (per_layer(**_WIDER["ffn"])[0] - base_token) / _BASE["ffn_hidden_size"]
    query = (per_layer(**_WIDER["query"])[0] - base_token) / (6 * 64 - 4 * 64)
    hidden = (per_layer(**_WIDER["hidden"])[0] - base_token) / 256 - query  # q grew with h
    fixed = base_token - hidden * 256 - query * 256 - ffn * _BASE["ffn_hidden_size"]

    def outside_layers(vocab: int, seq: int) -> float:
        s = shape(_LAYERS[0], vocab_size=vocab)
        return run(s, seq) - _LAYERS[0] * (_GRAD_ACC * _MBS * seq * base_token
                                           + _GRAD_ACC * count_parameters(s).per_layer * layer_param)

    tokens = [_GRAD_ACC * _MBS * s for s in _SEQS]
    per_vocab = [(outside_layers(_VOCABS[1], s) - outside_layers(_VOCABS[0], s)) / (_VOCABS[1] - _VOCABS[0])
                 for s in _SEQS]
    logit = (per_vocab[1] - per_vocab[0]) / (tokens[1] - tokens[0])
    head_param = (per_vocab[0] - logit * tokens[0]) / (_GRAD_ACC * 2 * _BASE["hidden_size"])
    rest = outside_layers(_VOCABS[0], _SEQS[0]) - _VOCABS[0] * (logit * tokens[0]
                                                                + _GRAD_ACC * 2 * _BASE["hidden_size"] * head_param)
    outside = rest / (tokens[0] * _BASE["hidden_size"])
    return {"hidden": hidden, "query": query, "ffn": ffn, "fixed": fixed, "outside": outside,
            "logit": logit, "layer_param": layer_param, "head_param": head_param}
