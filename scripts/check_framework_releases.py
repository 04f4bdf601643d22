#!/usr/bin/env python3
"""Is the support matrix current? Ask the package index for each framework's newest release.

    scripts/check-framework-releases.sh                       # pypi.org
    scripts/check-framework-releases.sh --index-url URL       # a mirror with PyPI's JSON API

For every package of `sweep.frameworks.releases.RELEASES_CHECKED` (megatron-core, torchtitan,
nanotron, torch) it reads `URL/<package>/json` (PyPI's JSON API: `info.version` is the newest final
release) and prints one line per package. Exit status: 0 when no package has a release newer than
the matrix was checked at; 1 when one has (update RELEASES_CHECKED after contract-testing the new
release, or say in it why it is refused); 2 when the index cannot be read. For maintainers: CI is
offline and does not run it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweep.frameworks.releases import RELEASES_CHECKED, ReleaseCheck, is_newer  # noqa: E402

PYPI = "https://pypi.org/pypi"
CURRENT, NEWER, UNREADABLE = 0, 1, 2


def newest_on_index(index_url: str, package: str, timeout_s: float) -> tuple[str, str]:
    """(newest final release, its upload date) from the index's JSON API."""
    url = f"{index_url.rstrip('/')}/{package}/json"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a URL we build
        document = json.load(response)
    version = str(document["info"]["version"])
    files = document.get("releases", {}).get(version) or [{}]
    uploaded = str(files[0].get("upload_time", ""))[:10]
    return version, uploaded


def check(release: ReleaseCheck, index_url: str, timeout_s: float) -> tuple[int, str]:
    try:
        newest, uploaded = newest_on_index(index_url, release.package, timeout_s)
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as error:
        return UNREADABLE, (f"{release.package}: cannot read {index_url}/{release.package}/json "
                            f"({error})")
    if is_newer(newest, release.newest):
        return NEWER, (f"{release.package}: {newest} ({uploaded}) is newer than {release.newest}, "
                       f"the newest release the matrix was checked at on {release.checked_on}: "
                       f"contract-test it and update sweep/frameworks/releases.py")
    return CURRENT, (f"{release.package}: {newest} is the newest release, as checked on "
                     f"{release.checked_on}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index-url", default=PYPI,
                        help=f"a package index with PyPI's JSON API (default {PYPI})")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per request")
    args = parser.parse_args(argv)
    worst = CURRENT
    for release in RELEASES_CHECKED:
        status, line = check(release, args.index_url, args.timeout)
        print(line, file=sys.stderr if status == UNREADABLE else sys.stdout, flush=True)
        worst = max(worst, status)
    return worst


if __name__ == "__main__":
    sys.exit(main())
