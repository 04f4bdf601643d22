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


def slurm_available() -> bool:
    """A live local cluster: `scontrol ping` answers."""
    import shutil
    import subprocess

    if shutil.which("scontrol") is None:
        return False
    result = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    return result.returncode == 0 and "UP" in result.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Tests marked with this need the real cluster of scripts/local-slurm.sh.

    Under the test command (SWEEP_REQUIRE_SLURM=1) a missing cluster fails the test; elsewhere
    it skips, so a developer without root can still run the rest.
    """
    import os

    if slurm_available():
        return
    message = "no Slurm cluster answers `scontrol ping`: run `sudo scripts/local-slurm.sh start`"
    if os.environ.get("SWEEP_REQUIRE_SLURM") == "1":
        pytest.fail(message)
    pytest.skip(message)
