"""The embedded backend: run rendered jobs on this machine, the way Slurm would run them.

Each run's own `job.sbatch` runs under bash with Slurm's batch environment emulated
(SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_NODEID=0, SLURMD_NODENAME, ...) and with
stand-ins for `srun` and `scontrol` first on PATH (sweep/backends/local/srun.py, scontrol.py): `srun` starts one task per
emulated node, so a two-node job gets two watchdogs, as on a cluster. The #SBATCH lines are
honoured where they matter here: --nodes, --output/--error, --time (TIMEOUT, then TERM and KILL
after KillWait) and --signal=B:USR1@s. Emulated nodes are loopback addresses (127.0.0.k), so
MASTER_ADDR, taken from the node list, resolves and every node name is distinct.

Concurrency is capped by CPU slots: a job needs nodes x ranks-per-node slots; a job larger
than the machine runs alone. Given this machine's GPUs (`gpus`), a job whose runs use GPUs also
takes nodes x GPUs-per-node of them, and waits until that many are free: each emulated node sees
only its own through CUDA_VISIBLE_DEVICES (`NODE_GPUS_ENV`, which the srun stand-in reads), as a
Slurm node would, so two jobs, or two emulated nodes of one job, never share a GPU.

A job ends with an accounting record, `local_sacct.json` in its attempt folder (what sacct would
say: state, exit code, times), because a job killed at its time limit writes no status.json.

submitit's LocalExecutor was not used: it runs pickled Python callables, while the point here
is to run the very bash script a cluster runs, with Slurm's environment and signals.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

import sweep
from sweep.backends.base import Submitted
from sweep.backends.local.srun import NODE_GPUS_ENV
from sweep.core.runconfig import load as load_run
from sweep.core.state import (
    STATUS_FILE,
    LockHeld,
    atomic_write_json,
    attempt_dirs,
    exclusive_lock,
    new_attempt_dir,
    read_json,
)

ACCOUNTING_FILE = "local_sacct.json"
JOB_RECORD_FILE = "local_job.json"  # the batch shell of a running job: pid and start time
RUNNER_LOCK_FILE = ".run.lock"
JOB_FILE = "job.sbatch"
DEFAULT_KILL_WAIT_S = 5.0
_SHIMS = {"srun": "sweep.backends.local.srun", "scontrol": "sweep.backends.local.scontrol"}


# Pure helpers -----------------------------------------------------------------------------

def parse_directives(script: str) -> dict[str, str]:
    """The #SBATCH options of a script (up to its first command), as sbatch reads them."""
    options: dict[str, str] = {}
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not stripped.startswith("#SBATCH"):
            continue
        for word in shlex.split(stripped[len("#SBATCH"):], comments=True):
            name, _, value = word.lstrip("-").partition("=")
            options[name] = value
    return options


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_seconds(text: str) -> int:
    """Slurm's --time in seconds, in each of its forms: minutes, minutes:seconds,
    hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds."""
    match = _SLURM_TIME.match(text.strip())
    if match is None:
        raise ValueError(f"--time={text!r} is not a Slurm time")
    days, first, second, third = match.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if second is None:
        return int(first) * 60
    if third is None:
        return int(first) * 60 + int(second)
    return (int(first) * 60 + int(second)) * 60 + int(third)


def parse_signal(text: str) -> tuple[bool, int, int]:
    """--signal=[B:]SIG[@seconds] → (batch shell only, signal number, seconds before the end)."""
    match = re.fullmatch(r"(B:)?(?:SIG)?([A-Z0-9]+)(?:@(\d+))?", text)
    if match is None:
        raise ValueError(f"--signal={text!r} is not understood")
    name = match.group(2)
    number = int(name) if name.isdigit() else int(signal.Signals[f"SIG{name}"])
    return bool(match.group(1)), number, int(match.group(3) or 60)


def emulated_nodes(count: int) -> list[str]:
    return [f"127.0.0.{k}" for k in range(1, count + 1)]


def filename_pattern(pattern: str, job_id: int, job_name: str, node: str) -> str:
    """sbatch's %j/%x/%N/%% substitutions."""
    table = {"j": str(job_id), "J": str(job_id), "A": str(job_id), "a": "4294967294",
             "x": job_name, "N": node, "%": "%"}
    return re.sub(r"%([jJAaxN%])", lambda m: table[m.group(1)], pattern)


def accounting_state(returncode: int, timed_out: bool, cancelled: bool) -> tuple[str, str]:
    """(State, ExitCode "code:signal") as sacct reports a batch job."""
    signum = -returncode if returncode < 0 else 0
    code = returncode if returncode > 0 else 0
    if timed_out:
        return "TIMEOUT", f"0:{signum or int(signal.SIGTERM)}"
    if cancelled:
        return "CANCELLED", f"0:{signum or int(signal.SIGTERM)}"
    return ("COMPLETED" if returncode == 0 else "FAILED"), f"{code}:{signum}"


def write_shims(directory: Path, python: str = sys.executable) -> Path:
    """Executables `srun` and `scontrol` in `directory` that run the shims with `python`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, module in _SHIMS.items():
        path = directory / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(python)} -m {module} \"$@\"\n")
        path.chmod(0o755)
    return directory


# Jobs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalResult:
    run_id: str
    run_dir: Path
    attempt_dir: Path
    job_id: int
    state: str  # sacct's: COMPLETED, FAILED, TIMEOUT, CANCELLED
    exit_code: str
    elapsed_s: float
    outcome: str | None  # status.json's outcome, when the watchdog wrote one


class NotEnoughGpus(ValueError):
    """A run needs more GPUs than this machine has; the message names the run and the fix."""


@dataclass
class _Job:
    run_dir: Path
    run_id: str
    slots: int
    gpus_needed: int = 0
    gpu_ids: list[str] = field(default_factory=list)
    job_id: int = 0
    attempt_dir: Path = Path()
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    time_limit_s: float = float("inf")
    signal_at: float = float("inf")
    signal_number: int = int(signal.SIGUSR1)
    nodes: list[str] = field(default_factory=list)
    files: list[IO[bytes]] = field(default_factory=list)
    seen: dict[int, float] = field(default_factory=dict)  # descendant pid → create time
    timed_out: bool = False
    cancelled: bool = False
    kill_at: float | None = None


class LocalBackend:
    """Runs run folders' job.sbatch scripts with Slurm emulated, `slots` CPU slots at a time."""

    def __init__(self, slots: int | None = None, *, kill_wait_s: float = DEFAULT_KILL_WAIT_S,
                 poll_s: float = 0.2, on_start: Callable[[Path, int], None] | None = None,
                 on_finish: Callable[[LocalResult], None] | None = None,
                 extra_env: dict[str, str] | None = None,
                 gpus: Sequence[str] | None = None) -> None:
        self.slots = slots or os.cpu_count() or 1
        # this machine's GPUs (CUDA_VISIBLE_DEVICES entries); None: GPUs are not handed out
        self.gpus = list(gpus) if gpus is not None else None
        self._free_gpus = list(self.gpus or [])
        self.kill_wait_s = kill_wait_s
        self.poll_s = poll_s
        self.on_start, self.on_finish = on_start, on_finish
        self.extra_env = dict(extra_env or {})
        self._next_id = random.randint(1, 5_000_000)
        self._queue: list[_Job] = []
        self._running: list[_Job] = []
        self._shim_dir: tempfile.TemporaryDirectory[str] | None = None

    # --- the backend interface (sweep.backends.base.Backend): submit, observe, cancel ---

    def submit(self, run_dirs: Iterable[str | Path]) -> Submitted:
        """Queue these runs; `poll` starts them as CPU slots free up. A run already queued or
        running here is not queued twice (adopted)."""
        waiting = self._waiting()
        jobs = [self._job(Path(d)) for d in run_dirs]
        fresh = [job for job in jobs if job.run_id not in waiting]
        self._queue += fresh
        return Submitted(launched=[job.run_id for job in fresh],
                         adopted=[job.run_id for job in jobs if job.run_id in waiting])

    def poll(self) -> list[LocalResult]:
        """Advance the emulated cluster once: start queued jobs that fit in the free slots, and
        finish the jobs whose processes are all gone (with their accounting records). Returns
        the results of the jobs that ended in this poll."""
        used = sum(job.slots for job in self._running)
        while self._queue and (not self._running or used + self._queue[0].slots <= self.slots) \
                and self._queue[0].gpus_needed <= len(self._free_gpus):
            job = self._queue.pop(0)
            job.gpu_ids = self._free_gpus[:job.gpus_needed]
            del self._free_gpus[:job.gpus_needed]
            self._start(job, self._shims())
            self._running.append(job)
            used += job.slots
        ended = [job for job in self._running if self._tick(job)]
        for job in ended:
            self._running.remove(job)
        return [self._finish(job) for job in ended]

    def in_flight(self, run_ids: Collection[str]) -> set[str]:
        """Those of `run_ids` queued or running, after one `poll` (here, observing the cluster
        is also what moves it on)."""
        self.poll()
        return self._waiting() & set(run_ids)

    def finished(self, run_dir: Path) -> bool:
        return finished(run_dir)

    def _waiting(self) -> set[str]:
        """Run ids queued or running (what squeue would list)."""
        return {job.run_id for job in self._queue + self._running}

    def cancel(self) -> list[LocalResult]:
        """Cancel every queued and running job as scancel would: TERM to each job's processes,
        KILL after the kill wait; the running ones end `CANCELLED` with accounting records."""
        self._queue.clear()
        running, self._running = self._running, []
        for job in running:
            job.cancelled = True
            self._terminate(job)
        deadline = time.monotonic() + self.kill_wait_s
        while any(j.process and j.process.poll() is None for j in running) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        for job in running:
            self._kill(job)
        return [self._finish(job) for job in running]

    def close(self) -> None:
        """Remove the srun/scontrol stand-ins (after the last job ended)."""
        if self._shim_dir is not None:
            self._shim_dir.cleanup()
            self._shim_dir = None

    def _shims(self) -> Path:
        if self._shim_dir is None:
            self._shim_dir = tempfile.TemporaryDirectory(prefix="sweep-local-")
            write_shims(Path(self._shim_dir.name) / "bin")
        return Path(self._shim_dir.name) / "bin"

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Use the backend round after round (a search): on Ctrl-C or SIGTERM, what is in flight
        is cancelled (TERM, KillWait, KILL) as scancel would, then the error goes on."""
        with _term_raises():
            try:
                yield
            except BaseException:
                self.cancel()
                raise
            finally:
                self.close()

    def run(self, run_dirs: Iterable[str | Path]) -> list[LocalResult]:
        """Run every job to its end; results in completion order. Ctrl-C or SIGTERM cancels the
        rest (see `session`) and re-raises."""
        results: list[LocalResult] = []
        with self.session():
            self.submit(run_dirs)
            while True:
                results += self.poll()
                if not self._waiting():
                    break
                time.sleep(self.poll_s)
        return results

    # --- one job ---

    def _job(self, run_dir: Path) -> _Job:
        script = run_dir / JOB_FILE
        if not script.is_file():
            raise FileNotFoundError(f"{script} does not exist; run `sweep render` first")
        config = load_run(run_dir)
        ranks = config.nodes * config.gpus_per_node
        gpus_needed = ranks if self.gpus is not None and config.gpu.lower() != "cpu" else 0
        if self.gpus is not None and gpus_needed > len(self.gpus):
            raise NotEnoughGpus(
                f"{run_dir}: needs {gpus_needed} GPUs ({config.nodes} node(s) × "
                f"{config.gpus_per_node}), and this machine has {len(self.gpus)}; plan fewer "
                "nodes or GPUs per node for a local run, or submit to a cluster")
        return _Job(run_dir=run_dir.resolve(), run_id=config.run_id, slots=ranks,
                    gpus_needed=gpus_needed)

    def _start(self, job: _Job, shims: Path) -> None:
        script = job.run_dir / JOB_FILE
        options = parse_directives(script.read_text(encoding="utf-8"))
        nodes = int(options.get("nodes", "1").split("-")[0])
        job.job_id, self._next_id = self._next_id, self._next_id + 1
        job.nodes = emulated_nodes(nodes)
        job.attempt_dir = new_attempt_dir(job.run_dir)
        name = options.get("job-name", JOB_FILE)
        out = Path(filename_pattern(options.get("output", str(job.attempt_dir / "slurm-%j.out")),
                                    job.job_id, name, job.nodes[0]))
        err = Path(filename_pattern(options["error"], job.job_id, name, job.nodes[0])) \
            if "error" in options else out
        out.parent.mkdir(parents=True, exist_ok=True)
        err.parent.mkdir(parents=True, exist_ok=True)
        job.files = [open(out, "ab")]
        job.files.append(open(err, "ab") if err != out else job.files[0])
        job.started = time.monotonic()
        if "time" in options:
            job.time_limit_s = slurm_seconds(options["time"])
            if "signal" in options:
                _, job.signal_number, before = parse_signal(options["signal"])
                job.signal_at = max(0.0, job.time_limit_s - before)
        job.process = subprocess.Popen(
            ["bash", str(script)], cwd=job.run_dir, stdin=subprocess.DEVNULL,
            stdout=job.files[0], stderr=job.files[1], start_new_session=True,
            env=self._environment(job, name, shims))
        atomic_write_json(job.attempt_dir / JOB_RECORD_FILE, {
            "pid": job.process.pid, "create_time": psutil.Process(job.process.pid).create_time(),
            "job_id": job.job_id, "runner_pid": os.getpid()})
        if self.on_start:
            self.on_start(job.run_dir, job.job_id)

    def _environment(self, job: _Job, name: str, shims: Path) -> dict[str, str]:
        env = dict(os.environ)
        package_parent = str(Path(sweep.__file__).resolve().parent.parent)
        env["PATH"] = os.pathsep.join([str(shims), str(Path(sys.executable).parent),
                                       env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH"))
                                            if p)
        nodelist = ",".join(job.nodes)
        env.update({
            "SLURM_JOB_ID": str(job.job_id), "SLURM_JOBID": str(job.job_id),
            "SLURM_JOB_NAME": name, "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(len(job.nodes)), "SLURM_NNODES": str(len(job.nodes)),
            "SLURM_NODEID": "0", "SLURMD_NODENAME": job.nodes[0],
            "SLURM_SUBMIT_DIR": str(job.run_dir), "SLURM_SUBMIT_HOST": job.nodes[0],
            "SLURM_CLUSTER_NAME": "local", "SLURM_NTASKS_PER_NODE": "1",
            "SWEEP_RUN_DIR": str(job.run_dir), "SWEEP_ATTEMPT_DIR": str(job.attempt_dir),
            "SWEEP_ATTEMPT": job.attempt_dir.name, "SWEEP_RUN_ID": job.run_id,
            "SWEEP_BACKEND": "local",
        })
        if job.gpu_ids:
            per_node = len(job.gpu_ids) // len(job.nodes)
            node_gpus = [job.gpu_ids[i * per_node:(i + 1) * per_node] for i in range(len(job.nodes))]
            env[NODE_GPUS_ENV] = ";".join(",".join(ids) for ids in node_gpus)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus[0])  # the batch shell runs on node 0
        env.update(self.extra_env)
        return env

    def _tick(self, job: _Job) -> bool:
        """Advance one job's clock; True once its batch shell and every descendant are gone."""
        assert job.process is not None
        self._remember_descendants(job)
        elapsed = time.monotonic() - job.started
        if job.process.poll() is None:
            if elapsed >= job.signal_at:
                job.signal_at = float("inf")
                _signal(job.process.pid, job.signal_number)
            if elapsed >= job.time_limit_s and not job.timed_out:
                job.timed_out = True
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
                job.files[1].write(f"slurmstepd: error: *** JOB {job.job_id} ON {job.nodes[0]} "
                                   f"CANCELLED AT {stamp} DUE TO TIME LIMIT ***\n".encode())
                job.files[1].flush()
                self._terminate(job)
            if job.kill_at is not None and time.monotonic() >= job.kill_at:
                self._kill(job)
            return False
        if job.kill_at is None:  # the batch shell is done: as Slurm's cgroup, end what is left
            if not self._alive(job):
                return True
            self._terminate(job)
        if time.monotonic() >= (job.kill_at or 0):
            self._kill(job)
            return True
        return not self._alive(job)

    def _remember_descendants(self, job: _Job) -> None:
        assert job.process is not None
        try:
            for child in psutil.Process(job.process.pid).children(recursive=True):
                job.seen.setdefault(child.pid, child.create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass

    def _members(self, job: _Job) -> list[psutil.Process]:
        """The job's live processes: its process group (the job runs in a session of its
        own), and every descendant seen, which covers those that left the group (the watchdog
        starts each launcher in a new session) and were then orphaned. Slurm has a cgroup."""
        assert job.process is not None
        self._remember_descendants(job)
        members: dict[int, psutil.Process] = {}
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == job.process.pid:
                    job.seen.setdefault(process.pid, process.create_time())
            except (OSError, psutil.Error):
                continue
        for pid, created in job.seen.items():
            try:
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    members[pid] = process
            except psutil.Error:
                continue
        members.pop(job.process.pid, None)
        return list(members.values())

    def _alive(self, job: _Job) -> bool:
        return bool(self._members(job)) or (job.process is not None
                                              and job.process.poll() is None)

    def _terminate(self, job: _Job) -> None:
        if job.kill_at is None:
            job.kill_at = time.monotonic() + self.kill_wait_s
        for process in self._members(job):
            _signal(process.pid, signal.SIGTERM)
        if job.process and job.process.poll() is None:
            _signal(job.process.pid, signal.SIGTERM)

    def _kill(self, job: _Job) -> None:
        for process in self._members(job):
            _signal(process.pid, signal.SIGKILL)
        if job.process and job.process.poll() is None:
            _signal(job.process.pid, signal.SIGKILL)
            job.process.wait()

    def _finish(self, job: _Job) -> LocalResult:
        assert job.process is not None
        returncode = job.process.wait()
        elapsed = time.monotonic() - job.started
        for handle in {id(f): f for f in job.files}.values():
            handle.close()
        state, exit_code = accounting_state(returncode, job.timed_out, job.cancelled)
        atomic_write_json(job.attempt_dir / ACCOUNTING_FILE, {
            "JobID": str(job.job_id), "State": state, "ExitCode": exit_code,
            "ElapsedRaw": round(elapsed, 3), "NodeList": ",".join(job.nodes),
            "NNodes": len(job.nodes), "Timelimit_s": job.time_limit_s
            if job.time_limit_s != float("inf") else None,
            "End": time.time(), "backend": "local", "run_id": job.run_id})
        self._free_gpus += job.gpu_ids
        job.gpu_ids = []
        status = read_json(job.attempt_dir / STATUS_FILE) or {}
        result = LocalResult(run_id=job.run_id, run_dir=job.run_dir, attempt_dir=job.attempt_dir,
                             job_id=job.job_id, state=state, exit_code=exit_code,
                             elapsed_s=elapsed, outcome=status.get("outcome"))
        if self.on_finish:
            self.on_finish(result)
        return result


@contextlib.contextmanager
def _term_raises() -> Iterator[None]:
    """SIGTERM raises SystemExit, so that `run` cancels its jobs (they run in sessions of their
    own, so nothing else would stop them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def finished(run_dir: str | Path) -> bool:
    """Whether a run's latest attempt reached a verdict that a rerun would not change: a
    status.json, or this backend's accounting record, other than a cancellation. A run never
    started, cancelled, or cut off with its runner (no record at all) is not finished, so
    `sweep run` after an interruption redoes exactly those."""
    attempts = attempt_dirs(run_dir)
    if not attempts:
        return False
    status = read_json(attempts[-1] / STATUS_FILE) or {}
    if status.get("outcome"):
        return status["outcome"] != "cancelled"
    record = read_json(attempts[-1] / ACCOUNTING_FILE) or {}
    return record.get("State") in ("COMPLETED", "FAILED", "TIMEOUT")


def run_local(run_dirs: Sequence[str | Path], *, slots: int | None = None,
              **options: Any) -> list[LocalResult]:
    """Run these rendered runs on this machine; see LocalBackend."""
    return LocalBackend(slots, **options).run(run_dirs)


@contextlib.contextmanager
def runner_lock(sweep_dir: str | Path) -> Iterator[None]:
    """One local runner per sweep folder: two would run the same runs at once. Raises LockHeld
    naming the holder's pid when another runner has it."""
    path = Path(sweep_dir) / RUNNER_LOCK_FILE
    try:
        with exclusive_lock(path) as handle:
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield
    except LockHeld:
        raise LockHeld(f"pid {path.read_text().strip() or '?'}") from None


def reap_orphans(run_dirs: Iterable[str | Path], kill_wait_s: float = DEFAULT_KILL_WAIT_S
                 ) -> list[Path]:
    """End jobs that a killed runner left running (their batch shells live on in sessions of
    their own): TERM to each job's process group, as scancel would, KILL after `kill_wait_s`.
    Their watchdogs stop their trees and record the attempt `cancelled`, so the runner that calls
    this (holding `runner_lock`) runs them again. Returns their attempt folders."""
    orphans: list[tuple[Path, psutil.Process]] = []
    for run_dir in run_dirs:
        attempts = attempt_dirs(run_dir)
        if not attempts or read_json(attempts[-1] / ACCOUNTING_FILE) is not None:
            continue
        record = read_json(attempts[-1] / JOB_RECORD_FILE) or {}
        try:
            shell = psutil.Process(int(record["pid"]))
            if shell.create_time() != record["create_time"]:
                continue  # the pid was reused: that job is long gone
        except (KeyError, TypeError, ValueError, psutil.Error):
            continue
        orphans.append((attempts[-1], shell))
        _signal_group(shell.pid, signal.SIGTERM)
    deadline = time.monotonic() + kill_wait_s
    for _, shell in orphans:
        try:
            shell.wait(max(0.0, deadline - time.monotonic()))
        except psutil.TimeoutExpired:
            _signal_group(shell.pid, signal.SIGKILL)
        except psutil.Error:
            pass
    return [attempt for attempt, _ in orphans]


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
