#!/usr/bin/env bash
# Exits non-zero when megatron-core, torchtitan, nanotron or torch has a release newer than the
# support matrix was checked at (sweep/frameworks/releases.py); 2 when the index is unreachable.
# For maintainers: it needs the network, and CI (offline) does not run it.
#   scripts/check-framework-releases.sh [--index-url URL]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${SWEEP_PYTHON:-$repo/.venv/bin/python}
[[ -x $py ]] || py=python3
exec "$py" "$repo/scripts/check_framework_releases.py" "$@"
