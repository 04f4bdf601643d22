#!/usr/bin/env bash
# Create .venv (if needed) and install llm-sweep with the built-in workload and test tools.
# Idempotent: a second run only checks. PyTorch is pinned to the CPU wheel available on these
# machines (torch==2.13.0); the package itself only asks for torch>=2.6, so CUDA builds satisfy it.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SWEEP_VENV:-$repo/.venv}
torch_spec=${SWEEP_TORCH:-torch==2.13.0}

if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
stamp="$venv/.llm-sweep-installed"
fingerprint=$(cat "$repo/pyproject.toml" <(echo "$torch_spec") | sha256sum | cut -c1-16)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$fingerprint" ]]; then
  exit 0
fi
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "$torch_spec"
"$py" -m pip install --quiet -e "${repo}[workload,test,docs,mlflow,wandb,tracker-tests]"
echo "$fingerprint" > "$stamp"
echo "llm-sweep installed in $venv ($("$py" -c 'import torch; print("torch", torch.__version__)'))"
