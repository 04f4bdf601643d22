"""The walkthroughs' wall-clock figures, measured: the README's CPU demo and docs/cluster.md's
first sweep on the local Slurm cluster.

- demo: `sweep run examples/local-cpu.yaml` into a fresh folder (plan, render, run, collect,
  report), from launch to exit.
- cluster: `sweep submit examples/local-slurm.yaml --no-report` into a fresh folder, then until
  no job of the sweep is left in the queue (`squeue`): its runs done. Needs the local cluster
  (scripts/local-slurm.sh); skipped, with a line saying so, where `scontrol ping` fails.

The README and docs/cluster.md quote these figures from docs/speed.md's row of this script;
tests/test_walkthrough_figures.py checks that they agree, and that the number of job arrays
docs/cluster.md states is the one `sweep submit --dry-run` makes. The last line holds the figures
as key=value pairs.

Usage: .venv/bin/python benchmarks/walkthrough_speed.py [--only demo|cluster]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = [sys.executable, "-m", "sweep.cli"]


def demo(folder: Path) -> float:
    start = time.monotonic()
    subprocess.run([*SWEEP, "run", "examples/local-cpu.yaml", "--out", str(folder / "demo")],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def cluster(folder: Path, timeout_s: float = 1800) -> tuple[float, int, int] | None:
    """Seconds until the sweep's runs are done, its runs and its arrays; None without Slurm."""
    if subprocess.run(["scontrol", "ping"], capture_output=True, check=False).returncode:
        print("cluster: skipped, no Slurm cluster answers `scontrol ping`")
        return None
    out = folder / "local-slurm"
    start = time.monotonic()
    done = subprocess.run([*SWEEP, "submit", "examples/local-slurm.yaml", "--out", str(out),
                           "--no-report"], cwd=REPO, check=True, capture_output=True, text=True)
    print(done.stdout.strip())
    found = re.search(r"submitted (\d+) run\(s\) in (\d+) array\(s\)", done.stdout)
    assert found, done.stdout
    batches = [p.name for p in (out / "batches").iterdir() if p.is_dir()]
    while time.monotonic() - start < timeout_s:
        names = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True,
                               check=True).stdout.split()
        if not any(name.split(".", 1)[-1] in batches for name in names
                   if name.startswith("local-slurm.")):
            break
        time.sleep(2)
    return time.monotonic() - start, int(found.group(1)), int(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["demo", "cluster"])
    args = parser.parse_args()
    figures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="walkthrough-") as tmp:
        if args.only in (None, "demo"):
            seconds = demo(Path(tmp))
            print(f"demo: `sweep run examples/local-cpu.yaml` in {seconds:.0f} s")
            figures["demo_s"] = f"{seconds:.0f}"
        if args.only in (None, "cluster"):
            measured = cluster(Path(tmp))
            if measured is not None:
                seconds, runs, arrays = measured
                print(f"cluster: {runs} run(s) in {arrays} array(s), done in {seconds:.0f} s")
                figures.update(cluster_s=f"{seconds:.0f}", cluster_runs=str(runs),
                               cluster_arrays=str(arrays))
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
