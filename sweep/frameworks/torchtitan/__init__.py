"""torchtitan (python -m torchtitan.train), launched by torchrun, in two forms chosen by version.

- 0.3.0 and main (`v0.3`, the default, and `main`): each run is a small Python config module
  (templates/launch/torchtitan.config.py.j2) that builds torchtitan's own `Trainer.Config`, with
  the model described by its dimensions, started with `--module <the module> --config
  llm_sweep_config`. ZeRO-0 = HSDP with a shard degree of 1 (0.3 has no DDP path), ZeRO-2/3 =
  FSDP2 over dp·ep with reshard_after_forward never/always; TP with or without sequence
  parallelism (the layout's sp); EP borrows its ranks from the FSDP region.
- 0.2.x (`v0.2`, `v0.2.0`): a JobConfig TOML (templates/launch/torchtitan.toml.j2) naming a llama3
  flavor. ZeRO-0 = DDP; TP is always sequence-parallel.

In both, interleaved 1F1B has two stages per rank and selective recompute is torchtitan's per-op
selective AC ("op").
"""

from __future__ import annotations

from sweep.core.model import ModelShape
from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.torchtitan import capabilities
from sweep.frameworks.torchtitan.parser import TorchtitanParser
from sweep.frameworks.torchtitan.version import MAIN, MAIN_PIN, V02, V020, V03


def pipeline_fits(model: ModelShape, stages: int) -> bool:
    """torchtitan weighs the embedding and the output as one layer each when it splits the
    model into stages: stages <= L + 2."""
    return stages <= model.num_layers + 2


ADAPTER = FrameworkAdapter(
    name="torchtitan",
    description="torchtitan's trainer (python -m torchtitan.train), launched by torchrun",
    parser=TorchtitanParser,
    versions=(
        SupportedVersion(V03, "torchtitan 0.3.0 (PyPI, 2026-09-03; Python config registries, "
                              "--module/--config)",
                         tested_with=("0.3.0",)),
        SupportedVersion(MAIN, f"torchtitan main from 73aed7f6c (2026-08-20) up to "
                               f"{MAIN_PIN[:9]} (2026-08-21)",
                         tested_with=(MAIN_PIN[:9],)),
        SupportedVersion(V02, "torchtitan 0.2.1 or 0.2.2 (a checkout from e61f2cce4, "
                              "2025-10-29, to before 9810191bb, 2026-02-23)",
                         tested_with=("0.2.1", "0.2.2")),
        SupportedVersion(V020, "torchtitan 0.2.0 (a checkout from 8a2686c4a, 2025-09-30, "
                               "to before e61f2cce4, 2025-10-29)",
                         tested_with=("0.2.0",)),
    ),
    default_version=V03,
    capabilities=capabilities.RULES,
    zero_stages=(0, 2, 3),
    entry_point="torchtitan/train.py",
    checkout_env="TORCHTITAN_DIR",
    package="torchtitan",
    pipeline_fits=pipeline_fits,
    grad_reduce_bytes=4,  # FSDP2's mixed precision reduces in fp32 (mixed_precision_reduce)
    notes=(
        "torchtitan 0.3.0 (the default) and main up to b5bcd76c6 get a Python config module "
        "(--module/--config) built with torchtitan's own config API; 0.2.x gets the JobConfig "
        "TOML with run.framework_version: v0.2 (or v0.2.0). A later main or release is refused "
        "by the job's version check, by name.",
        "On 0.3 and main a model is built by its dimensions: dense models as torchtitan's llama3 "
        "family, MoE models (SwiGLU experts, top-k softmax routing, GQA: Mixtral) as its qwen3 "
        "MoE family without QK-norm; run.moe sets the load balancing and expert TP. On 0.2 only "
        "the llama3 flavors 8B/70B/405B run (matched by exact shape) and EP is pruned.",
        "0.3 and main attend with FlexAttention's block-causal mask over the packed documents "
        "(sdpa is no longer offered for language models), use the chunked cross-entropy loss and "
        "fused QKV; the 0.3/main form is checked against torchtitan's own config code, not yet "
        "run on a GPU.",
        "The benchmark data and tokenizer are the checkout's tests/assets (c4_test, the test "
        "tokenizer; token ids stay below the model's vocabulary), so run.framework_dir names a "
        "torchtitan source tree at every version.",
        "torchtitan's logged mfu divides by the device's bf16 peak at every dtype "
        "(utils.get_peak_flops); llm-sweep's own MFU uses the run's dtype.",
    ),
)
