"""torchtitan 0.2.x (torchtitan.train with a rendered JobConfig TOML), launched by torchrun.

What the layout columns mean here (templates/launch/torchtitan.toml.j2): ZeRO-0 = DDP, ZeRO-2/3 =
FSDP2 with reshard_after_forward never/always; TP is always sequence-parallel; interleaved 1F1B
has two stages per rank; selective recompute is torchtitan's per-op selective AC ("op").
"""

from __future__ import annotations

from sweep.core.model import ModelShape
from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.torchtitan import capabilities
from sweep.frameworks.torchtitan.parser import TorchtitanParser
from sweep.frameworks.torchtitan.version import V02, V020


def pipeline_fits(model: ModelShape, stages: int) -> bool:
    """torchtitan weighs the embedding and the output as one layer each when it splits the
    model into stages: stages <= L + 2."""
    return stages <= model.num_layers + 2


ADAPTER = FrameworkAdapter(
    name="torchtitan",
    description="torchtitan's trainer (python -m torchtitan.train), launched by torchrun",
    parser=TorchtitanParser,
    flops_convention="full_attention",
    versions=(
        SupportedVersion(V02, "torchtitan 0.2.1 or 0.2.2 (a checkout from e61f2cce4, "
                              "2025-10-29, to before 9810191bb, 2026-02-23)",
                         tested_with=("0.2.1", "0.2.2")),
        SupportedVersion(V020, "torchtitan 0.2.0 (a checkout from 8a2686c4a, 2025-09-30, "
                               "to before e61f2cce4, 2025-10-29)",
                         tested_with=("0.2.0",)),
    ),
    default_version=V02,
    capabilities=capabilities.RULES,
    zero_stages=(0, 2, 3),
    entry_point="torchtitan/train.py",
    checkout_env="TORCHTITAN_DIR",
    package="torchtitan",
    pipeline_fits=pipeline_fits,
    grad_reduce_bytes=4,  # FSDP2's mixed precision reduces in fp32 (mixed_precision_reduce)
    notes=(
        "torchtitan 0.3.0 and main since 9810191bb (2026-02-23) configure runs with Python "
        "config registries (--module/--config); llm-sweep renders the 0.2 JobConfig only and "
        "the job refuses to start on a newer torchtitan.",
        "Models are torchtitan's llama3 flavors 8B/70B/405B, matched by exact shape; any other "
        "model is pruned (torchtitan cannot build a model from dimensions).",
        "The benchmark data and tokenizer are the checkout's tests/assets (c4_test, the test "
        "tokenizer; token ids stay below the model's 128256-entry vocabulary).",
        "torchtitan's logged mfu divides by the device's bf16 peak at every dtype "
        "(utils.get_peak_flops); llm-sweep's own MFU uses the run's dtype.",
    ),
)
