"""torchtitan step lines: `<ts> - root - INFO - step: N  loss: X  ...  mfu: U%`.

The line is MetricsProcessor.log in torchtitan/components/metrics.py:
- v0.2.0 (29624e37f) and v0.2.1 (81af8833d): `step: {step:2}  loss: {loss:7.4f}  grad_norm:
  {grad_norm:7.4f}  memory: {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)  tps:
  {round(tps):,}  tflops: {tflops:,.2f}  mfu: {mfu:.2f}%`, each field behind an ANSI colour
  unless metrics.disable_color_printing;
- v0.2.2 (73a0e6979): the same with `loss: {loss:8.5f}`; main after 0.2.2 writes `mfu: N/A`
  when the device's peak is unknown;
- 0.3.0 (the PyPI wheel, metrics.py lines 522-532) and main at b5bcd76c6: the 0.2.2 line with
  `mfu: N/A` for an unknown peak, read unchanged (tests/frameworks/torchtitan/test_parser_v03.py);
  their `validate step:` lines are not training steps.
Older formats (fixtures in tests/fixtures/logs/torchtitan_steps_*.log): ``torchtitan-2024``
(`wps`, no tflops, no `[titan]` tag), ``torchtitan-2025`` (`tps`, `tflops`), ``torchtitan-2026``
(adds `grad_norm`; every 0.2.x line is this one).

Every rank logs every step (our launcher keeps all ranks, prefixed `[rankN]:` by torchrun), with
its own values: the memory is that rank's peak reserved memory (`max_memory_reserved`, GiB), and
under pipeline parallelism only the last stage's ranks hold the loss; the others log the
placeholder -1.0 summed over their data-parallel group (train.py forward_backward_step and
train_step), i.e. a negative number. So a parsed log has one record per step: the lowest rank
with a real (non-negative) loss, whose memory field is the peak over every rank that logged the
step. A log with only placeholder losses (the first stages' node of a multi-node run) keeps the
step with loss None. `tps` is tokens per second per device; torchtitan does not log step times.
An srun `--label` prefix (`0: `) and one identical copy per node are also read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sweep.core.units import GiB
from sweep.frameworks.log_parser import LineParser, ParsedLog, StepRecord, strip_ansi, to_float, utc_timestamp

_STEP = re.compile(
    r"^(?:\d+:\s*)?(?:\[rank(?P<rank>\d+)\]:)*(?:\[titan\]\s*)?"
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) - \S+ - INFO - "
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)(?P<rest>(?:\s+\w+:\s*\S+)*)\s*$"
)
_FIELD = re.compile(r"(\w+):\s*(\S+)")
_MEMORY = re.compile(r"^(?P<gib>[\d.]+)GiB\((?P<pct>[\d.]+)%\)$")


def is_placeholder_loss(loss: float | None) -> bool:
    """A non-last pipeline stage's loss: -1.0 per rank, summed over its loss mesh (< 0)."""
    return loss is not None and loss < 0


@dataclass
class _StepLines:
    """Every record of one step, and the lines that were exact copies of one already seen."""

    records: list[StepRecord] = field(default_factory=list)
    copies: int = 0

    def merged(self) -> StepRecord:
        """The step from the lowest rank with a real loss, with the peak memory of all ranks."""
        real = [r for r in self.records if not is_placeholder_loss(r.loss)]
        chosen = min(real or self.records, key=lambda r: r.rank if r.rank is not None else 0)
        memory = [r.mem_reserved_bytes for r in self.records if r.mem_reserved_bytes is not None]
        return replace(chosen, loss=chosen.loss if real else None,
                       mem_reserved_bytes=max(memory, default=None))


class TorchtitanParser(LineParser):
    framework = "torchtitan"

    def match_step(self, line: str) -> StepRecord | None:
        match = _STEP.match(strip_ansi(line).rstrip("\r\n"))
        if match is None:
            return None
        fields = dict(_FIELD.findall(match["rest"]))
        if "mfu" not in fields:  # always the last field: without it the line was cut short
            return None
        throughput_key = "tps" if "tps" in fields else "wps"
        memory = _MEMORY.match(fields.get("memory", ""))
        mfu = fields["mfu"]
        if throughput_key == "wps":
            version = "torchtitan-2024"
        else:
            version = "torchtitan-2026" if "grad_norm" in fields else "torchtitan-2025"
        stamp = utc_timestamp(match["ts"], "%Y-%m-%d %H:%M:%S")
        return StepRecord(
            step=int(match["step"]),
            loss=to_float(match["loss"]),
            grad_norm=to_float(fields.get("grad_norm", "")),
            mem_reserved_bytes=round(float(memory["gib"]) * GiB) if memory else None,
            tokens_per_sec_per_gpu=to_float(fields.get(throughput_key, "")),
            tflops_per_gpu=to_float(fields.get("tflops", "")),
            mfu_pct=to_float(mfu[:-1]) if mfu.endswith("%") else None,
            timestamp=stamp + int(match["ms"]) / 1000.0 if stamp is not None else None,
            rank=int(match["rank"]) if match["rank"] is not None else None,
            format_version=version,
        )

    def parse_lines(self, lines: Iterable[str], source: str, truncated: bool = False) -> ParsedLog:
        """One record per step across all ranks' lines (see the module docstring)."""
        steps: dict[int, _StepLines] = {}
        seen: dict[tuple[int | None, int], StepRecord] = {}  # (rank, step) -> its first record
        problems: list[str] = []
        lines_read = 0
        for number, line in enumerate(lines, start=1):
            lines_read = number
            try:
                record = self.match_step(line)
            except (ValueError, KeyError, TypeError) as exc:  # a parser bug must not stop collect
                problems.append(f"{source}:{number}: unreadable line skipped ({exc})")
                continue
            if record is None:
                continue
            group = steps.setdefault(record.step, _StepLines())
            first = seen.get((record.rank, record.step))
            if first is not None and replace(first, timestamp=None) == replace(record, timestamp=None):
                group.copies += 1  # the same line again: one copy per node (srun --label)
                continue
            if first is not None and record.rank is not None:
                problems.append(f"{source}:{number}: rank {record.rank} logged step {record.step} "
                                "again with other values (a restart?); the first one is kept")
                continue
            seen.setdefault((record.rank, record.step), record)
            group.records.append(record)
        if truncated:
            problems.append(f"{source}:{lines_read + 1}: last line has no newline (writer cut off); skipped")
        merged = [group.merged() for group in steps.values()]
        versions = list(dict.fromkeys(r.format_version for r in merged if r.format_version))
        dropped = sum(len(g.records) - 1 + g.copies for g in steps.values())
        return ParsedLog(framework=self.framework, source=source, steps=tuple(merged),
                         format_versions=tuple(versions), lines_read=lines_read,
                         truncated=truncated, problems=tuple(problems), duplicate_steps=dropped)
