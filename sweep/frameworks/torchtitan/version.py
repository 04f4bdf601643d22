"""Which torchtitan a job is about to run (see sweep.frameworks.versions).

Supported: the TOML/CLI JobConfig of torchtitan 0.2.x. Two keys, because the seed moved:
- ``v0.2.0``: torchtitan 0.2.0 (`training.seed`). A checkout from 8a2686c4a (2025-09-30, the
  float8 converter renamed to "quantize.linear.float8") to before e61f2cce4 (2025-10-29).
- ``v0.2``: torchtitan 0.2.1 and 0.2.2 (`debug.seed`, e61f2cce4). A checkout from e61f2cce4 to
  before 9810191bb (2026-02-23), which replaced the TOML JobConfig with Python config registries
  (torchtitan/config/job_config.py deleted; `--module/--config`): torchtitan 0.3.0 and today's
  main read none of our settings and are refused.

A checkout is recognised by source markers (no import, no torch): job_config.py and its `class
Debug`, and the converter name registered in components/quantization/float8.py. Without a
checkout, the installed `torchtitan` distribution's version decides.
"""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Final

from sweep.frameworks.versions import DetectedVersion

V020: Final = "v0.2.0"
V02: Final = "v0.2"
JOB_CONFIG: Final = "torchtitan/config/job_config.py"
FLOAT8: Final = "torchtitan/components/quantization/float8.py"
NEW_CONFIG_MARKERS: Final = ("torchtitan/config/configs.py", "torchtitan/config/configurable.py")
USE_02: Final = ("use torchtitan 0.2.x: `pip install torchtitan==0.2.2`, or a checkout of tag "
                 "v0.2.2 (git checkout v0.2.2)")


def key_for_release(version: str) -> tuple[str | None, str | None]:
    """(key, problem) for a released version string such as "0.2.2" or "0.3.0.dev20260301"."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return None, f"cannot read the torchtitan version {version!r}; {USE_02}"
    release = tuple(int(part) for part in match.groups())
    if release[:2] == (0, 2):
        return (V020 if release[2] == 0 else V02), None
    if release < (0, 2, 0):
        return None, f"torchtitan {version} predates the 0.2 JobConfig llm-sweep renders; {USE_02}"
    return None, registry_problem(f"torchtitan {version}")


def registry_problem(what: str) -> str:
    return (f"{what} configures runs with Python config registries (--module/--config; "
            f"9810191bb, 2026-02-23, as in torchtitan 0.3.0 and main), which llm-sweep does not "
            f"render; {USE_02}")


def key_for_checkout(root: Path) -> tuple[str | None, str | None]:
    """(key, problem) from the source markers of a checkout."""
    if not (root / "torchtitan").is_dir():
        return None, f"{root} has no torchtitan/ package: point run.framework_dir at a torchtitan checkout"
    job_config = root / JOB_CONFIG
    if not job_config.is_file():
        if any((root / marker).is_file() for marker in NEW_CONFIG_MARKERS):
            return None, registry_problem(f"the checkout {root} (no {JOB_CONFIG})")
        return None, f"{root} has no {JOB_CONFIG}; {USE_02}"
    float8 = root / FLOAT8
    if not float8.is_file() or '"quantize.linear.float8"' not in float8.read_text(errors="replace"):
        return key_for_release("0.1.0")
    return (V02 if "class Debug" in job_config.read_text(errors="replace") else V020), None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=0.5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def describe_checkout(root: Path) -> str:
    """"torchtitan 0.2.2 @ 73a0e69 (2026-02-20) in DIR", as much of it as can be read."""
    text = "torchtitan"
    version_file = root / "assets" / "version.txt"
    if version_file.is_file():
        text += " " + version_file.read_text(errors="replace").strip()[:40]
    commit = _git(root, "log", "-1", "--format=%h %cs")
    if commit:
        sha, _, day = commit.partition(" ")
        text += f" @ {sha} ({day})"
    return f"{text} in {root}"


def detect(framework_dir: str | None) -> DetectedVersion:
    try:
        if framework_dir:
            root = Path(framework_dir).expanduser()
            key, problem = key_for_checkout(root)
            return DetectedVersion(found=describe_checkout(root), key=key, problem=problem)
        try:
            version = metadata.version("torchtitan")
        except metadata.PackageNotFoundError:
            return DetectedVersion(found="no torchtitan", key=None,
                                   problem="torchtitan is not installed and no checkout is set: "
                                           "set run.framework_dir (or TORCHTITAN_DIR) to a "
                                           "torchtitan 0.2.x checkout")
        key, problem = key_for_release(version)
        return DetectedVersion(found=f"torchtitan {version}", key=key, problem=problem)
    except Exception as error:  # noqa: BLE001 - detection reports, it never takes a job down
        return DetectedVersion(found="unknown", key=None,
                               problem=f"torchtitan version detection failed: {error!r}")
