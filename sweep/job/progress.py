"""Training progress as the watchdog sees it: new step records in the attempt folder.

Progress is run-wide: every node's watchdog reads the shared attempt folder, that is rank 0's
`metrics.jsonl` (built-in workload) and every node's `logs/node<k>.out/.err` through the
framework's step parser. A node whose own ranks print nothing (Megatron logs from the last
rank, torchtitan from rank 0) therefore still sees the run advance. Files are read
incrementally, so one poll costs a few stat calls when nothing changed. Step times are kept per
step number (the first line seen for a step: several ranks or nodes may print the same one), in
step order, for the watchdog's early-stop rule. A framework that logs a rate but no step time
(torchtitan's tokens/s per device) gets one derived from `tokens_per_step_per_gpu`; a constant
error in that figure does not change the coefficient of variation the rule looks at.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sweep.core.state import METRICS_FILE, json_record

LOGS_DIR = "logs"
StepMatcher = Callable[[str], object | None]  # a line -> a record with `.step` (`.step_time_s`), or None


@dataclass
class FileTail:
    """New complete lines of a growing file; a partial last line waits for its newline."""

    path: Path
    offset: int = 0
    partial: bytes = b""

    def read_lines(self, max_bytes: int = 8 << 20) -> list[str]:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start again
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(max_bytes)
        self.offset += len(chunk)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in lines]


@dataclass
class Progress:
    """The run's progress so far; `last_progress` is on the monotonic clock."""

    attempt_dir: Path
    match_step: StepMatcher | None = None
    steps_seen: int = 0
    last_step: int | None = None
    last_progress: float | None = None
    summary: dict[str, object] | None = None
    tokens_per_step_per_gpu: float | None = None  # derives step times from logged tokens/s/GPU
    step_times: dict[int, float] = field(default_factory=dict)  # step -> seconds, in step order
    _tails: dict[Path, FileTail] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)

    def poll(self) -> int:
        """Read what is new; returns how many step records appeared."""
        new_steps: list[tuple[int, object]] = []  # (step, seconds or None)
        for record in self._records(self.attempt_dir / METRICS_FILE):
            step = record.get("step")
            if record.get("kind") == "step" and isinstance(step, int):
                new_steps.append((step, record.get("step_time_s")))
            elif record.get("kind") == "summary":
                self.summary = record
        if self.match_step is not None:
            for path in self._log_files():
                for line in self._tail(path).read_lines():
                    matched = self.match_step(line)
                    step = getattr(matched, "step", None)
                    if isinstance(step, int):
                        new_steps.append((step, self._seconds(matched)))
        self._keep_times(new_steps)
        if new_steps:
            # Distinct step numbers: every rank of a torchtitan run (--tee) and every node of some
            # frameworks prints each step, and a step is one step however many print it.
            self._seen.update(step for step, _ in new_steps)
            self.steps_seen = len(self._seen)
            previous = [] if self.last_step is None else [self.last_step]
            self.last_step = max([step for step, _ in new_steps] + previous)
            self.last_progress = time.monotonic()
        return len(new_steps)

    def _seconds(self, record: object) -> object:
        """The record's step time, or one derived from its tokens/s per GPU (None: neither)."""
        seconds = getattr(record, "step_time_s", None)
        rate = getattr(record, "tokens_per_sec_per_gpu", None)
        if seconds is None and self.tokens_per_step_per_gpu and isinstance(rate, (int, float)) and rate > 0:
            return self.tokens_per_step_per_gpu / rate
        return seconds

    def _keep_times(self, new_steps: list[tuple[int, object]]) -> None:
        """The first time seen for each step, in step order (a late line from another file re-sorts)."""
        last = next(reversed(self.step_times), None)
        in_order = True
        for step, seconds in new_steps:
            if step in self.step_times or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                continue
            in_order = in_order and (last is None or step > last)
            self.step_times[step] = float(seconds)
            last = step if last is None else max(last, step)
        if not in_order:
            self.step_times = dict(sorted(self.step_times.items()))

    def _tail(self, path: Path) -> FileTail:
        if path not in self._tails:
            self._tails[path] = FileTail(path)
        return self._tails[path]

    def _records(self, path: Path) -> list[dict[str, object]]:
        return [record for line in self._tail(path).read_lines()
                if (record := json_record(line)) is not None]

    def _log_files(self) -> list[Path]:
        try:
            names = os.listdir(self.attempt_dir / LOGS_DIR)
        except FileNotFoundError:
            return []
        return [self.attempt_dir / LOGS_DIR / n for n in sorted(names)
                if n.endswith((".out", ".err"))]


def read_tail(path: Path, max_bytes: int = 256 << 10) -> str:
    """The last `max_bytes` of a file (from a line start), or "" when it does not exist."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except FileNotFoundError:
        return ""
    if size > max_bytes:
        data = data.partition(b"\n")[2]
    return data.decode(errors="replace")
