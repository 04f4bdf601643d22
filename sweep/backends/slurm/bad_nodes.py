"""A sweep's record of the nodes its runs failed on, and the exclude list built from it.

One file in the sweep folder, `bad_nodes.json`: every node failure seen (run, attempt, kind,
the nodes blamed and how surely), the nodes excluded from later submissions (since when, and
why when a check excluded them: `reasons`, e.g. the fabric check's figure), and those taken out
of the list again (forgiven_at; by hand or `sweep nodes --forgive`). The rules,
which failures exclude a node and what forgiving undoes, are pure functions in
`sweep.backends.slurm.submission` (`update_exclusions`, `change_exclusions`, `node_records`); this module is
their file. A status poll merges what it saw (`BadNodes.merge`), `sweep nodes` reads and changes
the list, and every submission reads `exclude`.

Writes are atomic and happen only when something changed, so a poll that saw nothing new leaves
the file (and its modification time) alone, and a sweep whose nodes never failed has no file.
Several processes change the file (a status poll or the search driver merging failures, `sweep
nodes`, `sweep collect` counting stragglers), each by reading it, changing what it read and
writing it back; each of those holds `.bad_nodes.json.lock` from the read to the write, so one
never writes back a copy that misses what another added meanwhile.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from sweep.backends.slurm.submission import (
    NodeExclusions,
    NodeFailure,
    NodeRecord,
    change_exclusions,
    node_records,
    update_exclusions,
)
from sweep.core.errors import UserError
from sweep.core.state import LockHeld, atomic_write_json, exclusive_lock, read_json

BAD_NODES_FILE: Final = "bad_nodes.json"
LOCK_WAIT_S: Final = 60.0  # a holder reads, changes and writes one small file (and may ask sinfo)


class BadNodes:
    """The bad-node file of one sweep folder."""

    def __init__(self, sweep_dir: Path) -> None:
        self.path = sweep_dir / BAD_NODES_FILE

    def exclude(self) -> list[str]:
        """The nodes later submissions leave out, sorted."""
        return sorted(self._read().get("exclude") or [])

    def records(self) -> list[NodeRecord]:
        """Every node that failed or is excluded, with its counts and why it is in or out."""
        data = self._read()
        return node_records(_exclusions_of(data), _failures_of(data.get("failures") or []),
                            data.get("reasons") or {})

    def merge(self, failures: Sequence[NodeFailure],
              unhealthy: Callable[[], set[str]] = set) -> list[str]:
        """Add the failures not seen before and return the exclude list.

        A failure Slurm did not pin on a node (the batch host died with its srun) blames the
        job's nodes that `unhealthy()` (sinfo: down, drained, not responding) names now, else
        every node of the job; `unhealthy` is asked once, and only when there is such a failure."""
        if not failures and not self.path.exists():
            return []  # nothing to record, nothing recorded: no file, and no lock file either
        with self._changing():
            return self._merge(failures, unhealthy)

    def _merge(self, failures: Sequence[NodeFailure], unhealthy: Callable[[], set[str]]
               ) -> list[str]:
        data = self._read()
        now = time.time()
        known = {(f["run_id"], f.get("attempt"), f["kind"]): f for f in data.get("failures") or []}
        new = [f for f in failures if (f.run_id, f.attempt, f.kind) not in known]
        suspect = unhealthy() if any(not f.exact for f in new) else set()
        for failure in new:
            blamed = [n for n in failure.nodes if n in suspect] if not failure.exact else []
            known[(failure.run_id, failure.attempt, failure.kind)] = {
                "run_id": failure.run_id, "attempt": failure.attempt, "kind": failure.kind,
                "nodes": blamed or list(failure.nodes), "seen_at": now,
                "ended_at": failure.ended_at,
                "blame": "exact" if failure.exact else "sinfo" if blamed else "every node of the job"}
        exclusions = update_exclusions(_exclusions_of(data), _failures_of(known.values()), now)
        self._write(data, exclusions, list(known.values()))
        return list(exclusions.exclude)

    def change(self, *, forgive: Sequence[str] = (), exclude: Sequence[str] = (),
               reasons: Mapping[str, str] | None = None) -> NodeExclusions:
        """Forgive nodes (back into use; their failures so far stop counting) or exclude them,
        each with the reason in `reasons` when there is one (the fabric check's figure), which
        `sweep nodes` shows; forgiving a node drops its reason. The caller holds the sweep's
        submit lock, so that no submission reads a half-made change."""
        with self._changing():
            return self._change(forgive, exclude, reasons)

    def _change(self, forgive: Sequence[str], exclude: Sequence[str],
                reasons: Mapping[str, str] | None) -> NodeExclusions:
        data = self._read()
        changed = change_exclusions(_exclusions_of(data), forgive=forgive, exclude=exclude,
                                    now=time.time())
        self._write(data, changed, list(data.get("failures") or []),
                    {**(data.get("reasons") or {}), **(reasons or {})})
        return changed

    def suspects(self) -> dict[str, dict[str, Any]]:
        """Straggler counts per node, with the runs as evidence (`sweep collect` records them:
        sweep.collect.suspects); never part of the exclude list."""
        return dict(self._read().get("suspects") or {})

    def set_suspects(self, suspects: dict[str, dict[str, Any]]) -> None:
        """Replace the suspects with `suspects` (none: the key goes), writing only on a change."""
        if not suspects and not self.path.exists():
            return
        with self._changing():
            data = self._read()
            updated = {key: value for key, value in data.items() if key != "suspects"}
            if suspects:
                updated["suspects"] = suspects
            if updated != data:
                atomic_write_json(self.path, updated)

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold the file's lock from a read to the write that follows it. The kernel drops a
        flock when its holder dies, so a killed process leaves no stale lock."""
        lock = self.path.with_name(f".{self.path.name}.lock")
        try:
            with exclusive_lock(lock, wait_s=LOCK_WAIT_S):
                yield
        except LockHeld:
            raise UserError(f"{lock}: another process has held it for over {LOCK_WAIT_S:.0f} s "
                            f"while changing {self.path.name}; if it is stuck, stop it (`fuser "
                            f"{lock}` names it) and try again") from None

    def _read(self) -> dict[str, Any]:
        return read_json(self.path) or {}

    def _write(self, before: dict[str, Any], exclusions: NodeExclusions,
               failures: list[dict[str, Any]], reasons: Mapping[str, str] | None = None) -> None:
        """Write the file, unless it would stay as `before` (what was read from it) or, with
        no file yet, would hold nothing. The reasons (`before`'s, unless given) are kept for
        the nodes still excluded only."""
        updated: dict[str, Any] = {
            "exclude": list(exclusions.exclude), "excluded_at": dict(exclusions.excluded_at),
            "forgiven_at": dict(exclusions.forgiven_at), "failures": failures}
        given = (before.get("reasons") or {}) if reasons is None else reasons
        kept = {node: why for node, why in given.items() if node in exclusions.exclude}
        if kept:
            updated["reasons"] = kept
        if before.get("suspects"):  # collect's straggler counts (set_suspects): kept as they are
            updated["suspects"] = before["suspects"]
        if updated != before and (before or any(updated.values())):
            atomic_write_json(self.path, updated)


def _exclusions_of(data: dict[str, Any]) -> NodeExclusions:
    return NodeExclusions(tuple(data.get("exclude") or ()), data.get("excluded_at") or {},
                          data.get("forgiven_at") or {})


def _failures_of(records: Iterable[dict[str, Any]]) -> list[tuple[NodeFailure, float]]:
    """The recorded failures with when each was first seen."""
    out = []
    for record in records:
        ended = record.get("ended_at")
        failure = NodeFailure(record["run_id"], record.get("attempt"), record["kind"],
                              tuple(record["nodes"]),
                              ended_at=float(ended) if isinstance(ended, (int, float)) else None)
        out.append((failure, float(record.get("seen_at") or 0.0)))
    return out
