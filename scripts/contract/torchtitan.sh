#!/usr/bin/env bash
# torchtitan's own config parser and validators, pinned, for the contract tests
# (tests/frameworks/torchtitan/test_contract.py, -m contract). Idempotent: a finished target
# folder has a stamp and is left alone.
#
# Each supported torchtitan release goes into .contract/torchtitan-<version>/ without its
# dependencies (torch comes from .venv; datasets/tokenizers/torchdata are not imported by the
# parts the tests run), plus the pure-Python packages its ConfigManager imports: tyro and what
# tyro needs (docstring-parser, typeguard), and tokenizers (a binary wheel: torchtitan/__init__.py
# imports its tokenizer module through the model protocol). tomllib is in Python 3.11.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${SWEEP_PYTHON:-$repo/.venv/bin/python}

VERSIONS=(0.2.0 0.2.1 0.2.2)      # v0.2.0; v0.2 (0.2.1 and 0.2.2)
DEPS=(tyro==1.0.17 docstring-parser==0.17.0 typeguard==4.4.4 tokenizers==0.22.1)

for version in "${VERSIONS[@]}"; do
  target=$repo/.contract/torchtitan-$version
  stamp=$target/.installed
  wanted="torchtitan==$version ${DEPS[*]}"
  if [[ -f $stamp && "$(cat "$stamp")" == "$wanted" ]]; then
    continue
  fi
  rm -rf "$target"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" \
    "torchtitan==$version" "${DEPS[@]}"
  echo "$wanted" > "$stamp"
done
