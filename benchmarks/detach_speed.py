"""The time from `sweep submit --detach` to the prompt: what a user on a login node waits before
logging out. Target: <= 3 s.

Two sweeps, each timed as a user's shell runs it (a fresh `python -m sweep.cli` process, wall
clock, interpreter start included):

- examples/playbook.yaml (nanotron, H100s): the local cluster has no GPUs and cannot accept its
  jobs, so it goes through `--detach --dry-run`, the same path up to the driver's sbatch: plan,
  render, the GPU-hour estimate, the driver's settings. Timed from the spec (planning and
  rendering included) and again from the rendered folder (the detach step alone).
- examples/local-slurm.yaml on the local cluster: a real submission of the search driver through
  submitit (preflight skipped: it is one job whose queue wait is the cluster's, not ours), from
  the rendered folder and from the spec; the driver is cancelled right after.

    .venv/bin/python benchmarks/detach_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "examples" / "playbook.yaml"
LOCAL = REPO / "examples" / "local-slurm.yaml"


def sweep(*argv: str) -> tuple[float, str]:
    """Run `sweep ARGV` in a new process; (wall seconds, stdout). Fails loudly on an error."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sweep.cli", *argv], capture_output=True,
                            text=True, cwd=REPO, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"sweep {' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return elapsed, result.stdout


def playbook_dry(root: Path) -> tuple[float, float]:
    """(from the spec, from the rendered folder) of a detached adaptive dry run."""
    out = root / "playbook"
    from_spec, shown = sweep("submit", str(PLAYBOOK), "--out", str(out), "--strategy", "adaptive",
                             "--detach", "--dry-run")
    assert "would submit the adaptive search driver" in shown, shown
    from_dir, _ = sweep("submit", str(out), "--strategy", "adaptive", "--detach", "--dry-run")
    return from_spec, from_dir


def local_real(root: Path, index: int) -> tuple[float, float]:
    """(from the spec, from the rendered folder) of a real detached submission on the local
    cluster; each driver is cancelled once it is queued."""
    rendered = root / f"local-{index}-dir"
    sweep("render", str(LOCAL), "--out", str(rendered))
    from_dir, shown = sweep("submit", str(rendered), "--strategy", "adaptive", "--detach",
                            "--no-preflight", "--yes")
    assert "search driver: job" in shown, shown
    sweep("cancel", str(rendered))
    spec_out = root / f"local-{index}-spec"
    from_spec, _ = sweep("submit", str(LOCAL), "--out", str(spec_out), "--strategy", "adaptive",
                         "--detach", "--no-preflight", "--yes")
    sweep("cancel", str(spec_out))
    return from_spec, from_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="detach-speed-") as tmp:
        for index in range(args.repeat):
            root = Path(tmp) / str(index)
            spec_s, dir_s = playbook_dry(root)
            figures.setdefault("playbook_dry_from_spec_s", []).append(spec_s)
            figures.setdefault("playbook_dry_from_dir_s", []).append(dir_s)
            spec_s, dir_s = local_real(root, index)
            figures.setdefault("local_slurm_from_spec_s", []).append(spec_s)
            figures.setdefault("local_slurm_from_dir_s", []).append(dir_s)
            print(f"run {index + 1}: " + ", ".join(f"{k}={v[-1]:.2f}" for k, v in figures.items()),
                  flush=True)
    medians = {k: statistics.median(v) for k, v in figures.items()}
    target = max(medians["local_slurm_from_dir_s"], medians["playbook_dry_from_dir_s"])
    print(" ".join(f"{k}={v:.2f}" for k, v in medians.items())
          + f" repeat={args.repeat} target_s=3 meets_target={target <= 3.0}")


if __name__ == "__main__":
    main()
