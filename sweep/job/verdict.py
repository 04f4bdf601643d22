"""What the watchdogs observed -> `sweep.job.classify.Evidence` -> node files and the run's status.

Each node's watchdog records what only it can know (its launcher's exit code, the signals it
received, whether it stopped the tree for a hang, the cgroup's oom_kill count) as `observed`
in `node<k>.json`, with its own verdict. Node 0 then classifies the whole run once, from every
node's observations and every node's log tails (they all sit in the shared attempt folder).
The root-cause order lives in one place, `sweep.job.classify.RULES`: an OOM on node 1 beats the
lost-peer errors it causes on node 0, a hang the watchdog detected beats the crashes its own
SIGTERM provokes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sweep.core.slurm_states import SRUN_NODE_FAILURE, node_failures_in_srun_output
from sweep.core.state import SLURM_STDERR_LINK, STATUS_FILE, read_json
from sweep.job.classify import Evidence, Verdict, classify
from sweep.job.progress import LOGS_DIR, read_tail

LOG_TAIL_BYTES = 128 << 10  # per file: the end of a log holds the failure


def node_file(attempt_dir: Path, node_index: int) -> Path:
    return attempt_dir / f"node{node_index}.json"


def log_text(attempt_dir: Path, nodes: list[int]) -> str:
    """The tails of the given nodes' stderr and stdout, stderr first (tracebacks go there), and
    srun's lines that blame a node: they are only in the batch script's stderr, and a node that
    could not start its part of the step leaves nothing else behind."""
    parts = []
    for k in nodes:
        for stream in ("err", "out"):
            parts.append(read_tail(attempt_dir / LOGS_DIR / f"node{k}.{stream}", LOG_TAIL_BYTES))
    parts += srun_blame_lines(attempt_dir)
    return "\n".join(part for part in parts if part)


# Verdicts that srun's blame of a node cannot change: the run finished, or a node failure is
# already the verdict. Any other verdict (a watchdog that saw only a signal, a crash, no verdict
# at all) yields to it, as the classifier's first rule would have, had the line been written
# before the watchdog decided.
SRUN_BLAME_SETTLED = frozenset({"completed", "node_fail"})


def srun_blame_lines(attempt_dir: Path) -> list[str]:
    """srun's lines in the batch script's stderr that blame a node (and nothing else of it)."""
    srun = read_tail(attempt_dir / SLURM_STDERR_LINK, LOG_TAIL_BYTES)
    return [match[0] for match in SRUN_NODE_FAILURE.finditer(srun)]


def srun_node_failure(attempt_dir: Path) -> tuple[str, tuple[str, ...]] | None:
    """(reason, nodes) when srun blamed nodes in the batch script's stderr: the only record of
    a step that could not start on a node, where no watchdog may have run at all."""
    return node_failures_in_srun_output("\n".join(srun_blame_lines(attempt_dir)))


def decide(observed: dict[int, dict[str, Any]], text: str, expected_steps: int | None) -> Verdict:
    """The verdict for the nodes in `observed` (one node, or all of them on node 0)."""
    errors = [o["launch_error"] for o in observed.values() if o.get("launch_error")]
    hangs = [o["hang"] for o in observed.values() if o.get("hang")]
    steps = [o["last_step"] for o in observed.values() if o.get("last_step") is not None]
    kills = [o["cgroup_oom_kills"] for o in observed.values() if o.get("cgroup_oom_kills")]
    evidence = Evidence(
        exit_codes={f"node{k}": o.get("exit_code") for k, o in sorted(observed.items())},
        signals=tuple(sorted({s for o in observed.values() for s in o.get("signals", [])})),
        log_text=text,
        hang_killed=bool(hangs),
        hang_phase=min((h["phase"] for h in hangs), default=None),  # "startup" < "step"
        last_step=max(steps, default=None),
        expected_steps=expected_steps,
        summary_written=any(o.get("summary_written") for o in observed.values()),
        oom_kill_count=sum(kills) if kills else None,
        launch_error="; ".join(errors) or None,
        time_limit_hit=any(o.get("time_limit_hit") for o in observed.values()),
        steady_state=next((o["steady_state"] for o in observed.values() if o.get("steady_state")), None),
    )
    return classify(evidence)


def wait_for_node_files(attempt_dir: Path, nnodes: int, wait_s: float,
                        poll_s: float = 0.5) -> dict[int, dict[str, Any] | None]:
    """The other nodes' files (None for a node that wrote none within `wait_s`)."""
    deadline = time.monotonic() + wait_s
    found: dict[int, dict[str, Any] | None] = {k: None for k in range(1, nnodes)}
    while True:
        for k in found:
            if found[k] is None:
                found[k] = read_json(node_file(attempt_dir, k))
        if all(v is not None for v in found.values()) or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)


def wait_for_status(attempt_dir: Path, wait_s: float, poll_s: float = 0.25) -> bool:
    """Whether node 0's status.json appeared within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while not (attempt_dir / STATUS_FILE).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _consequential_signals(records: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Observations without the TERM/INT that another node's earlier failure caused.

    `srun --kill-on-bad-exit` answers one node's failure with SIGTERM to the others; that TERM
    is not a cancel. A node that failed on its own (no signal) before the TERM arrived is the cause.
    """
    failures = [r["ended_at"] for r in records.values()
                if r["outcome"] != "completed" and not r["observed"].get("signals")]
    if not failures:
        return {k: r["observed"] for k, r in records.items()}
    first_failure = min(failures)
    cleaned = {}
    for k, r in records.items():
        obs = r["observed"]
        pairs = list(zip(obs.get("signals", []), obs.get("signal_times", [])))
        kept = [name for name, at in pairs if name == "USR1" or at < first_failure]
        cleaned[k] = {**obs, "signals": kept} if pairs else obs
    return cleaned


def merge_nodes(attempt_dir: Path, own: dict[str, Any], others: dict[int, dict[str, Any] | None],
                nnodes: int, expected_steps: int | None) -> dict[str, Any]:
    """The run's status.json: node 0's file, re-decided over every node that wrote one."""
    records = {0: own, **others}
    present = {k: r for k, r in records.items() if r is not None}
    missing = sorted(k for k, r in records.items() if r is None)
    observed = _consequential_signals(present)
    verdict = decide(observed, log_text(attempt_dir, sorted(present)), expected_steps)
    outcome, reason, rule = verdict.outcome, verdict.reason, verdict.rule
    lines = list(verdict.evidence_lines)
    if missing and outcome not in ("timeout", "cancelled", "preempted", "node_fail"):
        # A watchdog that wrote nothing was killed with its node (or by SIGKILL); what the
        # others saw (lost peers, a hang) follows from that.
        outcome, reason, rule = "node_fail", "node_without_verdict", "watchdog_missing_node_file"
        lines = [f"node{k} wrote no node{k}.json" for k in missing] + lines
    exit_codes: dict[str, int | None] = {f"node{k}": None for k in range(nnodes)}
    for record in present.values():
        exit_codes.update(record["exit_codes"])
    return {
        **own,
        "outcome": outcome, "reason": reason, "rule": rule, "evidence": lines,
        "exit_codes": exit_codes,
        "last_step": max((r["last_step"] for r in present.values()
                          if r.get("last_step") is not None), default=None),
        "signals": sorted({s for o in observed.values() for s in o.get("signals", [])}),
        "started_at": min(r["started_at"] for r in present.values()),
        "ended_at": time.time(),
        "nodes": [r["node"] if (r := records[k]) is not None else None for k in range(nnodes)],
        "missing_nodes": [f"node{k}" for k in missing],
        "writer": "watchdog",
    }
