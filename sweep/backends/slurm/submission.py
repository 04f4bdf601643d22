"""Submission logic without I/O: resource shapes, job arrays, the ledger, run states, bad nodes.

A sweep's runs are submitted as job arrays, one per resource shape (the #SBATCH options that
decide where and how long a job runs; not its name or output files), split so that no array
index reaches MaxArraySize and the cluster's job count stays under MaxJobCount. Every array is a
*batch* with an id of its own; the ledger records the intent (batch id, run ids) before sbatch
and the job id after. The batch id also travels in the job's `--comment`, so a submitter killed
between the two writes leaves a batch that `squeue`/`sacct` can name: it is never submitted twice.

Everything here is pure (dataclasses in, dataclasses out), so `sweep.backends.slurm.tracker` and the commands
stay thin and these rules are tested without a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from sweep.core.hostlist import expand as expand_hosts
from sweep.core.slurm_states import outcome_from_sacct

# #SBATCH options that name a job or its files: they differ per run and do not shape resources.
NOT_SHAPE: Final = frozenset({"job-name", "output", "error", "comment", "array"})
OUTCOMES: Final = ("completed", "oom", "hang", "timeout", "crashed", "node_fail", "cancelled",
                   "preempted", "unknown", "lost")
IN_FLIGHT: Final = frozenset({"pending", "running", "submitted"})
NEVER_SUBMITTED: Final = "unsubmitted"
# `sweep resume` with no --only: every class but these (and the runs in flight).
NOT_RESUMED_BY_DEFAULT: Final = frozenset({"completed", "oom"})
BAD_NODE_THRESHOLD: Final = 2  # node_fail or NCCL incidents on a node before it is excluded
INCIDENT_WINDOW_S: Final = 60.0  # jobs of one node that ended this close together: one incident
LOST_AFTER_S: Final = 600.0  # a submitted task Slurm has no word of, this long after sbatch
_BATCH_IN_TEXT: Final = re.compile(r"(?:^|[;\s])batch=([0-9a-z]+)\b")
_ARRAY_ID: Final = re.compile(r"^(\d+)_(\d+|\[([0-9,\-]+)(?:%\d+)?\])$")
_SHORT_NAME: Final = re.compile(r"^[A-Za-z]$")

Shape = tuple[tuple[str, str], ...]


class SubmissionError(ValueError):
    """A run folder or ledger that cannot be submitted as it is; the message says the fix."""


# Shapes and batches -----------------------------------------------------------------------

@dataclass(frozen=True)
class RunJob:
    """A rendered run, as the submitter needs it."""

    run_id: str
    shape: Shape
    gpus: int = 0  # nodes x GPUs (or ranks) per node, for GPU-hours


@dataclass(frozen=True)
class Batch:
    """One job array: runs of one shape; task i runs run_ids[i]."""

    batch_id: str
    shape: Shape
    run_ids: tuple[str, ...]


def shape_of(directives: Mapping[str, str], where: str = "job.sbatch") -> Shape:
    """The resource shape of a job script's #SBATCH options (see NOT_SHAPE)."""
    for name in directives:
        if _SHORT_NAME.match(name):
            raise SubmissionError(f"{where}: #SBATCH -{name} is a short option; write its long "
                                  "form (e.g. --nodes=2) so that runs can be grouped by shape")
    return tuple(sorted((k, v) for k, v in directives.items() if k not in NOT_SHAPE))


def shape_options(shape: Shape, exclude: Iterable[str] = ()) -> list[str]:
    """sbatch command-line options for a shape, with extra nodes to exclude merged in."""
    options = dict(shape)
    current = options.get("exclude", "")
    listed = set(current.split(",")) if "[" not in current else {current}
    extra = sorted(set(exclude) - listed)
    if extra:
        options["exclude"] = ",".join([current, *extra] if current else extra)
    return [f"--{name}={value}" if value else f"--{name}"
            for name, value in sorted(options.items())]


def group_by_shape(runs: Sequence[RunJob]) -> list[tuple[Shape, list[str]]]:
    """Run ids per shape, shapes and runs in first-seen order."""
    groups: dict[Shape, list[str]] = {}
    for run in runs:
        groups.setdefault(run.shape, []).append(run.run_id)
    return list(groups.items())


def split_arrays(run_ids: Sequence[str], max_array_size: int) -> list[list[str]]:
    """Chunks whose highest index (n - 1) stays below MaxArraySize."""
    if max_array_size < 1:
        raise SubmissionError(f"MaxArraySize={max_array_size}: job arrays are disabled on this "
                              "cluster; ask the admins, or submit fewer runs")
    return [list(run_ids[i:i + max_array_size]) for i in range(0, len(run_ids), max_array_size)]


def plan_batches(runs: Sequence[RunJob], max_array_size: int, capacity: int,
                 new_id: Any) -> tuple[list[Batch], list[str]]:
    """Arrays for `runs`: grouped by shape, split at MaxArraySize, at most `capacity` tasks in
    all (the room left under MaxJobCount/MaxSubmitJobs). Returns (batches, run ids left over)."""
    batches: list[Batch] = []
    left: list[str] = []
    room = max(capacity, 0)
    for shape, ids in group_by_shape(runs):
        take, rest = ids[:room], ids[room:]
        room -= len(take)
        left += rest
        for chunk in split_arrays(take, max_array_size) if take else []:
            batches.append(Batch(batch_id=new_id(), shape=shape, run_ids=tuple(chunk)))
    return batches, left


def array_option(size: int, max_running: int | None) -> str:
    """`--array=0-(n-1)[%N]`."""
    throttle = f"%{max_running}" if max_running and max_running < size else ""
    return f"--array=0-{size - 1}{throttle}"


def job_comment(sweep: str, batch_id: str) -> str:
    """The short tag every job carries: which sweep, which batch (the task list has the runs)."""
    return f"sweep={sweep};batch={batch_id}"


def batch_in(text: str) -> str | None:
    """The batch id in a job's comment or sbatch command line (sacct SubmitLine)."""
    match = _BATCH_IN_TEXT.search(text or "")
    return match[1] if match else None


# The ledger -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Submission:
    """A batch as the ledger knows it: job_id None means intent written, result not (yet)."""

    batch_id: str
    run_ids: tuple[str, ...]
    time: float
    job_id: str | None = None
    failed: str | None = None  # sbatch refused it (nothing was submitted): the message


def submissions(records: Iterable[Mapping[str, Any]]) -> list[Submission]:
    """Ledger records → one Submission per batch, in intent order.

    Records: {"event": "intent", "batch", "run_ids", "time"}, {"event": "submitted", "batch",
    "job_id"}, {"event": "reconciled", "batch", "job_id" (None: never reached Slurm)},
    {"event": "failed", "batch", "error"}."""
    order: list[str] = []
    intents: dict[str, Mapping[str, Any]] = {}
    results: dict[str, tuple[str | None, str | None]] = {}
    for record in records:
        batch = str(record.get("batch", ""))
        event = record.get("event")
        if event == "intent" and batch not in intents:
            order.append(batch)
            intents[batch] = record
        elif event in ("submitted", "reconciled") and batch in intents:
            job = record.get("job_id")
            results[batch] = (str(job) if job else None,
                              None if job else "not found in squeue/sacct: never submitted")
        elif event == "failed" and batch in intents:
            results[batch] = (None, str(record.get("error") or "sbatch failed"))
    out = []
    for batch in order:
        intent = intents[batch]
        job, failed = results.get(batch, (None, None))
        out.append(Submission(batch_id=batch, run_ids=tuple(intent.get("run_ids") or ()),
                              time=float(intent.get("time") or 0.0), job_id=job, failed=failed))
    return out


def dangling(subs: Iterable[Submission]) -> list[Submission]:
    """Intents without a result: the submitter died around its sbatch."""
    return [s for s in subs if s.job_id is None and s.failed is None]


def reconcile(subs: Sequence[Submission], seen: Mapping[str, str]) -> list[dict[str, Any]]:
    """Ledger records that settle dangling intents, given the jobs Slurm knows by batch id
    (`seen`: batch id → master job id, from the jobs' comments). A batch Slurm does not know was
    never submitted (job_id None), so its runs are free to go again."""
    return [{"event": "reconciled", "batch": s.batch_id, "job_id": seen.get(s.batch_id)}
            for s in dangling(subs)]


@dataclass(frozen=True)
class TaskRef:
    """Where a run was last submitted: array master id and task index."""

    job_id: str
    index: int
    time: float

    @property
    def task_id(self) -> str:
        return f"{self.job_id}_{self.index}"


def latest_tasks(subs: Iterable[Submission]) -> dict[str, TaskRef]:
    """Each run's latest submitted array task (failed and never-submitted batches skipped)."""
    latest: dict[str, TaskRef] = {}
    for sub in subs:
        if sub.job_id is None:
            continue
        for index, run_id in enumerate(sub.run_ids):
            latest[run_id] = TaskRef(sub.job_id, index, sub.time)
    return latest


# Array task ids ---------------------------------------------------------------------------

def expand_task_ids(job_id: str) -> tuple[str, list[int]] | None:
    """'12_3' → ('12', [3]); '12_[0-2,7%4]' → ('12', [0, 1, 2, 7]); a plain job → None."""
    match = _ARRAY_ID.match(job_id)
    if match is None:
        return None
    if match[3] is None:
        return match[1], [int(match[2])]
    indices: list[int] = []
    for part in match[3].split(","):
        low, _, high = part.partition("-")
        indices += range(int(low), int(high or low) + 1)
    return match[1], indices


# Run states -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmView:
    """What Slurm says about one array task."""

    state: str  # squeue or sacct state
    live: bool  # from squeue (pending/running) rather than accounting
    raw_id: str = ""  # the task's own job id (SLURM_JOB_ID inside it)
    exit_code: str = ""
    derived_exit_code: str = ""
    step_states: tuple[str, ...] = ()
    nodes: str = ""
    elapsed_s: int = 0
    reason: str = ""
    ended_at: float | None = None  # sacct's End, as epoch seconds (None: not ended, or unknown)


@dataclass(frozen=True)
class AttemptView:
    """The latest attempt folder of a run that belongs to its latest submission (or, for a run
    never submitted through the ledger, its latest attempt)."""

    number: int
    outcome: str | None  # None: no status.json (yet)
    reason: str = ""
    elapsed_s: float | None = None
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunState:
    run_id: str
    state: str  # an outcome, "pending", "running", "submitted" or "unsubmitted"
    reason: str = ""
    task: str | None = None  # "<master>_<index>"
    attempt: int | None = None
    nodes: tuple[str, ...] = ()
    elapsed_s: float | None = None

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT


_WATCHDOG_DECIDES: Final = frozenset({"completed", "hang", "oom", "timeout"})
_SLURM_DECIDES: Final = frozenset({"node_fail", "oom", "timeout", "preempted", "cancelled"})


def combine(status: str | None, sacct: tuple[str, str] | None) -> tuple[str, str] | None:
    """One outcome from the watchdog's status.json and Slurm's accounting verdict.

    The watchdog's evidence wins where it is specific (completed, hang, oom, timeout); Slurm's
    wins for what the watchdog cannot see or only sees as a kill (a node failure, an OOM kill of
    the step, the time limit, a cancel)."""
    if status in _WATCHDOG_DECIDES:
        return status, "status.json"
    if sacct is not None and sacct[0] in _SLURM_DECIDES:
        return sacct[0], f"sacct: {sacct[1]}"
    if status is not None:
        return status, "status.json"
    return (sacct[0], f"sacct: {sacct[1]}") if sacct is not None else None


def run_state(run_id: str, task: TaskRef | None, slurm: SlurmView | None,
              attempt: AttemptView | None, now: float) -> RunState:
    """The state of one run from its latest submission, Slurm's view of that task, and its
    attempt folder."""
    common: dict[str, Any] = {"run_id": run_id, "task": task.task_id if task else None,
                              "attempt": attempt.number if attempt else None,
                              "nodes": attempt.nodes if attempt else ()}
    if task is None:
        if attempt is None or attempt.outcome is None:
            return RunState(state=NEVER_SUBMITTED, **common)
        return RunState(state=attempt.outcome, reason=attempt.reason or "status.json",
                        elapsed_s=attempt.elapsed_s, **common)
    if slurm is not None and slurm.nodes and not common["nodes"]:
        common["nodes"] = _host_names(slurm.nodes)
    if slurm is not None and slurm.live:
        state = "running" if slurm.state in ("RUNNING", "COMPLETING", "CONFIGURING") else "pending"
        return RunState(state=state, reason=slurm.reason or slurm.state, **common)
    verdict = None
    if slurm is not None:
        try:
            verdict = outcome_from_sacct(slurm.state, slurm.exit_code, slurm.derived_exit_code,
                                         slurm.step_states)
        except ValueError:
            verdict = ("unknown", f"sacct exit code {slurm.exit_code!r}")
        if verdict is None:  # accounting still says pending/running; squeue no longer does
            return RunState(state="submitted", reason=f"sacct: {slurm.state}", **common)
    decided = combine(attempt.outcome if attempt else None, verdict)
    elapsed = attempt.elapsed_s if attempt and attempt.elapsed_s is not None else (
        float(slurm.elapsed_s) if slurm is not None and slurm.elapsed_s else None)
    if decided is not None:
        reason = decided[1] if decided[1] != "status.json" or attempt is None else \
            (attempt.reason or "status.json")
        return RunState(state=decided[0], reason=reason, elapsed_s=elapsed, **common)
    if now - task.time > LOST_AFTER_S:
        return RunState(state="lost", reason="neither squeue nor sacct knows the task", **common)
    return RunState(state="submitted", reason="waiting for Slurm's accounting", **common)


def _host_names(hostlist: str) -> tuple[str, ...]:
    """sacct's `node[1-2],gpu7` as names; a list that does not parse is kept as it is."""
    try:
        return tuple(expand_hosts(hostlist))
    except ValueError:
        return (hostlist,)


def resumable(states: Iterable[RunState], only: Sequence[str] | None) -> list[str]:
    """Run ids to submit again: the selected failure classes (default: every class but
    completed and oom, and runs never submitted); never a run in flight or completed."""
    chosen = set(only) if only else (set(OUTCOMES) | {NEVER_SUBMITTED}) - NOT_RESUMED_BY_DEFAULT
    chosen -= {"completed"} | IN_FLIGHT
    return [s.run_id for s in states if s.state in chosen and not s.in_flight]


# Bad nodes --------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeFailure:
    """One failed attempt that points at nodes: a node failure or an NCCL error."""

    run_id: str
    attempt: int | None
    kind: str  # "node_fail" or "nccl"
    nodes: tuple[str, ...]
    exact: bool = True  # False: Slurm named no node, so these are all the job's nodes
    ended_at: float | None = None  # when the job ended (sacct End); None: unknown


def bad_nodes(failures: Iterable[NodeFailure],
              threshold: int = BAD_NODE_THRESHOLD) -> dict[str, int]:
    """Nodes with at least `threshold` incidents: each attempt counted once per node, and the
    failures of one node whose jobs ended within INCIDENT_WINDOW_S of each other counted once
    (one slurmd death ends every job on its node at once: one failure of the node, not one per
    job, or a single incident would exclude it). A failure whose end is unknown stands alone."""
    ends: dict[str, list[float | None]] = {}
    seen: set[tuple[str, int | None, str]] = set()
    for failure in failures:
        for node in failure.nodes:
            key = (failure.run_id, failure.attempt, node)
            if node and key not in seen:
                seen.add(key)
                ends.setdefault(node, []).append(failure.ended_at)
    counts = {node: incidents(times) for node, times in ends.items()}
    return {node: count for node, count in sorted(counts.items()) if count >= threshold}


def incidents(ended_at: Sequence[float | None], window_s: float = INCIDENT_WINDOW_S) -> int:
    """How many incidents these job ends are: ends within `window_s` of an incident's first end
    join it; unknown ends count one each."""
    known = sorted(t for t in ended_at if t is not None)
    count = sum(1 for t in ended_at if t is None)
    first: float | None = None
    for end in known:
        if first is None or end - first > window_s:
            count, first = count + 1, end
    return count


@dataclass(frozen=True)
class NodeExclusions:
    """bad_nodes.json: what is excluded, since when, and which nodes were given another chance."""

    exclude: tuple[str, ...] = ()
    excluded_at: Mapping[str, float] = field(default_factory=dict)
    forgiven_at: Mapping[str, float] = field(default_factory=dict)


def update_exclusions(previous: NodeExclusions, failures: Iterable[tuple[NodeFailure, float]], now: float,
                      threshold: int = BAD_NODE_THRESHOLD) -> NodeExclusions:
    """The exclusions after `failures` (each with the time it was first seen). A node that was
    excluded but is no longer in `exclude` was taken out by hand: it is forgiven now, and only
    failures seen after that count against it. Nodes put into `exclude` by hand stay."""
    listed = set(previous.exclude)
    forgiven_at = dict(previous.forgiven_at)
    forgiven_at.update({node: now for node in previous.excluded_at if node not in listed})
    counted = failures_that_count(failures, forgiven_at)
    exclude = sorted(set(bad_nodes(counted, threshold)) | listed)
    excluded_at = {node: previous.excluded_at.get(node, now) for node in exclude}
    return NodeExclusions(tuple(exclude), excluded_at, forgiven_at)


def failures_that_count(failures: Iterable[tuple[NodeFailure, float]],
                        forgiven_at: Mapping[str, float]) -> list[NodeFailure]:
    """Each failure without the nodes that were forgiven after it was seen."""
    return [replace(f, nodes=tuple(n for n in f.nodes
                                   if seen_at > forgiven_at.get(n, float("-inf"))))
            for f, seen_at in failures]


def change_exclusions(previous: NodeExclusions, *, forgive: Iterable[str] = (),
                      exclude: Iterable[str] = (), now: float) -> NodeExclusions:
    """`sweep nodes --forgive/--exclude`: the same outcome as editing `exclude` in bad_nodes.json
    by hand, in one step. A forgiven node's failures so far stop counting against it."""
    forgiven = set(forgive)
    listed = sorted((set(previous.exclude) - forgiven) | set(exclude))
    return NodeExclusions(tuple(listed),
                          {node: previous.excluded_at.get(node, now) for node in listed},
                          {**previous.forgiven_at, **{node: now for node in sorted(forgiven)}})


@dataclass(frozen=True)
class NodeRecord:
    """One node of `sweep nodes`: its failures, and whether later submissions avoid it."""

    node: str
    failures: int  # every failed attempt that pointed at it
    counted: int  # of those, the ones seen since it was last forgiven
    excluded_at: float | None
    forgiven_at: float | None
    reason: str | None = None  # why a check excluded it (the fabric check's figure)

    def excluded_by_hand(self, threshold: int = BAD_NODE_THRESHOLD) -> bool:
        return self.excluded_at is not None and self.counted < threshold


def node_records(exclusions: NodeExclusions,
                 failures: Sequence[tuple[NodeFailure, float]],
                 reasons: Mapping[str, str] | None = None) -> list[NodeRecord]:
    """Every node that failed or is excluded, by name, with the reason a check gave for
    excluding it (`reasons`)."""
    total = bad_nodes((f for f, _ in failures), threshold=1)
    counted = bad_nodes(failures_that_count(failures, exclusions.forgiven_at), threshold=1)
    names = sorted(set(total) | set(exclusions.exclude) | set(exclusions.forgiven_at))
    return [NodeRecord(node, total.get(node, 0), counted.get(node, 0),
                       exclusions.excluded_at.get(node) if node in exclusions.exclude else None,
                       exclusions.forgiven_at.get(node),
                       (reasons or {}).get(node) if node in exclusions.exclude else None)
            for node in names]


def counts_by(states: Iterable[RunState], key: Any = lambda s: s.state) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for state in states:
        k = key(state)
        out[k] = out.get(k, 0) + 1
    return out

