"""The search driver: a pruned, adaptive or shortlist search that lives on the cluster, not on a
login node.

`sweep submit SPEC --strategy adaptive` (detached, the default for a search) plans, renders,
runs the preflight and submits this driver as a small CPU job through submitit, then exits. The
driver runs the same search as the foreground path (`search_on_slurm`), from the sweep folder's
state, which is crash-safe: the ledger says what was submitted, the attempt folders and sacct
what happened. So a driver started again (requeued at its time limit, or a new one after it
died) redoes the search's decisions from what is known, waits for what is in flight and never
submits a run twice. When the search ends it collects (with sacct) and reports, so the report is
there when the user comes back.

Files in the sweep folder:
  driver.json           the driver's job id (the one driver allowed to act on the sweep), its
                        options, and the report job of a one-round sweep
  driver_progress.json  written by the driver: phase, round, runs launched/skipped/left out
  driver/               submitit's folder: the pickled job and the driver's stdout/stderr logs

Never two drivers: `driver.json` names the sweep's driver, and a new one is only submitted,
under the sweep's submit lock (`.submit.lock`), when Slurm says the recorded one is over
(`driver_state`). A driver that starts and finds another job id in driver.json exits at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from submitit.helpers import Checkpointable

from sweep.core.errors import UserError, exit_code_of
from sweep.core.state import atomic_write_json, read_json

if TYPE_CHECKING:
    from sweep.backends.base import RoundHook, Rounds, Submitted
    from sweep.backends.slurm.client import Slurm
    from sweep.backends.slurm.observation import Observation
    from sweep.backends.slurm.tracker import SubmitReport, Tracker
    from sweep.plan.spec import DriverSettings

DRIVER_FILE: Final = "driver.json"
PROGRESS_FILE: Final = "driver_progress.json"
DRIVER_DIR: Final = "driver"
# Requeues at the time limit before submitit gives up (preemptions do not count).
MAX_REQUEUES: Final = 100
# Slurm states of a job that is, or may again be, running: a driver in one of them owns the sweep.
LIVE_STATES: Final = frozenset({
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
    "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# Environment variables Slurm sets inside a job. The driver drops them before it submits the
# sweep's arrays (an array task would otherwise read the driver's SLURM_NTASKS, SLURM_MEM_PER_*
# and the like through sbatch/srun) and puts them back for submitit's requeue.
_KEEP_ENV: Final = ("SLURM_CONF",)

DriverState = Literal["none", "live", "completed", "dead", "lost"]
Phase = Literal["submitted", "searching", "requeued", "reporting", "done", "budget", "failed"]


# -- the search, shared by the foreground path and the driver ----------------------------------

@dataclass(frozen=True)
class SearchOptions:
    """How to search: the strategy and the knobs `sweep submit` passes on."""

    strategy: str
    top: int | None = None  # shortlist: completed runs per cell (None: Params' default)
    max_running: int | None = None
    poll_s: float = 30.0
    max_gpu_hours: float | None = None
    report: bool = True
    calibrate: bool = True  # refit the memory model after every round (sweep.search.round_calibration)


@dataclass(frozen=True)
class SearchEnd:
    """How a search on Slurm ended."""

    summary: str
    rounds: int
    launched: int
    skipped: int
    left_out: list[str] = field(default_factory=list)


def search_on_slurm(folder: Path, options: SearchOptions, *,
                    on_poll: Callable[[Observation], None] | None = None,
                    on_round: RoundHook | None = None) -> SearchEnd:
    """Run the sweep's search round by round on Slurm until it ends or the GPU-hour cap stops
    it; raises UserError when the folder was not planned from a spec, SlurmError as Slurm
    does."""
    import pandas as pd

    from sweep.backends.base import Rounds
    from sweep.backends.slurm.backend import SlurmBackend
    from sweep.backends.slurm.tracker import LEFT_OUT_FILE, Tracker
    from sweep.calibration.throughput_coefficients import sweep_coefficients
    from sweep.plan.budget import BudgetReached
    from sweep.plan.plan_file import PLAN_FILE, SPEC_COPY
    from sweep.plan.predictions import workloads_for
    from sweep.plan.spec import load_spec
    from sweep.search.live_search import search_sweep
    from sweep.search.round_calibration import for_search
    from sweep.search.strategies import Params

    if not (folder / PLAN_FILE).is_file() or not (folder / SPEC_COPY).is_file():
        raise UserError(f"{folder}: --strategy needs the sweep's {PLAN_FILE} and {SPEC_COPY}; "
                        "submit the spec file, or run `sweep plan` and `sweep render` first")
    spec = load_spec(folder / SPEC_COPY)
    plan = pd.read_parquet(folder / PLAN_FILE)
    backend = SlurmBackend(Tracker(folder), max_running=options.max_running,
                           max_gpu_hours=options.max_gpu_hours, on_poll=on_poll)
    rounds = Rounds(backend, poll_s=options.poll_s, on_round=on_round)
    # A relative templates_dir is anchored where the driver runs: the submitting directory.
    calibration, line = for_search(folder, spec, plan, enabled=options.calibrate)
    print(line, flush=True)
    _print_budget(backend.tracker, options.max_gpu_hours)
    try:
        search = search_sweep(folder, plan, options.strategy, workloads_for(spec), rounds,
                              params=Params.with_top(options.top), calibration=calibration,
                              plan_coefficients=sweep_coefficients(folder, spec))
    except BudgetReached as stop:
        summary = (f"{options.strategy}: stopped at the budget of {stop.cap_gpu_hours:g} "
                   f"GPU-hours after {rounds.rounds} round(s); {len(stop.left_out)} run(s) the "
                   f"search asked for were left out, listed in {folder / LEFT_OUT_FILE}")
        return SearchEnd(summary, rounds.rounds, len(rounds.launched), 0, stop.left_out)
    return SearchEnd(search.summary(folder), search.result.rounds, search.launched, search.saved)


def _print_budget(tracker: Tracker, cap: float | None) -> None:
    """The estimate and the cap of the runs not submitted yet, as submit and resume print them
    (sweep.backends.slurm.budget_gate): the driver's log says what it may still spend."""
    from sweep.backends.slurm.budget_gate import describe
    from sweep.backends.slurm.submission import latest_tasks

    seen = latest_tasks(tracker.submissions())
    todo = [r for r in tracker.run_ids() if r not in seen]
    if todo:
        print(describe(tracker, todo, cap)[0], flush=True)


def collect_and_report(folder: str | Path) -> int:
    """What `sweep collect DIR --sacct` then `sweep report DIR` do, on the cluster: the end of a
    detached sweep (the driver's last step, or the report job after a one-round sweep's arrays).
    It prints what those commands print and returns their exit code (see `_exit_code`); the
    report is not made when the collection failed."""
    folder = Path(folder)
    code = exit_code_of("collect", lambda: _collect_with_sacct(folder))
    if code:
        return code
    code = exit_code_of("report", lambda: _write_report(folder))
    export_if_asked(folder)
    return code


def _collect_with_sacct(folder: Path) -> None:
    from sweep.collect.folder import collect_folder, collect_summary

    result, out = collect_folder(folder, sacct=True)
    for line in collect_summary(result, out):
        print(line)


def _write_report(folder: Path) -> None:
    from analysis.sweep_report import report_summary, report_sweep, runs_file

    for line in report_summary(report_sweep(runs_file(folder))):
        print(line)


def export_if_asked(folder: Path) -> bool:
    """The spec's `export:` section, once the sweep is collected: its trackers get every
    attempt. Never fails the sweep: a tracker that does not answer is said on stderr (the job's
    log), with the command that retries it. False when an export was asked for and failed."""
    from sweep.plan.plan_file import planned_spec

    try:
        spec = planned_spec(folder)
    except Exception:  # noqa: BLE001 - an unreadable spec copy was said by collect already
        return True
    if spec is None or spec.export is None:
        return True
    from sweep.export.sweep_export import export_at_end

    ok, lines = export_at_end(folder, spec.export.to)
    for line in lines:
        print(line, file=sys.stdout if ok else sys.stderr, flush=True)
    return ok


# -- the guard: one driver per sweep ------------------------------------------------------------

def driver_state(job_id: str | None, queue_state: str | None, acct_state: str | None) -> DriverState:
    """What became of the recorded driver, from squeue (live jobs) and sacct (every job):
    none (no driver recorded), live (pending, running, requeued: it owns the sweep), completed,
    dead (failed, cancelled, timed out, killed with its node) or lost (Slurm knows nothing of
    it: its record aged out of the accounting)."""
    if not job_id:
        return "none"
    if queue_state is not None:
        return "live" if _base(queue_state) in LIVE_STATES else "dead"
    if acct_state is None:
        return "lost"
    state = _base(acct_state)
    if state in LIVE_STATES:
        return "live"  # sacct not yet updated, or squeue forgot it this very moment
    return "completed" if state == "COMPLETED" else "dead"


def may_start_driver(state: DriverState) -> bool:
    """A new driver may be submitted unless the recorded one is live (two drivers would each
    submit the runs of their rounds)."""
    return state != "live"


def is_the_sweeps_driver(recorded_job_id: str | None, my_job_id: str | None) -> bool:
    """Whether a starting driver job is the one driver.json names; any other (an old driver
    requeued after a new one was started) must leave the sweep alone."""
    return bool(my_job_id) and recorded_job_id == my_job_id


def _base(state: str) -> str:
    """`CANCELLED by 1000` → CANCELLED."""
    return state.split()[0].upper() if state.strip() else ""


# -- driver.json and driver_progress.json -------------------------------------------------------

def read_record(folder: Path) -> dict[str, Any]:
    return read_json(folder / DRIVER_FILE) or {}


def write_record(folder: Path, **fields: Any) -> None:
    """Update driver.json (callers hold the sweep's submit lock)."""
    atomic_write_json(folder / DRIVER_FILE, {**read_record(folder), **fields})


def read_progress(folder: Path) -> dict[str, Any]:
    return read_json(folder / PROGRESS_FILE) or {}


def write_progress(folder: Path, **fields: Any) -> None:
    atomic_write_json(folder / PROGRESS_FILE, {**read_progress(folder), **fields,
                                               "updated_at": time.time()})


@dataclass(frozen=True)
class DriverView:
    """What `sweep status` shows of the driver."""

    folder: Path
    job_id: str
    state: DriverState
    slurm_state: str
    progress: dict[str, Any]
    log_tail: list[str]
    report_job: str | None = None


def observe_driver(folder: Path, slurm: Slurm, tail_lines: int = 15) -> DriverView | None:
    """The recorded driver's state (one squeue, one sacct), its progress and, when it did not
    end well, the last lines of its log. None: the sweep has no driver."""
    record = read_record(folder)
    job_id = str(record.get("job_id") or "")
    if not job_id:
        return None
    queue_state, acct_state = driver_slurm_states(slurm, job_id)
    state = driver_state(job_id, queue_state, acct_state)
    progress = read_progress(folder)
    failed = state in ("dead", "lost") or progress.get("phase") == "failed"
    return DriverView(folder=folder, job_id=job_id, state=state,
                      slurm_state=queue_state or acct_state or "unknown to Slurm",
                      progress=progress, log_tail=log_tail(folder, job_id, tail_lines) if failed else [],
                      report_job=record.get("report_job"))


def driver_slurm_states(slurm: Slurm, job_id: str) -> tuple[str | None, str | None]:
    """(squeue state, sacct state) of the driver job; None where it is not listed."""
    queued = [e.state for e in slurm.queue([job_id]) if e.job_id == job_id]
    if queued:
        return queued[0], None
    acct = [e.state for e in slurm.accounting([job_id]) if e.job_id == job_id]
    return None, (acct[0] if acct else None)


def log_tail(folder: Path, job_id: str, lines: int) -> list[str]:
    """The last lines of the driver's stderr then stdout (submitit's `<job>_0_log.*`)."""
    out: list[str] = []
    for suffix in ("err", "out"):
        path = folder / DRIVER_DIR / f"{job_id}_0_log.{suffix}"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out += [f"{path.name}: {line}" for line in text.splitlines()[-lines:]]
    return out


# -- the driver job -----------------------------------------------------------------------------

_STASHED_ENV: dict[str, str] = {}


def _drop_job_env() -> None:
    """Keep the driver's Slurm job variables out of the sweep's sbatch calls (see _KEEP_ENV)."""
    for name in [n for n in os.environ if n.startswith(("SLURM_", "SUBMITIT_"))]:
        if name not in _KEEP_ENV:
            _STASHED_ENV[name] = os.environ.pop(name)


def _restore_job_env() -> None:
    """submitit's requeue reads SLURM_JOB_ID: put the job's variables back."""
    os.environ.update(_STASHED_ENV)


class SearchDriver(Checkpointable):
    """The job submitit runs. At Slurm's time limit or a preemption, submitit calls
    `checkpoint` (on the USR2 Slurm sends `signal_before_s` early) and requeues the job with
    this same object: the search then starts again from the sweep folder and goes on."""

    def __init__(self, folder: str, options: SearchOptions) -> None:
        self.folder, self.options = folder, options

    def __call__(self) -> str:
        folder = Path(self.folder)
        me = os.environ.get("SLURM_JOB_ID")
        if not self._owns_the_sweep(folder, me):
            return f"job {me} is not this sweep's driver (see {folder / DRIVER_FILE}); nothing done"
        _drop_job_env()
        stints = int(read_progress(folder).get("stints") or 0) + 1
        write_progress(folder, job_id=me, phase="searching", stints=stints, host=os.uname().nodename)
        try:
            end = search_on_slurm(folder, self.options, on_poll=_log_poll,
                                  on_round=lambda *args: _record_round(folder, *args))
        except BaseException as error:
            if not isinstance(error, SystemExit):  # submitit's requeue exits; that is no failure
                write_progress(folder, phase="failed", error=f"{type(error).__name__}: {error}")
            raise
        print(end.summary, flush=True)
        write_progress(folder, phase="reporting" if self.options.report else "searched",
                       round=end.rounds, skipped=end.skipped, left_out=len(end.left_out),
                       summary=end.summary)
        if self.options.report:
            self._report(folder)
        write_progress(folder, phase="budget" if end.left_out else "done")
        return end.summary

    @staticmethod
    def _report(folder: Path) -> None:
        """Collect and report. The search is over whatever happens here: a report that fails
        is recorded (`sweep status` shows it; `sweep report DIR` makes it again by hand), not
        a failed driver that `sweep resume` would start again for nothing."""
        try:
            code = collect_and_report(folder)
        except Exception as error:  # noqa: BLE001 - any failure of the report is reported
            code, reason = 1, f"{type(error).__name__}: {error}"
            print(f"collect or report failed: {reason}", file=sys.stderr, flush=True)
        else:
            reason = f"exit code {code}"
        if code:
            write_progress(folder, report_error=f"{reason}; run `sweep collect {folder} "
                                                f"--sacct` and `sweep report {folder}` by hand")

    def _owns_the_sweep(self, folder: Path, me: str | None) -> bool:
        from sweep.backends.slurm.tracker import Tracker

        with Tracker(folder).lock():  # the submitter writes driver.json under this lock
            return is_the_sweeps_driver(str(read_record(folder).get("job_id") or ""), me)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit before it requeues the job: nothing to save (the sweep folder is
        the state), so the same driver is submitted again."""
        _restore_job_env()
        write_progress(Path(self.folder), phase="requeued")
        print(f"{time.strftime('%H:%M:%S')} time limit or preemption: requeueing", flush=True)
        return super().checkpoint(*args, **kwargs)


def _record_round(folder: Path, rounds: Rounds, run_dirs: Sequence[Path],
                  submitted: Submitted) -> None:
    """driver_progress.json after a round was submitted: the round, the runs launched over
    every stint of the driver, and the cells still open (those the round asked runs for)."""
    launched = sorted(set(read_progress(folder).get("launched_runs") or []) | set(rounds.launched))
    asked = open_cells(folder, [d.name for d in run_dirs])
    write_progress(folder, round=rounds.rounds, launched=len(launched), launched_runs=launched,
                   open_cells=len(asked), cells=count_cells(folder))
    print(f"{time.strftime('%H:%M:%S')} round {rounds.rounds}: {len(submitted.launched)} run(s) "
          f"launched, {len(submitted.adopted)} adopted, {len(submitted.left_out)} left out by "
          f"the budget; {len(asked)} cell(s) open", flush=True)


def open_cells(folder: Path, run_ids: Sequence[str]) -> set[tuple[str, int]]:
    """The (model, nodes) cells of these runs: a round asks runs of the cells it has not
    closed."""
    from sweep.backends.slurm.sweep_folder import SweepFolder

    infos = SweepFolder(folder).run_info()
    return {(infos[r].model, infos[r].nodes) for r in run_ids if r in infos}


def count_cells(folder: Path) -> int:
    """How many (model, nodes) cells the sweep has (the kept rows of its plan)."""
    import pandas as pd

    from sweep.plan.plan_file import PLAN_FILE
    from sweep.search.live_search import candidates_of

    plan = pd.read_parquet(folder / PLAN_FILE, columns=["status", "model", "nodes"])
    return int(candidates_of(plan).groupby(["model", "nodes"]).ngroups)


def _log_poll(observation: Observation) -> None:
    from sweep.backends.slurm.submission import counts_by

    counts = counts_by(observation.states)
    print(time.strftime("%H:%M:%S"), ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
          flush=True)


# -- submitting the driver and the report job ---------------------------------------------------

def _executor(folder: Path, settings: DriverSettings, name: str, role: str,
              extra: dict[str, Any] | None = None) -> Any:
    """A submitit executor for a small CPU job of this sweep, with the spec's driver settings.
    The comment names the sweep and the role, for `squeue -o %k` and clean-ups."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder / DRIVER_DIR, max_num_timeout=MAX_REQUEUES)
    additional: dict[str, Any] = {"requeue": True, **(extra or {})}
    if settings.account:
        additional["account"] = settings.account
    executor.update_parameters(
        job_name=f"{name}.{role}", time=settings.time_limit_min, mem=settings.mem,
        cpus_per_task=settings.cpus, ntasks_per_node=1, nodes=1,
        partition=settings.partition, qos=settings.qos,
        signal_delay_s=settings.signal_before_s, comment=f"sweep-{role}={name}",
        additional_parameters=additional)
    return executor


def record_search(folder: Path, options: SearchOptions) -> None:
    """Record the search's options in driver.json before anything is submitted (the preflight
    included): a submit stopped before its driver started leaves a sweep that `sweep resume`
    goes on with as this search, not as plain arrays."""
    from sweep.backends.slurm.tracker import Tracker

    tracker = Tracker(folder)
    with tracker.lock():
        recorded = str(read_record(folder).get("job_id") or "")
        if recorded and driver_state(recorded, *driver_slurm_states(tracker.slurm, recorded)) \
                == "live":
            return  # its driver goes on with its own options; start_driver says so
        write_record(folder, options=asdict(options), recorded_at=time.time())


def submit_driver(folder: Path, settings: DriverSettings, options: SearchOptions,
                  name: str) -> str:
    """Submit the search driver; records it in driver.json (callers hold the submit lock and
    checked `may_start_driver`). Returns its job id."""
    job = _executor(folder, settings, name, "driver").submit(SearchDriver(str(folder), options))
    write_record(folder, job_id=str(job.job_id), submitted_at=time.time(), options=asdict(options),
                 argv=sys.argv[1:])
    write_progress(folder, job_id=str(job.job_id), phase="submitted")
    return str(job.job_id)


def start_driver(tracker: Tracker, settings: DriverSettings, options: SearchOptions) -> str:
    """Submit a driver for the sweep unless its recorded driver is still live (then UserError
    naming it). Takes the sweep's submit lock, so two `sweep submit`/`sweep resume` racing on
    one sweep, even from two login nodes over a shared file system, start one driver."""
    with tracker.lock():
        recorded = str(read_record(tracker.dir).get("job_id") or "")
        state = driver_state(recorded, *driver_slurm_states(tracker.slurm, recorded)) \
            if recorded else "none"
        if not may_start_driver(state):
            raise UserError(f"{tracker.dir / DRIVER_FILE}: driver job {recorded} is still "
                            f"live; it owns the sweep. Watch it with `sweep status "
                            f"{tracker.dir}`, or stop it with `sweep cancel {tracker.dir}`")
        return submit_driver(tracker.dir, settings, options, tracker.sweep_name())


def report_after(folder: Path, tracker: Tracker, report: SubmitReport) -> str | None:
    """The afterany job that collects and reports after a submission's arrays (submit's, and
    resume's: the report is made again once the rerun runs end); None when nothing was
    submitted."""
    from sweep.plan.plan_file import driver_settings

    if not report.submitted:
        return None
    return submit_report_job(folder, driver_settings(folder), [j for _, j, _ in report.submitted],
                             tracker.sweep_name())


def submit_report_job(folder: Path, settings: DriverSettings, after: Sequence[str],
                      name: str) -> str:
    """A job that collects and reports once every one of `after` (the arrays) has ended, however
    it ended (afterany). Recorded in driver.json as report_job."""
    dependency = {"dependency": "afterany:" + ":".join(after)} if after else {}
    job = _executor(folder, settings, name, "report", dependency).submit(
        collect_and_report, str(folder))
    write_record(folder, report_job=str(job.job_id))
    return str(job.job_id)
