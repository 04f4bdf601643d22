"""`sweep run SPEC [--out DIR] [--strategy S] [--slots N]`: a whole sweep on this machine.

plan → render → run every job.sbatch through the local backend (the scripts a cluster would
run, with Slurm's environment emulated) → collect → report. Runs that already have a verdict are
not run again, so a second `sweep run` on a finished sweep does nothing, and one after an
interruption (Ctrl-C, `kill`) finishes the rest. With `--strategy pruned|adaptive|shortlist` the
search of sweep.search.strategies picks the runs, round by round, and what it skipped is written beside
runs.parquet.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sweep.backends.base import Rounds
from sweep.backends.local.backend import LocalBackend, LocalResult, finished, reap_orphans, runner_lock
from sweep.backends.slurm.preflight import visible_gpu_ids
from sweep.calibration.throughput_coefficients import sweep_coefficients
from sweep.commands._shared import add_top_argument, shortlist_top
from sweep.core.errors import UserError
from sweep.core.runconfig import load as load_run
from sweep.core.state import LockHeld
from sweep.plan.predictions import workloads_for
from sweep.search.live_search import search_sweep
from sweep.search.render_sweep import Rendered, render_sweep
from sweep.search.round_calibration import for_search
from sweep.search.strategies import STRATEGIES, Params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the sweep spec (YAML)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the sweep folder (default: results/<spec name>)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="exhaustive",
                        help="which runs to launch (default %(default)s: every kept run)")
    add_top_argument(parser)
    parser.add_argument("--slots", type=int, default=None,
                        help="CPU slots to fill at once; a job takes nodes × ranks per node "
                             "(default: this machine's CPU count). A GPU spec's jobs also take "
                             "nodes × GPUs per node of this machine's GPUs each")
    parser.add_argument("--no-report", action="store_true", help="stop after collect")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="a search: keep the plan's memory verdicts instead of "
                             "refitting the memory model on the sweep's attempts after every "
                             "round (sweep.search.round_calibration)")


class RunProgress:
    """A progress bar (runs done, running, failed, ETA) on a terminal, one line per finished run
    everywhere (a log file or CI shows those)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.failed = 0
        self.running = 0
        self._progress = Progress(
            TextColumn("[bold]runs"), BarColumn(), MofNCompleteColumn(),
            TextColumn("running {task.fields[running]} · failed {task.fields[failed]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
            transient=False)
        self._task = self._progress.add_task("runs", total=0, running=0, failed=0)

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._progress.stop()

    def add(self, count: int) -> None:
        total = self._progress.tasks[0].total or 0
        self._progress.update(self._task, total=total + count)

    def started(self, _run_dir: Path, _job_id: int) -> None:
        self.running += 1
        self._refresh()

    def finished(self, result: LocalResult) -> None:
        self.running -= 1
        outcome = result.outcome or result.state.lower()
        self.failed += outcome != "completed"
        config = load_run(result.run_dir)
        colour = "green" if outcome == "completed" else "red"
        self._progress.console.print(
            f"[{colour}]{outcome:<10}[/] {config.model.name} × {config.nodes} node(s) "
            f"{config.layout.label()}  {result.elapsed_s:.1f} s  {result.attempt_dir}",
            highlight=False, soft_wrap=True)
        self._progress.advance(self._task)
        self._refresh()

    def _refresh(self) -> None:
        self._progress.update(self._task, running=self.running, failed=self.failed)


def run(args: argparse.Namespace) -> int:
    if args.slots is not None and args.slots < 1:
        raise UserError(f"--slots: must be at least 1, got {args.slots}")
    shortlist_top(args)  # refused before anything is planned
    started = time.perf_counter()
    console = Console()
    rendered = render_sweep(args.spec, args.out)
    gpus = local_gpus(rendered, args.spec)
    try:
        with runner_lock(rendered.out):
            _run_locked(rendered, args, console, gpus)
    except LockHeld as holder:
        raise UserError(f"{rendered.out}: another `sweep run` ({holder}) is running this sweep; "
                        "wait for it, or stop it (Ctrl-C) and run again") from None
    console.print(f"done in {time.perf_counter() - started:.0f} s", highlight=False)
    return 0


def local_gpus(rendered: Rendered, spec_path: Path) -> list[str] | None:
    """This machine's GPUs, for a spec whose runs use them (None for a CPU spec): the local
    backend hands each job its own, and a run wider than the machine is refused before any
    starts, naming the fix."""
    spec = rendered.spec
    if spec.gpu.lower() == "cpu":
        return None
    ids = visible_gpu_ids()
    if not ids:
        raise UserError(f"{spec_path}: gpu: {spec.gpu} asks for GPUs, and this "
                        "machine shows none (CUDA_VISIBLE_DEVICES is empty, or nvidia-smi lists "
                        "none); `sweep run` runs here: use gpu: cpu for a local sweep, or "
                        "`sweep submit` to a cluster")
    kept_nodes = rendered.plan.loc[rendered.plan["status"] == "kept", "nodes"]
    per_node = spec.gpus_per_node_resolved
    widest = int(kept_nodes.max()) * per_node if len(kept_nodes) else 0
    if widest > len(ids):
        raise UserError(f"{spec_path}: nodes: runs of up to {widest} GPUs "
                        f"({int(kept_nodes.max())} node(s) × gpus_per_node {per_node}), "
                        f"and this machine has {len(ids)}; list fewer nodes for a local sweep, "
                        "or `sweep submit` to a cluster")
    return ids


def measure_cpu_peaks(out: Path, run_dirs: list[Path], console: Console) -> None:
    """Before the sweep's first run, measure this host's CPU peak for every shape of its CPU runs
    (dtype, ranks per node, threads per rank), with nothing of the sweep running, and store in
    <out>/peaks/ the larger of it and the host record (the best earlier sweeps on this host
    measured or achieved; sweep.workload.peak): every run divides by that. A peak the sweep
    already has is kept."""
    from sweep.workload.peak import cpu_threads_per_rank, ensure_cpu_peak

    configs = [load_run(run_dir) for run_dir in run_dirs]
    shapes = sorted({(c.dtype, c.gpus_per_node) for c in configs if c.gpu.lower() == "cpu"})
    for dtype, ranks in shapes:
        value, source = ensure_cpu_peak(out, dtype, ranks, cpu_threads_per_rank(ranks),
                                        measured_by="sweep run, before the sweep's first run")
        console.print(f"CPU peak: {value / 1e9:.4g} GFLOP/s per rank, {source}",
                      highlight=False, soft_wrap=True)


def _run_locked(rendered: Rendered, args: argparse.Namespace, console: Console,
                gpus: list[str] | None = None) -> None:
    """Everything after rendering, while this process holds the sweep's runner lock."""
    out, run_dirs = rendered.out, rendered.run_dirs
    reaped = reap_orphans(run_dirs)
    if reaped:
        console.print(f"ended {len(reaped)} job(s) that an interrupted `sweep run` left running; "
                      "they run again", highlight=False)
    pending = [d for d in run_dirs if not finished(d)]
    console.print(f"{rendered.spec.name}: {rendered.counts} rendered from "
                  f"{rendered.plan_source}, {len(run_dirs) - len(pending)} already have a "
                  f"verdict → {out}", highlight=False, soft_wrap=True)

    if gpus is None:
        measure_cpu_peaks(out, run_dirs, console)
    with RunProgress(console) as progress:
        backend = LocalBackend(args.slots, on_start=progress.started,
                               on_finish=progress.finished, gpus=gpus)
        if args.strategy == "exhaustive":
            progress.add(len(pending))
            if pending:
                backend.run(pending)
            search = None
        else:
            rounds = Rounds(backend, poll_s=backend.poll_s,
                            on_round=lambda _rounds, batch, _submitted: progress.add(len(batch)))
            calibration, line = for_search(out, rendered.spec, rendered.plan,
                                           enabled=not args.no_calibrate,
                                           spec_dir=args.spec.resolve().parent)
            console.print(line, highlight=False, soft_wrap=True)
            with backend.session():
                search = search_sweep(out, rendered.plan, args.strategy,
                                      workloads_for(rendered.spec), rounds,
                                      params=Params.with_top(args.top),
                                      calibration=calibration,
                                      plan_coefficients=sweep_coefficients(out, rendered.spec))
    if search is not None:
        console.print(search.summary(out), highlight=False, soft_wrap=True)

    from sweep.collect.attempts import update_runs

    result, runs_path = update_runs(out)
    outcomes = result.table.column("outcome").value_counts().to_pylist()
    counts = ", ".join(f"{item['counts']} {item['values']}" for item in outcomes)
    console.print(f"collected {result.table.num_rows} attempt(s) ({counts}) → {runs_path}",
                  highlight=False, soft_wrap=True)
    if not args.no_report:
        from analysis.sweep_report import report_sweep

        report = report_sweep(runs_path, out / "report")
        console.print(f"report → {report.out_dir / 'index.html'}\n"
                      f"  heatmap: {report.out_dir / 'heatmap_best.png'}\n"
                      f"  best configurations: {report.out_dir / 'best_configs.md'} "
                      f"(also .csv, .tex)", highlight=False, soft_wrap=True)
    if rendered.spec.export is not None:  # never fails the sweep: a failure is said, with the retry
        from sweep.export.sweep_export import export_at_end

        for line in export_at_end(out, rendered.spec.export.to)[1]:
            console.print(line, highlight=False, soft_wrap=True)

