"""Megatron-LM (and Megatron-DeepSpeed, Megatron-Core) iteration lines.

Format versions (fixtures in tests/fixtures/logs/megatron_steps_*.log):
- ``megatron-2020``: `iteration N/ T | elapsed time per iteration (ms) | learning rate | lm loss | ...`,
  no consumed samples; memory as `after N iterations memory (MB) | ...`.
- ``megatron-2021``: adds `consumed samples`, `global batch size`, `grad norm` (Megatron-DeepSpeed adds
  `consumed tokens`, `num zeros`); memory as `[Rank R] (after N iterations) memory (MB) | ...`.
- ``megatron-2024``: a ` [YYYY-MM-DD hh:mm:ss]` prefix, optional `throughput per GPU (TFLOP/s/GPU)`,
  MoE/MTP loss fields.
- ``megatron-2025``: the same with microseconds in the prefix (` [YYYY-MM-DD hh:mm:ss.ffffff]`,
  Megatron-LM main since late 2025), optional `skipped samples`, `energy per GPU`, `power per GPU`.
Iteration lines always end with ` |`, so a line cut short does not match. Megatron logs every
`--log-interval` iterations; elapsed time is the mean over the interval. An interval whose
iterations were all skipped (fp16 loss-scale warm-up) has no `lm loss`.
"""

from __future__ import annotations

import re

from sweep.core.units import MiB
from sweep.frameworks.log_parser import (
    LineParser,
    MemorySample,
    StepRecord,
    ms_to_s,
    strip_ansi,
    to_float,
    to_int,
    utc_timestamp,
)

_PREFIX = r"^(?:\d+:\s*|\[default\d+\]:|\[rank\d+\]:)*\s*"
_ITERATION = re.compile(
    _PREFIX + r"(?:\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<us>\.\d+)?\]\s+)?"
    r"iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|(?P<fields>.*)\|\s*$"
)
_MEMORY = re.compile(
    _PREFIX + r"(?:\[Rank (?P<rank>\d+)\] \(after (?P<step_r>\d+) iterations\)|after (?P<step>\d+) iterations)"
    r" memory \(MB\) \| allocated: (?P<a>[\d.]+) \| max allocated: (?P<ma>[\d.]+)"
    r" \| reserved: (?P<r>[\d.]+) \| max reserved: (?P<mr>[\d.]+)"
)
_ELAPSED = "elapsed time per iteration (ms)"


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in text.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _timestamp(stamp: str | None, fraction: str | None) -> float | None:
    seconds = utc_timestamp(stamp, "%Y-%m-%d %H:%M:%S") if stamp else None
    return seconds + float(fraction) if seconds is not None and fraction else seconds


def _mib(text: str) -> int:
    return round(float(text) * MiB)


class MegatronParser(LineParser):
    framework = "megatron"

    def match_step(self, line: str) -> StepRecord | None:
        match = _ITERATION.match(strip_ansi(line).rstrip("\r\n"))
        if match is None:
            return None
        fields = _fields(match["fields"])
        step_time_s = ms_to_s(fields.get(_ELAPSED, ""))
        if step_time_s is None:
            return None
        if match["us"]:
            version = "megatron-2025"
        elif match["ts"]:
            version = "megatron-2024"
        elif "consumed samples" in fields:
            version = "megatron-2021"
        else:
            version = "megatron-2020"
        return StepRecord(
            step=int(match["step"]),
            total_steps=int(match["total"]),
            step_time_s=step_time_s,
            loss=to_float(fields.get("lm loss", "")),
            tflops_per_gpu=to_float(fields.get("throughput per GPU (TFLOP/s/GPU)", "")),
            grad_norm=to_float(fields.get("grad norm", "")),
            learning_rate=to_float(fields.get("learning rate", "")),
            global_batch_size=to_int(fields.get("global batch size", "")),
            skipped_iterations=to_int(fields.get("number of skipped iterations", "")),
            timestamp=_timestamp(match["ts"], match["us"]),
            format_version=version,
        )

    def match_memory(self, line: str) -> MemorySample | None:
        match = _MEMORY.match(strip_ansi(line))
        if match is None:
            return None
        step = match["step_r"] or match["step"]
        return MemorySample(
            allocated_bytes=_mib(match["a"]),
            max_allocated_bytes=_mib(match["ma"]),
            reserved_bytes=_mib(match["r"]),
            max_reserved_bytes=_mib(match["mr"]),
            rank=int(match["rank"]) if match["rank"] else None,
            after_step=int(step),
        )
