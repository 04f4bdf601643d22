"""Applying a layout to a model: the (pp, dp, cp, tp) device mesh, TP/SP, recomputation, ZeRO.

Order (torchtitan's): pipeline split (sweep.workload.pipeline), then the tensor-parallel plan,
then activation checkpointing, then the data-parallel wrapper. Gradients are averaged over the
flattened dp×cp mesh: context-parallel ranks see different tokens of the same sequences, so for
the weights they are data-parallel replicas.

ZeRO stages: 0 = DDP, 1 = ZeroRedundancyOptimizer + DDP, 2/3 = FSDP2 `fully_shard` with
`reshard_after_forward` False/True. Where DDP cannot go, ZeRO 0/1 all-reduce the gradients
after backward instead (same arithmetic, no overlap): with tp > 1 (DDP cannot hold DTensor
parameters) and with pp > 1 (DDP's reducer fails when a pipeline schedule runs several
micro-batch backwards per step: "rebuilt parameter indices size is not same as original model
parameters size").

FSDP, DTensor, ZeroRedundancyOptimizer and checkpointing are imported where they are used: each
costs seconds of start-up, and a plain DDP run needs none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from sweep.core.layout import Layout
from sweep.workload.model import ContextParallel, Transformer, TransformerBlock

MESH_DIMS = ("pp", "dp", "cp", "tp")

# AdamW settings of the benchmark (PyTorch-on-CPU measurements (torch 2.13): lr 3e-3, wd 0.1).
LR = 3e-3
WEIGHT_DECAY = 0.1


def layout_modules(layout: Layout) -> list[str]:
    """The modules that building `layout` imports where they are used."""
    modules = ["torch._dynamo"]  # the optimizer's first call imports it (torch._disable_dynamo)
    if layout.tp > 1:
        modules += ["torch.distributed.tensor", "torch.distributed.tensor.parallel"]
    if layout.recompute != "none":
        modules += ["torch.utils.checkpoint", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"]
    if layout.zero_stage in (2, 3):
        modules.append("torch.distributed.fsdp")
    elif layout.zero_stage == 1:
        modules.append("torch.distributed.optim")
    if layout.pp > 1:
        modules.append("sweep.workload.pipeline")
    return modules


def import_layout_modules(layout: Layout) -> None:
    """Import them now. A rank does so before its memory baseline (code is not training memory,
    and tens of MB of it would otherwise count as the run's); the launcher, before it forks the
    ranks (sweep.workload.launch), so that they start with it loaded."""
    for name in layout_modules(layout):
        importlib.import_module(name)


@dataclass(frozen=True)
class Mesh:
    """This rank's view of the (pp, dp, cp, tp) mesh."""

    mesh: DeviceMesh
    dp_cp: DeviceMesh  # dp and cp flattened: the gradient-averaging group

    def rank(self, dim: str) -> int:
        return self.mesh.get_local_rank(dim)

    def size(self, dim: str) -> int:
        return self.mesh.size(MESH_DIMS.index(dim))


def build_mesh(layout: Layout, device_type: str) -> Mesh:
    mesh = init_device_mesh(device_type, (layout.pp, layout.dp, layout.cp, layout.tp),
                            mesh_dim_names=MESH_DIMS)
    return Mesh(mesh=mesh, dp_cp=mesh["dp", "cp"]._flatten("dp_cp"))


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style TP with DTensor: column-parallel in, row-parallel out; SP shards norms by sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sequence_parallel else Replicate()
    root: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        root["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.norm is not None and sequence_parallel:
        root["norm"] = SequenceParallel()
    if model.output is not None:
        root["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate(),
                                         use_local_output=True)
    if root:
        parallelize_module(model, tp_mesh, root)
    if model.tok_embeddings is not None and model.output is not None and model.shape.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight  # both Shard(0) over the vocabulary
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                     "attention": gather, "feed_forward": gather}
        parallelize_module(block, tp_mesh, plan)


def apply_context_parallel(model: Transformer, cp_mesh: DeviceMesh) -> None:
    cp = ContextParallel(group=cp_mesh.get_group(), rank=cp_mesh.get_local_rank(), size=cp_mesh.size())
    for block in model.layers.values():
        cast(TransformerBlock, block).attention.cp = cp  # a ModuleDict's values are typed nn.Module


def _saved_ops() -> list[Any]:
    """Ops whose outputs selective recomputation keeps: the matmuls and the attention kernels."""
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    aten = torch.ops.aten
    return [aten.mm.default] + [getattr(aten, n).default for n in names if hasattr(aten, n)]


def _selective_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_saved_ops())


def apply_recompute(model: Transformer, mode: str) -> None:
    """full: recompute each whole block in backward; selective (torchtitan's "op" SAC): keep
    matmul and attention outputs, recompute the cheap rest (norms, RoPE, SiLU, products)."""
    if mode == "none":
        return
    if mode not in ("selective", "full"):
        raise ValueError(f"layout.recompute: unknown mode {mode!r}; use none, selective or full")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in list(model.layers.items()):
        if mode == "full":
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False,
                                                    context_fn=_selective_context)


class DataParallel:
    """The data-parallel wrapper of one model chunk, with its grad-accumulation switch."""

    def __init__(self, module: nn.Module, zero_stage: int, dp_cp: DeviceMesh, tensor_parallel: bool,
                 pipeline: bool, device: torch.device) -> None:
        self.zero_stage = zero_stage
        self.group = dp_cp.get_group()
        self.replicas = dp_cp.size()
        self.manual_allreduce = False
        self.fsdp = zero_stage in (2, 3)
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            for block in cast(nn.ModuleDict, module.layers).values():
                fully_shard(block, mesh=dp_cp, reshard_after_forward=zero_stage == 3)
            fully_shard(module, mesh=dp_cp, reshard_after_forward=zero_stage == 3)
        elif self.replicas > 1 and (tensor_parallel or pipeline):
            if zero_stage == 1 and tensor_parallel:
                raise ValueError("layout: zero_stage 1 with tp > 1 is not supported by the built-in "
                                 "workload (ZeroRedundancyOptimizer cannot shard DTensor parameters); "
                                 "use zero_stage 2 or 3")
            self.manual_allreduce = True
        elif self.replicas > 1:
            device_ids = [device.index] if device.type == "cuda" else None
            module = DistributedDataParallel(module, process_group=self.group, device_ids=device_ids)
        self.module = module

    @contextmanager
    def accumulate(self, sync: bool) -> Iterator[None]:
        """Skip the gradient reduction on all but the last micro-batch."""
        if self.fsdp:
            self.module.set_requires_gradient_sync(sync)  # type: ignore[operator]
            yield
        elif isinstance(self.module, DistributedDataParallel) and not sync:
            with self.module.no_sync():
                yield
        else:
            with nullcontext():
                yield

    def finish_gradients(self) -> None:
        """The plain all-reduce where DDP cannot be used (DDP does this inside backward)."""
        if not self.manual_allreduce:
            return
        from torch.distributed.tensor import DTensor

        for param in self.module.parameters():
            if param.grad is None:
                continue
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=self.group)
            grad.div_(self.replicas)


def build_optimizer(modules: list[nn.Module], zero_stage: int, dp_cp: DeviceMesh) -> torch.optim.Optimizer:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    if zero_stage == 1 and dp_cp.size() > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=dp_cp.get_group(), lr=LR,
                                       weight_decay=WEIGHT_DECAY)
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)
