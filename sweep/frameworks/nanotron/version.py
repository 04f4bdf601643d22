"""Which supported nanotron version a checkout is (see sweep.frameworks.versions).

Decided from the checkout's source, not from dates, so that forks and cherry-picks are judged by
what they run:

- the step-time key its trainer logs: `LogItem("time_per_iteration_ms"` (main from 8279c784,
  2025-03-26) or `LogItem("elapsed_time_per_iteration_ms"` (before; the parser reads both, but the
  rendered YAML differs);
- whether ParallelismArgs has `context_parallel_size` (main from bc921993, 2025-03-21): the strict
  config loader rejects our YAML's key where it lacks it, and needs it nowhere else;
- for the playbook key, that the config modules are byte-identical (git blob ids) to e24d2483's,
  since older commits without context parallelism declare other fields.

The commit and its date (from git, when the checkout is a repository) are reported, not judged.
Fast (a few small file reads and two git calls with a timeout) and never raises.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Final

from sweep.frameworks.nanotron.config_schema import MAIN, PLAYBOOK, PLAYBOOK_COMMIT
from sweep.frameworks.versions import DetectedVersion

TRAINER: Final = "src/nanotron/trainer.py"
PARALLELISM: Final = "src/nanotron/config/parallelism_config.py"
NEW_STEP_KEY: Final = re.compile(r'LogItem\(\s*"time_per_iteration_ms"')
OLD_STEP_KEY: Final = re.compile(r'LogItem\(\s*"elapsed_time_per_iteration_ms"')
CP_FIELD: Final = re.compile(r"^\s+context_parallel_size\s*:\s*int\b", re.MULTILINE)

# `git rev-parse e24d2483:<path>` for the modules whose dataclasses the YAML loads into.
PLAYBOOK_BLOBS: Final = {
    "src/nanotron/config/config.py": "8a8c8926a784dfc19ee0d70faf6d8fafc3ff7c05",
    "src/nanotron/config/models_config.py": "d92de40546c1c967322045823c595ef80f656387",
    "src/nanotron/config/parallelism_config.py": "7f20ad997edc373d1dc978565b345169e92eab2c",
    "src/nanotron/config/utils_config.py": "f4c07146266b6576ab989bd1a9318eb7c10d95ef",
}
UPGRADE: Final = ("check out nanotron main at or after 8279c784 (2025-03-26) and render for "
                  f"{MAIN!r}, or check out {PLAYBOOK_COMMIT[:8]} and render for {PLAYBOOK!r}")


def _git(directory: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                             text=True, timeout=0.4, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _blob_id(path: Path) -> str | None:
    """git's blob id of a file (sha1 of "blob <size>\\0" + bytes), without git."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's id


def _found(directory: Path) -> str:
    commit = _git(directory, "rev-parse", "HEAD")
    if commit is None:
        return f"nanotron at {directory} (not a git checkout)"
    date = _git(directory, "log", "-1", "--format=%cs")
    return f"nanotron @ {commit[:8]}" + (f" ({date})" if date else "")


def classify(trainer: str, parallelism: str, playbook_config: bool) -> tuple[str | None, str | None]:
    """(key, problem) from the source markers: pure, for tests."""
    new_key, old_key = bool(NEW_STEP_KEY.search(trainer)), bool(OLD_STEP_KEY.search(trainer))
    has_cp = bool(CP_FIELD.search(parallelism))
    if new_key and has_cp:
        return MAIN, None
    if old_key and not has_cp:
        if playbook_config:
            return PLAYBOOK, None
        return None, ("a nanotron from before 2025-03-21 whose config classes differ from "
                      f"{PLAYBOOK_COMMIT[:8]}'s, so the rendered YAML may not load; " + UPGRADE)
    if old_key and has_cp:
        return None, ("nanotron main of 2025-03-21..25: it has context_parallel_size but still "
                      "the old step line; " + UPGRADE)
    return None, ("neither of nanotron's known step-time keys (time_per_iteration_ms, "
                  f"elapsed_time_per_iteration_ms) is in {TRAINER}: an unknown nanotron; " + UPGRADE)


def detect(framework_dir: str | None) -> DetectedVersion:
    if not framework_dir:
        return DetectedVersion(found="no nanotron checkout", key=None,
                               problem="set run.framework_dir (or NANOTRON_DIR) to a nanotron checkout")
    directory = Path(framework_dir)
    try:
        trainer = (directory / TRAINER).read_text(errors="replace")
        parallelism = (directory / PARALLELISM).read_text(errors="replace")
    except OSError as error:
        return DetectedVersion(found=f"no nanotron at {directory}", key=None,
                               problem=f"cannot read {error.filename}: point run.framework_dir "
                                       "(or NANOTRON_DIR) at a nanotron checkout")
    playbook_config = all(_blob_id(directory / path) == blob for path, blob in PLAYBOOK_BLOBS.items())
    key, problem = classify(trainer, parallelism, playbook_config)
    return DetectedVersion(found=_found(directory), key=key, problem=problem)
