"""`sweep status DIR|SPEC [--watch]`: the state of every run, from status files, squeue and sacct.

SPEC is resolved to its sweep folder as `sweep submit SPEC` chooses it (`--out`, else
results/<name>); before it is submitted, status says so. A submit or resume that did not reach
its end (stopped by a signal, or killed) is shown as half-submitted, with the command that
finishes it (sweep.backends.slurm.submit_record). A detached search adds its driver: job id,
state, round, runs launched and skipped, GPU-hours spent, and the end of its log when it died;
the self-calibration line is about the round of now, never an earlier one.

One poll costs at most one squeue and one sacct per 1,000 job arrays (queried by array id, never
task by task). Shows counts by state and by (model, nodes), GPU-hours used and an estimate of
those still to spend, and the nodes the sweep excludes after repeated failures on them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.core.errors import UserError

if TYPE_CHECKING:
    from sweep.backends.slurm.observation import Observation
    from sweep.backends.slurm.submission import RunState
    from sweep.search.driver import DriverView

FAILED = ("oom", "hang", "timeout", "crashed", "node_fail", "cancelled", "preempted", "unknown",
          "lost")
SKIPPED = "skipped by the search"  # rendered, never submitted: the last search chose not to
ORDER = ("completed", *FAILED, "running", "pending", "submitted", "unsubmitted", SKIPPED)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", type=Path,
                        help="the sweep folder, or the spec it was submitted from")
    parser.add_argument("--out", type=Path,
                        help="with SPEC: its sweep folder, as given to `sweep submit SPEC --out` "
                             "(default results/<name>)")
    parser.add_argument("--watch", action="store_true",
                        help="poll until no run is pending or running (Ctrl-C stops)")
    parser.add_argument("--interval", type=float, default=30.0, metavar="S",
                        help="seconds between polls with --watch (default 30)")


def gpu_hours(observation: Observation, skipped: frozenset[str] = frozenset()
              ) -> tuple[float, float]:
    """(used, remaining estimate). Used: elapsed x GPUs of every run's latest attempt. Remaining:
    each run still to finish (in flight, never submitted, or failed but resumable) at the median
    elapsed time of completed runs of its (model, nodes), else at its time limit; not the runs
    in `skipped`, which a search chose not to run (`sweep.backends.slurm.sweep_folder.skipped_by_search`)."""
    from sweep.backends.slurm.submission import NOT_RESUMED_BY_DEFAULT

    infos = observation.infos
    used = 0.0
    done: dict[tuple[str, int], list[float]] = {}
    for state in observation.states:
        info = infos.get(state.run_id)
        if info is None or state.elapsed_s is None:
            continue
        used += state.elapsed_s * info.gpus / 3600
        if state.state == "completed":
            done.setdefault((info.model, info.nodes), []).append(state.elapsed_s)
    remaining = 0.0
    for state in observation.states:
        info = infos.get(state.run_id)
        if info is None or state.state in NOT_RESUMED_BY_DEFAULT or (
                state.state == "unsubmitted" and state.run_id in skipped):
            continue
        typical = done.get((info.model, info.nodes))
        seconds = statistics.median(typical) if typical else info.time_limit_s
        remaining += seconds * info.gpus / 3600
    return used, remaining


def render(observation: Observation, sweep_dir: Path, elapsed_s: float,
           skipped: frozenset[str] = frozenset()) -> Iterable[object]:
    """rich renderables for one poll; `skipped`: the runs a search chose not to run, shown apart
    from the runs still to submit."""

    from sweep.backends.slurm.submission import counts_by
    from sweep.commands._output import titled_table

    states = observation.states

    def shown(state: RunState) -> str:
        return SKIPPED if state.state == "unsubmitted" and state.run_id in skipped else state.state

    counts = counts_by(states, shown)
    summary = titled_table(f"{sweep_dir.name}: {len(states)} run(s)")
    summary.add_column("state")
    summary.add_column("runs", justify="right")
    for state in sorted(counts, key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER)):
        summary.add_row(state, str(counts[state]))
    yield summary

    by_cell = titled_table("by model and nodes")
    columns = ("completed", "failed", "in flight", "unsubmitted",
               *(("skipped",) if skipped else ()))
    for column in ("model", "nodes", "runs", *columns):
        by_cell.add_column(column, justify="left" if column == "model" else "right")
    cells: dict[tuple[str, int], dict[str, int]] = {}
    for state in states:
        info = observation.infos.get(state.run_id)
        key = (info.model, info.nodes) if info else ("?", 0)
        cell = cells.setdefault(key, {"runs": 0, **dict.fromkeys(columns, 0)})
        cell["runs"] += 1
        column = ("completed" if state.state == "completed" else "in flight" if state.in_flight
                  else "skipped" if shown(state) == SKIPPED
                  else "unsubmitted" if state.state == "unsubmitted" else "failed")
        cell[column] += 1
    for (model, nodes), cell in sorted(cells.items()):
        by_cell.add_row(model, str(nodes), *(str(v) for v in cell.values()))
    yield by_cell

    failed = [s for s in states if s.state in FAILED]
    if failed:
        table = titled_table(f"failed runs ({len(failed)}; first 20)")
        for column in ("run", "outcome", "reason", "task", "attempt", "nodes"):
            table.add_column(column)
        for state in failed[:20]:
            table.add_row(state.run_id, state.state, state.reason[:60], state.task or "",
                          str(state.attempt or ""), ",".join(state.nodes))
        yield table
    used, remaining = gpu_hours(observation, skipped)
    excluded = (f"{','.join(observation.excluded)} (why: `sweep nodes {sweep_dir}`)"
                if observation.excluded else "none")
    calls = ", ".join(f"{n} {c}" for c, n in sorted(observation.slurm_calls.items())) or "none"
    yield (f"GPU-hours: {used:.2f} used, about {remaining:.2f} to go (estimate)\n"
           f"bad nodes excluded from later submissions: {excluded}\n"
           f"Slurm calls: {calls}; {elapsed_s:.2f} s")


def render_driver(view: DriverView, spent_gpu_hours: float) -> str:
    """The search driver's lines: job, state, round, runs launched/skipped/left out, GPU-hours,
    and when it died, what to do and the end of its log."""
    progress = view.progress
    phase = progress.get("phase", "?")
    lines = [f"search driver: job {view.job_id}, {view.state} ({view.slurm_state}), phase {phase}, "
             f"round {progress.get('round', 0)}{_cells(progress)}, "
             f"runs launched {progress.get('launched', 0)}, "
             f"skipped {progress.get('skipped', '–') if phase in ('done', 'budget', 'reporting') else '–'}"
             f", left out by the budget {progress.get('left_out', 0)}, "
             f"GPU-hours spent {spent_gpu_hours:.2f}, stints {progress.get('stints', 0)}"]
    if progress.get("summary"):
        lines.append(f"  {progress['summary']}")
    if view.state in ("dead", "lost") and phase not in ("done", "budget"):
        lines.append(f"  the driver died before the search ended: `sweep resume {view.folder}` "
                     "starts a new one, which adopts the runs in flight")
    if progress.get("error"):
        lines.append(f"  error: {progress['error']}")
    if progress.get("report_error"):
        lines.append(f"  the search ended, but its report failed: {progress['report_error']}")
    lines += [f"  {line}" for line in view.log_tail]
    return "\n".join(lines)


def _cells(progress: dict[str, object]) -> str:
    """` (cells: 3 open, 5 closed)`: open cells are those the latest round asked runs of; once
    the search is over, every cell is closed."""
    cells = progress.get("cells")
    if not isinstance(cells, int):
        return ""
    over = progress.get("phase") in ("done", "budget", "reporting", "searched")
    asked = progress.get("open_cells")
    still = asked if isinstance(asked, int) and not over else 0
    return f" (cells: {still} open, {cells - still} closed)"


def calibration_line(folder: Path, progress: dict[str, object]) -> str | None:
    """The self-calibration line, about now: the latest re-plan, and when it had nothing to
    learn from, said as of the round it preceded, never as if that still held (a file it did
    not find then may be there now)."""
    from sweep.search.round_calibration import describe_latest, read_rounds

    rounds = read_rounds(folder)
    if not rounds:
        return None
    latest = rounds[-1]
    if latest.get("calibrated"):
        return describe_latest(folder)
    reason = str(latest.get("reason", "?"))
    if (folder / "runs.parquet").is_file() and "no such file" in reason.lower():
        reason = "no attempt had been collected yet"
    number = latest.get("round")
    if not isinstance(number, int):
        return f"self-calibration at {number}: nothing to learn from then ({reason})"
    before = number + 1
    now = progress.get("round")
    over = progress.get("phase") in ("done", "budget", "reporting", "searched")
    if over or (isinstance(now, int) and now > before):
        since = ("the search has ended since" if over else f"round {now} is the current one")
        return (f"self-calibration: the re-plan before round {before} had nothing to learn from "
                f"({reason}); {since}")
    return f"self-calibration before round {before}: nothing to learn from yet ({reason})"


def resolve(target: Path, out: Path | None) -> Path | None:
    """The sweep folder of a folder or a spec (None: the spec's folder has no runs yet)."""
    if target.is_file():
        from sweep.search.render_sweep import sweep_dir_of

        folder = sweep_dir_of(target, out)
        return folder if (folder / "runs").is_dir() else None
    if out is not None:
        raise UserError(f"--out applies to a spec; {target} is a sweep folder")
    return target


def run(args: argparse.Namespace) -> int:
    from sweep.backends.slurm.client import SlurmError
    from sweep.backends.slurm.submit_record import describe_submit
    from sweep.backends.slurm.sweep_folder import skipped_by_search
    from sweep.backends.slurm.tracker import Tracker
    from sweep.commands._output import output_console
    from sweep.search.driver import observe_driver, read_progress

    folder = resolve(args.sweep_dir, args.out)
    if folder is None:
        from sweep.search.render_sweep import sweep_dir_of

        where = sweep_dir_of(args.sweep_dir, args.out)
        print(f"{args.sweep_dir}: not submitted yet (no runs in {where}); "
              f"`sweep submit {args.sweep_dir}` plans, renders and submits it")
        return 0
    tracker = Tracker(folder)
    console = output_console(140)  # a pipe or a log file: not squeezed into 80 columns
    while True:
        started = time.perf_counter()
        try:
            observation = tracker.observe()
        except SlurmError as error:
            raise UserError(str(error)) from None
        if args.watch:
            console.clear()
        skipped = skipped_by_search(tracker.dir)
        for item in render(observation, tracker.dir, time.perf_counter() - started, skipped):
            console.print(item)
        half = describe_submit(tracker.dir)
        if half is not None:
            console.print(half, markup=False, highlight=False, soft_wrap=True)
        try:
            view = observe_driver(tracker.dir, tracker.slurm)
        except SlurmError as error:
            raise UserError(str(error)) from None
        if view is not None:
            console.print(render_driver(view, gpu_hours(observation, skipped)[0]), markup=False,
                          highlight=False, soft_wrap=True)
        calibrated = calibration_line(tracker.dir, view.progress if view is not None
                                      else read_progress(tracker.dir))
        if calibrated is not None:
            console.print(calibrated, markup=False, highlight=False, soft_wrap=True)
        driving = view is not None and view.state == "live"
        if not args.watch or not (driving or any(s.in_flight for s in observation.states)):
            return 0
        time.sleep(args.interval)
