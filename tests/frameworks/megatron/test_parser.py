"""The Megatron-LM parser reads real iteration and memory lines of three format generations.

Fixtures: tests/fixtures/logs/megatron_steps_*.log (copies of the reference data's logs/ ($SWEEP_REFDATA, data/README.md), with their
#SOURCE headers). Expected values are read off the fixture lines by eye and written out here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sweep.core.units import MiB
from sweep.frameworks import get_parser
from sweep.frameworks.log_parser import LogParseError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def parser():
    return get_parser("megatron")


def test_2021_format_with_skipped_interval_and_per_rank_memory(parser):
    log = parser.parse_file(FIXTURES / "megatron_steps_1.log")
    assert [r.step for r in log.steps] == [10, 20, 30, 40, 50, 60]
    assert log.format_version == "megatron-2021"
    first, third = log.steps[0], log.steps[2]
    # iteration 10: all 10 iterations skipped, so no lm loss and no grad norm
    assert first.step_time_s == 19.9324
    assert first.loss is None and first.grad_norm is None
    assert first.skipped_iterations == 10
    assert first.total_steps == 1000 and first.global_batch_size == 4
    assert first.learning_rate == 0.0
    assert third.loss == 76.76836 and third.grad_norm == 126.963 and third.step_time_s == 6.7465
    assert log.last_step == 60
    # 19 `[Rank N] (after 20 iterations) memory (MB)` lines; rank 0 (first stage) holds the most
    assert len(log.memory) == 19
    rank0 = next(m for m in log.memory if m.rank == 0)
    assert rank0.after_step == 20
    assert rank0.max_allocated_bytes == round(22769.7333984375 * MiB)
    assert rank0.max_reserved_bytes == 25658 * MiB
    assert log.peak_mem_allocated_bytes == rank0.max_allocated_bytes
    assert log.peak_mem_reserved_bytes == 25658 * MiB
    assert not log.truncated and log.problems == ()


def test_2020_format_without_consumed_samples(parser):
    log = parser.parse_file(FIXTURES / "megatron_steps_2.log")
    assert [r.step for r in log.steps] == [1, 2, 3, 4]
    assert log.format_version == "megatron-2020"
    step1 = log.steps[0]
    assert step1.step_time_s == 123.7424
    assert step1.loss == 12.52221
    assert step1.learning_rate == 1.875e-05
    assert step1.global_batch_size is None  # not logged in 2020
    (memory,) = log.memory  # `after 1 iterations memory (MB)`, no rank
    assert memory.rank is None and memory.after_step == 1
    assert memory.max_allocated_bytes == round(26118.2294921875 * MiB)


def test_2020_format_all_iterations_skipped_has_no_loss(parser):
    log = parser.parse_file(FIXTURES / "megatron_steps_6.log")
    assert [(r.step, r.step_time_s, r.loss, r.skipped_iterations) for r in log.steps] == [
        (5, 16.4915, None, 5),
        (10, 1.9939, None, 5),
    ]


def test_2024_format_with_timestamp_and_throughput(parser):
    log = parser.parse_file(FIXTURES / "megatron_steps_4.log")
    assert [r.step for r in log.steps] == [2, 3, 71, 72, 73]
    assert log.format_version == "megatron-2024"
    step2 = log.steps[0]
    assert step2.timestamp == datetime(2024, 4, 6, 2, 55, 45, tzinfo=UTC).timestamp()
    assert step2.tflops_per_gpu == 231.9
    assert step2.loss == 2.02153  # lm loss, not load_balancing_loss
    assert step2.grad_norm == 6.895 and step2.global_batch_size == 128 and step2.step_time_s == 5.6301
    assert log.memory[0].rank == 1 and log.memory[0].max_reserved_bytes == 61480 * MiB


def test_newest_format_with_mtp_losses(parser):
    (step,) = parser.parse_file(FIXTURES / "megatron_steps_7.log").steps
    assert (step.step, step.total_steps, step.loss, step.grad_norm) == (50, 50, 4.791878e-03, 0.022)
    assert step.tflops_per_gpu is None  # --log-throughput was not set


def test_megatron_deepspeed_bare_timer_lines_are_not_steps(parser):
    log = parser.parse_file(FIXTURES / "megatron_steps_5.log")
    assert [(r.step, r.step_time_s, r.loss) for r in log.steps] == [(110, 0.1641, 10.64812), (120, 0.1419, 10.65025)]
    assert parser.match_step("time (ms)") is None


def test_timer_and_unrelated_lines_are_not_steps(parser):
    assert parser.match_step("time (ms) | forward-compute: 147.77 | forward-recv: 508.89 |") is None
    # the m4 trainer's line (fail_slurm_node_fail_1) looks similar but is another framework
    m4 = "iteration:  2500/500000   0% | elapsed time: 07:41:19 | per_token_loss: 3.1525 | lr: 9.990E-06 |"
    assert parser.match_step(m4) is None


def test_line_cut_short_or_garbled_is_none(parser):
    real = (
        " iteration       40/    1000 | consumed samples:          160 | elapsed time per iteration (ms): 6736.4 |"
        " learning rate: 1.499E-04 | global batch size:     4 | lm loss: 3.169739E+01 | loss scale: 16384.0 |"
        " grad norm: 13.641 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    assert parser.match_step(real).loss == 31.69739
    assert parser.match_step(real[:150]) is None  # constructed: the real line cut mid-field
    assert parser.match_step(" iteration abc/ 1000 | elapsed time per iteration (ms): x |") is None
    assert parser.match_step(" iteration 4/ 10 | elapsed time per iteration (ms): not-a-number |") is None
    assert parser.match_step("") is None
    assert parser.match_step("\x00\xff garbage |||") is None


def test_truncated_file_keeps_complete_lines(parser, tmp_path):
    text = (FIXTURES / "megatron_steps_1.log").read_text()
    cut = text.index(" iteration       60/") + 80  # constructed: the writer died mid-line
    path = tmp_path / "node0.out"
    path.write_text(text[:cut])
    log = parser.parse_file(path)
    assert [r.step for r in log.steps] == [10, 20, 30, 40, 50]
    assert log.truncated
    assert str(path) in log.problems[0]


def test_missing_file_names_the_file(parser, tmp_path):
    with pytest.raises(LogParseError, match="nope.log"):
        parser.parse_file(tmp_path / "nope.log")


def test_microsecond_timestamp_of_megatron_main(parser):
    # Constructed from Megatron-LM main's training_log (strftime('%Y-%m-%d %H:%M:%S.%f'), optional
    # energy fields) around the field values of megatron_steps_8's iteration 30: no such real log was found.
    line = (
        " [2025-11-02 10:00:01.250000] iteration       30/     200 | consumed samples:          480 |"
        " elapsed time per iteration (ms): 464.2 | throughput per GPU (TFLOP/s/GPU): 412.3 |"
        " energy per GPU (J/iter/GPU): 301.5 | power per GPU (W/GPU): 649.5 | learning rate: 7.031250E-07 |"
        " global batch size:    16 | lm loss: 1.077634E+01 | loss scale: 262144.0 | grad norm: 17.701 |"
        " number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    record = parser.match_step(line)
    assert record.format_version == "megatron-2025"
    assert record.timestamp == datetime(2025, 11, 2, 10, 0, 1, 250000, tzinfo=UTC).timestamp()
    assert (record.step, record.step_time_s, record.tflops_per_gpu, record.loss) == (30, 0.4642, 412.3, 10.77634)
