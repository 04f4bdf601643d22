"""The builtin parser reads metrics.jsonl records as the shared contract defines them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.frameworks import get_parser
from sweep.frameworks.log_parser import LogParseError


def _step(step: int, step_time_s: float, loss: float) -> dict[str, object]:
    return {
        "kind": "step", "step": step, "time": 1763800000.0 + step, "step_time_s": step_time_s, "tokens": 1024,
        "tokens_per_sec": 1024 / step_time_s, "tokens_per_sec_per_gpu": 512 / step_time_s, "loss": loss,
        "flops_per_token": {"megatron": 1.0e6, "full_attention": 1.1e6, "6N": 0.9e6},
        "mfu": {"megatron": 0.1, "full_attention": 0.11, "6N": 0.09}, "mfu_pct": 11.0,
        "peak_flops": 9.895e14, "peak_flops_source": "catalog:h100-sxm:bf16",
        "mem_allocated_bytes": 1000 + step, "mem_reserved_bytes": 4096 + step, "mem_source": "cpu-rss-anon",
        "mem_per_rank": [{"rank": 0, "allocated_bytes": 1000, "reserved_bytes": 4096}],
    }  # fmt: skip


SUMMARY = {"kind": "summary", "steps": 3, "warmup_steps_skipped": 1, "step_time_mean_s": 0.25, "ended_by": "step_budget"}


def _write(path: Path, records: list[dict[str, object]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


@pytest.fixture(scope="module")
def parser():
    return get_parser("builtin")


def test_step_records_and_summary(parser, tmp_path):
    path = _write(tmp_path / "metrics.jsonl", [_step(1, 0.5, 7.0812), _step(2, 0.25, 6.5), _step(3, 0.25, 6.1), SUMMARY])
    log = parser.parse_file(path)
    assert [r.step for r in log.steps] == [1, 2, 3]
    first = log.steps[0]
    assert (first.step_time_s, first.loss, first.tokens, first.mfu_pct) == (0.5, 7.0812, 1024, 11.0)
    assert (first.tokens_per_sec, first.tokens_per_sec_per_gpu) == (2048.0, 1024.0)
    assert (first.mem_allocated_bytes, first.mem_reserved_bytes, first.timestamp) == (1001, 4097, 1763800001.0)
    assert log.summary == SUMMARY
    assert log.format_version == "builtin-1"
    assert log.peak_mem_reserved_bytes == 4099 and log.problems == ()


def test_torn_last_line_is_skipped_and_reported(parser, tmp_path):
    path = _write(tmp_path / "metrics.jsonl", [_step(1, 0.5, 7.0)], tail=json.dumps(_step(2, 0.5, 6.9))[:40])
    log = parser.parse_file(path)
    assert [r.step for r in log.steps] == [1]
    assert log.truncated and log.summary is None
    assert f"{path}:2:" in log.problems[0]


def test_corrupt_and_incomplete_records_are_reported_not_fatal(parser, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        json.dumps(_step(1, 0.5, 7.0)) + "\n"
        + "{not json\n"
        + json.dumps({"kind": "step", "step": "two"}) + "\n"
        + json.dumps({"kind": "note", "text": "a record kind readers do not know"}) + "\n"
        + json.dumps(_step(3, 0.5, 6.8)) + "\n"
    )  # fmt: skip
    log = parser.parse_file(path)
    assert [r.step for r in log.steps] == [1, 3]
    assert log.problems == (
        f"{path}:2: not a JSON object; skipped",
        f"{path}:3: step record without an integer 'step'; skipped",
    )


def test_match_step_on_single_lines(parser):
    assert parser.match_step(json.dumps(_step(4, 0.2, 6.0))).step == 4
    assert parser.match_step(json.dumps(SUMMARY)) is None
    assert parser.match_step("[1, 2, 3]") is None
    assert parser.match_step('{"kind": "step", "step": true}') is None
    assert parser.match_step("garbage") is None


def test_unknown_framework_and_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="known frameworks: builtin, megatron, nanotron, torchtitan"):
        get_parser("deepspeed")
    with pytest.raises(LogParseError, match="is a directory"):
        get_parser("builtin").parse_file(tmp_path)
    binary = tmp_path / "metrics.jsonl"
    binary.write_bytes(b"\x00\x01\x02")
    with pytest.raises(LogParseError, match=str(binary)):
        get_parser("builtin").parse_file(binary)
