"""nanotron step lines: `<date> <time> [LEVEL|tags]: iteration: N / T | key: value | ...`.

The line is `LoggerWriter.add_scalars_from_list`'s `" | ".join(...)` of `LogItem`s, each
`human_format`ted (3 significant digits, K/M/G or K/M/B suffixes: values are exact to what was
printed, not to what was measured), under the formatter of `set_logger_verbosity_format`.
Format versions, as nanotron main had them (merge commits on main; tests/frameworks/nanotron
builds lines from each version's format strings):

- ``nanotron-2024``: up to 2025-03-23, and @e24d2483 (the playbook). Date `MM/DD/YYYY`, tag
  `[INFO|DP=i|PP=j|TP=k]` (+ `|EXP=e` with ep > 1, + `|host` under Slurm); step time
  `elapsed_time_per_iteration_ms`; `global_batch_size` in sequences; G for 1e9; iterations 1-4
  add `cuda_memory_allocated` (current) and `cuda_max_memory_reserved` (peak) of the logging rank.
  Forks kept it after that (tests/fixtures/logs/nanotron_steps_issue390.log is of Oct 2025).
- ``nanotron-2025-03-23``: main from d57c2ea4 (2025-03-23, logging/base.py SafeFormatter) to
  8279c784: date `MM/DD` without a year, ANSI dim codes around the header, rank tags only for
  dimensions larger than 1 (`[INFO|DP=0|TP=1]`, or `[INFO]`), B instead of G; still
  `elapsed_time_per_iteration_ms`.
- ``nanotron-2025-03-26``: main from 8279c784 (2025-03-26, "add eta") on: the step time is
  `time_per_iteration_ms`, `global_batch_size` is in tokens (so it is not read), an `eta: H:MM:SS`
  item ends the line, and the step line carries no memory (it went to wandb only).

One rank logs the step line: dp 0, tp 0 (cp 0) of the last pipeline stage (trainer.py
`logger_ranks`). The step line's `cuda_memory_allocated` is the current (not peak) allocation, so
it is not used as the peak; peaks also come from the ` Memory usage: ... Peak allocated ... Peak
reserved: ...` lines (rank 0, the first iterations) and the `[After model building]` lines (dp
rank 0 of every tp/pp group), so a log's peak is the largest of those ranks' peaks.
"""

from __future__ import annotations

import re
from decimal import Decimal

from sweep.core.units import MiB
from sweep.frameworks.log_parser import LineParser, MemorySample, StepRecord, strip_ansi, utc_timestamp

_STEP = re.compile(
    r"^(?:\d+:\s*)?(?P<date>\d\d/\d\d(?:/(?P<year>\d{4}))?) (?P<time>\d\d:\d\d:\d\d) "
    r"\[(?P<level>[A-Z]+)(?P<tags>[^\]]*)\]: iteration: (?P<step>\d+) / (?P<total>\d+)(?P<fields>.*)$"
)
_HUMAN = re.compile(r"^(?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?P<suffix>[KMGBTPE]?)$")
_SCALE = {s: Decimal(10) ** (3 * i) for i, s in enumerate(["", "K", "M", "G", "T", "P", "E"])} | {"B": Decimal(10**9)}
STEP_TIME_KEY = "time_per_iteration_ms"  # main from 8279c784 (2025-03-26)
OLD_STEP_TIME_KEY = "elapsed_time_per_iteration_ms"  # before, and @e24d2483
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
        renamed = STEP_TIME_KEY in fields
        elapsed_ms = fields.get(STEP_TIME_KEY if renamed else OLD_STEP_TIME_KEY)
        if elapsed_ms is None:
            return None
        reserved = fields.get("cuda_max_memory_reserved")
        gbs = None if renamed else fields.get("global_batch_size")  # tokens, since the rename

        def get(key: str) -> float | None:
            return _float(fields.get(key))

        if match["year"]:
            version = "nanotron-2024"
            stamp = utc_timestamp(f"{match['date']} {match['time']}", "%m/%d/%Y %H:%M:%S")
        else:  # no year in the line: no absolute time
            version, stamp = ("nanotron-2025-03-26" if renamed else "nanotron-2025-03-23"), None
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
            allocated_bytes=round(float(match["a"]) * MiB),
            max_allocated_bytes=round(float(match["ma"]) * MiB),
            max_reserved_bytes=round(float(match["mr"]) * MiB),
        )
