"""Read back what W&B offline wrote: each offline run folder's `run-<id>.wandb`, a LevelDB-style
log of W&B's own protobuf records (`wandb.proto.wandb_internal_pb2.Record`), decoded with W&B's
own message classes. wandb 0.31 has no Python reader of its own (its Go core reads them), so the
log's framing (32 KiB blocks of CRC, length, type, data) is undone here."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # b":W&B" + magic (2 bytes) + version (1 byte)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    folder: Path
    run_id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    entity: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifact_files: dict[str, int] = field(default_factory=dict)  # name in the artifact: size
    exit_code: int | None = None


def records(path: Path) -> list[bytes]:
    """The payloads of a .wandb file, reassembled across blocks."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    out, pending, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(folder: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = folder.glob("run-*.wandb")
    run = OfflineRun(folder)
    for payload in records(path):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id, run.name, run.group = r.run_id, r.display_name, r.run_group
            run.project, run.entity, run.job_type = r.project, r.entity, r.job_type
            run.tags = list(r.tags)
            run.config.update({_key(i): json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            run.config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "artifact":
            run.artifact_files.update({e.path: e.size for e in record.artifact.manifest.contents})
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every offline run under WANDB_DIR (its wandb/offline-run-* folders), oldest first."""
    return [read_run(folder) for folder in sorted((wandb_dir / "wandb").glob("offline-run-*"))]
