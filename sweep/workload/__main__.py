"""`python -m sweep.workload --run-dir DIR [--attempt-dir DIR] [--memtrack] [launcher options]`.

Runs as one rank: alone, or under torchrun. With --nproc-per-node it is the launcher instead
(sweep.workload.launch): it forks that many ranks on this node, which is how job.sbatch starts
it. Exit: results are written before tear-down, then the process leaves with os._exit so that
no C++ thread can abort it during interpreter finalisation (PyTorch-on-CPU measurements (torch 2.13) §9e).
Any failure prints the exception and exits non-zero: 2 for a run.json or launcher option the
workload cannot run, 1 for everything else. An out-of-memory error also prints one line the
watchdog recognises: `sweep.workload: rank <r>: CPU out of memory: <allocator message>`
(`CUDA out of memory` on GPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil

from sweep.core import runconfig
from sweep.core.runconfig import RunConfig


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sweep.workload", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory holding run.json")
    parser.add_argument("--attempt-dir", type=Path, default=None,
                        help="where metrics.jsonl goes (default: $SWEEP_ATTEMPT_DIR, else the run dir)")
    parser.add_argument("--memtrack", action="store_true",
                        help="after the timed steps, run one more under MemTracker and write memtrack.json")
    launcher = parser.add_argument_group("launcher", "fork the ranks of this node (instead of torchrun)")
    launcher.add_argument("--nproc-per-node", type=int, default=None, help="ranks on this node")
    launcher.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default 1)")
    launcher.add_argument("--node-rank", type=int, default=0, help="this node's index, 0-based (default 0)")
    launcher.add_argument("--master", default=None, metavar="HOST:PORT",
                          help="where the ranks meet (rank 0's node); default on one node: a free local port")
    launcher.add_argument("--grace-s", type=float, default=10.0,
                          help="after a rank fails: SIGTERM to the others, SIGKILL this much later")
    return parser.parse_args(argv)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _load(run_dir: Path) -> RunConfig:
    run_file = run_dir / "run.json"
    if not run_file.is_file():
        raise _Unrunnable(f"{run_file} not found; --run-dir must be a run directory (written by `sweep render`)")
    try:
        return runconfig.load(run_file)
    except (ValueError, KeyError, TypeError) as error:
        raise _Unrunnable(f"{run_file}: {error}") from None


class _Unrunnable(ValueError):
    """Nothing can start: the message names the file or option and the fix; exit code 2."""


def main(argv: list[str] | None = None) -> int:
    entered = time.time()
    args = _parse(argv)
    try:
        cfg = _load(args.run_dir)
        if args.nproc_per_node is not None:
            return _launch(args, cfg)
    except _Unrunnable as error:
        print(f"sweep.workload: {error}", file=sys.stderr)
        return 2
    return run_rank(args, cfg, entered)


def _launch(args: argparse.Namespace, cfg: RunConfig) -> int:
    from sweep.workload.launch import Rendezvous, launch, parse_master

    try:
        host, port = parse_master(args.master, args.nnodes)
        rdzv = Rendezvous(args.nnodes, args.node_rank, args.nproc_per_node, host, port)
    except ValueError as error:
        raise _Unrunnable(str(error)) from None
    if cfg.gpu.lower() == "cpu":  # preload, so that the forked ranks start with it; never before CUDA
        import sweep.workload.train  # noqa: F401 - torch and the workload
        from sweep.workload.parallel import import_layout_modules

        import_layout_modules(cfg.layout)
    return launch(rdzv, lambda: guarded(lambda: run_rank(args, cfg, time.time())), grace_s=args.grace_s)


def run_rank(args: argparse.Namespace, cfg: RunConfig, entered: float) -> int:
    """This process is one rank: train, and say how long each part of the start-up took."""
    attempt_dir = args.attempt_dir or Path(os.environ.get("SWEEP_ATTEMPT_DIR") or args.run_dir)
    import torch.distributed as dist

    from sweep.workload.launch import LAUNCHED_AT_ENV
    from sweep.workload.train import WorkloadError, device_for, init_distributed, train

    try:
        device = device_for(cfg)
        imported = time.time()
        init_distributed(device, timeout_s=float(cfg.settings.get("hang_timeout_s", 300)))
        group_s = time.time() - imported
        result = train(cfg, attempt_dir, memtrack=args.memtrack)
    except WorkloadError as error:
        print(f"sweep.workload: rank {_rank()}: {error}", file=sys.stderr)
        return 2
    if dist.get_rank() == 0:
        started = float(os.environ.get(LAUNCHED_AT_ENV) or psutil.Process().create_time())
        share = 100.0 * result.metrics_write_s / result.loop_s if result.loop_s else 0.0
        print(f"sweep.workload: done run_id={cfg.run_id} steps={len(result.losses)} "
              f"startup_s={result.loop_started_at - started:.3f} "
              f"loop_started_at={result.loop_started_at:.6f} "
              f"python_start_s={entered - started:.3f} import_s={imported - entered:.3f} "
              f"process_group_s={group_s:.3f} build_s={result.build_s:.3f} peak_s={result.peak_s:.3f} "
              f"loop_s={result.loop_s:.3f} "
              f"metrics_write_s={result.metrics_write_s:.6f} metrics_share_pct={share:.4f} "
              f"final_loss={result.losses[-1] if result.losses else float('nan'):.6f} "
              f"attempt_dir={attempt_dir}", flush=True)
    dist.destroy_process_group()
    return 0


def guarded(body: Callable[[], int]) -> int:
    """Every failure prints and becomes a non-zero exit code; nothing escapes."""
    try:
        return body()
    except SystemExit as exit_:  # argparse: usage error, already printed
        return exit_.code if isinstance(exit_.code, int) else 2
    except BaseException as error:  # noqa: BLE001 - every failure must print and exit non-zero
        _report_failure(error)
        return 1


def _report_failure(error: BaseException) -> None:
    from sweep.workload.memory_tracking import oom_message

    traceback.print_exc()
    oom = oom_message(error)
    if oom is not None:
        kind = "CUDA out of memory" if "CUDA" in oom else "CPU out of memory"
        print(f"sweep.workload: rank {_rank()}: {kind}: {oom}", file=sys.stderr)
    print(f"sweep.workload: rank {_rank()} failed: {type(error).__name__}: {error}", file=sys.stderr)


if __name__ == "__main__":
    code = guarded(main)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
