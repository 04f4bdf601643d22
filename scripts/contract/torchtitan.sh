#!/usr/bin/env bash
# torchtitan's own config parser and validators, pinned, for the contract tests
# (tests/frameworks/torchtitan/test_contract.py, -m contract). Idempotent: a finished target
# folder has a stamp and is left alone.
#
# Each supported torchtitan release goes into .contract/torchtitan-<version>/ without its
# dependencies (torch comes from .venv).
# - 0.2.x: plus the pure-Python packages its ConfigManager imports: tyro and what tyro needs
#   (docstring-parser, typeguard), and tokenizers (a binary wheel: torchtitan/__init__.py imports
#   its tokenizer module through the model protocol). tomllib is in Python 3.11.
# - 0.3.0: the contract imports the rendered config module, hence torchtitan.trainer and the
#   model families, as the job does: also spmd_types (ParallelDims), torchdata, triton (imported
#   by the MoE token dispatcher's kernels; nothing runs on a GPU), torchao (float8), einops,
#   safetensors, tensorboard
#   and protobuf (the metrics module), datasets and what it imports (the data loaders). The same
#   folder carries what torchtitan main (b5bcd76c6) imports besides: grain and its imports. main
#   itself is not on PyPI and GitHub is not reachable from CI: its contract test runs from a
#   checkout named by SWEEP_TORCHTITAN_MAIN, put before this folder on the path.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${SWEEP_PYTHON:-$repo/.venv/bin/python}

VERSIONS=(0.2.0 0.2.1 0.2.2 0.3.0)      # v0.2.0; v0.2 (0.2.1 and 0.2.2); v0.3
DEPS=(tyro==1.0.17 docstring-parser==0.17.0 typeguard==4.4.4 tokenizers==0.22.1)
DEPS_03=(spmd_types==0.2.3 torchdata==0.11.0 triton==3.9.0 einops==0.8.2 safetensors==0.8.0
         tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1
         datasets==4.7.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
         huggingface_hub==0.36.2 tqdm==4.70.1 filelock==4.3.1
         grain==0.2.18 array-record==0.8.6 cloudpickle==3.1.3 etils==1.15.0 portpicker==1.6.0
         torchao==0.18.0)

for version in "${VERSIONS[@]}"; do
  target=$repo/.contract/torchtitan-$version
  stamp=$target/.installed
  deps=("${DEPS[@]}")
  if [[ $version == 0.3.* ]]; then
    deps+=("${DEPS_03[@]}")
  fi
  wanted="torchtitan==$version ${deps[*]}"
  if [[ -f $stamp && "$(cat "$stamp")" == "$wanted" ]]; then
    continue
  fi
  rm -rf "$target"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" \
    "torchtitan==$version" "${deps[@]}"
  echo "$wanted" > "$stamp"
done
