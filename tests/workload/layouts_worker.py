"""Torchrun worker for the golden tests: trains several run directories in ONE process group.

Start-up (import torch, rendezvous) costs 3-4 s per launch on this machine; sharing it across
layouts keeps the golden tests fast. Each layout still builds its own device mesh, model,
wrappers and optimizer through `sweep.workload.train.train`, exactly as the CLI does.

Usage: torchrun --nproc-per-node N layouts_worker.py OUT.json RUN_DIR [RUN_DIR ...]
Rank 0 writes {run_dir: {"losses": [...], "error": null | "<exception>"}} to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from sweep import runconfig
from sweep.workload.train import device_for, init_distributed, train


def main() -> None:
    out, run_dirs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    results: dict[str, dict[str, object]] = {}
    for run_dir in run_dirs:
        cfg = runconfig.load(run_dir)
        device = device_for(cfg)
        init_distributed(device, timeout_s=120)
        try:
            result = train(cfg, run_dir)
            results[str(run_dir)] = {"losses": result.losses, "error": None}
        except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
            traceback.print_exc()
            results[str(run_dir)] = {"losses": [], "error": f"{type(error).__name__}: {error}"}
            break  # the group may be out of step after a failure
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
