"""Megatron-LM (pretrain_gpt.py of a checkout, on megatron-core)."""

from __future__ import annotations

from sweep.core.model import ModelShape
from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.megatron import capabilities
from sweep.frameworks.megatron.parser import MegatronParser
from sweep.models.pipeline_stages import megatron_extra_layers


def pipeline_fits(model: ModelShape, stages: int) -> bool:
    """Megatron splits the layers evenly over the stages, optionally counting the loss, then the
    embedding too, as one layer each (--account-for-loss/embedding-in-pipeline-split, which
    launch/megatron.args renders when needed)."""
    return stages <= model.num_layers and megatron_extra_layers(model.num_layers, stages) is not None


ADAPTER = FrameworkAdapter(
    name="megatron",
    description="Megatron-LM's pretrain_gpt.py with mock data, launched by torchrun",
    parser=MegatronParser,
    versions=(SupportedVersion(
        "core_r0.17+",
        "megatron-core 0.17 and later (a Megatron-LM checkout of tag core_v0.17.0 or newer, "
        "main of 2026 included)",
        tested_with=("megatron-core 0.17.1", "megatron-core 0.19.2")),),
    default_version="core_r0.17+",
    capabilities=capabilities.RULES,
    zero_stages=(0, 1),
    entry_point="pretrain_gpt.py",
    checkout_env="MEGATRON_DIR",
    package="megatron-core",
    pipeline_fits=pipeline_fits,
    grad_reduce_bytes=2,  # reduces in bf16 unless --accumulate-allreduce-grads-in-fp32
    notes=(
        ("Every run needs Transformer Engine: launch/megatron.args names --transformer-impl "
         "transformer_engine (Megatron's default); fp8 (--fp8-format hybrid) also needs a GPU of "
         "compute capability 8.9 or newer."),
        ("The launch arguments are launch/megatron.args, one per line; the contract test runs "
         "them through Megatron's own parse_args and validate_args."),
    ),
)
