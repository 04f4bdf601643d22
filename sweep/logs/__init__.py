"""One parser per framework: log lines -> step metrics (see sweep/logs/base.py for the records).

`get_parser(framework)` is what the watchdog (progress) and collect (metrics) call.
"""

from __future__ import annotations

from sweep.logs.base import LogParseError, LogParser, MemorySample, ParsedLog, StepRecord
from sweep.logs.builtin import BuiltinParser
from sweep.logs.megatron import MegatronParser
from sweep.logs.nanotron import NanotronParser
from sweep.logs.torchtitan import TorchtitanParser

FRAMEWORKS: dict[str, type[LogParser]] = {
    "builtin": BuiltinParser,
    "megatron": MegatronParser,
    "nanotron": NanotronParser,
    "torchtitan": TorchtitanParser,
}


def get_parser(framework: str) -> LogParser:
    try:
        return FRAMEWORKS[framework]()
    except KeyError:
        known = ", ".join(sorted(FRAMEWORKS))
        raise ValueError(f"no log parser for framework {framework!r}; known frameworks: {known}") from None


__all__ = [
    "FRAMEWORKS",
    "LogParseError",
    "LogParser",
    "MemorySample",
    "ParsedLog",
    "StepRecord",
    "get_parser",
]
