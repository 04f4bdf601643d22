"""Torchrun worker for the golden tests: trains several run directories in ONE process group.

Start-up (import torch, rendezvous) costs 3-4 s per launch on this machine; sharing it across
layouts keeps the golden tests fast. Each layout still builds its own device mesh, model,
wrappers and optimizer through `sweep.workload.train.train`, exactly as the CLI does.

Usage: torchrun --nproc-per-node N layouts_worker.py OUT.json RUN_DIR [RUN_DIR ...]
Rank 0 writes {run_dir: {"losses": [...], "memtrack": [...] | null, "error": null | "<exception>"}}
to OUT.json.

Two test-only keys in run.json settings steer a layout (the workload ignores unknown settings):
- `test_memtrack: true` runs the extra MemTracker step (as `--memtrack` does) and returns its peaks;
- `test_grad_norms: true` builds the layout, runs one forward/backward of step 1 and returns the
  norm of every parameter's full gradient (no optimizer step): AdamW hides a wrong gradient
  scale from the loss curve, this does not;
- `test_unsynced_ddp: true` is the NEGATIVE CONTROL of the golden test: DDP is replaced by a
  wrapper that never all-reduces, so each rank trains on its half of the batch. The golden
  comparison must tell this broken layout apart from the real ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sweep.core import runconfig
from sweep.workload import parallel
from sweep.workload.data import global_batch
from sweep.workload.train import Trainer, device_for, init_distributed, train


def first_step_grad_norms(cfg: runconfig.RunConfig) -> dict[str, float]:
    """Per-parameter norms of the full gradient after the first step's backward (pp 1 only)."""
    from torch.distributed.tensor import DTensor

    trainer = Trainer(cfg, device_for(cfg))
    batch = global_batch(trainer.seed, 1, cfg.global_batch_sequences, cfg.seq_len, cfg.model.vocab_size)
    trainer._plain_step(batch)
    for wrapper in trainer.wrappers:
        wrapper.finish_gradients()
    norms = {}
    for name, param in trainer.modules[0].named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        clean = name.replace("_checkpoint_wrapped_module.", "").removeprefix("module.")
        norms[clean] = grad.norm().item()
    return norms


class UnsyncedDDP(torch.nn.Module):
    """Negative control: looks like DDP to the workload, but never reduces gradients."""

    def __init__(self, module: torch.nn.Module, **_: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:
        return self.module(*args)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield


@contextlib.contextmanager
def unsynced_ddp(active: bool) -> Iterator[None]:
    real = parallel.DistributedDataParallel
    if active:
        parallel.DistributedDataParallel = UnsyncedDDP  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        parallel.DistributedDataParallel = real  # type: ignore[misc]


def main() -> None:
    out, run_dirs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    results: dict[str, dict[str, object]] = {}
    for run_dir in run_dirs:
        cfg = runconfig.load(run_dir)
        device = device_for(cfg)
        init_distributed(device, timeout_s=120)
        try:
            if cfg.settings.get("test_grad_norms"):
                results[str(run_dir)] = {"losses": [], "memtrack": None, "error": None,
                                         "grad_norms": first_step_grad_norms(cfg)}
                continue
            with unsynced_ddp(bool(cfg.settings.get("test_unsynced_ddp"))):
                result = train(cfg, run_dir, memtrack=bool(cfg.settings.get("test_memtrack")))
            results[str(run_dir)] = {"losses": result.losses, "memtrack": result.memtrack, "error": None}
        except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
            traceback.print_exc()
            results[str(run_dir)] = {"losses": [], "memtrack": None, "error": f"{type(error).__name__}: {error}"}
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
