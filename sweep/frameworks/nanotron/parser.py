"""nanotron step lines: `<date> <time> [LEVEL|tags]: iteration: N / T | key: value | ...`.

Format versions (fixtures in tests/fixtures/logs/nanotron_steps_*.log):
- ``nanotron-2024``: date `MM/DD/YYYY`, tag `[INFO|DP=i|PP=j|TP=k]` with an optional host
  (`|ip-26-0-160-225`). Used from early 2024 through at least Oct 2025, and by the Ultra-Scale
  Playbook sweep. Numbers are "human formatted" (3 significant digits, K/M/G suffixes: `13.8K`,
  `9.94G`), so values are exact to what was printed, not to what was measured.
- ``nanotron-current``: nanotron main's formatter since 2025: date `MM/DD` without a year, ANSI
  dim codes around the header, rank tags only for dimensions larger than 1 (`[INFO|DP=0|TP=1]`, or
  `[INFO]`), and `B` instead of `G` for 1e9.
The step line's `cuda_memory_allocated` is the current (not peak) allocation, so it is not used as
the peak; peaks come from the separate ` Memory usage: ... Peak allocated ... Peak reserved: ...` lines.
"""

from __future__ import annotations

import re
from decimal import Decimal

from sweep.logs.base import MIB, LineParser, MemorySample, StepRecord, strip_ansi, utc_timestamp

_STEP = re.compile(
    r"^(?:\d+:\s*)?(?P<date>\d\d/\d\d(?:/(?P<year>\d{4}))?) (?P<time>\d\d:\d\d:\d\d) "
    r"\[(?P<level>[A-Z]+)(?P<tags>[^\]]*)\]: iteration: (?P<step>\d+) / (?P<total>\d+)(?P<fields>.*)$"
)
_HUMAN = re.compile(r"^(?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?P<suffix>[KMGBTPE]?)$")
_SCALE = {s: Decimal(10) ** (3 * i) for i, s in enumerate(["", "K", "M", "G", "T", "P", "E"])} | {"B": Decimal(10**9)}
_MEMORY = re.compile(
    r"Memory usage: (?P<a>[\d.]+)MiB\.? Peak allocated:? (?P<ma>[\d.]+)MiB\.? Peak reserved: (?P<mr>[\d.]+)MiB"
)


def human_number(text: str) -> Decimal | None:
    """Inverse of nanotron's `human_format` ("15.2K" -> 15200), exact; None when it is not a number."""
    match = _HUMAN.match(text.strip())
    if match is None:
        return None
    return Decimal(match["num"]) * _SCALE[match["suffix"]]


def _float(value: Decimal | None) -> float | None:
    return float(value) if value is not None else None


def _fields(text: str) -> dict[str, Decimal | None]:
    fields: dict[str, Decimal | None] = {}
    for part in text.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            fields[key.strip()] = human_number(value)
    return fields


class NanotronParser(LineParser):
    framework = "nanotron"

    def match_step(self, line: str) -> StepRecord | None:
        match = _STEP.match(strip_ansi(line).rstrip("\r\n"))
        if match is None:
            return None
        fields = _fields(match["fields"])
        elapsed_ms = fields.get("elapsed_time_per_iteration_ms")
        if elapsed_ms is None:
            return None
        reserved = fields.get("cuda_max_memory_reserved")
        gbs = fields.get("global_batch_size")

        def get(key: str) -> float | None:
            return _float(fields.get(key))

        if match["year"]:
            version = "nanotron-2024"
            stamp = utc_timestamp(f"{match['date']} {match['time']}", "%m/%d/%Y %H:%M:%S")
        else:
            version, stamp = "nanotron-current", None  # no year in the line: no absolute time
        return StepRecord(
            step=int(match["step"]),
            total_steps=int(match["total"]),
            step_time_s=float(elapsed_ms / 1000),
            tokens_per_sec=get("tokens_per_sec"),
            tokens_per_sec_per_gpu=get("tokens_per_sec_per_gpu"),
            loss=get("lm_loss"),
            tflops_per_gpu=get("model_tflops_per_gpu"),
            grad_norm=get("grad_norm"),
            learning_rate=get("lr"),
            global_batch_size=int(gbs) if gbs is not None and gbs == gbs.to_integral_value() else None,
            mem_reserved_bytes=int(reserved) if reserved is not None else None,
            timestamp=stamp,
            format_version=version,
        )

    def match_memory(self, line: str) -> MemorySample | None:
        match = _MEMORY.search(strip_ansi(line))
        if match is None:
            return None
        return MemorySample(
            allocated_bytes=round(float(match["a"]) * MIB),
            max_allocated_bytes=round(float(match["ma"]) * MIB),
            max_reserved_bytes=round(float(match["mr"]) * MIB),
        )
