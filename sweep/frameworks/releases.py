"""How fresh the support matrix is: per framework, the newest release on the package index when a
maintainer last looked, and what the job refuses.

A support matrix that does not say when it was last checked against the index cannot tell a user
whether "torchtitan 0.2.x" means "the current release" or "one a year behind". This table is that
date. `scripts/check-framework-releases.sh` compares it with the package index and exits non-zero
when a newer release is out, so the table is updated (and the new release contract-tested) by a
person, never silently: it is a maintainer's tool and is not run in CI, which is offline.

Pure data and pure comparisons; the network is the script's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ReleaseCheck:
    """The newest release of one package that the matrix was checked against.

    `package` is the name on the package index; `newest` the newest final release there on
    `checked_on` (ISO date), released on `released_on`; `refused` what the job refuses of it, and
    why, for a user choosing what to install.
    """

    framework: str
    package: str
    newest: str
    released_on: str
    checked_on: str
    refused: str


RELEASES_CHECKED: Final[tuple[ReleaseCheck, ...]] = (
    ReleaseCheck("megatron", "megatron-core", "0.19.2", "2026-09-18", "2026-11-28",
                 "megatron-core before 0.17 (its pretrain_gpt.py arguments differ)"),
    ReleaseCheck("nanotron", "nanotron", "0.4", "2024-03-05", "2026-11-28",
                 "the PyPI releases (0.4 predates both supported commits and its code needs "
                 "CUDA and flash-attn to import): install from a checkout; a checkout older than "
                 "the playbook's commit e24d2483"),
    ReleaseCheck("torchtitan", "torchtitan", "0.3.0", "2026-09-03", "2026-11-28",
                 "torchtitan before 0.2.0 (no float8 converter of the 0.2 name); a nightly "
                 "(0.3.x.devN) or any release after 0.3.0, until contract-tested; a main checkout "
                 "from before 73aed7f6c or after b5bcd76c6, the commit the contract tests pin"),
    ReleaseCheck("builtin", "torch", "2.15.0", "2026-10-28", "2026-11-28",
                 "torch before 2.6 (pyproject.toml); tests run on the 2.13.0 CPU wheel, the "
                 "newest CPU build the test machines' package index carries (docs/frameworks.md)"),
)


def release_key(version: str) -> tuple[int, ...]:
    """Orders final releases: "0.19.2" < "0.20.0", "0.4" < "0.4.1". The numeric prefix only;
    a pre-release suffix ("1.0.0rc1") sorts as its release, which is why the index's *final*
    release is what gets compared (`is_newer`)."""
    numbers = re.match(r"\d+(?:\.\d+)*", version.strip())
    if numbers is None:
        raise ValueError(f"not a release number: {version!r}")
    parts = [int(part) for part in numbers.group(0).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def is_newer(index_version: str, checked: str) -> bool:
    """Whether the index's newest final release is newer than the one the matrix was checked at."""
    return release_key(index_version) > release_key(checked)
