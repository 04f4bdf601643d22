"""One interface for every experiment tracker: an Exporter takes a sweep's records and returns
what it did. A tracker is one module (`mlflow_tracker`, `wandb_tracker`) and one line in
`exporter_for`; its client library is imported there, only when something is exported, so
`sweep status` never loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sweep.core.trackers import TrackerTarget
from sweep.export.records import AttemptRecord


class TrackerUnreachable(Exception):
    """The tracker did not answer (or refused the credentials): nothing is lost, a later
    `sweep export` sends what this one could not."""


class TrackerMissing(Exception):
    """The tracker's client library is not installed; the message names the pip extra."""


@dataclass
class ExportReport:
    """What one export did to one tracker."""

    target: str
    where: str = ""  # the experiment or project it wrote to
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    files_uploaded: int = 0
    files_skipped: int = 0  # already there with the same size
    failed: list[str] = field(default_factory=list)  # "<key>: <why>", one per record not sent

    @property
    def sent(self) -> int:
        return self.created + self.updated

    def summary(self) -> str:
        line = (f"{self.target}: {self.created} run(s) created, {self.updated} updated, "
                f"{self.unchanged} unchanged; {self.files_uploaded} file(s) uploaded, "
                f"{self.files_skipped} already there")
        if self.where:
            line += f" → {self.where}"
        if self.failed:
            line += f"; {len(self.failed)} failed (first: {self.failed[0]})"
        return line


class Exporter(Protocol):
    """Sends records to one tracker. Idempotent: a record already there with the same
    fingerprint is left as it is, a changed one updates its run, and none is ever added
    twice (the key is `<sweep>/<run_id>/<attempt>`)."""

    target: TrackerTarget

    def export(self, records: Sequence[AttemptRecord]) -> ExportReport: ...


def exporter_for(target: TrackerTarget, state_dir: Path) -> Exporter:
    """The exporter of a tracker. `state_dir`: a folder of the sweep where an exporter that
    cannot ask its tracker what it holds (W&B offline) remembers what it sent."""
    if target.kind == "mlflow":
        from sweep.export.mlflow_tracker import MlflowExporter

        return MlflowExporter(target)
    from sweep.export.wandb_tracker import WandbExporter

    return WandbExporter(target, state_dir)
