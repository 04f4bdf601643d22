"""Which Megatron a job is about to run (see sweep.frameworks.versions).

A Megatron-LM checkout carries its megatron-core version in megatron/core/package_info.py
(`MAJOR = 0`, `MINOR = 19`, `PATCH = 2`, `PRE_RELEASE = ""`), so the version is read from that
file, with the checkout's git commit when it is a git work tree. Without a checkout, the
installed megatron-core distribution's metadata is used. Nothing here imports Megatron or torch
(importing megatron.core takes seconds and needs its dependencies): the file is read as text.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path
from typing import Final

from sweep.frameworks.versions import DetectedVersion

KEY: Final = "core_r0.17+"
OLDEST: Final = (0, 17)
PACKAGE_INFO: Final = Path("megatron") / "core" / "package_info.py"
_FIELD = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([\w.]*)['\"]?\s*$", re.MULTILINE)
_RELEASE = re.compile(r"^(\d+)\.(\d+)")
GIT_TIMEOUT_S: Final = 0.8


def version_from_package_info(text: str) -> str | None:
    """"0.19.2" (or "0.20.0rc1") from package_info.py's MAJOR/MINOR/PATCH/PRE_RELEASE lines."""
    fields = dict(_FIELD.findall(text))
    if not all(fields.get(k, "").isdigit() for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}"


def classify(version: str) -> tuple[str | None, str | None]:
    """(key, problem) of a megatron-core version string."""
    match = _RELEASE.match(version)
    if match is None:
        return None, f"cannot read the megatron-core version {version!r}"
    if (int(match[1]), int(match[2])) < OLDEST:
        return None, (f"megatron-core {version} is older than {OLDEST[0]}.{OLDEST[1]}, the oldest "
                      "release llm-sweep renders pretrain_gpt.py arguments for; use a checkout of "
                      "tag core_v0.17.1 or newer")
    return KEY, None


def _git_commit(checkout: Path) -> str | None:
    """"@1a2b3c4 (2026-08-22)" of a git checkout, None when it is not one (or git is slow).

    Only the checkout's own repository counts (a .git there), not one that encloses it."""
    if not (checkout / ".git").exists():
        return None
    try:
        result = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %cs"],
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                                check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = result.stdout.split()
    return f"@{parts[0]} ({parts[1]})" if result.returncode == 0 and len(parts) == 2 else None


def _from_checkout(checkout: Path) -> DetectedVersion:
    info = checkout / PACKAGE_INFO
    try:
        text = info.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return DetectedVersion(found=f"no {PACKAGE_INFO} in {checkout}", key=None,
                               problem=f"{checkout} is not a Megatron-LM checkout (no "
                                       f"{PACKAGE_INFO}); point run.framework_dir or "
                                       "MEGATRON_DIR at one")
    version = version_from_package_info(text)
    commit = _git_commit(checkout)
    found = f"Megatron-LM {commit or 'checkout'}, megatron-core {version or 'unknown'}"
    if version is None:
        return DetectedVersion(found=found, key=None,
                               problem=f"{info} has no MAJOR/MINOR/PATCH version lines")
    key, problem = classify(version)
    return DetectedVersion(found=found, key=key, problem=problem)


def detect(framework_dir: str | None) -> DetectedVersion:
    """The checkout's version when there is one, else the installed megatron-core's. Never raises."""
    try:
        if framework_dir:
            return _from_checkout(Path(framework_dir))
        try:
            version = importlib.metadata.version("megatron-core")
        except importlib.metadata.PackageNotFoundError:
            return DetectedVersion(found="no megatron-core", key=None,
                                   problem="no Megatron-LM checkout given and megatron-core is "
                                           "not installed: set run.framework_dir or MEGATRON_DIR")
        key, problem = classify(version)
        return DetectedVersion(found=f"megatron-core {version}", key=key, problem=problem)
    except Exception as error:  # noqa: BLE001 - detection must never take a job down by itself
        return DetectedVersion(found="unknown", key=None,
                               problem=f"megatron version detection failed: {error!r}")
