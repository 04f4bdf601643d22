"""From one node's evidence to its verdict, and from the nodes' verdicts to the run's status.

The rules that read log text live in `sweep.classify`; this module feeds it what only the
watchdog knows (the hang it detected, the signals it received, the exit code it reaped) and
merges the per-node files. Merging picks the earliest cause: when node 1 crashes and node 0's
ranks then fail on a closed connection, node 1's verdict is the run's; when node 0 detects a
hang and stops its tree, the crash that follows elsewhere is a consequence, not the cause.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sweep.state import read_json

# When two nodes' causes are this close in time, the more specific class wins.
CAUSE_WINDOW_S = 1.0
SEVERITY = ("oom", "crashed", "node_fail", "hang", "timeout", "preempted", "cancelled", "completed")
SIGNAL_OUTCOMES = {"USR1": ("timeout", "slurm_time_limit_signal"),
                   "TERM": ("cancelled", "sigterm"), "INT": ("cancelled", "sigint")}


def node_file(attempt_dir: Path, node_index: int) -> Path:
    return attempt_dir / f"node{node_index}.json"


def classify_node(evidence: dict[str, Any]) -> dict[str, Any]:
    """outcome, reason, rule and evidence lines for one node.

    What the watchdog itself observed comes first (a hang it detected, a Slurm signal), because
    the launcher's exit after our SIGTERM says nothing about the run. Log text decides the rest.
    """
    lines = _failure_lines(evidence)
    if evidence.get("launch_error"):
        return _verdict("crashed", "launcher_failed_to_start", "watchdog:launch_error",
                        [evidence["launch_error"]])
    if evidence.get("hang"):
        hang = evidence["hang"]
        oom = [line for line in lines if _is_oom(line)]
        if oom:  # one rank died of OOM and the others waited for it
            return _verdict("oom", "oom_then_hang", "watchdog:hang_after_oom", oom)
        return _verdict("hang", f"no_progress_{hang['phase']}", "watchdog:progress_timeout",
                        [f"no new step for {hang['idle_s']} s (limit {hang['timeout_s']} s, "
                         f"phase {hang['phase']}, last step {hang['last_step']})"] + lines[-3:])
    for name in evidence.get("signals") or []:
        if name in SIGNAL_OUTCOMES:
            outcome, reason = SIGNAL_OUTCOMES[name]
            return _verdict(outcome, reason, f"watchdog:signal_{name}", [f"received SIG{name}"])
    return _from_logs(evidence, lines)


def _verdict(outcome: str, reason: str, rule: str, lines: list[str]) -> dict[str, Any]:
    return {"outcome": outcome, "reason": reason, "rule": rule, "evidence": lines}


# --- interim log rules, until sweep.classify lands (then: one import) -------------------------
_OOM_TEXTS = ("CUDA out of memory", "OutOfMemoryError", "DefaultCPUAllocator: can't allocate memory",
              "oom-kill", "Out of memory", "MemoryError")


def _is_oom(line: str) -> bool:
    return any(text in line for text in _OOM_TEXTS) and "illegal memory access" not in line


def _failure_lines(evidence: dict[str, Any]) -> list[str]:
    text = (evidence.get("stderr_tail") or "") + "\n" + (evidence.get("stdout_tail") or "")
    keys = ("Error", "error:", "Traceback", "Killed", "oom-kill", "Signal ", "exitcode")
    return [line.strip() for line in text.splitlines() if any(k in line for k in keys)]


def _from_logs(evidence: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    code = evidence.get("exit_code")
    oom = [line for line in lines if _is_oom(line)]
    if code == 0 and not oom:
        return _verdict("completed", "exit_0", "exit_code:0", [])
    if oom:
        return _verdict("oom", "oom_text", "log:oom", oom)
    if evidence.get("cgroup_oom_kills"):
        return _verdict("oom", "cgroup_oom_kill", "cgroup:oom_kill",
                        [f"memory cgroup oom_kill +{evidence['cgroup_oom_kills']}"])
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return _verdict("crashed", f"exit_{code}", "exit_code:nonzero",
                    errors[-3:] or lines[-3:] or [f"launcher exit code {code}"])
# ---------------------------------------------------------------------------------------------


def wait_for_node_files(attempt_dir: Path, nnodes: int, wait_s: float,
                        poll_s: float = 0.5) -> dict[int, dict[str, Any] | None]:
    """The other nodes' verdicts (None for a node that wrote none within `wait_s`)."""
    deadline = time.monotonic() + wait_s
    found: dict[int, dict[str, Any] | None] = {k: None for k in range(1, nnodes)}
    while True:
        for k in found:
            if found[k] is None:
                found[k] = read_json(node_file(attempt_dir, k))
        if all(v is not None for v in found.values()) or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)


def merge_nodes(own: dict[str, Any], others: dict[int, dict[str, Any] | None],
                nnodes: int) -> dict[str, Any]:
    """The run's status.json from node 0's verdict and the other nodes' files."""
    nodes = {0: own, **others}
    present = {k: v for k, v in nodes.items() if v is not None}
    missing = sorted(k for k, v in nodes.items() if v is None)
    exit_codes: dict[str, int | None] = {f"node{k}": None for k in range(nnodes)}
    for record in present.values():
        exit_codes.update(record.get("exit_codes", {}))
    failed = [r for r in present.values() if r["outcome"] != "completed"]
    if missing and own["outcome"] not in ("timeout", "cancelled", "preempted"):
        chosen = dict(own, outcome="node_fail", reason="node_without_verdict",
                      rule="merge:missing_node_file",
                      evidence=[f"node{k} wrote no node{k}.json" for k in missing]
                      + list(own.get("evidence", [])))
    elif failed:
        first = min(r.get("cause_at", r["ended_at"]) for r in failed)
        close = [r for r in failed if r.get("cause_at", r["ended_at"]) <= first + CAUSE_WINDOW_S]
        chosen = min(close, key=lambda r: (SEVERITY.index(r["outcome"])
                                          if r["outcome"] in SEVERITY else len(SEVERITY),
                                          not r.get("evidence"), r.get("node_index", 0)))
    else:
        chosen = own
    status = dict(chosen)
    status.update({
        "exit_codes": exit_codes,
        "last_step": max((r["last_step"] for r in present.values() if r.get("last_step") is not None),
                         default=None),
        "signals": sorted({s for r in present.values() for s in r.get("signals", [])}),
        "started_at": min(r["started_at"] for r in present.values()),
        "ended_at": time.time(),
        "node": chosen.get("node", own["node"]),
        "nodes": [nodes[k]["node"] if nodes[k] is not None else None for k in range(nnodes)],
        "missing_nodes": [f"node{k}" for k in missing],
        "decided_by_node": chosen.get("node_index", 0),
        "writer": "watchdog",
    })
    return status
