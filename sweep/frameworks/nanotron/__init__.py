"""nanotron (run_train.py of a checkout, with a rendered YAML config)."""

from __future__ import annotations

from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.nanotron import capabilities
from sweep.frameworks.nanotron.parser import NanotronParser

ADAPTER = FrameworkAdapter(
    name="nanotron",
    description="nanotron's run_train.py with a rendered YAML config, launched by torchrun",
    parser=NanotronParser,
    flops_convention="full_attention",
    versions=(SupportedVersion("main-2025-03-26+", "nanotron main from 2025-03-26 on"),),
    default_version="main-2025-03-26+",
    capabilities=capabilities.RULES,
    zero_stages=(0, 1),
    entry_point="run_train.py",
    checkout_env="NANOTRON_DIR",
)
