"""`sweep frameworks` prints the support matrix, then how fresh it is, from the code itself."""

from __future__ import annotations

import subprocess
import sys

from sweep.frameworks.matrix import capability_tables, freshness_table, support_matrix


def frameworks(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "sweep.cli", "frameworks", *args],
                          capture_output=True, text=True, check=True, timeout=120)
    return done.stdout


def test_it_prints_the_supported_versions_and_the_newest_release_checked_per_framework() -> None:
    out = frameworks()
    assert out.index(support_matrix()) < out.index(freshness_table())
    assert "newest release checked" in out
    assert capability_tables() not in out


def test_capabilities_adds_every_rule() -> None:
    assert capability_tables() in frameworks("--capabilities")
