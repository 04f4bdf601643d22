"""Progress as the watchdog reads it: new step records in the shared attempt folder."""

from __future__ import annotations

import json
from pathlib import Path

from sweep.frameworks import get_parser
from sweep.job.progress import FileTail, Progress, read_tail

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    tail = FileTail(path)
    assert tail.read_lines() == []  # not there yet
    path.write_text("one\ntw")
    assert tail.read_lines() == ["one"]
    with open(path, "a") as f:
        f.write("o\nthree\n")
    assert tail.read_lines() == ["two", "three"]
    assert tail.read_lines() == []
    path.write_text("new\n")  # replaced by a shorter file: read from the start
    assert tail.read_lines() == ["new"]


def test_metrics_step_records_are_progress_and_the_summary_is_kept(tmp_path: Path) -> None:
    progress = Progress(tmp_path)
    assert progress.poll() == 0 and progress.last_progress is None
    with open(tmp_path / "metrics.jsonl", "a") as f:
        for step in (1, 2):
            f.write(json.dumps({"kind": "step", "step": step}) + "\n")
        f.write('{"kind": "step", "st')  # a writer in mid-line
    assert progress.poll() == 2 and (progress.last_step, progress.steps_seen) == (2, 2)
    first = progress.last_progress
    assert first is not None and progress.poll() == 0 and progress.last_progress == first
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('ep": 3}\n' + json.dumps({"kind": "summary", "steps": 3}) + "\n")
    assert progress.poll() == 1 and progress.last_step == 3
    assert progress.summary == {"kind": "summary", "steps": 3}


def test_framework_step_lines_on_any_node_are_progress(tmp_path: Path) -> None:
    progress = Progress(tmp_path, get_parser("torchtitan").match_step)
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [ln for ln in (FIXTURES / "torchtitan_steps_3.log").read_text().splitlines()
             if not ln.startswith("#SOURCE")]
    (logs / "node0.out").write_text("")
    (logs / "node1.err").write_text("\n".join(lines) + "\n")  # torchtitan logs from rank 0 only
    steps = [ln for ln in lines if " step: " in ln]
    assert progress.poll() == len(steps) > 0
    assert progress.last_step == max(int(ln.split(" step: ")[1].split()[0]) for ln in steps)


def test_read_tail_starts_at_a_line(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    tail = read_tail(path, max_bytes=100)
    assert tail.endswith("line 999\n") and tail.startswith("line ") and len(tail) <= 100
    assert read_tail(tmp_path / "missing") == ""


def test_step_times_are_kept_once_per_step_in_step_order(tmp_path: Path) -> None:
    """Real Megatron lines, printed by two nodes (a late one included): one time per step."""
    parser = get_parser("megatron")
    progress = Progress(tmp_path, parser.match_step)
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [ln for ln in (FIXTURES / "megatron_steps_4.log").read_text().splitlines()
             if parser.match_step(ln) is not None]
    expected = {parser.match_step(ln).step: parser.match_step(ln).step_time_s for ln in lines}
    (logs / "node1.out").write_text("\n".join(lines[1:]) + "\n")
    progress.poll()
    assert list(progress.step_times) == sorted(expected)[1:]
    (logs / "node0.out").write_text("\n".join(lines) + "\n")  # the same lines, and the first one late
    progress.poll()
    assert progress.step_times == expected and list(progress.step_times) == sorted(expected)


def test_a_step_printed_by_every_rank_is_counted_once(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = "".join(f"[rank{rank}]:step {step}\n" for step in (1, 2, 3) for rank in range(4))
    (logs / "node0.out").write_text(lines)

    class Step:
        def __init__(self, step: int) -> None:
            self.step = step

    def match(line: str):  # noqa: ANN202 - a stand-in for a framework parser
        return Step(int(line.rsplit(" ", 1)[1])) if "step" in line else None

    from sweep.job.progress import Progress

    progress = Progress(tmp_path, match_step=match)
    assert progress.poll() == 12  # twelve records: progress
    assert progress.steps_seen == 3 and progress.last_step == 3
