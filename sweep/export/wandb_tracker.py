"""Export to Weights & Biases: a sweep is a group, an attempt a run (and the report one more).

Through W&B's own client, one `wandb.init` per record. A record's W&B run id is derived from its
key, so W&B itself never holds two runs of one attempt: a changed attempt resumes its run.
W&B offline (WANDB_MODE=offline) has no server to ask what it holds, so the exporter remembers
what it sent, by key and fingerprint, in the sweep folder (`export/wandb-<project>.json`: no
credential, only keys and hashes); an unchanged record is not sent again. Files go in one W&B
artifact per record, which W&B stores once per content.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from sweep.core.state import atomic_write_json
from sweep.core.trackers import TrackerTarget
from sweep.export.base import ExportReport, TrackerMissing, TrackerUnreachable
from sweep.export.records import AttemptRecord

DEFAULT_PROJECT: Final = "llm-sweep"
MAX_TAG: Final = 64  # W&B's limit on one tag's length
SHORT_TAGS: Final = ("outcome", "rule", "framework", "framework_version", "node_list")


class WandbExporter:
    def __init__(self, target: TrackerTarget, state_dir: Path) -> None:
        self.target = target
        self.state_dir = state_dir

    @property
    def project(self) -> str:
        return self.target.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT

    @property
    def entity(self) -> str | None:
        return self.target.entity or os.environ.get("WANDB_ENTITY")

    @property
    def ledger_path(self) -> Path:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{self.entity or ''}-{self.project}").strip("-")
        return self.state_dir / "export" / f"wandb-{slug}.json"

    def export(self, records: Sequence[AttemptRecord]) -> ExportReport:
        wandb = _wandb()
        sent = self._ledger()
        where = f"{self.entity + '/' if self.entity else ''}{self.project}"
        report = ExportReport(str(self.target), where=f"W&B {where} ({_mode()})")
        for record in records:
            if sent.get(record.key) == record.fingerprint:
                report.unchanged += 1
                continue
            try:
                self._send(wandb, record)
            except Exception as error:  # noqa: BLE001 - W&B raises many kinds; each is reported
                said = " ".join(str(error).split())[:300] or type(error).__name__
                if not sent and not report.sent:  # the first one failed: W&B is not there
                    raise TrackerUnreachable(f"wandb ({where}): {said}") from None
                report.failed.append(f"{record.key}: {said}")
                continue
            report.created += record.key not in sent
            report.updated += record.key in sent
            report.files_uploaded += len(record.artifacts)
            sent[record.key] = record.fingerprint
            self._remember(sent)
        return report

    def _send(self, wandb: Any, record: AttemptRecord) -> None:
        tags = record.all_tags
        run = wandb.init(
            project=self.project, entity=self.entity, group=record.sweep, name=record.name,
            id=run_id_of(record.key), resume="allow", job_type=record.kind, reinit="create_new",
            config={**record.params, "tags": tags}, tags=short_tags(tags),
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                    x_disable_meta=True, save_code=False))
        try:
            steps = sorted({step for points in record.series.values() for step, _ in points})
            by_step = {name: dict(points) for name, points in record.series.items()}
            for step in steps:
                run.log({name: values[step] for name, values in by_step.items() if step in values},
                        step=step)
            run.summary.update(dict(record.metrics))
            if record.artifacts:
                artifact = wandb.Artifact(f"{run_id_of(record.key)}-files", type=f"{record.kind}-files")
                for item in record.artifacts:
                    artifact.add_file(str(item.path), name=item.name)
                run.log_artifact(artifact)
        finally:
            run.finish(exit_code=0 if record.outcome in ("completed", "unknown") else 1)

    def _ledger(self) -> dict[str, str]:
        try:
            data = json.loads(self.ledger_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        runs = data.get("runs") if isinstance(data, dict) else None
        return {str(k): str(v) for k, v in runs.items()} if isinstance(runs, dict) else {}

    def _remember(self, sent: dict[str, str]) -> None:
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.ledger_path, {"target": str(self.target), "runs": sent})


def run_id_of(key: str) -> str:
    """A W&B run id for a record key: stable, and of the characters W&B allows."""
    return "ls-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def short_tags(tags: dict[str, str]) -> list[str]:
    """W&B's tags are short labels: `outcome:oom`, `framework:builtin`, ... (the full values,
    evidence included, are in the run's config under `tags`)."""
    return [f"{k}:{tags[k]}"[:MAX_TAG] for k in SHORT_TAGS if tags.get(k)]


def _mode() -> str:
    return os.environ.get("WANDB_MODE", "online")


def _wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise TrackerMissing("wandb: its client is not installed; pip install "
                             "'llm-sweep[wandb]'") from None
    return wandb
