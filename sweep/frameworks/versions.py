"""Which framework version a job is about to run, and whether the adapter supports it.

`python -m sweep.frameworks.versions --framework F [--framework-dir DIR] [--want KEY]` runs in
the job before launch: it prints what it found as JSON (env.json keeps it), and exits 3 with a
message that names the fix when the version is not one the adapter renders for, so a run never
starts on a framework that would read our files differently, or when a module that version
imports on every run is missing (`SupportedVersion.requires`), so a run never dies at import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

# The first words of every line by which a launcher refuses to start (sweep.job.classify knows them).
LAUNCH_REFUSED: Final = "llm-sweep: cannot launch:"


@dataclass(frozen=True)
class DetectedVersion:
    found: str  # what was found, for people: "megatron-core 0.19.2", "nanotron @ 1a2b3c4 (2025-05-02)"
    key: str | None  # the adapter's SupportedVersion.key it matches; None: unsupported or unknown
    problem: str | None = None  # why it is unsupported, and what to do; None when supported


def detect(framework: str, framework_dir: str | None) -> DetectedVersion:
    """What the adapter's `version.detect` finds (the built-in workload is this installation)."""
    from sweep.frameworks import get_adapter

    adapter = get_adapter(framework)
    if adapter.bundled:
        import sweep

        return DetectedVersion(found=f"llm-sweep {sweep.__version__}", key=adapter.default_version)
    module = importlib.import_module(f"sweep.frameworks.{framework}.version")
    try:
        detected: DetectedVersion = module.detect(framework_dir)
    except Exception as error:  # noqa: BLE001 - detection must never take a job down by itself
        return DetectedVersion(found="unknown", key=None,
                               problem=f"version detection failed: {error!r}")
    return detected


def refusal(framework: str, wanted: str, detected: DetectedVersion) -> str | None:
    """Why a run rendered for `wanted` must not start on what was found (None: it may)."""
    from sweep.frameworks import get_adapter

    if detected.key == wanted:
        return None
    version = get_adapter(framework).version(wanted)
    found = f"found {detected.found}"
    if detected.key is not None:
        found += f" (supported as {detected.key!r}, not the {wanted!r} this run was rendered for)"
    fix = detected.problem or (f"point run.framework_dir at a {framework} of {version.description}, "
                               f"or set run.framework_version to {detected.key!r} and re-render"
                               if detected.key else "")
    return f"{framework} version check: {found}; this run needs {version.description}. {fix}".strip()


def missing_requirements(framework: str, wanted: str) -> list[str]:
    """What `wanted` imports on every run and this Python cannot find, each with its fix. Looked
    up without importing it (a GPU extension may need a device this process has none of)."""
    from sweep.frameworks import get_adapter

    problems = []
    for need in get_adapter(framework).version(wanted).requires:
        try:
            found = importlib.util.find_spec(need.module) is not None
        except (ImportError, ValueError):  # a parent package that is missing or broken
            found = False
        if not found:
            problems.append(f"{framework} {wanted}: the Python module {need.module!r} is not "
                            f"installed for {sys.executable} ({need.why}); install it where "
                            f"the jobs run: {need.install}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.frameworks.versions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--framework", required=True)
    parser.add_argument("--want", required=True, help="the supported-version key of the run")
    parser.add_argument("--framework-dir", default=None)
    parser.add_argument("--out", default=None, help="write what was found here (JSON)")
    args = parser.parse_args(argv)
    detected = detect(args.framework, args.framework_dir or None)
    try:
        problem = refusal(args.framework, args.want, detected) \
            or "; ".join(missing_requirements(args.framework, args.want)) or None
    except ValueError as error:  # an unknown framework or version key: a hand-edited script
        problem = str(error)
    if args.out:
        from sweep.core.state import atomic_write_json

        atomic_write_json(Path(args.out), {**asdict(detected), "framework": args.framework,
                                           "wanted": args.want, "refused": problem})
    if problem is not None:
        print(f"{LAUNCH_REFUSED} {problem}", file=sys.stderr, flush=True)
        return 3
    print(f"llm-sweep: {args.framework}: {detected.found} (supported as {detected.key})",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
