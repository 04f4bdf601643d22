"""Slurm accounting (sacct) states and exit codes -> a run outcome.

A job killed by Slurm (time limit, node failure, cancel, preemption) writes no status.json, so
sacct decides. Two traps (found on a real cluster, see notes/local-slurm.md):
- An OOM kill inside an `srun` step marks the *step* OUT_OF_MEMORY (0:125), while the job is
  FAILED 1:0 (srun was the last command) or even COMPLETED 0:0 with DerivedExitCode 0:125. So the
  step states and the derived exit code are checked, never the job state alone.
- On a node failure the steps end CANCELLED 0:15 while the job is NODE_FAIL; when the batch host
  itself failed, the batch step may even be COMPLETED. The job row decides.
- A node that cannot start its part of an `srun` step (slurmd down or unreachable) leaves the
  job FAILED 105:0 and the step CANCELLED 0:105, which reads as a crash. Only srun's own line in
  the job's stderr names the node: `node_failures_in_srun_output` finds it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# States in which the job may still run or run again: no outcome yet.
PENDING_STATES = frozenset(
    {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "CONFIGURING",
     "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "REVOKED"}
)  # fmt: skip
OOM_SIGNAL = 125  # Slurm reports a cgroup OOM kill as exit code 0:125
_EXIT = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_SIGNAL_NAMES = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
# srun's lines (in the batch script's stderr) that blame a node. A step launch that fails for
# want of a working slurmd on the node is the node's fault; "Unable to layout tasks" and other
# launch errors are the job's, and are not matched.
SRUN_NODE_FAILURE = re.compile(
    r"srun: error: Node failure on (?P<failed>[^\s:]+)"
    r"|srun: error: Task launch for \S+ failed on node (?P<unreachable>[^\s:]+): (?:Communication connection "
    r"failure|Socket timed out on send/recv operation|Connection refused|Connection timed out|No route to host|"
    r"Zero Bytes were transmitted or received|Protocol authentication error)"
)


def normalize_state(state: str) -> str:
    """'CANCELLED by 1000' -> 'CANCELLED'; sacct's truncated 'CANCELLED+' -> 'CANCELLED'."""
    word = state.strip().split(" ", 1)[0] if state.strip() else ""
    return word.rstrip("+").upper()


def has_ended(state: str) -> bool:
    """Whether an accounting state (`CANCELLED by 1000`, `COMPLETED`, ...) is a job's end."""
    word = normalize_state(state)
    return bool(word) and word not in PENDING_STATES


def parse_exit_code(text: str | None, field: str = "ExitCode") -> tuple[int, int] | None:
    """sacct's 'code:signal' -> (code, signal); None for an empty field."""
    if text is None or not text.strip():
        return None
    match = _EXIT.match(text)
    if match is None:
        raise ValueError(f"sacct {field} {text!r} is not of the form 'code:signal' (e.g. '1:0')")
    return int(match[1]), int(match[2])


def outcome_from_sacct(
    job_state: str,
    exit_code: str | None = None,
    derived_exit_code: str | None = None,
    step_states: Iterable[str] = (),
) -> tuple[str, str] | None:
    """(outcome, reason) for a finished job; None while the job may still run (or run again)."""
    if not isinstance(job_state, str):
        raise TypeError(
            f"outcome_from_sacct: job_state must be sacct's State string, not {type(job_state).__name__}; "
            "for a whole sacct row use outcome_from_sacct_row(row)"
        )
    job = normalize_state(job_state)
    steps = [normalize_state(s) for s in step_states if s and s.strip()]
    if not has_ended(job):
        return None
    code = parse_exit_code(exit_code, "ExitCode")
    derived = parse_exit_code(derived_exit_code, "DerivedExitCode")

    if job == "NODE_FAIL" or "NODE_FAIL" in steps:
        return "node_fail", "slurm_node_fail"
    if job == "BOOT_FAIL":
        return "node_fail", "slurm_boot_fail"
    if job == "PREEMPTED" or "PREEMPTED" in steps:
        return "preempted", "slurm_preempted"
    if job == "OUT_OF_MEMORY":
        return "oom", "slurm_out_of_memory"
    if "OUT_OF_MEMORY" in steps:
        return "oom", f"slurm_step_out_of_memory (job {job})"
    if OOM_SIGNAL in (_signal(code), _signal(derived)):
        return "oom", f"slurm_exit_signal_125 (job {job})"
    if job in ("TIMEOUT", "DEADLINE") or "TIMEOUT" in steps:
        return "timeout", "slurm_time_limit" if job != "DEADLINE" else "slurm_deadline"
    if job == "CANCELLED":
        return "cancelled", "slurm_cancelled"
    if job == "FAILED" or "FAILED" in steps:
        return "crashed", "slurm_failed" + _describe(code or derived)
    if job == "COMPLETED":
        if derived is not None and derived != (0, 0):
            return "crashed", "slurm_step_failed" + _describe(derived)
        return "completed", "slurm_completed"
    return "crashed", f"slurm_state_{job.lower()}"


def outcome_from_sacct_row(row: Mapping[str, Any]) -> tuple[str, str] | None:
    """The same, from one `sacct -P` job row (keys State, ExitCode, DerivedExitCode) whose optional
    "steps" entry lists the step rows (dicts with State) or step states (strings)."""
    steps = row.get("steps") or row.get("step_states") or ()
    states = [s.get("State", "") if isinstance(s, Mapping) else str(s) for s in steps]
    return outcome_from_sacct(
        str(row.get("State") or row.get("state") or ""),
        row.get("ExitCode") or row.get("exit_code"),
        row.get("DerivedExitCode") or row.get("derived_exit_code"),
        states,
    )


def _signal(code: tuple[int, int] | None) -> int | None:
    return code[1] if code is not None else None


def _describe(code: tuple[int, int] | None) -> str:
    if code is None:
        return ""
    exit_status, signal = code
    if signal:
        return f" (signal {_SIGNAL_NAMES.get(signal, signal)})"
    return f" (exit code {exit_status})"


def node_failures_in_srun_output(text: str) -> tuple[str, tuple[str, ...]] | None:
    """(reason, nodes) when srun says nodes failed, or could not start the step on them."""
    failed: list[str] = []
    unreachable: list[str] = []
    for match in SRUN_NODE_FAILURE.finditer(text):
        if match["failed"]:
            failed.append(match["failed"])
        else:
            unreachable.append(match["unreachable"])
    if failed:
        return "srun_node_failure", tuple(sorted(set(failed)))
    if unreachable:
        return "srun_step_launch_failed", tuple(sorted(set(unreachable)))
    return None
