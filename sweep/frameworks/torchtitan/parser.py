"""torchtitan step lines: `<ts> - root - INFO - step: N  loss: X  ...  mfu: U%`.

Format versions (fixtures in tests/fixtures/logs/torchtitan_steps_*.log):
- ``torchtitan-2024``: `memory: M GiB(P%)  wps: 1,786  mfu: U%`, no `[titan]` tag, no tflops.
- ``torchtitan-2025``: `[rank0]:[titan] <ts> ...`, `tps` (renamed from wps) and `tflops`.
- ``torchtitan-2026``: adds `grad_norm`; `mfu: N/A` when the peak FLOP/s of the device is unknown.
Any version may carry ANSI colour codes around each field (written by `--tee`), an srun `--label`
prefix (`0: `) and one identical line per node or rank. `memory` is the peak reserved memory
(`max_memory_reserved`) in GiB; `wps`/`tps` are tokens per second per device. torchtitan does
not log the step time; it can be derived from tps and the tokens per step per device.
"""

from __future__ import annotations

import re

from sweep.logs.base import GIB, LineParser, StepRecord, strip_ansi, to_float, utc_timestamp

_STEP = re.compile(
    r"^(?:\d+:\s*)?(?:\[rank(?P<rank>\d+)\]:)*(?:\[titan\]\s*)?"
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) - \S+ - INFO - "
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)(?P<rest>(?:\s+\w+:\s*\S+)*)\s*$"
)
_FIELD = re.compile(r"(\w+):\s*(\S+)")
_MEMORY = re.compile(r"^(?P<gib>[\d.]+)GiB\((?P<pct>[\d.]+)%\)$")


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
            mem_reserved_bytes=round(float(memory["gib"]) * GIB) if memory else None,
            tokens_per_sec_per_gpu=to_float(fields.get(throughput_key, "")),
            tflops_per_gpu=to_float(fields.get("tflops", "")),
            mfu_pct=to_float(mfu[:-1]) if mfu.endswith("%") else None,
            timestamp=stamp + int(match["ms"]) / 1000.0 if stamp is not None else None,
            rank=int(match["rank"]) if match["rank"] is not None else None,
            format_version=version,
        )
