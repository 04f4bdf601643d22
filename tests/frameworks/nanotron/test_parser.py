"""The nanotron parser reads real step lines (Jan 2024, Jan 2025, Oct 2025) and lines built from nanotron's format strings at each supported version.

Fixtures: tests/fixtures/logs/nanotron_steps_{1,2}.log (copies of the reference data's logs/ ($SWEEP_REFDATA, data/README.md)) and
nanotron_steps_issue390.log (huggingface/nanotron issue #390), each with its #SOURCE header.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from sweep.core.units import MiB
from sweep.frameworks import get_parser
from sweep.frameworks.nanotron.parser import human_number

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def parser():
    return get_parser("nanotron")


def test_human_format_numbers_are_read_back_exactly():
    assert human_number("13.8K") == Decimal("13800")
    assert human_number("85.8G") == Decimal("85800000000")
    assert human_number("85.8B") == Decimal("85800000000")  # newer nanotron says B for billions
    assert human_number("592") == Decimal("592")
    assert human_number("1e-05") == Decimal("0.00001")
    assert human_number("0.00869") == Decimal("0.00869")
    assert human_number("N/A") is None and human_number("") is None and human_number("12Q") is None


def test_jan_2025_log_steps_and_memory_lines(parser):
    log = parser.parse_file(FIXTURES / "nanotron_steps_1.log")
    assert [r.step for r in log.steps] == list(range(1, 22))
    assert log.format_version == "nanotron-2024"
    step1, step2 = log.steps[0], log.steps[1]
    assert step1.step_time_s == 13.8  # elapsed_time_per_iteration_ms: 13.8K
    assert step1.tokens_per_sec == 1180.0 and step1.tokens_per_sec_per_gpu == 592.0
    assert step1.loss == 14.5 and step1.learning_rate == 5e-08 and step1.grad_norm == 64.7
    assert step1.tflops_per_gpu == 13.9 and step1.global_batch_size == 4 and step1.total_steps == 120000
    assert step1.mem_reserved_bytes == 39 * 10**9  # cuda_max_memory_reserved: 39G
    assert step1.mem_allocated_bytes is None  # cuda_memory_allocated is current, not peak
    assert step1.timestamp == datetime(2025, 1, 27, 15, 50, 16, tzinfo=UTC).timestamp()
    assert (step2.step_time_s, step2.tokens_per_sec_per_gpu, step2.tflops_per_gpu) == (0.538, 15200.0, 358.0)
    assert log.steps[5].mem_reserved_bytes is None  # memory fields only on iterations 1-4
    # ` Memory usage: ...MiB. Peak allocated ...MiB. Peak reserved: ...MiB` lines, plus the two
    # `[After model building]` lines; the largest peak allocated is 41138.03 MiB
    assert log.peak_mem_allocated_bytes == round(41138.03 * MiB)
    assert log.peak_mem_reserved_bytes == 50_900_000_000  # the 50.9G on a step line beats 48542 MiB
    assert log.problems == () and not log.truncated


def test_jan_2024_log_with_host_in_tag(parser):
    log = parser.parse_file(FIXTURES / "nanotron_steps_2.log")
    assert [r.step for r in log.steps] == [991, 992, 993]
    first = log.steps[0]
    assert (first.step_time_s, first.tokens_per_sec, first.tokens_per_sec_per_gpu) == (0.045, 14200.0, 1780.0)
    assert first.tflops_per_gpu == 0.00869 and first.mem_reserved_bytes == 547_000_000
    assert log.steps[1].step_time_s == 0.0412 and log.steps[1].mem_reserved_bytes is None


def test_oct_2025_log_is_still_the_2024_format(parser):
    log = parser.parse_file(FIXTURES / "nanotron_steps_issue390.log")
    assert [r.step for r in log.steps] == [327281, 327282, 327283, 327284]
    assert log.format_version == "nanotron-2024"
    assert [r.loss for r in log.steps] == [2.38, 2.35, 2.51, 2.36]
    assert {(r.step_time_s, r.tokens_per_sec_per_gpu, r.total_steps) for r in log.steps} == {(11.5, 11400.0, 378950)}


def test_main_of_2025_03_23_header_without_year_with_ansi_and_conditional_tags(parser):
    # Constructed from nanotron main's SafeFormatter (fmt "\033[2;3m%(asctime)s [%(levelname)s{ranks}]\033[0m:
    # %(message)s", datefmt "%m/%d %H:%M:%S", rank tags only for sizes > 1) around the Oct 2025 message.
    message = (
        "iteration: 12 / 100 | consumed_tokens: 98.3K | elapsed_time_per_iteration_ms: 2.05K | tokens_per_sec: 4K"
        " | tokens_per_sec_per_gpu: 500 | global_batch_size: 2 | lm_loss: 9.87 | lr: 0.0003 | model_tflops_per_gpu: 210"
        " | hardware_tflops_per_gpu: 210 | grad_norm: 0.953"
    )
    record = parser.match_step(f"\x1b[2;3m10/17 16:31:56 [INFO|DP=0|TP=1]\x1b[0m: {message}")
    assert record is not None and record.format_version == "nanotron-2025-03-23"
    assert (record.step, record.step_time_s, record.tokens_per_sec, record.loss) == (12, 2.05, 4000.0, 9.87)
    assert record.timestamp is None  # no year: no absolute time
    assert parser.match_step(f"\x1b[2;3m10/17 16:31:56 [INFO]\x1b[0m: {message}").step == 12


def test_other_lines_garbled_or_cut_lines_are_none(parser):
    lines = (FIXTURES / "nanotron_steps_1.log").read_text().splitlines()
    start = next(line for line in lines if "[Start training]" in line)
    assert parser.match_step(start) is None
    # the fragment the issue corpus shows after issue #390's 4th line: a line without its header
    assert parser.match_step("36.9 | hardware_tflops_per_gpu: 36.9 | grad_norm: 1.27") is None
    assert parser.match_step("10/05/2025 20:32:24 [INFO|DP=0|PP=1|TP=0]: iteration:") is None
    assert parser.match_step("01/17/2024 13:47:27 [INFO|DP=0]: iteration: 5 / 9 | lm_loss: 1") is None  # no step time
    assert parser.match_step("") is None


def test_truncated_file_keeps_complete_lines(parser, tmp_path):
    text = (FIXTURES / "nanotron_steps_issue390.log").read_text()
    path = tmp_path / "node0.out"
    path.write_text(text[: text.rindex("lm_loss: 2.36")])  # constructed: last line cut
    log = parser.parse_file(path)
    assert [r.step for r in log.steps] == [327281, 327282, 327283]
    assert log.truncated and str(path) in log.problems[0]


# Lines built from nanotron's own format strings at each supported version ----------------------
# LoggerWriter.add_scalars_from_list: "iteration: {step} / {train_steps}" then " | ".join of
# "{tag}: {human_format(value)}" for the LogItems of DistributedTrainer.train_step_logs, under the
# formatter of set_logger_verbosity_format. Values are written as human_format prints them.

# @e24d2483 (src/nanotron/logging.py, trainer.py): fmt "%(asctime)s [%(levelname)s|DP=|PP=|TP=
# {|host}]: %(message)s", datefmt "%m/%d/%Y %H:%M:%S"; items consumed_tokens,
# elapsed_time_per_iteration_ms, tokens_per_sec, tokens_per_sec_per_gpu, global_batch_size
# (sequences), lm_loss, lr, model_tflops_per_gpu, hardware_tflops_per_gpu, grad_norm, and on
# iterations < 5 cuda_memory_allocated, cuda_max_memory_reserved, hd_*; G for 1e9. One rank logs
# it: dp 0, tp 0 of the last pipeline stage. log_memory's " Memory usage" line: rank 0 only; the
# "[After model building]" line: dp rank 0 of each (tp, pp) group. A dp2·pp2·tp2 node, 16 layers:
PLAYBOOK_LOG = """\
02/19/2025 16:40:01 [INFO|DP=0|PP=0|TP=0|ip-26-0-1-2]: [After model building] Memory usage: 9100.50MiB. Peak allocated: 9100.50MiB Peak reserved: 9200.00MiB
02/19/2025 16:40:01 [INFO|DP=0|PP=0|TP=1|ip-26-0-1-2]: [After model building] Memory usage: 9100.50MiB. Peak allocated: 9100.50MiB Peak reserved: 9200.00MiB
02/19/2025 16:40:01 [INFO|DP=0|PP=1|TP=0|ip-26-0-1-2]: [After model building] Memory usage: 12050.25MiB. Peak allocated: 12050.25MiB Peak reserved: 12100.00MiB
02/19/2025 16:40:01 [INFO|DP=0|PP=1|TP=1|ip-26-0-1-2]: [After model building] Memory usage: 12050.25MiB. Peak allocated: 12050.25MiB Peak reserved: 12100.00MiB
02/19/2025 16:40:05 [INFO|DP=0|PP=0|TP=0|ip-26-0-1-2]:  Memory usage: 36400.10MiB. Peak allocated 61234.75MiB. Peak reserved: 64020.00MiB
02/19/2025 16:40:09 [INFO|DP=0|PP=1|TP=0|ip-26-0-1-2]: iteration: 1 / 20 | consumed_tokens: 262K | elapsed_time_per_iteration_ms: 4.21K | tokens_per_sec: 62.3K | tokens_per_sec_per_gpu: 7.78K | global_batch_size: 64 | lm_loss: 12.1 | lr: 6e-05 | model_tflops_per_gpu: 301 | hardware_tflops_per_gpu: 301 | grad_norm: 8.73 | cuda_memory_allocated: 30.2G | cuda_max_memory_reserved: 58.1G | hd_total_memory_tb: 312G | hd_used_memory_tb: 201G | hd_free_memory_tb: 111G
02/19/2025 16:40:11 [INFO|DP=0|PP=1|TP=0|ip-26-0-1-2]: iteration: 2 / 20 | consumed_tokens: 524K | elapsed_time_per_iteration_ms: 1.52K | tokens_per_sec: 172K | tokens_per_sec_per_gpu: 21.6K | global_batch_size: 64 | lm_loss: 11.9 | lr: 0.00012 | model_tflops_per_gpu: 834 | hardware_tflops_per_gpu: 834 | grad_norm: 7.9 | cuda_memory_allocated: 30.2G | cuda_max_memory_reserved: 58.3G | hd_total_memory_tb: 312G | hd_used_memory_tb: 201G | hd_free_memory_tb: 111G
02/19/2025 16:40:11 [WARNING|DP=1|PP=1|TP=1|ip-26-0-1-2]: iteration: 2 is not a step line
"""

# @2411b022 (src/nanotron/logging/base.py, trainer.py): fmt "\\033[2;3m%(asctime)s [%(levelname)s
# %(category)s{ranks}]\\033[0m: %(message)s" with only the dimensions > 1 in {ranks}, datefmt
# "%m/%d %H:%M:%S"; items consumed_tokens, time_per_iteration_ms, tokens_per_sec,
# tokens_per_sec_per_gpu, global_batch_size (tokens), grad_norm (inserted at 5 when clip_grad is
# set), lm_loss, lr, model_tflops_per_gpu, eta; B for 1e9; no memory items. log_memory writes its
# message, a newline, then " Memory usage: ..." (NewLineStreamHandler formats each line).
MAIN_LOG = """\
\x1b[2;3m04/07 15:30:00 [INFO|DP=0|PP=1|TP=0|ip-26-0-1-2]\x1b[0m: [After model building] Memory usage: 12050.25MiB. Peak allocated: 12050.25MiB Peak reserved: 12100.00MiB
\x1b[2;3m04/07 15:30:00 [INFO|DP=0|PP=0|TP=0|ip-26-0-1-2]\x1b[0m: [After model building] Memory usage: 9100.50MiB. Peak allocated: 9100.50MiB Peak reserved: 9200.00MiB
\x1b[2;3m04/07 15:30:04 [INFO|DP=0|PP=0|TP=0|ip-26-0-1-2]\x1b[0m: After train_batch_iter
\x1b[2;3m04/07 15:30:04 [INFO|DP=0|PP=0|TP=0|ip-26-0-1-2]\x1b[0m:  Memory usage: 36400.10MiB. Peak allocated 61234.75MiB. Peak reserved: 64020.00MiB
\x1b[2;3m04/07 15:30:05 [INFO|DP=0|PP=1|TP=0|ip-26-0-1-2]\x1b[0m: iteration: 1 / 20 | consumed_tokens: 262K | time_per_iteration_ms: 4.21K | tokens_per_sec: 62.3K | tokens_per_sec_per_gpu: 7.78K | global_batch_size: 262K | grad_norm: 8.73 | lm_loss: 12.1 | lr: 6e-05 | model_tflops_per_gpu: 301 | eta: 0:01:20
\x1b[2;3m04/07 15:30:07 [INFO|DP=0|PP=1|TP=0|ip-26-0-1-2]\x1b[0m: iteration: 2 / 20 | consumed_tokens: 524K | time_per_iteration_ms: 1.52K | tokens_per_sec: 172K | tokens_per_sec_per_gpu: 21.6K | global_batch_size: 262K | grad_norm: 7.9 | lm_loss: 11.9 | lr: 0.00012 | model_tflops_per_gpu: 834 | eta: 0:00:27
"""


def test_playbook_commit_lines_one_logging_rank_and_the_most_loaded_rank_s_memory(parser):
    log = parser.parse_text(PLAYBOOK_LOG)
    assert [r.step for r in log.steps] == [1, 2] and log.format_version == "nanotron-2024"
    first = log.steps[0]
    assert (first.step_time_s, first.tokens_per_sec_per_gpu, first.global_batch_size) == (4.21, 7780.0, 64)
    assert (first.loss, first.learning_rate, first.grad_norm, first.tflops_per_gpu) == (12.1, 6e-05, 8.73, 301.0)
    assert first.mem_reserved_bytes == 58_100_000_000 and first.mem_allocated_bytes is None
    # the peak over the ranks that logged: rank 0's " Memory usage" line beats the logging rank's
    assert log.peak_mem_allocated_bytes == round(61234.75 * MiB)
    assert log.peak_mem_reserved_bytes == round(64020.00 * MiB)
    assert len(log.memory) == 5  # four "[After model building]" (every tp/pp rank) and rank 0's line


def test_main_lines_with_the_renamed_step_time(parser):
    log = parser.parse_text(MAIN_LOG)
    assert [r.step for r in log.steps] == [1, 2] and log.format_version == "nanotron-2025-03-26"
    second = log.steps[1]
    assert (second.step_time_s, second.tokens_per_sec, second.tflops_per_gpu) == (1.52, 172000.0, 834.0)
    assert (second.loss, second.grad_norm, second.total_steps) == (11.9, 7.9, 20)
    assert second.global_batch_size is None  # logged in tokens (262K) since 8279c784
    assert second.mem_reserved_bytes is None and second.timestamp is None
    assert log.peak_mem_allocated_bytes == round(61234.75 * MiB)


def test_both_step_time_keys_give_the_same_record_apart_from_the_version(parser):
    old = "02/19/2025 16:40:11 [INFO|DP=0|PP=1|TP=0]: iteration: 2 / 20 | elapsed_time_per_iteration_ms: 1.52K | lm_loss: 11.9"
    new = "\x1b[2;3m02/19 16:40:11 [INFO|PP=1]\x1b[0m: iteration: 2 / 20 | time_per_iteration_ms: 1.52K | lm_loss: 11.9"
    a, b = parser.match_step(old), parser.match_step(new)
    assert (a.step_time_s, a.loss) == (b.step_time_s, b.loss) == (1.52, 11.9)
    assert (a.format_version, b.format_version) == ("nanotron-2024", "nanotron-2025-03-26")
