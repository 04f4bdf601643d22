"""Which torchtitan a job is about to run (see sweep.frameworks.versions).

Two forms, four keys:
- the TOML/CLI JobConfig of torchtitan 0.2.x (templates/launch/torchtitan.toml.j2):
  ``v0.2.0``: torchtitan 0.2.0 (`training.seed`), a checkout from 8a2686c4a (2025-09-30, the
  float8 converter renamed to "quantize.linear.float8") to before e61f2cce4 (2025-10-29);
  ``v0.2``: torchtitan 0.2.1 and 0.2.2 (`debug.seed`, e61f2cce4), a checkout from e61f2cce4 to
  before 9810191bb (2026-02-23), which replaced the JobConfig with Python config registries;
- the Python config module (templates/launch/torchtitan.config.py.j2, `--module/--config`):
  ``v0.3``: torchtitan 0.3.0 (PyPI, 2026-09-03, cut from a release branch: `training.local_batch_size`,
  `parallelism.pipeline_parallel_microbatch_size`); ``main``: a main checkout from 73aed7f6c
  (2026-08-20, "fold batch dim": token budgets `training.num_tokens_per_microbatch_per_dp_rank`,
  `parallelism.num_pp_microbatches`, `training.max_context_length`) up to b5bcd76c6 (2026-08-21), the
  commit the contract tests pin. main's assets/version.txt still says 0.2.2, so a checkout is
  told by its source markers (torchtitan/config/configs.py), never by that file.

A checkout is recognised by source markers (no import, no torch); when it is a git repository, a
main checkout must also be the pinned commit or an ancestor of it (`git merge-base --is-ancestor
HEAD <pin>`): a later main is refused by name, with the fix. Without a checkout, the installed
`torchtitan` distribution's version decides (0.3.0 only: a nightly 0.3.x.devN is some main commit
no one can name, so it is refused).
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
V03: Final = "v0.3"
MAIN: Final = "main"
CONFIG_MODULE_KEYS: Final = (V03, MAIN)  # the keys rendered as a Python config module
MAIN_PIN: Final = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"  # 2026-08-21, the contract tests' main
MAIN_FIRST: Final = "73aed7f6c"  # 2026-08-20, "fold batch dim (#4121)": the token-budget settings
REGISTRY_COMMIT: Final = "9810191bb"  # 2026-02-23: the JobConfig TOML replaced by config registries
JOB_CONFIG: Final = "torchtitan/config/job_config.py"
CONFIGS: Final = "torchtitan/config/configs.py"
FLOAT8: Final = "torchtitan/components/quantization/float8.py"
NEW_CONFIG_MARKERS: Final = (CONFIGS, "torchtitan/config/configurable.py")
# What each Python-config form's configs.py defines (TrainingConfig / ParallelismConfig fields).
V03_MARKERS: Final = ("local_batch_size:", "pipeline_parallel_microbatch_size:")
MAIN_MARKERS: Final = ("num_tokens_per_microbatch_per_dp_rank:", "num_pp_microbatches:",
                       "max_context_length:")
SUPPORTED: Final = (f"torchtitan 0.3.0 (`pip install torchtitan==0.3.0`, or a source tree of the "
                    f"v0.3.0 release), or a main checkout at {MAIN_PIN[:9]} "
                    f"(git checkout {MAIN_PIN[:9]}), or 0.2.2 with run.framework_version: v0.2")
USE_02: Final = ("use torchtitan 0.2.x: `pip install torchtitan==0.2.2`, or a checkout of tag "
                 "v0.2.2 (git checkout v0.2.2)")


def key_for_release(version: str) -> tuple[str | None, str | None]:
    """(key, problem) for a released version string such as "0.2.2" or "0.3.0"."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(.*)", version)
    if match is None:
        return None, f"cannot read the torchtitan version {version!r}; use {SUPPORTED}"
    release = tuple(int(part) for part in match.groups()[:3])
    suffix = match.group(4)
    if release[:2] == (0, 2):
        return (V020 if release[2] == 0 else V02), None
    if release < (0, 2, 0):
        return None, f"torchtitan {version} predates the 0.2 JobConfig llm-sweep renders; {USE_02}"
    if release == (0, 3, 0) and not re.match(r"\.?(dev|a|b|rc)", suffix):
        return V03, None
    return None, (f"torchtitan {version} is not a version llm-sweep has checked its rendered "
                  f"configs against (a nightly or later release); use {SUPPORTED}")


def registry_problem(what: str) -> str:
    """Why a Python-config torchtitan cannot run a run rendered as a 0.2 TOML (and the fix)."""
    return (f"{what} configures runs with Python config registries (--module/--config; "
            f"{REGISTRY_COMMIT}, 2026-02-23, as in torchtitan 0.3.0 and main), which a run "
            f"rendered for 0.2 does not have; re-render with run.framework_version: v0.3 or "
            f"main, or {USE_02}")


def _markers(path: Path, markers: tuple[str, ...]) -> bool:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return all(marker in text for marker in markers)


def is_ancestor_of_pin(root: Path) -> bool | None:
    """Whether the checkout's HEAD is the pinned main commit or an ancestor of it; None when it is
    not a git repository. A repository whose history lacks the pin (a shallow clone of a later
    main, a fork) is not on it: False."""
    if _git(root, "rev-parse", "--is-inside-work-tree") != "true":
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", "HEAD",
                               MAIN_PIN], capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.returncode == 0


def _main_checkout(root: Path) -> tuple[str | None, str | None]:
    ancestor = is_ancestor_of_pin(root)
    if ancestor is False:
        return None, (f"the torchtitan main checkout {root} is later than (or not on) "
                      f"{MAIN_PIN[:9]} (2026-08-21), the newest main llm-sweep has checked its "
                      f"rendered configs against; `git -C {root} checkout {MAIN_PIN[:9]}`, or use "
                      f"{SUPPORTED}")
    return MAIN, None


def _v03_checkout(root: Path) -> tuple[str | None, str | None]:
    """A source tree with 0.3.0's settings: the release, or a main from before the token budgets."""
    if is_ancestor_of_pin(root):
        return None, (f"the torchtitan checkout {root} is a main from before {MAIN_FIRST} "
                      f"(2026-08-20), whose settings neither 0.3.0 nor the pinned main have; "
                      f"`git -C {root} checkout {MAIN_PIN[:9]}`, or use {SUPPORTED}")
    version_file = root / "assets" / "version.txt"
    stated = version_file.read_text(errors="replace").strip() if version_file.is_file() else ""
    stated = stated or next((p.name.split("-")[1].removesuffix(".dist-info")
                             for p in root.glob("torchtitan-*.dist-info")), "")
    if stated:
        key, problem = key_for_release(stated)
        if key == V03:
            return key, None
        if problem and key is None and not stated.startswith("0.2"):
            return None, problem
    return None, (f"the torchtitan source tree {root} has 0.3-style settings but does not say it "
                  f"is 0.3.0 (assets/version.txt: {stated or 'missing'}); use {SUPPORTED}")


def key_for_checkout(root: Path) -> tuple[str | None, str | None]:
    """(key, problem) from the source markers of a checkout (and git, for main)."""
    if not (root / "torchtitan").is_dir():
        return None, f"{root} has no torchtitan/ package: point run.framework_dir at a torchtitan checkout"
    job_config = root / JOB_CONFIG
    if not job_config.is_file():
        configs = root / CONFIGS
        if _markers(configs, MAIN_MARKERS):
            return _main_checkout(root)
        if _markers(configs, V03_MARKERS):
            return _v03_checkout(root)
        if any((root / marker).is_file() for marker in NEW_CONFIG_MARKERS):
            return None, (f"the checkout {root} configures runs with Python config registries "
                          f"but has neither 0.3.0's nor the pinned main's settings in {CONFIGS}; "
                          f"use {SUPPORTED}")
        return None, f"{root} has no {JOB_CONFIG}; {USE_02}"
    float8 = root / FLOAT8
    if not float8.is_file() or '"quantize.linear.float8"' not in float8.read_text(errors="replace"):
        return key_for_release("0.1.0")
    return (V02 if "class Debug" in job_config.read_text(errors="replace") else V020), None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def describe_checkout(root: Path, key: str | None = None) -> str:
    """"torchtitan 0.2.2 @ 73a0e69 (2026-02-20) in DIR", as much of it as can be read. A main
    checkout is "torchtitan main": its version.txt still says 0.2.2."""
    text = "torchtitan"
    version_file = root / "assets" / "version.txt"
    if key == MAIN:
        text += " main"
    elif version_file.is_file():
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
            return DetectedVersion(found=describe_checkout(root, key), key=key, problem=problem)
        try:
            version = metadata.version("torchtitan")
        except metadata.PackageNotFoundError:
            return DetectedVersion(found="no torchtitan", key=None,
                                   problem="torchtitan is not installed and no checkout is set: "
                                           "set run.framework_dir (or TORCHTITAN_DIR) to a "
                                           f"torchtitan source tree: {SUPPORTED}")
        key, problem = key_for_release(version)
        return DetectedVersion(found=f"torchtitan {version}", key=key, problem=problem)
    except Exception as error:  # noqa: BLE001 - detection reports, it never takes a job down
        return DetectedVersion(found="unknown", key=None,
                               problem=f"torchtitan version detection failed: {error!r}")
