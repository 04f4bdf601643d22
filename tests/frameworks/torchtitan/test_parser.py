"""The torchtitan parser reads real step lines of the 2024 (wps), 2025 (tps, tflops) and 2026 (grad_norm) formats.

Fixtures: tests/fixtures/logs/torchtitan_steps_*.log and fail_illegal_memory_access_1.log (copies
of the reference data's logs/ ($SWEEP_REFDATA, data/README.md) with their #SOURCE headers). The 2026 lines carry ANSI colour codes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sweep.core.units import GiB
from sweep.frameworks import get_parser

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def parser():
    return get_parser("torchtitan")


def test_2026_lines_with_ansi_colours(parser):
    log = parser.parse_file(FIXTURES / "torchtitan_steps_1.log")
    assert [r.step for r in log.steps] == [1, 10]
    assert log.format_version == "torchtitan-2026"
    step10 = log.steps[1]
    assert step10.loss == 6.23047 and step10.grad_norm == 43.5
    assert step10.mem_reserved_bytes == round(75.22 * GiB)
    assert step10.tokens_per_sec_per_gpu == 8754.0  # "tps: 8,754"
    assert step10.tflops_per_gpu == 737.59 and step10.mfu_pct == 32.78
    assert step10.rank == 0
    assert step10.timestamp == datetime(2026, 5, 19, 22, 5, 24, 364000, tzinfo=UTC).timestamp()
    assert step10.step_time_s is None  # torchtitan does not log it
    assert log.peak_mem_reserved_bytes == round(75.22 * GiB)


def test_2024_wps_lines_from_four_nodes_count_once(parser):
    log = parser.parse_file(FIXTURES / "torchtitan_steps_2.log")
    (step,) = log.steps
    assert log.duplicate_steps == 3  # srun --label 0:..3: printed the same line once per node
    assert log.format_version == "torchtitan-2024"
    assert (step.step, step.loss, step.tokens_per_sec_per_gpu, step.mfu_pct) == (10, 1.5568, 1786.0, 10.46)
    assert step.tflops_per_gpu is None and step.grad_norm is None
    assert step.mem_reserved_bytes == round(26.47 * GiB)


def test_2025_lines_between_warnings(parser):
    log = parser.parse_file(FIXTURES / "torchtitan_steps_3.log")
    assert log.format_version == "torchtitan-2025"
    steps = {r.step: r for r in log.steps}
    assert (steps[22].loss, steps[22].tokens_per_sec_per_gpu, steps[22].tflops_per_gpu, steps[22].mfu_pct) == (
        6.225,
        193831.0,
        18.36,
        1.86,
    )
    assert steps[22].mem_reserved_bytes == round(1.41 * GiB)  # "memory:  1.41GiB(1.79%)"
    log4 = parser.parse_file(FIXTURES / "torchtitan_steps_4.log")
    assert [r.step for r in log4.steps][:3] == [200, 210, 220]
    assert log4.steps[0].mfu_pct == 34.29


def test_mfu_not_available(parser):
    (step,) = parser.parse_file(FIXTURES / "fail_illegal_memory_access_1.log").steps
    assert step.mfu_pct is None  # "mfu: N/A"
    assert (step.step, step.tokens_per_sec_per_gpu, step.tflops_per_gpu) == (1, 1150.0, 96.88)
    assert step.mem_reserved_bytes == round(172.59 * GiB)


def test_other_ranks_lines_do_not_replace_rank_0(parser):
    # Constructed: torchtitan without --local-ranks-filter prints one line per rank with that rank's values.
    line = (
        "[rank{r}]:[titan] 2025-03-12 11:10:21,511 - root - INFO - step: 22  loss:  {loss}  memory:  1.41GiB(1.79%)"
        "  tps: 193,831  tflops: 18.36  mfu: 1.86%\n"
    )
    text = line.format(r=1, loss="6.3000") + line.format(r=0, loss="6.2250") + line.format(r=1, loss="6.3000")
    log = parser.parse_text(text)
    assert [(r.rank, r.loss) for r in log.steps] == [(0, 6.225)]


def test_unrelated_garbled_and_cut_lines_are_none(parser):
    real = (
        "[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  memory: 49.66GiB(52.28%)"
        "  tps: 5,856  tflops: 339.16  mfu: 34.29%"
    )
    assert parser.match_step(real).step == 200
    assert parser.match_step(real[: real.index("mfu")]) is None  # constructed: cut before the last field
    assert parser.match_step("[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - [GC] Peforming periodical GC collection") is None
    assert parser.match_step("[rank0]:[titan] 2025-03-12 11:10:21,589 - root - WARNING - Dataset c4_test is being re-looped") is None
    assert parser.match_step("step: garbage loss: ???") is None
    assert parser.match_step("") is None
