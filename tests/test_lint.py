"""Lint and type-check as part of the tests: ruff and mypy, configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's ruff and mypy, the pins of the `test` extra


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    tool = BIN / command[0]
    if not tool.exists():
        pytest.fail(f"{tool} not found: pip install -e '.[test]'")
    return subprocess.run([str(tool), *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff() -> None:
    result = _run("ruff", "check", "sweep", "analysis", "tests", "benchmarks", "scripts")
    if result.returncode != 0:
        pytest.fail(f"ruff found problems:\n{result.stdout}{result.stderr}", pytrace=False)


@pytest.mark.slow  # about 30 s without a warm .mypy_cache
def test_mypy() -> None:
    result = _run("mypy")  # files and options from [tool.mypy]
    if result.returncode != 0:
        pytest.fail(f"mypy found problems:\n{result.stdout}{result.stderr}", pytrace=False)


def test_imports_keep_the_layers() -> None:
    """The folder tree is the architecture: `lint-imports` holds the contracts in pyproject.toml
    (each layer imports only those below it; the job loads no numpy; nothing in the product
    imports sweep.validation; the analysis never imports Slurm, the backends or the watchdog)."""
    result = _run("lint-imports")
    if result.returncode != 0:
        pytest.fail(f"import contracts broken:\n{result.stdout}{result.stderr}", pytrace=False)


def test_only_the_command_line_stands_directly_in_the_package() -> None:
    """Every module of sweep/ lives in the subpackage of its job (docs/architecture.md)."""
    loose = sorted(p.name for p in (ROOT / "sweep").glob("*.py"))
    assert loose == ["__init__.py", "cli.py"]
