"""Megatron-LM (pretrain_gpt.py of a checkout, on megatron-core)."""

from __future__ import annotations

from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.megatron import capabilities
from sweep.frameworks.megatron.parser import MegatronParser

ADAPTER = FrameworkAdapter(
    name="megatron",
    description="Megatron-LM's pretrain_gpt.py with mock data, launched by torchrun",
    parser=MegatronParser,
    flops_convention="megatron",
    versions=(SupportedVersion("core_r0.17+", "megatron-core 0.17 and later, Megatron-LM main "
                                              "of 2026"),),
    default_version="core_r0.17+",
    capabilities=capabilities.RULES,
    zero_stages=(0, 1),
    entry_point="pretrain_gpt.py",
    checkout_env="MEGATRON_DIR",
)
