"""The resolved configuration of one run: what `run.json` holds.

`run.json` is the single source for everything a run does: the sbatch script, the launch files,
the watchdog and the built-in workload all read it. The run id is a hash of the benchmark's
identity (model shape, layout, hardware, batch, framework), not of its run settings, so that a
longer time limit or a retry keeps the same id. Pure apart from `load`/`save`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.core.layout import Layout
from sweep.core.model import ModelShape

RUN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunConfig:
    sweep: str
    framework: str
    model: ModelShape
    layout: Layout
    nodes: int
    gpus_per_node: int
    gpu: str
    dtype: str
    seq_len: int
    global_batch_sequences: int
    settings: dict[str, Any] = field(default_factory=dict, hash=False)  # RunSettings, as JSON
    spec_hash: str = ""
    predicted: dict[str, float] = field(default_factory=dict, hash=False)  # memory/throughput model

    @property
    def run_id(self) -> str:
        identity = {
            "framework": self.framework,
            "model": _shape_identity(self.model),
            "layout": self.layout.to_dict(),
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu,
            "dtype": self.dtype,
            "seq_len": self.seq_len,
            "global_batch_sequences": self.global_batch_sequences,
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return f"{self.model.name}-n{self.nodes}-{digest[:10]}"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA_VERSION,
            "run_id": self.run_id,
            "sweep": self.sweep,
            "spec_hash": self.spec_hash,
            "framework": self.framework,
            "model": dataclasses.asdict(self.model),
            "layout": self.layout.to_dict(),
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu,
            "dtype": self.dtype,
            "seq_len": self.seq_len,
            "global_batch_sequences": self.global_batch_sequences,
            "settings": self.settings,
            "predicted": self.predicted,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunConfig:
        if data.get("schema") != RUN_SCHEMA_VERSION:
            raise ValueError(f"run.json schema {data.get('schema')!r} is not {RUN_SCHEMA_VERSION}")
        config = cls(
            sweep=data["sweep"], framework=data["framework"], model=ModelShape(**data["model"]),
            layout=Layout(**data["layout"]), nodes=data["nodes"],
            gpus_per_node=data["gpus_per_node"], gpu=data["gpu"], dtype=data["dtype"],
            seq_len=data["seq_len"], global_batch_sequences=data["global_batch_sequences"],
            settings=data.get("settings", {}), spec_hash=data.get("spec_hash", ""),
            predicted=data.get("predicted", {}))
        if data.get("run_id") not in (None, config.run_id):
            raise ValueError(f"run.json run_id {data['run_id']!r} does not match its content "
                             f"({config.run_id!r}); was the file edited by hand?")
        return config


def _shape_identity(shape: ModelShape) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(shape).items() if k != "source"}


def load(path: str | Path) -> RunConfig:
    """Read a run.json (or the run.json inside a run directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "run.json"
    return RunConfig.from_json(json.loads(path.read_text(encoding="utf-8")))
