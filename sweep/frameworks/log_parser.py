"""What every framework parser returns, and the file handling they share.

A parser turns one line into a `StepRecord` (or None), and a whole log into a `ParsedLog`. The
watchdog calls `match_step` on each new line to see progress; collect calls `parse_file` once per
attempt. Values are kept exactly as logged (no rounding); a field the framework does not log is
None, never 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Protocol, runtime_checkable

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class LogParseError(Exception):
    """A log that cannot be read at all (missing, a directory, not text)."""


@dataclass(frozen=True)
class StepRecord:
    """One logged training step (or logging interval, for frameworks that log every N steps)."""

    step: int
    step_time_s: float | None = None
    tokens_per_sec: float | None = None  # global
    tokens_per_sec_per_gpu: float | None = None
    loss: float | None = None
    mfu_pct: float | None = None  # as the framework computed it (its own FLOPs convention)
    mem_allocated_bytes: int | None = None  # peak allocated (CUDA max_memory_allocated)
    mem_reserved_bytes: int | None = None  # peak reserved (CUDA max_memory_reserved)
    total_steps: int | None = None
    tflops_per_gpu: float | None = None  # model TFLOP/s per GPU as the framework reports it
    grad_norm: float | None = None
    learning_rate: float | None = None
    global_batch_size: int | None = None
    tokens: int | None = None  # global tokens in this step (builtin only)
    skipped_iterations: int | None = None  # Megatron: fp16 loss-scale skips in the interval
    timestamp: float | None = None  # unix seconds; log times carry no zone and are read as UTC
    rank: int | None = None  # the rank prefix of the line ([rankN]:), when there is one
    format_version: str = ""


@dataclass(frozen=True)
class MemorySample:
    """A memory report line that is not a step line (Megatron `memory (MB)`, nanotron `Memory usage`)."""

    allocated_bytes: int | None = None
    max_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    max_reserved_bytes: int | None = None
    rank: int | None = None
    after_step: int | None = None


@dataclass(frozen=True)
class ParsedLog:
    """Everything a parser got out of one log; `problems` says what it had to skip and where."""

    framework: str
    source: str
    steps: tuple[StepRecord, ...] = ()
    memory: tuple[MemorySample, ...] = ()
    format_versions: tuple[str, ...] = ()
    lines_read: int = 0
    truncated: bool = False  # the last line had no newline: a writer was cut off; it was skipped
    problems: tuple[str, ...] = ()
    summary: dict[str, object] | None = None  # builtin: the metrics.jsonl summary record
    duplicate_steps: int = 0  # identical step lines (one per node or rank) that were dropped

    @property
    def format_version(self) -> str:
        """The one format seen, "mixed:a,b" when the log changed format, "" when no step was found."""
        if len(self.format_versions) == 1:
            return self.format_versions[0]
        return "mixed:" + ",".join(self.format_versions) if self.format_versions else ""

    @property
    def last_step(self) -> int | None:
        return max((r.step for r in self.steps), default=None)

    @property
    def peak_mem_allocated_bytes(self) -> int | None:
        """Peak allocated over step records and memory lines (the max over every rank that logged)."""
        values = [r.mem_allocated_bytes for r in self.steps]
        values += [m.max_allocated_bytes for m in self.memory]
        return max((v for v in values if v is not None), default=None)

    @property
    def peak_mem_reserved_bytes(self) -> int | None:
        values = [r.mem_reserved_bytes for r in self.steps]
        values += [m.max_reserved_bytes for m in self.memory]
        return max((v for v in values if v is not None), default=None)


@runtime_checkable
class LogParser(Protocol):
    framework: str

    def match_step(self, line: str) -> StepRecord | None: ...

    def parse_text(self, text: str, source: str = "<text>") -> ParsedLog: ...

    def parse_file(self, path: str | Path) -> ParsedLog: ...


def strip_ansi(line: str) -> str:
    return ANSI_ESCAPE.sub("", line)


def to_float(text: str) -> float | None:
    """A logged number ("1,786", "1.412743E+01", "nan"); None when it is not one ("N/A")."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def ms_to_s(text: str) -> float | None:
    """Milliseconds as logged -> seconds, in decimal so that "123742.4" gives 123.7424, not 123.74239999999999."""
    try:
        value = Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None
    return float(value / 1000) if value.is_finite() else None


def to_int(text: str) -> int | None:
    value = to_float(text)
    return int(value) if value is not None and value.is_integer() else None


def utc_timestamp(text: str, fmt: str) -> float | None:
    try:
        return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


class LineParser:
    """The shared whole-log logic; a framework parser overrides `match_step` and `match_memory`."""

    framework = "base"

    def match_step(self, line: str) -> StepRecord | None:
        raise NotImplementedError

    def match_memory(self, line: str) -> MemorySample | None:
        return None

    def parse_lines(self, lines: Iterable[str], source: str, truncated: bool = False) -> ParsedLog:
        collector = StepCollector(self.framework, source)
        for number, line in enumerate(lines, start=1):
            collector.lines_read = number
            try:
                record = self.match_step(line)
                memory = None if record is not None else self.match_memory(line)
            except (ValueError, KeyError, TypeError) as exc:  # a parser bug must not stop collect
                collector.problems.append(f"{source}:{number}: unreadable line skipped ({exc})")
                continue
            if record is not None:
                collector.add_step(record, number)
            elif memory is not None:
                collector.memory.append(memory)
        if truncated:
            collector.problems.append(
                f"{source}:{collector.lines_read + 1}: last line has no newline (writer cut off); skipped"
            )
        return collector.result(truncated)

    def parse_text(self, text: str, source: str = "<text>") -> ParsedLog:
        lines = text.split("\n")
        truncated = bool(lines[-1])  # text that does not end with a newline ends with a partial line
        return self.parse_lines(lines[:-1], source, truncated)

    def parse_file(self, path: str | Path) -> ParsedLog:
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise LogParseError(f"{path}: log file not found") from None
        except IsADirectoryError:
            raise LogParseError(f"{path}: is a directory, expected a {self.framework} log file") from None
        except OSError as exc:
            raise LogParseError(f"{path}: cannot read log file ({exc.strerror})") from None
        if b"\0" in data[:4096]:
            raise LogParseError(f"{path}: binary data, not a {self.framework} text log")
        return self.parse_text(data.decode("utf-8", errors="replace"), source=str(path))


@dataclass
class StepCollector:
    """Accumulates step records: keeps the lowest rank's lines and drops repeated steps."""

    framework: str
    source: str
    steps: list[StepRecord] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    lines_read: int = 0
    duplicates: int = 0
    _by_step: dict[int, StepRecord] = field(default_factory=dict)
    _rank: int | None = None

    def add_step(self, record: StepRecord, line_no: int) -> None:
        # Several ranks may log the same step; keep the lowest rank's lines (rank 0 when present).
        rank = record.rank if record.rank is not None else 0
        if self._rank is None or rank < self._rank:
            if self._rank is not None:  # a lower rank's lines replace what was kept so far
                self.steps, self._by_step, self.versions, self.duplicates = [], {}, [], 0
            self._rank = rank
        elif rank > self._rank:
            return
        seen = self._by_step.get(record.step)
        if seen is not None:
            if replace(seen, timestamp=None) == replace(record, timestamp=None):
                self.duplicates += 1
            else:
                self.problems.append(
                    f"{self.source}:{line_no}: step {record.step} logged again with other values "
                    "(a restart?); the first one is kept"
                )
            return
        self._by_step[record.step] = record
        self.steps.append(record)
        if record.format_version and record.format_version not in self.versions:
            self.versions.append(record.format_version)

    def result(self, truncated: bool) -> ParsedLog:
        return ParsedLog(
            framework=self.framework,
            source=self.source,
            steps=tuple(self.steps),
            memory=tuple(self.memory),
            format_versions=tuple(self.versions),
            lines_read=self.lines_read,
            truncated=truncated,
            problems=tuple(self.problems),
            duplicate_steps=self.duplicates,
        )
