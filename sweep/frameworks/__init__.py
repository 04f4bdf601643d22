"""The framework adapters: one folder per framework, and the registry that names them.

Adding a framework = adding `sweep/frameworks/<name>/` (an `ADAPTER`, a parser, a capability
table) and `templates/launch/<name>.*.j2`, then listing it in `ADAPTER_MODULES`, in the spec's
`sweep.core.layout.FRAMEWORKS`, and giving it a memory profile (`sweep.models.memory_profiles.PROFILES`).
Nothing else in llm-sweep decides by a framework's name: it asks the adapter.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Final

from sweep.frameworks.base import FrameworkAdapter
from sweep.frameworks.log_parser import LogParser

ADAPTER_MODULES: Final = ("megatron", "nanotron", "torchtitan", "builtin")


@cache
def get_adapter(name: str) -> FrameworkAdapter:
    if name not in ADAPTER_MODULES:
        raise ValueError(f"unknown framework {name!r}; known frameworks: "
                         f"{', '.join(sorted(ADAPTER_MODULES))}")
    adapter: FrameworkAdapter = importlib.import_module(f"sweep.frameworks.{name}").ADAPTER
    return adapter


def get_parser(framework: str) -> LogParser:
    """The log parser of a framework: what the watchdog (progress) and collect (metrics) call."""
    return get_adapter(framework).parser()


def all_adapters() -> tuple[FrameworkAdapter, ...]:
    return tuple(get_adapter(name) for name in ADAPTER_MODULES)


__all__ = ["ADAPTER_MODULES", "FrameworkAdapter", "all_adapters", "get_adapter", "get_parser"]
