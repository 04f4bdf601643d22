"""Shared test fixtures: where the repository and the reference data are."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFDATA = REPO.parent / "shared" / "refdata"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def refdata() -> Path:
    if not REFDATA.is_dir():
        pytest.fail(f"reference data not found at {REFDATA}: the checkout needs ../shared beside it")
    return REFDATA
