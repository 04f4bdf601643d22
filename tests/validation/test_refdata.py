"""The reference data: one setting says where it is, the script checks every file, and its
absence skips (never fails) the tests that need it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.validation import refdata

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "get-refdata.sh"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          check=False, timeout=120)


def test_the_setting_names_the_folder_and_defaults_to_data_refdata(monkeypatch) -> None:
    monkeypatch.delenv(refdata.ENV_VAR, raising=False)
    assert refdata.refdata_dir() == REPO / "data" / "refdata"
    monkeypatch.setenv(refdata.ENV_VAR, "/somewhere/else")
    assert refdata.refdata_dir() == Path("/somewhere/else")


def test_a_missing_file_names_the_script(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(refdata.ENV_VAR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="get-refdata.sh"):
        refdata.refdata_file("playbook_runs_1B_8B.csv")


def test_the_data_is_not_in_git() -> None:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "data"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked == ["data/README.md"]


def test_the_copy_is_checked_file_by_file_and_a_changed_file_is_refused(refdata, tmp_path) -> None:
    dest = tmp_path / "copy"
    done = run_script("--from", str(refdata), "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    assert (dest / "playbook_runs_1B_8B.csv").read_bytes() == \
        (refdata / "playbook_runs_1B_8B.csv").read_bytes()
    assert run_script("--check", "--dest", str(dest)).returncode == 0

    tampered = tmp_path / "tampered"
    shutil.copytree(refdata, tampered)
    (tampered / "playbook_runs_1B_8B.csv").chmod(0o644)
    with open(tampered / "playbook_runs_1B_8B.csv", "a", encoding="utf-8") as handle:
        handle.write("1,2,3\n")
    refused = run_script("--from", str(tampered), "--dest", str(tmp_path / "second"))
    assert refused.returncode == 1
    assert "playbook_runs_1B_8B.csv has sha256" in refused.stderr
    assert not (tmp_path / "second" / "playbook_runs_1B_8B.csv").exists()


def test_a_missing_source_folder_is_a_usage_error(tmp_path) -> None:
    done = run_script("--from", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_without_the_data_its_tests_skip_with_one_line_naming_the_script(tmp_path) -> None:
    env = {**os.environ, refdata.ENV_VAR: str(tmp_path / "absent")}
    env.pop("SWEEP_REQUIRE_REFDATA", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         str(REPO / "tests" / "validation" / "test_memory_check.py"), "-k", "formats_are_told_apart"],
        capture_output=True, text=True, check=False, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "scripts/get-refdata.sh" in done.stdout
    assert "1 test(s) need the third-party reference data" in done.stdout  # said once, counted
