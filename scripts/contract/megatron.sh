#!/usr/bin/env bash
# Megatron-LM's own argument checks for the contract tests (tests/frameworks/megatron, -m contract):
# megatron-core, pinned, under .contract/megatron-<version>/ (idempotent: a version already there
# is not fetched again). The wheels carry megatron/training/arguments.py (parse_args,
# validate_args) and megatron/core, and need nothing the main .venv lacks (torch, numpy,
# packaging) for those checks, so they are installed without dependencies.
# megatron-core >= 0.17 declares Requires-Python >= 3.12; .venv is Python 3.11, and the modules
# the checks import need only typing.override from 3.12, which the test harness backports
# (tests/frameworks/megatron/contract_check.py), hence --ignore-requires-python.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"

# The newest patch of the oldest supported minor (0.17) and the newest release.
VERSIONS=(0.17.1 0.19.2)

for version in "${VERSIONS[@]}"; do
  target=.contract/megatron-$version
  if [[ -d $target/megatron_core-$version.dist-info && -f $target/megatron/training/arguments.py ]]; then
    continue
  fi
  rm -rf "$target"
  .venv/bin/python -m pip install --quiet --no-deps --ignore-requires-python \
    --target "$target" "megatron-core==$version"
  if [[ ! -f $target/megatron/training/arguments.py ]]; then
    echo "contract/megatron.sh: megatron-core $version has no megatron/training/arguments.py" >&2
    exit 1
  fi
done
