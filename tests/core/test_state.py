"""State files: atomic writes, torn ledger lines, attempt numbering."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sweep.core import state


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "status.json"
    state.atomic_write_json(target, {"outcome": "completed"})
    state.atomic_write_json(target, {"outcome": "oom"})
    assert state.read_json(target) == {"outcome": "oom"}
    assert os.listdir(target.parent) == ["status.json"]


def test_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert state.read_json(tmp_path / "nope.json") is None
    assert list(state.read_jsonl(tmp_path / "nope.jsonl")) == []


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    ledger = tmp_path / state.LEDGER_FILE
    state.append_jsonl(ledger, {"event": "before_sbatch", "n": 1})
    state.append_jsonl(ledger, {"event": "after_sbatch", "n": 1})
    with open(ledger, "a") as handle:
        handle.write('{"event": "before_sb')  # a submitter killed mid-write
    assert [r["event"] for r in state.read_jsonl(ledger)] == ["before_sbatch", "after_sbatch"]


def test_a_record_is_a_whole_json_object_on_one_line() -> None:
    """The rule every JSON-lines reader shares (ledger, metrics.jsonl in collect and the watchdog)."""
    assert state.json_record('{"kind": "step", "step": 3}\n') == {"kind": "step", "step": 3}
    assert state.json_record('{"kind": "st') is None  # torn
    assert state.json_record("[1, 2]") is None  # JSON, but no record
    assert state.json_record("7") is None
    assert state.json_record("[" * 100_000 + "]" * 100_000) is None  # too deep to decode


def test_a_line_that_is_not_an_object_is_not_yielded(tmp_path: Path) -> None:
    ledger = tmp_path / state.LEDGER_FILE
    ledger.write_text('{"event": "before_sbatch"}\n[1, 2]\n"text"\n{"event": "after_sbatch"}\n')
    assert [r["event"] for r in state.read_jsonl(ledger)] == ["before_sbatch", "after_sbatch"]


def test_attempt_numbers_are_unique_under_concurrency(tmp_path: Path) -> None:
    made: list[Path] = []
    threads = [threading.Thread(target=lambda: made.append(state.new_attempt_dir(tmp_path)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(int(p.name) for p in made) == list(range(1, 9))
    assert [p.name for p in state.attempt_dirs(tmp_path)] == [str(i) for i in range(1, 9)]


def test_files_written_through_a_temporary_name_get_the_usual_mode(tmp_path) -> None:
    """mkstemp makes 0600 files; a sweep folder is shared, so they must read like the rest."""
    import os

    from sweep.core.state import atomic_write_json

    path = tmp_path / "bad_nodes.json"
    atomic_write_json(path, {"a": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
