"""Which framework version a job is about to run, and whether the adapter supports it.

`python -m sweep.frameworks.versions --framework F [--framework-dir DIR] [--want KEY]` runs in
the job before launch: it prints what it found as JSON (env.json keeps it), and exits 3 with a
message that names the fix when the version is not one the adapter renders for, so a run never
starts on a framework that would read our files differently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DetectedVersion:
    found: str  # what was found, for people: "megatron-core 0.19.2", "nanotron @ 1a2b3c4 (2025-05-02)"
    key: str | None  # the adapter's SupportedVersion.key it matches; None: unsupported or unknown
    problem: str | None = None  # why it is unsupported, and what to do; None when supported
