"""torchtitan (torchtitan.train, configured on the command line)."""

from __future__ import annotations

from sweep.frameworks.base import FrameworkAdapter, SupportedVersion
from sweep.frameworks.torchtitan import capabilities
from sweep.frameworks.torchtitan.parser import TorchtitanParser

ADAPTER = FrameworkAdapter(
    name="torchtitan",
    description="torchtitan's trainer (python -m torchtitan.train), launched by torchrun",
    parser=TorchtitanParser,
    flops_convention="full_attention",
    versions=(SupportedVersion("v0.2", "torchtitan 0.2.x"),),
    default_version="v0.2",
    capabilities=capabilities.RULES,
    zero_stages=(0, 2, 3),
    checkout_env="TORCHTITAN_DIR",
)
