"""The parser reads the lines torchtitan 0.3.0 and main write, built from their own format strings.

The step line is MetricsProcessor.log in torchtitan/components/metrics.py, the same f-string in
the 0.3.0 wheel (lines 522-532) and in main at b5bcd76c6: `step: {step:2}  loss:
{global_avg_loss:8.5f}  grad_norm: {grad_norm:7.4f}  memory: {max_reserved_gib:5.2f}GiB(
{max_reserved_pct:.2f}%)  tps: {round(tps):,}  tflops: {tflops:,.2f}  mfu: {mfu_str}`, where
mfu_str is `{mfu:.2f}%`, or `N/A` when the device's peak is unknown; each field behind a
colour of tools/utils.py Color (NoColor with metrics.disable_color_printing, as our module sets).
The validation line (log_validation) starts `validate step:` and is not a training step. The
logger's format is tools/logging.py init_logger: `[titan] %(asctime)s - %(name)s -
%(levelname)s - %(message)s` (identical at both); torchrun prefixes `[rank${rank}]:`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sweep.core.units import GiB
from sweep.frameworks import get_parser

COLOURS = {"red": "\033[31m", "green": "\033[32m", "orange": "\033[38;2;180;60;0m",
           "turquoise": "\033[38;2;54;234;195m", "blue": "\033[34m", "cyan": "\033[36m",
           "magenta": "\033[35m", "yellow": "\033[33m", "reset": "\033[39m"}
VERSIONS = ("0.3.0", "main-b5bcd76c6")  # one format string: both are checked by the same lines
WHEN = datetime(2026, 9, 4, 8, 30, 12, 345000)


def logged(rank: int, message: str) -> str:
    """logging.Formatter's asctime is `%Y-%m-%d %H:%M:%S,mmm`."""
    stamp = WHEN.strftime("%Y-%m-%d %H:%M:%S") + f",{WHEN.microsecond // 1000:03d}"
    return f"[rank{rank}]:[titan] {stamp} - root - INFO - {message}\n"


def step_line(rank: int, step: int, loss: float, *, mfu: float | None, colour: bool) -> str:
    color = COLOURS if colour else dict.fromkeys(COLOURS, "")
    grad_norm, max_reserved_gib, max_reserved_pct = 0.8765, 61.25, 43.75
    tps, tflops = 12345.6, 456.789
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return logged(rank, f"{color['red']}step: {step:2}  "
                        f"{color['green']}loss: {loss:8.5f}  "
                        f"{color['orange']}grad_norm: {grad_norm:7.4f}  "
                        f"{color['turquoise']}memory: {max_reserved_gib:5.2f}GiB"
                        f"({max_reserved_pct:.2f}%)  "
                        f"{color['blue']}tps: {round(tps):,}  "
                        f"{color['cyan']}tflops: {tflops:,.2f}  "
                        f"{color['magenta']}mfu: {mfu_str}{color['reset']}")


def validation_line(rank: int, step: int) -> str:
    return logged(rank, f"validate step: {step:2}  loss: {2.5:7.4f}  memory: {61.25:5.2f}GiB"
                        f"({43.75:.2f}%)  tps: {round(999.0):,}")


@pytest.fixture(scope="module")
def parser():
    return get_parser("torchtitan")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("colour", [False, True])
def test_a_step_line(parser, version: str, colour: bool) -> None:
    record = parser.match_step(step_line(2, 12, 7.123456, mfu=38.5, colour=colour))
    assert (record.step, record.rank) == (12, 2)
    assert record.loss == 7.12346 and record.grad_norm == 0.8765
    assert record.mem_reserved_bytes == round(61.25 * GiB)
    assert (record.tokens_per_sec_per_gpu, record.tflops_per_gpu, record.mfu_pct) == (
        12346.0, 456.79, 38.5)
    assert record.timestamp == WHEN.replace(tzinfo=UTC).timestamp()  # read as UTC, as 0.2's
    assert record.format_version == "torchtitan-2026"


@pytest.mark.parametrize("version", VERSIONS)
def test_an_unknown_peak_logs_mfu_n_a(parser, version: str) -> None:
    record = parser.match_step(step_line(0, 3, 9.5, mfu=None, colour=False))
    assert record.mfu_pct is None and record.tflops_per_gpu == 456.79


@pytest.mark.parametrize("version", VERSIONS)
def test_validation_lines_are_not_steps(parser, version: str) -> None:
    text = (step_line(0, 10, 6.0, mfu=40.0, colour=False) + validation_line(0, 10)
            + step_line(0, 11, 5.9, mfu=40.0, colour=False))
    log = parser.parse_text(text)
    assert [(r.step, r.loss) for r in log.steps] == [(10, 6.0), (11, 5.9)]
    assert log.problems == ()
