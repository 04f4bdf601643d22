"""How long the fabric check of the local cluster's nodes takes. Target: 4 nodes < 60 s.

Renders a tiny CPU sweep into a temporary folder and runs `sweep nodes DIR --check` on the
usable nodes of the local Slurm cluster (scripts/local-slurm.sh start): one gloo all-reduce job
per node and one per ring pair, all submitted at once, measured in rounds. Nothing is
throttled, so nothing should be excluded; the wall time counts from the command's start to
fabric.json, queue wait and every job's torch import included. Repeats N times (default 1).
Usage: python benchmarks/fabric_check_speed.py [N]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from sweep.cli import main

SPEC = {"name": "fabric-speed", "framework": "builtin", "gpu": "cpu", "gpus_per_node": 1,
        "dtype": "fp32", "models": ["tiny-4l"], "nodes": [1], "seq_len": 64,
        "global_batch": {"sequences": 2},
        "axes": {"tp": [1], "pp": [1], "mbs": [2], "zero_stage": [0], "recompute": ["none"],
                 "pp_schedule": ["1f1b"]},
        "run": {"steps": 3, "warmup_steps": 1, "time_limit": "00:05:00", "mem": "1000M",
                "exclusive": False}}


def one_check(root: Path) -> tuple[float, dict]:
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC), encoding="utf-8")
    out = root / "sweep"
    assert main(["render", str(spec), "--out", str(out)]) == 0
    started = time.perf_counter()
    assert main(["nodes", str(out), "--check"]) == 0
    seconds = time.perf_counter() - started
    return seconds, json.loads((out / "fabric.json").read_text())


def main_benchmark(repeats: int) -> None:
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    times, fabric = [], {}
    for index in range(repeats):
        with tempfile.TemporaryDirectory(prefix="fabric-speed-") as tmp:
            seconds, fabric = one_check(Path(tmp))
        times.append(seconds)
        print(f"check {index + 1}: {seconds:.1f} s, node median {fabric['node_median_gbps']:.3g} "
              f"GB/s, pair median {fabric['pair_median_gbps']:.3g} GB/s, excluded "
              f"{fabric['excluded'] or 'none'}", flush=True)
    probes = fabric["probes"]
    slowest = max(p.get("seconds") or 0 for p in probes)
    up = max(p.get("ready_s") or 0 for p in probes)  # the last probe's torch import and init
    print(f"nodes={len(fabric['nodes'])} pairs={sum(p['kind'] == 'pair' for p in probes)} "
          f"rounds={len({p['round'] for p in probes})} repeats={repeats} "
          f"check_s={statistics.median(times):.1f} check_max_s={max(times):.1f} "
          f"slowest_probe_s={slowest:.1f} last_probe_up_s={up:.1f} node_median_gbps={fabric['node_median_gbps']:.3g} "
          f"pair_median_gbps={fabric['pair_median_gbps']:.3g} excluded={len(fabric['excluded'])} "
          f"target_s=60 within_target={max(times) < 60}")


if __name__ == "__main__":
    main_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
