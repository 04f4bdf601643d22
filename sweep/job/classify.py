"""Outcome classification: evidence (exit codes, signals, log lines, Slurm accounting) -> one class.

Outcomes are classes, not grep results (DESIGN decision 3). `scan_log_for_failures` finds every
known failure line in a log; `classify` walks the ordered `RULES` table and the first rule that
matches decides, keeping its evidence lines and its name. The order encodes which cause is the
root when several show: Slurm's own verdicts on the node (node failure, preemption) come first,
because they cause the NCCL errors and SIGTERMs that follow; then the watchdog's early stop at
steady state (its own SIGTERM causes the errors that follow); then a clean exit; then memory
(an OOM on one rank makes the others hang or lose their peers); then hangs, the time limit and
cancels; then generic crashes, and after them a rank that waited in vain for its peers (a store or
connect timeout: the peer that died first is the cause); then bare exit codes; then sacct alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweep.core.slurm_states import SRUN_NODE_FAILURE, outcome_from_sacct
from sweep.frameworks.log_parser import strip_ansi

OUTCOMES = ("completed", "oom", "hang", "timeout", "crashed", "node_fail", "cancelled", "preempted")
MAX_LINES_PER_RULE = 20  # findings kept per pattern: evidence, not a copy of the log
MAX_EVIDENCE_LINES = 5
MAX_LINE_CHARS = 1000


@dataclass(frozen=True)
class Finding:
    rule: str
    outcome: str
    reason: str
    line: str


@dataclass(frozen=True)
class Evidence:
    """What the watchdog (or collect, after the fact) knows about one attempt."""

    exit_codes: Mapping[str, int | None] = field(default_factory=dict)  # node -> launcher return code
    signals: tuple[str, ...] = ()  # signals the watchdog received: "USR1" (Slurm --signal), "TERM", ...
    log_text: str = ""  # tails of the launcher's stdout/stderr, all nodes
    hang_killed: bool = False  # the watchdog stopped the tree: no progress within the timeout
    hang_phase: str | None = None  # "startup" (before the first step) or "step"
    last_step: int | None = None
    expected_steps: int | None = None
    summary_written: bool = False  # the built-in workload wrote its summary record
    time_limit_hit: bool = False  # the watchdog knows the job's time limit was reached
    oom_kill_count: int | None = None  # oom_kill events in the job's memory cgroup, when readable
    slurm_state: str | None = None  # sacct State of the job (None: no accounting)
    slurm_exit_code: str | None = None  # sacct ExitCode "code:signal"
    derived_exit_code: str | None = None  # sacct DerivedExitCode
    step_states: tuple[str, ...] = ()  # sacct State of each step
    launch_error: str | None = None  # the launcher could not be started at all (exec failure)
    # The watchdog ended the run because its step times were steady (sweep.job.early_stop.Window.to_json()).
    steady_state: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reason: str
    evidence_lines: tuple[str, ...]
    rule: str


# ---------------------------------------------------------------- log patterns

@dataclass(frozen=True)
class _Pattern:
    rule: str
    outcome: str
    reason: str
    regex: re.Pattern[str]


def _p(rule: str, outcome: str, reason: str, regex: str) -> _Pattern:
    return _Pattern(rule, outcome, reason, re.compile(regex))


# gloo's GLOO_ERROR_MSG prefix, "[<path>/gloo/transport/<transport>/<file>:<line>] ": it tells gloo's
# socket timeouts apart from any other library's "Read timeout".
_GLOO_SOURCE = r"\[[^\]\s]*gloo/transport/[^\]\s]+:\d+\] "

# Order inside a rule matters only for the reason: the first pattern of a rule that matches names it.
PATTERNS: tuple[_Pattern, ...] = (
    _p("slurm_node_failure", "node_fail", "slurm_node_failure", r"DUE TO NODE FAILURE|srun: error: Node failure on"),
    _p("slurm_node_failure", "node_fail", "srun_step_launch_failed", SRUN_NODE_FAILURE.pattern),
    _p("gpu_hardware_error", "node_fail", "gpu_ecc_error", r"uncorrectable ECC error|cudaErrorECCUncorrectable"),
    _p("slurm_preemption", "preempted", "slurm_preempted", r"DUE TO PREEMPTION|this job is preempted"),
    _p("slurm_preemption", "preempted", "slurm_requeued", r"DUE TO JOB REQUEUE"),
    _p("launch_refused", "crashed", "launch_refused", r"llm-sweep: cannot launch: "),
    _p("illegal_memory_access", "crashed", "illegal_memory_access",
       r"an illegal memory access was encountered|cudaErrorIllegalAddress"),
    _p("cuda_oom", "oom", "cuda_oom", r"CUDA out of memory|OutOfMemoryError|HIP out of memory"),
    _p("cuda_oom", "oom", "cublas_alloc_failed", r"CUBLAS_STATUS_ALLOC_FAILED"),
    # NCCL's WARN: "Cuda failure 'out of memory'" (checks.h), "Cuda failure 2 'out of memory'" (cudawrap.h, 2.19+)
    _p("cuda_oom", "oom", "nccl_cuda_oom", r"Cuda failure (?:\d+ )?'?out of memory"),
    _p("cuda_runtime_oom", "oom", "cuda_runtime_oom", r"CUDA error: out of memory"),
    _p("cpu_oom", "oom", "cpu_alloc_oom", r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"),
    _p("cpu_oom", "oom", "python_memory_error", r"(?:^|[\s:\]])MemoryError\b"),
    _p("cpu_oom", "oom", "host_enomem", r"\[Errno 12\] Cannot allocate memory"),
    _p("cgroup_oom", "oom", "cgroup_oom_kill",
       r"Detected \d+ oom[-_]kill event|: Out Of Memory\s*$|Memory cgroup out of memory|oom-kill:|Killed process \d+"),
    _p("cgroup_oom", "oom", "slurm_memory_limit", r"exceeded memory limit \(\d+ > \d+\), being killed"),
    _p("collective_timeout", "hang", "nccl_watchdog_timeout", r"Watchdog caught collective operation timeout"),
    _p("collective_timeout", "hang", "nccl_work_timeout",
       r"Timeout at NCCL work: \d+|WorkNCCL\(.*\) timed out in blocking wait|"
       r"ran for \d+ milliseconds before timing out"),
    # Non-blocking communicators (TORCH_NCCL_USE_COMM_NONBLOCKING=1): NCCLUtils C10D_CHECK_TIMEOUT.
    _p("collective_timeout", "hang", "nccl_nonblocking_timeout", r"\bNCCL timeout in: \S+:\d+"),
    # The opt-in `nccl2` backend of 2.15 (a torchcomms port; its lines start "[TC][rank=N]").
    _p("collective_timeout", "hang", "nccl2_timeout",
       r"\[TC\]\S* Operation timed out after \d+ ms|Aborting process on rank \d+ due to timeout - |"
       r"\bNCCL operation timed out\b|\bNCCL \w+ failed timed out after \d+ ms|Work timed out during finalize"),
    # ncclCommAbort itself never returned (ProcessGroupNCCL::abort's waitForFutureOrTimeout, 2.15).
    _p("collective_timeout", "hang", "nccl_abort_timeout", r"Future for ProcessGroup abort timed out after \d+ ms"),
    # ProcessGroupNCCL's heartbeat monitor found the watchdog thread itself stuck (a CUDA or NCCL call that
    # never returned): its 2.2 to 2.15 wordings.
    _p("collective_timeout", "hang", "nccl_heartbeat_timeout",
       r"Heartbeat monitor timed out!|watchdog got stuck for \d+ seconds without making progress|"
       r"NCCL monitor thread timeout\.|monitoring thread detects no heartbeat|"
       r"No PGNCCL's watchdog heartbeat detected|"
       r"Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang|"
       r"would have terminated the process ?after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang"),
    _p("collective_timeout", "hang", "gloo_timeout",
       r"Timed out waiting \d+ms for (?:recv|send) operation|Application timeout caused pair closure|"
       rf"{_GLOO_SOURCE}(?:Read|Write) timeout |timed out in monitoredBarrier after \d+ ms"),
    _p("slurm_time_limit", "timeout", "slurm_time_limit", r"DUE TO TIME LIMIT"),
    _p("slurm_cancelled", "cancelled", "slurm_cancelled", r"\*\*\* (?:JOB|STEP) \S+ ON .+? CANCELLED AT \S+ \*\*\*"),
    _p("segfault", "crashed", "segfault",
       r"Signal 11 \(SIGSEGV\)|Segmentation fault|Caught signal 11\b|exitcode\s*:\s*-11\b|\(exitcode: -11\)"),
    # ncclGetErrorString's wordings (NCCL init.cc) are matched alone too: a wrapper may drop "NCCL error".
    _p("nccl_error", "crashed", "nccl_error",
       r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|unhandled system error|"
       r"unhandled cuda error|remote process exited or there was a network error|"
       r"internal error - please report this issue to the NCCL developers|nccl hit async error|NCCL Async Error"),
    # TORCH_NCCL_PROPAGATE_ERROR=1: a peer's error, broadcast through the store (2.15 Watchdog).
    _p("nccl_error", "crashed", "nccl_peer_error", r"\bremote error detected from rank: \d+"),
    # NCCL's own WARN lines that report a failed call or a lost peer (not its INFO "retrying" lines).
    _p("nccl_error", "crashed", "nccl_warn",
       r"NCCL WARN .*(?:\bCall to \S.* failed\b|\b[Cc]onnect to \S+ failed\b|Connection closed by remote peer|"
       r"Got completion from peer|Failed to execute operation)"),
    # The communicator was torn down earlier; when it says why ("Original reason for failure was: ..."),
    # the reason's own words on the same line decide through an earlier rule (a timeout is a hang).
    _p("nccl_error", "crashed", "nccl_comm_aborted",
       r"NCCL communicator was aborted (?:on rank \d+|after a previous error)|"
       r"NCCL communicator encountered error set by ProcessGroupNCCL"),
    # The watchdog's own lines when a collective failed or timed out; the flight-recorder dump signal says
    # "due to a collective timeout" but is also raised on an exception, so an NCCL error line outranks it.
    _p("nccl_watchdog_abort", "hang", "nccl_watchdog_abort",
       r"Some NCCL operations have failed or timed out|we are taking the entire process down|"
       r"(?:Process group|NCCL) watchdog thread terminated with exception|"
       r"(?:failure|Exception \(either an error or timeout\)) detected by watchdog at work|"
       r"Received a (?:global )?dump signal (?:due to a collective timeout )?from|"
       r"Observed flight recorder dump signal from another rank|"
       r"ProcessGroupNCCL's watchdog detected (?:an exception|a dump signal) from|"
       r"Terminating the process after attempting to dump debug info, due to collective timeout or exception"),
    _p("cuda_error", "crashed", "cuda_error", r"CUDA error: (?!out of memory)|c10::CUDAError|CUDA_ERROR_\w+"),
    _p("aborted", "crashed", "sigabrt", r"Fatal Python error: Aborted|Signal 6 \(SIGABRT\)|exitcode\s*:\s*-6\b"),
    # A rank waited in vain for its peers to join or to set a store key (c10d TCPStore, socket.cpp, gloo).
    _p("rendezvous_timeout", "hang", "store_wait_for_clients", r"Timed out after \d+ seconds waiting for clients"),
    _p("rendezvous_timeout", "hang", "store_wait_timeout",
       r"(?:DistStoreError|got error): Socket Timeout|\bwait timeout after \d+ms, keys: |"
       r"\bbarrier timeout after \d+ms, key: "),
    _p("rendezvous_timeout", "hang", "connect_timeout",
       rf"client socket has timed out after \d+ms while trying to connect to|{_GLOO_SOURCE}Connect timeout "),
    _p("killed_by_sigkill", "crashed", "sigkill", r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b|\(exitcode: -9\)"),
    _p("peer_failure", "crashed", "peer_connection_lost",
       r"Connection (?:closed|reset) by peer|DistNetworkError|Broken pipe"),
    _p("child_failed", "crashed", "child_failed",
       r"ChildFailedError|failed \(exitcode: -?\d+\) local_rank|Root Cause \(first observed failure\)"),
)
# A line is tried against the patterns only when it holds one of these words: plain substring
# tests cost little, and almost every line of a training log holds none of them.
_KEYWORDS = (
    "cannot launch", "DUE TO", "Node failure", "Task launch", "ECC", "preempted", "illegal memory access", "IllegalAddress", "out of memory",
    "OutOfMemory", "ALLOC_FAILED", "DefaultCPUAllocator", "MemoryError", "Cannot allocate", "oom", "Out Of Memory",
    "Killed process", "memory limit", "Watchdog caught", "Timed out waiting", "pair closure", "CANCELLED", "SIGSEGV",
    "Segmentation fault", "signal 11", "exitcode", "NCCL", "nccl", "CUDA error", "CUDAError", "CUDA_ERROR",
    "Aborted", "SIGABRT", "SIGKILL", "by peer", "DistNetworkError", "Broken pipe", "ChildFailedError", "Root Cause",
    "unhandled system error", "Traceback", "Heartbeat monitor", "watchdog got stuck", "monitor thread", "heartbeat",
    "dump signal", "watchdog thread terminated", "Terminating the process", "waiting for clients", "Socket Timeout",
    "wait timeout after", "client socket has timed out", "Read timeout", "Write timeout", "Connect timeout",
    "unhandled cuda error", "remote process exited", "please report this issue", "detected by watchdog",
    "watchdog detected", "timed out after", "Aborting process on rank", "monitoredBarrier", "barrier timeout after",
    "remote error detected", "timed out during finalize",
)
_LINE_PREFIX = re.compile(r"^(?:\d+:\s+|\[(?:rank|default)\d+\]: ?|\([^)]*pid=\d+[^)]*\)\s*)+")
_EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure))(?::|$)")
_LAUNCHER_EXCEPTIONS = ("ChildFailedError", "SignalException")  # torchrun's own, not a rank's root cause


def scan_log_for_failures(text: str) -> list[Finding]:
    """Every known failure line in the log, in log order (at most MAX_LINES_PER_RULE per pattern reason)."""
    findings: list[Finding] = []
    counts: dict[str, int] = {}
    in_traceback = False
    for raw in text.splitlines():
        if not in_traceback and not any(word in raw for word in _KEYWORDS):
            continue
        line = strip_ansi(raw).rstrip()[:MAX_LINE_CHARS]
        matched: set[str] = set()
        for pattern in PATTERNS:
            if pattern.rule not in matched and pattern.regex.search(line):
                matched.add(pattern.rule)
                _add(findings, counts, Finding(pattern.rule, pattern.outcome, pattern.reason, line))
        body = _LINE_PREFIX.sub("", line)
        if "Traceback (most recent call last)" in body:
            in_traceback = True
        elif in_traceback and body and not body[0].isspace() and not body.startswith("File "):
            in_traceback = False
            exception = _EXCEPTION.match(body)
            # An exception line that a pattern already names (NCCL, CUDA, OOM, lost peer) is left to
            # that pattern's rule; what remains is the program's own error: a root cause.
            if exception is not None and not matched and not exception["name"].endswith(_LAUNCHER_EXCEPTIONS):
                name = exception["name"].rsplit(".", 1)[-1]
                _add(findings, counts, Finding("python_exception", "crashed", f"python_exception:{name}", line))
    return findings


def _add(findings: list[Finding], counts: dict[str, int], finding: Finding) -> None:
    key = finding.reason
    counts[key] = counts.get(key, 0) + 1
    if counts[key] <= MAX_LINES_PER_RULE:
        findings.append(finding)


# ---------------------------------------------------------------- rules

@dataclass(frozen=True)
class Context:
    evidence: Evidence
    findings: tuple[Finding, ...]
    sacct: tuple[str, str] | None  # outcome_from_sacct(...) of the evidence, None without accounting

    def lines(self, rule: str) -> tuple[str, ...]:
        return tuple(f.line for f in self.findings if f.rule == rule)[:MAX_EVIDENCE_LINES]

    def first(self, rule: str) -> Finding | None:
        return next((f for f in self.findings if f.rule == rule), None)


Match = tuple[str, str, tuple[str, ...]]  # (outcome, reason, evidence lines)
Check = Callable[[Context], Match | None]


@dataclass(frozen=True)
class Rule:
    name: str
    outcome: str  # the usual outcome; a check may refine it (documented in its description)
    description: str
    check: Check


def _from_log(rule: str) -> Check:
    def check(ctx: Context) -> Match | None:
        first = ctx.first(rule)
        return (first.outcome, first.reason, ctx.lines(rule)) if first else None

    return check


def _sacct_line(ev: Evidence) -> str:
    steps = f" steps={','.join(ev.step_states)}" if ev.step_states else ""
    return (f"sacct: State={ev.slurm_state} ExitCode={ev.slurm_exit_code} "
            f"DerivedExitCode={ev.derived_exit_code}{steps}")


def _log_or_sacct(rule: str, outcome: str) -> Check:
    def check(ctx: Context) -> Match | None:
        first = ctx.first(rule)
        if first is not None:
            return outcome, first.reason, ctx.lines(rule)
        if ctx.sacct is not None and ctx.sacct[0] == outcome:
            return outcome, ctx.sacct[1], (_sacct_line(ctx.evidence),)
        return None

    return check


def exit_signal(code: int | None) -> int | None:
    """The signal that ended a process: -N from Popen, or 128+N from a shell."""
    if code is None:
        return None
    if code < 0:
        return -code
    return code - 128 if 128 < code <= 128 + 64 else None


def _exit_lines(ev: Evidence) -> tuple[str, ...]:
    return tuple(f"exit code {node}={code}" for node, code in sorted(ev.exit_codes.items()))


def _launch_failed(ctx: Context) -> Match | None:
    error = ctx.evidence.launch_error
    return ("crashed", "launcher_failed_to_start", (error,)) if error else None


def _steady_state(ctx: Context) -> Match | None:
    window = ctx.evidence.steady_state
    if not window:
        return None
    return "completed", "steady_state", (
        f"watchdog: step times steady, CV {window['cv']:.4g} < {window['max_cv']:g} over the last "
        f"{window['window']} step times (steps {window['first_step']}..{window['last_step']}); "
        f"stopped the process tree",)


def _clean_exit(ctx: Context) -> Match | None:
    ev = ctx.evidence
    codes = list(ev.exit_codes.values())
    if codes and all(code == 0 for code in codes):
        if ctx.sacct is not None and ctx.sacct[0] != "completed":
            return None
        if ev.hang_killed or (ev.signals and not ev.summary_written):
            return None  # a launcher that exits 0 on our SIGTERM did not finish its work
        if ev.expected_steps is not None and not ev.summary_written and (ev.last_step or 0) < ev.expected_steps:
            return None  # exit 0 without the work: `exited_early` below
        return "completed", "exit_0", _exit_lines(ev)
    if not codes and ctx.sacct == ("completed", "slurm_completed"):
        return "completed", "slurm_completed", (_sacct_line(ev),)
    return None


def _cuda_runtime_oom(ctx: Context) -> Match | None:
    first = ctx.first("cuda_runtime_oom")
    if first is None:
        return None
    if ctx.evidence.last_step is None:
        # The allocator's own OOM says "CUDA out of memory. Tried to allocate"; a runtime
        # "CUDA error: out of memory" before any step (at init or the first barrier) means the GPU
        # was already taken (a leftover process) or faulty, not that the configuration does not fit.
        return "crashed", "cuda_runtime_oom_before_first_step", ctx.lines("cuda_runtime_oom")
    return "oom", first.reason, ctx.lines("cuda_runtime_oom")


def _cgroup_oom(ctx: Context) -> Match | None:
    ev = ctx.evidence
    found = _log_or_sacct("cgroup_oom", "oom")(ctx)
    if found is not None:
        return found
    if ev.oom_kill_count:
        return "oom", "cgroup_oom_kill", (f"memory cgroup: oom_kill={ev.oom_kill_count}", *_exit_lines(ev))
    return None


def _watchdog_hang(ctx: Context) -> Match | None:
    ev = ctx.evidence
    if not ev.hang_killed:
        return None
    phase = ev.hang_phase or ("startup" if ev.last_step is None else "step")
    where = "before the first step" if phase == "startup" else f"after step {ev.last_step}"
    lines = ctx.lines("collective_timeout") + (f"watchdog: no progress {where}; stopped the process tree",)
    return "hang", f"no_progress_{phase}", lines


def _normalized_signals(ev: Evidence) -> set[str]:
    return {s.upper().removeprefix("SIG") for s in ev.signals}


def _time_limit(ctx: Context) -> Match | None:
    found = _log_or_sacct("slurm_time_limit", "timeout")(ctx)
    if found is not None:
        return found
    ev = ctx.evidence
    if "USR1" in _normalized_signals(ev) or ev.time_limit_hit:
        return "timeout", "time_limit_signal", (f"watchdog: received {', '.join(ev.signals) or 'time limit'}",)
    return None


def _cancelled(ctx: Context) -> Match | None:
    found = _log_or_sacct("slurm_cancelled", "cancelled")(ctx)
    if found is not None:
        return found
    received = _normalized_signals(ctx.evidence) & {"TERM", "INT", "HUP", "QUIT"}
    if received:
        return "cancelled", "signal_" + sorted(received)[0].lower(), (
            f"watchdog: received {', '.join(ctx.evidence.signals)}",)
    return None


def _python_exception(ctx: Context) -> Match | None:
    candidates = [f for f in ctx.findings if f.rule == "python_exception"]
    if not candidates:
        return None
    root_rank = _root_cause_rank(ctx.evidence.log_text)
    if root_rank is not None:
        ranked = [f for f in candidates if f.line.startswith(f"[rank{root_rank}]:")]
        candidates = ranked or candidates
    first = candidates[0]
    return "crashed", first.reason, (first.line,)


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\n(?:.*\n){0,3}?\s*rank\s*:\s*(\d+)")


def _root_cause_rank(text: str) -> int | None:
    match = _ROOT_CAUSE.search(text)
    return int(match[1]) if match else None


def _signal_exit(ctx: Context) -> Match | None:
    ev = ctx.evidence
    for _node, code in sorted(ev.exit_codes.items()):
        signal = exit_signal(code)
        if signal in (9, 6, 11):
            reason = {9: "sigkill", 6: "sigabrt", 11: "segfault"}[signal]
            return "crashed", reason, _exit_lines(ev)
    return None


def _nonzero_exit(ctx: Context) -> Match | None:
    ev = ctx.evidence
    failed = {node: code for node, code in ev.exit_codes.items() if code not in (0, None)}
    if not failed:
        return None
    node, code = sorted(failed.items())[0]
    signal = exit_signal(code)
    reason = f"killed_by_signal_{signal}" if signal is not None else f"exit_code_{code}"
    return "crashed", reason, _exit_lines(ev)


def _exited_early(ctx: Context) -> Match | None:
    ev = ctx.evidence
    if ev.exit_codes and all(code == 0 for code in ev.exit_codes.values()):
        return "crashed", "exited_early", (*_exit_lines(ev), f"last step {ev.last_step} of {ev.expected_steps}")
    return None


def _sacct_any(ctx: Context) -> Match | None:
    if ctx.sacct is None:
        return None
    return ctx.sacct[0], ctx.sacct[1], (_sacct_line(ctx.evidence),)


def _no_evidence(ctx: Context) -> Match | None:
    return "crashed", "no_evidence", ()


RULES: tuple[Rule, ...] = (
    Rule("slurm_node_failure", "node_fail", "Slurm says a node failed (log line, srun could not start the step on a node, or sacct NODE_FAIL/BOOT_FAIL)",
         _log_or_sacct("slurm_node_failure", "node_fail")),
    Rule("gpu_hardware_error", "node_fail", "uncorrectable ECC error: the GPU is faulty, not the configuration",
         _from_log("gpu_hardware_error")),
    Rule("slurm_preemption", "preempted", "preempted or requeued by Slurm",
         _log_or_sacct("slurm_preemption", "preempted")),
    Rule("launch_failed", "crashed", "the watchdog could not start the launcher", _launch_failed),
    Rule("launch_refused", "crashed", "the launcher refused to start: the framework is not the version the run "
         "was rendered for, or its checkout is missing (`llm-sweep: cannot launch:` line)",
         _from_log("launch_refused")),
    Rule("steady_state", "completed", "the watchdog ended the run early: the CV of its last step times was under "
         "run.early_stop.max_cv (errors its own SIGTERM causes do not count)", _steady_state),
    Rule("clean_exit", "completed", "every node exited 0 (and sacct, if any, agrees; the step budget was reached)",
         _clean_exit),
    Rule("illegal_memory_access", "crashed", "CUDA illegal memory access (even under memory pressure it is a crash)",
         _from_log("illegal_memory_access")),
    Rule("cuda_oom", "oom", "the CUDA caching allocator ran out of memory", _from_log("cuda_oom")),
    Rule("cuda_runtime_oom", "oom", "'CUDA error: out of memory'; crashed when no step was reached (GPU taken/faulty)",
         _cuda_runtime_oom),
    Rule("cpu_oom", "oom", "host memory: DefaultCPUAllocator, MemoryError, ENOMEM", _from_log("cpu_oom")),
    Rule("cgroup_oom", "oom", "killed by the (Slurm) cgroup OOM killer: log line, sacct OUT_OF_MEMORY/0:125, oom_kill",
         _cgroup_oom),
    Rule("watchdog_hang", "hang", "the watchdog saw no progress within the start-up or step timeout", _watchdog_hang),
    Rule("collective_timeout", "hang", "NCCL watchdog or gloo collective timeout, or ProcessGroupNCCL's heartbeat "
         "monitor found the watchdog stuck", _from_log("collective_timeout")),
    Rule("slurm_time_limit", "timeout", "Slurm time limit (log line, sacct TIMEOUT, or --signal USR1 received)",
         _time_limit),
    Rule("slurm_cancelled", "cancelled", "cancelled (scancel line, sacct CANCELLED, or SIGTERM/SIGINT received)",
         _cancelled),
    Rule("segfault", "crashed", "SIGSEGV (log line)", _from_log("segfault")),
    Rule("python_exception", "crashed", "a rank raised: its exception line (the root-cause rank's, when the "
         "launcher names it); exceptions that other rules name are left to them", _python_exception),
    Rule("killed_by_sigkill", "crashed", "a rank was SIGKILLed (the launcher's exitcode -9); not called oom without "
         "an oom-kill record", _from_log("killed_by_sigkill")),
    Rule("nccl_error", "crashed", "NCCL error other than a timeout (NCCL's error strings, its WARN lines on a failed "
         "call or a lost peer, or a communicator aborted for no stated timeout): a remote peer's error names no "
         "node, so it is a crash, not node_fail", _from_log("nccl_error")),
    Rule("nccl_watchdog_abort", "hang", "PyTorch's NCCL watchdog took the process down ('Some NCCL operations have "
         "failed or timed out ... taking the entire process down', its thread terminated with an exception, the "
         "debug-info dump it signalled) and no NCCL error line names another cause: a collective that never "
         "completed", _from_log("nccl_watchdog_abort")),
    Rule("cuda_error", "crashed", "other CUDA errors (unknown error, launch failure, ...)", _from_log("cuda_error")),
    Rule("aborted", "crashed", "SIGABRT (usually after a C++ exception)", _from_log("aborted")),
    Rule("rendezvous_timeout", "hang", "a rank waited in vain for its peers: c10d store timeouts ('Timed out after N "
         "seconds waiting for clients', DistStoreError), a store or gloo connect timeout; after the crash rules, "
         "since a peer that died first is the cause", _from_log("rendezvous_timeout")),
    Rule("peer_failure", "crashed", "a peer went away (gloo/socket): a symptom, used when nothing better shows",
         _from_log("peer_failure")),
    Rule("child_failed", "crashed", "the launcher reports a failed rank (torchrun's ChildFailedError or Root "
         "Cause) without a readable cause", _from_log("child_failed")),
    Rule("signal_exit", "crashed", "a launcher was killed by SIGKILL/SIGABRT/SIGSEGV (exit code -N or 128+N)",
         _signal_exit),
    Rule("nonzero_exit", "crashed", "a node's launcher exited non-zero", _nonzero_exit),
    Rule("exited_early", "crashed", "exit 0 before the step budget, without a summary record", _exited_early),
    Rule("slurm_accounting", "crashed", "only sacct knows: its state decides", _sacct_any),
    Rule("no_evidence", "crashed", "nothing to go on", _no_evidence),
)


def classify(evidence: Evidence, findings: list[Finding] | None = None) -> Verdict:
    """The first rule of RULES that matches; `findings` may be passed when the log was scanned already."""
    scanned = tuple(findings if findings is not None else scan_log_for_failures(evidence.log_text))
    sacct = None
    if evidence.slurm_state:
        sacct = outcome_from_sacct(evidence.slurm_state, evidence.slurm_exit_code, evidence.derived_exit_code,
                                   evidence.step_states)
    ctx = Context(evidence, scanned, sacct)
    for rule in RULES:
        match = rule.check(ctx)
        if match is not None:
            outcome, reason, lines = match
            return Verdict(outcome, reason, tuple(lines), rule.name)
    raise AssertionError("the last rule always matches")  # pragma: no cover


def rule_table() -> list[dict[str, str]]:
    """RULES as rows (name, outcome, description), in order: for docs/watchdog.md and `sweep status --explain`."""
    return [{"rule": r.name, "outcome": r.outcome, "description": r.description} for r in RULES]


__all__ = ["OUTCOMES", "RULES", "Evidence", "Finding", "Rule", "Verdict", "classify", "exit_signal",
           "rule_table", "scan_log_for_failures"]
