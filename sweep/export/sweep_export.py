"""A sweep folder exported to its trackers: what `sweep export` does, and the end-of-sweep step of
`sweep run` and the detached driver when the spec has an `export:` section.

At the end of a sweep an export never fails it: whatever goes wrong (a tracker that does not
answer, a client that is not installed) becomes a line that says so and how to retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sweep.core.trackers import TrackerTarget, parse_target
from sweep.export.base import ExportReport, TrackerMissing, TrackerUnreachable, exporter_for
from sweep.export.records import sweep_records


@dataclass(frozen=True)
class Outcome:
    """One tracker's export: its report, or why it did not happen."""

    target: str
    report: ExportReport | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.report is not None and not self.report.failed

    def line(self) -> str:
        if self.report is not None and self.problem is None:
            return self.report.summary()
        return f"{self.target}: export failed: {self.problem}"


def export_sweep(source: Path, targets: Sequence[TrackerTarget]) -> list[Outcome]:
    """Export every attempt of a sweep folder (or runs.parquet) to each target. A tracker that
    does not answer, or whose client is missing, is an Outcome with a problem; the others are
    still exported. Input errors (no runs.parquet) raise UserError."""
    records = sweep_records(source)
    folder = source if source.is_dir() else source.parent
    outcomes = []
    for target in targets:
        try:
            report = exporter_for(target, folder).export(records)
        except (TrackerUnreachable, TrackerMissing) as error:
            outcomes.append(Outcome(str(target), None, str(error)))
        else:
            outcomes.append(Outcome(str(target), report))
    return outcomes


def export_at_end(folder: Path, targets: Sequence[str]) -> tuple[bool, list[str]]:
    """The end of a sweep whose spec asks for an export: (all went well, the lines to print).
    Never raises: a sweep is done whether or not its trackers took it."""
    retry = f"retry with `sweep export {folder}`"
    try:
        outcomes = export_sweep(folder, [parse_target(t) for t in targets])
    except Exception as error:  # noqa: BLE001 - the sweep is over; the export is reported
        said = " ".join(str(error).split())[:300] or type(error).__name__
        return False, [f"export failed: {said}; {retry}"]
    lines = [f"export → {outcome.line()}" for outcome in outcomes]
    ok = all(outcome.ok for outcome in outcomes)
    if not ok:
        lines.append(f"export: not every attempt reached its tracker; the sweep is done: {retry}")
    return ok, lines
