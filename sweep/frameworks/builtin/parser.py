"""The built-in workload's `metrics.jsonl`: one JSON object per line (format ``builtin-1``).

The record layout is the shared contract (step records, then one summary record written before
teardown). Unlike a framework's stdout, every line of this file should be a record, so a line that
is not one is reported as a problem (with its line number) instead of being ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sweep.core.state import json_record
from sweep.frameworks.log_parser import LineParser, ParsedLog, StepCollector, StepRecord

FORMAT_VERSION = "builtin-1"


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _integer(record: dict[str, Any], key: str) -> int | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) and float(value).is_integer() else None


class BuiltinParser(LineParser):
    framework = "builtin"

    def match_step(self, line: str) -> StepRecord | None:
        record = json_record(line)
        return _step_record(record) if record is not None else None

    def parse_lines(self, lines: Iterable[str], source: str, truncated: bool = False) -> ParsedLog:
        collector = StepCollector(self.framework, source)
        summary: dict[str, Any] | None = None
        for number, line in enumerate(lines, start=1):
            collector.lines_read = number
            if not line.strip():
                continue
            record = json_record(line)
            kind = record.get("kind") if record is not None else None
            if kind == "summary":
                summary = record
                continue
            step = _step_record(record) if record is not None else None
            if step is not None:
                collector.add_step(step, number)
            elif record is None:
                collector.problems.append(f"{source}:{number}: not a JSON object; skipped")
            elif kind == "step":
                collector.problems.append(f"{source}:{number}: step record without an integer 'step'; skipped")
            # other kinds are allowed: readers ignore records they do not know
        if truncated:
            collector.problems.append(
                f"{source}:{collector.lines_read + 1}: last line has no newline (writer cut off); skipped"
            )
        parsed = collector.result(truncated)
        return replace(parsed, summary=summary) if summary is not None else parsed


def _step_record(record: dict[str, Any]) -> StepRecord | None:
    if record.get("kind") != "step":
        return None
    step = _integer(record, "step")
    if step is None:
        return None
    return StepRecord(
        step=step,
        step_time_s=_number(record, "step_time_s"),
        tokens_per_sec=_number(record, "tokens_per_sec"),
        tokens_per_sec_per_gpu=_number(record, "tokens_per_sec_per_gpu"),
        loss=_number(record, "loss"),
        mfu_pct=_number(record, "mfu_pct"),
        mem_allocated_bytes=_integer(record, "mem_allocated_bytes"),
        mem_reserved_bytes=_integer(record, "mem_reserved_bytes"),
        tokens=_integer(record, "tokens"),
        timestamp=_number(record, "time"),
        format_version=FORMAT_VERSION,
    )
