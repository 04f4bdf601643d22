"""The in-job supervisor: one per node, between srun and the launcher.

`python -m sweep.job.watchdog --run-dir R --attempt-dir A -- <launcher argv...>`

It cleans the node, starts the launcher in its own session with the run's tag in its
environment, and watches progress. No first step within `startup_timeout_s`, or no new step
within `hang_timeout_s`, is a hang. On a hang, on Slurm's USR1 (sent `signal_before_s` before
the time limit) or on TERM/INT, it stops the whole run: SIGTERM, a grace period, SIGKILL, then
the processes that escaped the session, found by their tag. With `settings.early_stop`, a
framework run (Megatron, nanotron, torchtitan) whose parsed step times are steady
(`sweep.job.early_stop`) is stopped the same way and is `completed`, ended by `steady_state`; the
built-in workload stops itself. Steadiness is judged step by step on the shared logs, so every
node's watchdog reaches it at the same step. It classifies the outcome from
evidence, writes `node<k>.json`, and on node 0 writes the run's `status.json`, last.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.core.state import STATUS_FILE, append_jsonl, atomic_write_json, read_json
from sweep.job import cleanup, jobinfo, proctree
from sweep.job.classify import Verdict, scan_log_for_failures
from sweep.job.early_stop import EarlyStop, Window, steady_window
from sweep.job.progress import LOGS_DIR, Progress, StepMatcher
from sweep.job.verdict import decide, log_text, merge_nodes, node_file, wait_for_node_files, wait_for_status

EVENTS_FILE = "watchdog.jsonl"
PROGRESS_EVENT_EVERY_S = 60.0
TIME_LIMIT_SLACK_S = 5.0  # a TERM this close to the job's end time is Slurm's time limit
_SIGNALS: dict[int, str] = {signal.SIGUSR1: "USR1", signal.SIGTERM: "TERM", signal.SIGINT: "INT"}


class WatchdogError(Exception):
    """Bad input to the watchdog; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class WatchdogConfig:
    run_dir: Path
    attempt_dir: Path
    command: tuple[str, ...]
    run_id: str
    attempt: int
    framework: str
    node_index: int = 0
    nnodes: int = 1
    node_name: str = field(default_factory=socket.gethostname)
    slurm_job_id: str | None = None
    startup_timeout_s: float = 600.0
    hang_timeout_s: float = 300.0
    grace_s: float = 10.0  # after a hang or USR1: Slurm still gives us signal_before_s
    signal_grace_s: float = 3.0  # after TERM: Slurm sends KILL after KillWait (5-30 s)
    poll_s: float = 0.5
    teardown_wait_s: float = 15.0  # a hang with a failure already logged: let the launcher exit
    node_wait_s: float = 30.0  # node 0 waits this long for the other nodes' files
    clean: bool = True
    shm_dir: Path = Path("/dev/shm")
    tmp_dir: Path = Path("/tmp")
    debris_min_age_s: float = 60.0
    expected_steps: int | None = None  # the built-in workload's step budget (settings.steps)
    early_stop: EarlyStop | None = None  # frameworks only: the built-in workload stops itself
    warmup_steps: int = 0
    step_budget: int | None = None  # settings.steps: at the budget, the budget ended the run
    tokens_per_step_per_gpu: float | None = None  # step times from torchtitan's tokens/s/GPU

    @property
    def tag(self) -> str:
        return f"{self.run_id}/{self.attempt}"


def load_config(run_dir: Path, attempt_dir: Path, command: list[str],
                environ: dict[str, str] | None = None, **overrides: Any) -> WatchdogConfig:
    """The configuration of one node's watchdog: run.json, the attempt folder, Slurm's variables."""
    from sweep.core import runconfig

    env = dict(os.environ if environ is None else environ)
    if not command:
        raise WatchdogError("no launcher command: put it after `--`, e.g. "
                            "`python -m sweep.job.watchdog --run-dir R --attempt-dir A -- "
                            "bash launch.sh`")
    try:
        run = runconfig.load(run_dir)
    except FileNotFoundError:
        raise WatchdogError(f"{run_dir}/run.json not found: --run-dir must be a rendered run "
                            f"directory (`sweep render` writes it)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise WatchdogError(f"{run_dir}/run.json is not a valid run file ({exc}); "
                            f"render the run again") from None
    settings = run.settings
    timeouts = {}
    for key in ("startup_timeout_s", "hang_timeout_s"):
        value = settings.get(key, WatchdogConfig.__dataclass_fields__[key].default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise WatchdogError(f"{run_dir}/run.json: settings.{key} = {value!r} must be a "
                                f"positive number of seconds; fix it in the spec and render again")
        timeouts[key] = float(value)
    steps = settings.get("steps")
    # a run that writes its own metrics file stops itself at `steps` or early; the watchdog ends
    # the others early when their log lines say the step time has settled
    try:
        stops_itself = _writes_metrics_file(run.framework)
    except ValueError as exc:
        raise WatchdogError(f"{run_dir}/run.json: {exc}; render the run again") from None
    expected = steps if stops_itself and isinstance(steps, int) else None
    try:
        early_stop = EarlyStop.from_settings(settings) if not stops_itself else None
    except ValueError as exc:
        raise WatchdogError(f"{run_dir}/run.json: {exc}; fix run.early_stop in the spec and "
                            f"render again") from None
    warmup = settings.get("warmup_steps", 0)
    attempt_text = env.get(proctree.ATTEMPT_ENV) or attempt_dir.name
    if not attempt_text.isdigit():
        raise WatchdogError(f"cannot tell the attempt number: {proctree.ATTEMPT_ENV} is unset and "
                            f"the attempt folder {attempt_dir} is not named attempts/<n>")

    def env_int(name: str, default: int) -> int:
        text = env.get(name, "")
        if not text:
            return default
        if not text.isdigit():
            raise WatchdogError(f"environment variable {name}={text!r} is not a whole number")
        return int(text)

    return WatchdogConfig(
        run_dir=run_dir, attempt_dir=attempt_dir, command=tuple(command), run_id=run.run_id,
        attempt=int(attempt_text), framework=run.framework,
        node_index=env_int("SLURM_NODEID", 0), nnodes=env_int("SLURM_NNODES", run.nodes),
        node_name=env.get("SLURMD_NODENAME") or socket.gethostname(),
        slurm_job_id=env.get("SLURM_JOB_ID") or None, expected_steps=expected,
        early_stop=early_stop, warmup_steps=warmup if isinstance(warmup, int) else 0,
        step_budget=steps if isinstance(steps, int) else None,
        tokens_per_step_per_gpu=run.global_batch_sequences * run.seq_len / run.world_size,
        startup_timeout_s=timeouts["startup_timeout_s"], hang_timeout_s=timeouts["hang_timeout_s"],
        **overrides)


def _writes_metrics_file(framework: str) -> bool:
    """Whether the framework's runs write their own step records and stop themselves
    (`FrameworkAdapter.writes_metrics_file`); imported here, not at the top, so that the
    watchdog starts without the adapters' dependencies."""
    from sweep.frameworks import get_adapter

    return get_adapter(framework).writes_metrics_file


def _step_matcher(framework: str) -> StepMatcher | None:
    """Step lines of the framework's logs; None where the run writes its own metrics file."""
    if _writes_metrics_file(framework):
        return None
    from sweep.frameworks import get_parser

    parser = get_parser(framework)

    def match(line: str) -> object | None:
        try:
            return parser.match_step(line)
        except (ValueError, KeyError, TypeError, IndexError):
            return None

    return match


def _exit_code(wait_status: int) -> int:
    """Popen's convention: the exit code, or minus the signal number."""
    return os.waitstatus_to_exitcode(wait_status)


class Watchdog:
    """One supervision: clean, launch, watch, stop, classify, write."""

    def __init__(self, config: WatchdogConfig) -> None:
        self.config = config
        self.logs = config.attempt_dir / LOGS_DIR
        self.signals: list[tuple[str, float]] = []
        self.launcher: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.orphans_reaped = 0
        self.peers_done: set[int] = set()
        self.peer_failed: str | None = None
        self.steady: Window | None = None  # set when the watchdog ends the run at steady state
        self._steady_checked = 0  # the last step the early-stop rule was applied to
        self.progress = Progress(config.attempt_dir, _step_matcher(config.framework),
                                 tokens_per_step_per_gpu=config.tokens_per_step_per_gpu)

    # -- events -------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        record = {"time": time.time(), "event": kind, "node": self.config.node_index, **fields}
        append_jsonl(self.config.attempt_dir / EVENTS_FILE, record)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append((_SIGNALS.get(signum, str(signum)), time.time()))

    def _collect(self, statuses: dict[int, int]) -> None:
        for pid, status in statuses.items():
            if self.launcher is not None and pid == self.launcher.pid:
                self.exit_code = _exit_code(status)
                self.launcher.returncode = self.exit_code  # we reaped it, not Popen
            else:
                self.orphans_reaped += 1

    # -- phases -------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.config
        self.logs.mkdir(parents=True, exist_ok=True)
        for signum in _SIGNALS:
            signal.signal(signum, self._on_signal)
        subreaper = proctree.become_subreaper()
        me = proctree.owner_marker()
        if cfg.clean:
            report = cleanup.prelaunch_clean(me=me, shm_dir=cfg.shm_dir, tmp_dir=cfg.tmp_dir,
                                             min_age_s=cfg.debris_min_age_s)
            self.event("prelaunch_clean", **report.to_json())
        oom_before = jobinfo.cgroup_oom_kills()
        job_end = jobinfo.job_end_time(cfg.slurm_job_id, dict(os.environ))
        started_at = time.time()
        launch_error = self._launch(me)
        self.event("launch", command=list(cfg.command), tag=cfg.tag, owner=me,
                   pid=self.launcher.pid if self.launcher else None, error=launch_error,
                   subreaper=subreaper, job_end=job_end, startup_timeout_s=cfg.startup_timeout_s,
                   hang_timeout_s=cfg.hang_timeout_s)
        hang = None
        try:
            hang = None if launch_error else self._watch()
        finally:  # whatever happened, the run's processes do not outlive the watchdog
            stop_at = time.time()
            stop = proctree.stop_run(
                sid=self.launcher.pid if self.launcher else None, owner=me,
                grace_s=(cfg.signal_grace_s if self.peer_failed or self._signal_names() - {"USR1"}
                         else cfg.grace_s),
                on_reap=self._collect)
            self.event("stopped", **stop.to_json(), exit_code=self.exit_code,
                       orphans_reaped=self.orphans_reaped)
        self.progress.poll()  # what the run wrote while it went down
        observed = self._observed(hang, launch_error, job_end, oom_before, stop, stop_at)
        verdict = self._publish(observed, started_at)
        usage = os.times()
        self.event("exit", cpu_self_s=usage.user + usage.system, survivors=stop.survivors)
        if hang is not None:
            return 1
        if self.steady is not None and verdict.outcome == "completed":
            return 0  # the launcher died of our SIGTERM, but the run did its work
        if self.exit_code is None:
            return 127 if launch_error else 1
        return self.exit_code if self.exit_code >= 0 else 128 - self.exit_code

    def _observed(self, hang: dict[str, Any] | None, launch_error: str | None,
                  job_end: float | None, oom_before: int | None, stop: proctree.StopReport,
                  stop_at: float) -> dict[str, Any]:
        """What only this node's watchdog knows; node files keep it for node 0's decision."""
        oom_after = jobinfo.cgroup_oom_kills()
        return {
            "exit_code": self.exit_code, "launch_error": launch_error,
            "signals": [name for name, _ in self.signals],
            "signal_times": [at for _, at in self.signals], "hang": hang,
            "peer_failed": self.peer_failed,
            "time_limit_hit": job_end is not None and any(
                name == "TERM" and at >= job_end - TIME_LIMIT_SLACK_S for name, at in self.signals),
            "last_step": self.progress.last_step, "steps_seen": self.progress.steps_seen,
            "summary_written": self.progress.summary is not None,
            "cgroup_oom_kills": (oom_after - oom_before
                                 if oom_after is not None and oom_before is not None else None),
            "stop": stop.to_json(), "stop_at": stop_at,
            "steady_state": self.steady.to_json() if self.steady is not None else None,
        }

    def _publish(self, observed: dict[str, Any], started_at: float) -> Verdict:
        """node<k>.json; on node 0 status.json, last; elsewhere wait for it before exiting."""
        cfg = self.config
        k = cfg.node_index
        verdict = decide({k: observed}, log_text(cfg.attempt_dir, [k]), cfg.expected_steps)
        record = self._node_record(verdict, observed, started_at)
        atomic_write_json(node_file(cfg.attempt_dir, k), record)
        self.event("node_verdict", outcome=verdict.outcome, reason=verdict.reason,
                   rule=verdict.rule)
        if k == 0:
            # After a TERM, Slurm sends KILL after KillWait (5-30 s): do not wait long for a
            # node that may be gone; sacct decides if status.json never gets written.
            terminated = bool(self._signal_names() - {"USR1"})
            wait_s = min(cfg.node_wait_s, cfg.signal_grace_s) if terminated else cfg.node_wait_s
            others = wait_for_node_files(cfg.attempt_dir, cfg.nnodes, wait_s)
            status = merge_nodes(cfg.attempt_dir, record, others, cfg.nnodes, cfg.expected_steps)
            status["ended_by"] = self._ended_by(status["outcome"], status["rule"])
            atomic_write_json(cfg.attempt_dir / STATUS_FILE, status)
            self.event("status", outcome=status["outcome"], reason=status["reason"],
                       rule=status["rule"], missing_nodes=status["missing_nodes"])
        elif verdict.outcome != "completed":
            # srun --kill-on-bad-exit answers our non-zero exit with SIGTERM to node 0's
            # watchdog: let node 0 write the run's verdict first.
            written = wait_for_status(cfg.attempt_dir, cfg.node_wait_s + 15)
            self.event("waited_for_status", written=written)
        return verdict

    def _ended_by(self, outcome: str, rule: str) -> str | None:
        """Which rule ended a completed run: steady_state or step_budget (None: not completed)."""
        if outcome != "completed":
            return None
        if rule == "steady_state":
            return "steady_state"
        summary = self.progress.summary or {}  # the built-in workload says it itself
        return str(summary.get("ended_by") or "step_budget")

    def _launch(self, me: str) -> str | None:
        cfg = self.config
        env = dict(os.environ)
        env.update({proctree.TAG_ENV: cfg.tag, proctree.RUN_ID_ENV: cfg.run_id,
                    proctree.ATTEMPT_ENV: str(cfg.attempt), proctree.OWNER_ENV: me,
                    "SWEEP_RUN_DIR": str(cfg.run_dir), "SWEEP_ATTEMPT_DIR": str(cfg.attempt_dir)})
        out_path = self.logs / f"node{cfg.node_index}.out"
        err_path = self.logs / f"node{cfg.node_index}.err"
        with open(out_path, "ab") as out, open(err_path, "ab") as err:
            try:
                self.launcher = subprocess.Popen(list(cfg.command), stdin=subprocess.DEVNULL,
                                                 stdout=out, stderr=err, env=env,
                                                 start_new_session=True)
            except OSError as exc:
                message = f"cannot start the launcher {cfg.command[0]!r}: {exc.strerror or exc}"
                err.write((message + "\n").encode())
                return message
        return None

    def _signal_names(self) -> set[str]:
        return {name for name, _ in self.signals}

    def _watch(self) -> dict[str, Any] | None:
        """Poll until the launcher exits, a signal arrives, or progress stops; the hang, if any."""
        cfg = self.config
        launched = time.monotonic()
        last_event = 0.0
        teardown_until: float | None = None
        while True:
            self._collect(proctree.reap())
            before = self.progress.steps_seen
            if self.progress.poll():
                now = time.monotonic()
                if before == 0 or now - last_event >= PROGRESS_EVENT_EVERY_S:
                    self.event("progress", last_step=self.progress.last_step,
                               steps_seen=self.progress.steps_seen)
                    last_event = now
            if self._steady_now():
                return None
            if self.exit_code is not None:
                self.event("launcher_exited", exit_code=self.exit_code)
                return None
            if self.signals:
                name, at = self.signals[0]
                self.event("signal", signal=name, received_at=at)
                return None
            if self._peer_failed():
                return None
            now = time.monotonic()
            if self.progress.last_progress is None:
                idle, limit, phase = now - launched, cfg.startup_timeout_s, "startup"
            else:
                idle, limit, phase = now - self.progress.last_progress, cfg.hang_timeout_s, "step"
            if idle > limit and teardown_until is None and self._failure_logged():
                # A rank already failed and the launcher is tearing down (torchrun can take
                # seconds): give it time to exit, so the failure, not a hang, is the verdict.
                teardown_until = now + cfg.teardown_wait_s
                self.event("hang_deferred", phase=phase, idle_s=round(idle, 3),
                           wait_s=cfg.teardown_wait_s)
            if idle > limit and (teardown_until is None or now >= teardown_until):
                hang = {"phase": phase, "timeout_s": limit, "idle_s": round(idle, 3),
                        "last_step": self.progress.last_step}
                self.event("hang", **hang)
                return hang
            time.sleep(cfg.poll_s)

    def _steady_now(self) -> bool:
        """Apply the early-stop rule to each new step in order; True once it says stop.

        Step by step, not to the latest step only, so that every node's watchdog (each reads the
        same logs, at its own moments) stops at the same step, even one whose launcher has
        already lost its peers to another node's stop. Not at the step budget (the budget ended
        that run), nor when a failure is already logged: that run is going down on its own, and
        its verdict is the failure.
        """
        rule, budget = self.config.early_stop, self.config.step_budget
        if rule is None:
            return False
        ordered = list(self.progress.step_times.items())
        for index, (step, _) in enumerate(ordered):
            if step <= self._steady_checked or (budget is not None and step >= budget):
                continue
            self._steady_checked = step
            window = steady_window(ordered[max(0, index + 1 - rule.window):index + 1], rule,
                                   self.config.warmup_steps)
            if window is not None and not self._failure_logged():
                self.steady = window
                self.event("steady_state", **window.to_json())
                return True
        return False

    def _peer_failed(self) -> bool:
        """Another node wrote a failed verdict: our ranks wait on a dead peer, so stop now."""
        cfg = self.config
        if cfg.nnodes < 2:
            return False
        names = set(os.listdir(cfg.attempt_dir))
        for k in range(cfg.nnodes):
            name = node_file(cfg.attempt_dir, k).name
            if k == cfg.node_index or k in self.peers_done or name not in names:
                continue
            record = read_json(cfg.attempt_dir / name) or {}
            if record.get("outcome") == "completed":
                self.peers_done.add(k)
            elif record.get("outcome"):
                self.peer_failed = f"node{k}"
                self.event("peer_failed", peer=self.peer_failed, outcome=record["outcome"],
                           reason=record.get("reason"))
                return True
        return False

    def _failure_logged(self) -> bool:
        text = log_text(self.config.attempt_dir, [self.config.node_index])
        return any(f.outcome in ("oom", "crashed") for f in scan_log_for_failures(text))

    def _node_record(self, verdict: Verdict, observed: dict[str, Any],
                     started_at: float) -> dict[str, Any]:
        cfg = self.config
        return {
            "run_id": cfg.run_id, "attempt": cfg.attempt, "outcome": verdict.outcome,
            "reason": verdict.reason, "rule": verdict.rule,
            "ended_by": self._ended_by(verdict.outcome, verdict.rule),
            "evidence": list(verdict.evidence_lines),
            "last_step": self.progress.last_step,
            "exit_codes": {f"node{cfg.node_index}": self.exit_code},
            "signals": observed["signals"], "started_at": started_at, "ended_at": time.time(),
            "node": cfg.node_name, "node_index": cfg.node_index, "nodes": [cfg.node_name],
            "slurm_job_id": cfg.slurm_job_id, "hostname": socket.gethostname(),
            "writer": "watchdog", "observed": observed,
        }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sweep.job.watchdog",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="the run directory (holds run.json)")
    parser.add_argument("--attempt-dir", type=Path, required=True, help="attempts/<n> of the run")
    parser.add_argument("--grace-s", type=float, default=10.0,
                        help="SIGTERM -> SIGKILL after a hang or USR1")
    parser.add_argument("--signal-grace-s", type=float, default=3.0,
                        help="SIGTERM -> SIGKILL after TERM/INT or a failed peer node")
    parser.add_argument("--teardown-wait-s", type=float, default=15.0,
                        help="when a failure is already logged at hang time, "
                             "wait this long for the launcher to exit")
    parser.add_argument("--poll-s", type=float, default=0.5, help="how often progress is checked")
    parser.add_argument("--node-wait-s", type=float, default=30.0,
                        help="how long node 0 waits for the other nodes' verdicts")
    parser.add_argument("--no-clean", action="store_true", help="skip the pre-launch clean-up")
    parser.add_argument("--shm-dir", type=Path, default=Path("/dev/shm"), help=argparse.SUPPRESS)
    parser.add_argument("--tmp-dir", type=Path, default=Path("/tmp"), help=argparse.SUPPRESS)
    parser.add_argument("--debris-min-age-s", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launcher's argv")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    for name in ("grace_s", "signal_grace_s", "teardown_wait_s", "poll_s", "node_wait_s",
                 "debris_min_age_s"):
        if getattr(args, name) < 0:
            print(f"watchdog: --{name.replace('_', '-')} must be >= 0", file=sys.stderr)
            return 2
    try:
        config = load_config(
            args.run_dir.resolve(), args.attempt_dir.resolve(), command,
            grace_s=args.grace_s, signal_grace_s=args.signal_grace_s,
            teardown_wait_s=args.teardown_wait_s, poll_s=args.poll_s,
            node_wait_s=args.node_wait_s, clean=not args.no_clean, shm_dir=args.shm_dir,
            tmp_dir=args.tmp_dir, debris_min_age_s=args.debris_min_age_s)
    except WatchdogError as exc:
        print(f"watchdog: {exc}", file=sys.stderr)
        return 2
    try:
        (config.attempt_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"watchdog: cannot write the attempt folder {config.attempt_dir} ({exc.strerror}); "
              f"--attempt-dir must be a writable runs/<run_id>/attempts/<n>", file=sys.stderr)
        return 2
    try:
        watchdog = Watchdog(config)
    except ValueError as exc:  # no step parser for the run's framework
        print(f"watchdog: {config.run_dir}/run.json: {exc}", file=sys.stderr)
        return 2
    return watchdog.run()


if __name__ == "__main__":
    sys.exit(main())
