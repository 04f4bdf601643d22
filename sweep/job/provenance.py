"""env.json: what ran where, recorded by job.sbatch before launch.

A benchmark figure is only worth as much as the record of the software that produced it: the
harness and framework commits, the library versions and the nodes. Versions come from package
metadata (no `import torch`: this runs before every job and must be fast and never fail).
`python -m sweep.job.provenance --out FILE --run-dir DIR [--framework-dir DIR] --nodes N...`
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import sweep
from sweep.core.state import atomic_write_json

PACKAGES = ("llm-sweep", "torch", "numpy", "megatron-core", "nanotron", "torchtitan",
            "transformer-engine", "flash-attn", "nvidia-nccl-cu12", "nvidia-nccl-cu13")
ENV_PREFIXES = ("SLURM_", "SLURMD_", "SWEEP_", "NCCL_", "TORCH_", "CUDA_", "MASTER_", "OMP_")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that matter; absent ones are left out."""
    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_state(path: str | Path | None) -> dict[str, Any] | None:
    """Commit and dirtiness of the checkout holding `path`, or None outside git."""
    if path is None or shutil.which("git") is None:
        return None
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(path), *args], capture_output=True,
                                  text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
    sha = git("rev-parse", "HEAD")
    if sha is None:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"path": git("rev-parse", "--show-toplevel"), "sha": sha, "dirty": bool(status),
            "describe": git("describe", "--always", "--dirty", "--tags")}


def gpu_inventory() -> list[str] | None:
    """`nvidia-smi` names and driver versions, when there is one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] or None


def detected_framework(framework: str | None, framework_dir: str | None) -> dict[str, Any] | None:
    """The framework version this job will run, as its adapter finds it (never raises)."""
    if not framework:
        return None
    from sweep.frameworks.versions import detect

    try:
        return asdict(detect(framework, framework_dir))
    except ValueError as error:  # an unknown framework name
        return {"found": "unknown", "key": None, "problem": str(error)}


def collect(run_dir: str | Path | None, framework_dir: str | None, nodes: list[str],
            environ: dict[str, str] | None = None, framework: str | None = None) -> dict[str, Any]:
    environ = dict(os.environ if environ is None else environ)
    harness_dir = Path(sweep.__file__).resolve().parent
    return {
        "schema": 1,
        "written_at": time.time(),
        "run_dir": str(run_dir) if run_dir else None,
        "hostname": socket.gethostname(),
        "node_name": environ.get("SLURMD_NODENAME"),
        "nodes": nodes,
        "slurm_job_id": environ.get("SLURM_JOB_ID"),
        "slurm_array": (f"{environ['SLURM_ARRAY_JOB_ID']}_{environ.get('SLURM_ARRAY_TASK_ID')}"
                        if "SLURM_ARRAY_JOB_ID" in environ else None),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "harness": {"version": sweep.__version__, "git": git_state(harness_dir)},
        "framework": {"name": framework, "dir": framework_dir,
                      "git": git_state(framework_dir) if framework_dir else None,
                      "detected": detected_framework(framework, framework_dir)},
        "packages": package_versions(),
        "gpus": gpu_inventory(),
        "env": {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.job.provenance", description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--framework", help="the run's framework: its version is recorded")
    parser.add_argument("--framework-dir")
    parser.add_argument("--nodes", nargs="*", default=[])
    args = parser.parse_args(argv)
    atomic_write_json(args.out, collect(args.run_dir, args.framework_dir or None, list(args.nodes),
                                         framework=args.framework))
    return 0


if __name__ == "__main__":
    sys.exit(main())
