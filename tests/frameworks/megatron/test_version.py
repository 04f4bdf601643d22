"""The Megatron version a job finds: a checkout's package_info.py, or installed megatron-core."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

import pytest

from sweep.frameworks.megatron import ADAPTER, version

PACKAGE_INFO = '''# Copyright (c) 2023, NVIDIA CORPORATION.  All rights reserved.
# isort: skip_file


MAJOR = {major}
MINOR = {minor}
PATCH = {patch}
PRE_RELEASE = {pre!r}

# Use the following formatting: (major, minor, patch, pre-release)
VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)
'''  # the head of megatron/core/package_info.py (core_v0.17.1, 0.19.2 and main @d98e8a64)


def checkout(tmp_path: Path, major: int = 0, minor: int = 19, patch: int = 2, pre: str = "",
             git: bool = False) -> Path:
    info = tmp_path / "megatron" / "core" / "package_info.py"
    info.parent.mkdir(parents=True)
    info.write_text(PACKAGE_INFO.format(major=major, minor=minor, patch=patch, pre=pre))
    if git:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t", "GIT_COMMITTER_DATE": "2026-08-22T15:22:22+00:00",
               "GIT_AUTHOR_DATE": "2026-08-22T15:22:22+00:00", "HOME": str(tmp_path)}
        for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
            subprocess.run(["git", "-C", str(tmp_path), *command], check=True, env=env)
    return tmp_path


def test_the_key_is_the_adapters() -> None:
    assert version.KEY == ADAPTER.default_version


@pytest.mark.parametrize(("minor", "patch", "pre"), [(17, 0, "rc0"), (17, 1, ""), (19, 2, ""),
                                                     (20, 0, "")])
def test_supported_checkouts(tmp_path: Path, minor: int, patch: int, pre: str) -> None:
    found = version.detect(str(checkout(tmp_path, minor=minor, patch=patch, pre=pre)))
    assert found.key == "core_r0.17+" and found.problem is None
    assert f"megatron-core 0.{minor}.{patch}{pre}" in found.found


def test_an_older_checkout_is_refused_with_the_fix(tmp_path: Path) -> None:
    found = version.detect(str(checkout(tmp_path, minor=16, patch=1)))
    assert found.key is None and "0.16.1 is older than 0.17" in found.problem
    assert "core_v0.17.1" in found.problem


def test_the_git_commit_is_part_of_what_was_found(tmp_path: Path) -> None:
    found = version.detect(str(checkout(tmp_path, git=True)))
    assert found.found.startswith("Megatron-LM @") and "(2026-08-22)" in found.found


def test_a_folder_that_is_not_a_checkout(tmp_path: Path) -> None:
    found = version.detect(str(tmp_path))
    assert found.key is None and "not a Megatron-LM checkout" in found.problem


def test_unreadable_version_lines(tmp_path: Path) -> None:
    info = tmp_path / "megatron" / "core" / "package_info.py"
    info.parent.mkdir(parents=True)
    info.write_text("MAJOR = 'x'\n")
    found = version.detect(str(tmp_path))
    assert found.key is None and "MAJOR/MINOR/PATCH" in found.problem


def test_installed_megatron_core_without_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    def installed(name: str) -> str:
        if name != "megatron-core":
            raise importlib.metadata.PackageNotFoundError(name)
        return "0.19.2"

    monkeypatch.setattr(importlib.metadata, "version", installed)
    assert version.detect(None).key == "core_r0.17+"

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    found = version.detect(None)
    assert found.key is None and "MEGATRON_DIR" in found.problem


def test_the_wheels_package_info_reads(repo_root: Path) -> None:
    wheel = repo_root / ".contract" / "megatron-0.19.2"
    if not wheel.is_dir():
        pytest.skip("megatron-core 0.19.2 not installed: bash scripts/contract/megatron.sh")
    # inside llm-sweep's own git work tree, but not a git checkout itself: no commit is claimed
    assert version.detect(str(wheel)).found == "Megatron-LM checkout, megatron-core 0.19.2"
