"""Log parsing: the records every framework parser returns (`sweep.logs.base`), and the parser
of each framework, which lives in its adapter (`sweep/frameworks/<name>/parser.py`).

`get_parser(framework)` is what the watchdog (progress) and collect (metrics) call.
"""

from __future__ import annotations

from sweep.logs.base import LogParseError, LogParser, MemorySample, ParsedLog, StepRecord


def get_parser(framework: str) -> LogParser:
    from sweep.frameworks import get_adapter

    return get_adapter(framework).parser()


__all__ = [
    "LogParseError",
    "LogParser",
    "MemorySample",
    "ParsedLog",
    "StepRecord",
    "get_parser",
]
