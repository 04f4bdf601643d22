"""The built-in workload (sweep.workload): a Llama-style model on PyTorch's own parallelism APIs."""

from __future__ import annotations

from sweep.core.model import ModelShape
from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.builtin import capabilities
from sweep.frameworks.builtin.parser import BuiltinParser


def pipeline_fits(model: ModelShape, stages: int) -> bool:
    """torch.distributed.pipelining splits the decoder layers only (at least one per stage), and
    a tied embedding cannot live on two stages."""
    return stages <= model.num_layers and not model.tie_word_embeddings


ADAPTER = FrameworkAdapter(
    name="builtin",
    description="llm-sweep's own PyTorch workload: FSDP2, DTensor TP/SP, "
                "torch.distributed.pipelining; metrics.jsonl per step",
    parser=BuiltinParser,
    versions=(SupportedVersion("bundled", "the sweep.workload of this llm-sweep installation"),),
    default_version="bundled",
    capabilities=capabilities.RULES,
    zero_stages=(0, 1, 2, 3),
    pipeline_fits=pipeline_fits,
    expert_parallel=False,
    shards_need_divisibility=True,  # the FFN and the vocabulary are sharded without padding
    one_f_one_b_microbatch_offset=0,  # torch's Schedule1F1B needs grad_acc >= pp
    writes_metrics_file=True,
    bundled=True,
    kernels="eager",
    grad_reduce_bytes=4,  # fp32 weights and gradients (autocast computes in bf16)
)
