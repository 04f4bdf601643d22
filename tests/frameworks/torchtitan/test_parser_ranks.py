"""Multi-rank torchtitan logs: one record per step, from the rank holding the real loss.

The step lines are built with the format of MetricsProcessor.log (torchtitan/components/
metrics.py) at v0.2.0 29624e37f / v0.2.1 81af8833d (`loss: {:7.4f}`) and v0.2.2 73a0e6979
(`loss: {:8.5f}`), with its ANSI colours (tools/utils.py Color) or without
(metrics.disable_color_printing, as our TOML sets), behind torchrun's `[rank${rank}]:` prefix
(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, set by the launcher) and torchtitan's `[titan]` logger
format.
"""

from __future__ import annotations

import pytest

from sweep.core.units import GiB
from sweep.frameworks import get_parser

COLOURS = {"red": "\033[31m", "green": "\033[32m", "orange": "\033[38;2;180;60;0m",
           "turquoise": "\033[38;2;54;234;195m", "blue": "\033[34m", "cyan": "\033[36m",
           "magenta": "\033[35m", "reset": "\033[39m"}
LOSS_FORMAT = {"0.2.0": "7.4f", "0.2.1": "7.4f", "0.2.2": "8.5f"}


def step_line(version: str, rank: int, step: int, loss: float, mem_gib: float, *,
              colour: bool = False, second: int = 0) -> str:
    c = COLOURS if colour else dict.fromkeys(COLOURS, "")
    tps, tflops, mfu, grad_norm = 4321.4, 250.123, 25.29, 1.2345
    message = (f"{c['red']}step: {step:2}  "
               f"{c['green']}loss: {loss:{LOSS_FORMAT[version]}}  "
               f"{c['orange']}grad_norm: {grad_norm:7.4f}  "
               f"{c['turquoise']}memory: {mem_gib:5.2f}GiB({mem_gib / 80 * 100:.2f}%)  "
               f"{c['blue']}tps: {round(tps):,}  "
               f"{c['cyan']}tflops: {tflops:,.2f}  "
               f"{c['magenta']}mfu: {mfu:.2f}%{c['reset']}")
    return f"[rank{rank}]:[titan] 2026-01-05 10:00:{second:02d},123 - root - INFO - {message}\n"


@pytest.fixture(scope="module")
def parser():
    return get_parser("torchtitan")


@pytest.mark.parametrize("version", sorted(LOSS_FORMAT))
@pytest.mark.parametrize("colour", [False, True])
def test_each_versions_line(parser, version: str, colour: bool) -> None:
    record = parser.match_step(step_line(version, 3, 7, 6.12345, 41.5, colour=colour))
    assert (record.step, record.rank, record.grad_norm) == (7, 3, 1.2345)
    assert record.tokens_per_sec_per_gpu == 4321.0
    assert record.loss == pytest.approx(6.12345, abs=1e-4)
    assert (record.tflops_per_gpu, record.mfu_pct) == (250.12, 25.29)
    assert record.mem_reserved_bytes == round(41.5 * GiB)
    assert record.format_version == "torchtitan-2026"


@pytest.mark.parametrize("version", sorted(LOSS_FORMAT))
def test_pipeline_log_takes_the_last_stages_loss_and_the_peak_memory(parser, version: str) -> None:
    # 8 ranks, pp = 2 (outermost), dp = 4: ranks 0-3 are stage 0 and log -1.0 summed over their
    # 4-rank loss mesh (-4.0); ranks 4-7 hold the loss. Lines interleave as torchrun tees them.
    text = ""
    for step in (1, 2, 3):
        for rank in (2, 0, 5, 1, 4, 3, 7, 6):
            loss = -4.0 if rank < 4 else 9.0 - step
            memory = 30.0 + rank + step  # rank 7 is the fullest
            text += step_line(version, rank, step, loss, memory, second=step)
    log = parser.parse_text(text)
    assert [(r.step, r.rank, r.loss) for r in log.steps] == [(1, 4, 8.0), (2, 4, 7.0), (3, 4, 6.0)]
    assert [r.mem_reserved_bytes for r in log.steps] == [round((37.0 + s) * GiB) for s in (1, 2, 3)]
    assert log.problems == ()  # other ranks' lines are not restarts
    assert log.duplicate_steps == 3 * 7
    assert log.format_version == "torchtitan-2026"


def test_a_node_of_first_stages_only_has_no_loss(parser) -> None:
    text = "".join(step_line("0.2.2", rank, 1, -8.0, 20.0 + rank) for rank in range(8))
    (record,) = parser.parse_text(text).steps
    assert record.loss is None and record.rank == 0
    assert record.mem_reserved_bytes == round(27.0 * GiB)


def test_a_ranks_second_line_for_a_step_is_a_restart(parser) -> None:
    text = step_line("0.2.2", 0, 1, 5.0, 10.0) + step_line("0.2.2", 0, 1, 7.0, 10.0)
    log = parser.parse_text(text)
    assert [r.loss for r in log.steps] == [5.0]
    assert len(log.problems) == 1 and "restart" in log.problems[0]


def test_unprefixed_lines_of_several_ranks_are_not_restarts(parser) -> None:
    # Without torchrun's prefix (an older launcher): every rank's line looks alike.
    lines = [step_line("0.2.2", rank, 1, 5.0 + rank / 100, 10.0 + rank).split("]:", 1)[1]
             for rank in range(4)]
    log = parser.parse_text("".join(lines))
    (record,) = log.steps
    assert record.loss == 5.0 and record.mem_reserved_bytes == round(13.0 * GiB)
    assert log.problems == ()
