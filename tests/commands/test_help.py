"""Every command's --help reads well in a narrow terminal: argparse wraps at spaces only, so a
word is never broken across lines (a comma-joined list has no space to wrap at)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sweep.cli import COMMANDS


def _help(command: str, columns: int) -> list[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run([sys.executable, "-m", "sweep.cli", command, "--help"], env=env,
                          capture_output=True, text=True, check=True, timeout=120)
    return done.stdout.split()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_word_of_a_commands_help_is_broken_at_80_columns(command: str) -> None:
    assert _help(command, 80) == _help(command, 1000)
