"""The built-in workload (sweep.workload): a Llama-style model on PyTorch's own parallelism APIs."""

from __future__ import annotations

from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.builtin import capabilities
from sweep.frameworks.builtin.parser import BuiltinParser

ADAPTER = FrameworkAdapter(
    name="builtin",
    description="llm-sweep's own PyTorch workload: FSDP2, DTensor TP/SP, "
                "torch.distributed.pipelining; metrics.jsonl per step",
    parser=BuiltinParser,
    flops_convention="full_attention",
    versions=(SupportedVersion("bundled", "the sweep.workload of this llm-sweep installation"),),
    default_version="bundled",
    capabilities=capabilities.RULES,
    zero_stages=(0, 1, 2, 3),
)
