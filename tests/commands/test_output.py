"""Rich tables piped to a file (no terminal): titles are not wrapped one word per line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sweep.cli import main
from sweep.commands._output import output_console, titled_table
from tests.specs import tiny_cpu_spec


def test_a_narrow_table_keeps_its_title_on_one_line() -> None:
    title = "results-of-a-long-sweep-name: 11 run(s)"
    table = titled_table(title)
    table.add_column("state")
    table.add_row("completed")
    console = Console(file=io.StringIO(), width=160)
    console.print(table)
    assert title in console.file.getvalue().splitlines()[0]  # type: ignore[attr-defined]


def test_without_a_terminal_the_console_is_wide() -> None:
    assert output_console(140).width >= 140  # pytest captures stdout: not a terminal


def test_sweep_plan_piped_keeps_table_titles_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", "titles")
    assert main(["plan", str(spec), "--out", str(tmp_path / "out"), "--candidates"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for title in ("sweep plan: candidates per (model, nodes)",
                  "sweep plan: kept candidates, predicted (throughput model)"):
        assert any(title in line for line in lines), title
