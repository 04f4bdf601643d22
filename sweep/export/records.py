"""What a tracker receives of one attempt: its parameters, metrics, step series, tags and files,
read from runs.parquet and the sweep folder, the same for every tracker.

One attempt of one run becomes one tracker run, keyed by `<sweep>/<run_id>/<attempt>`; the
report's figures go to one more run per sweep, keyed `<sweep>/report`. A record's fingerprint
covers everything a tracker is sent (file sizes included), so a second export of an unchanged
attempt is skipped without comparing the tracker's contents item by item.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sweep.collect.attempt_metrics import read_metrics
from sweep.core.errors import UserError
from sweep.core.state import ATTEMPTS_DIR, METRICS_FILE, RUN_FILE

RUNS_FILE: Final = "runs.parquet"
REPORT_DIR: Final = "report"
KEY_TAG: Final = "sweep.key"  # the tag (MLflow) or config key (W&B) a record is found by
FINGERPRINT_TAG: Final = "sweep.fingerprint"
KIND_TAG: Final = "sweep.kind"  # attempt | report

# The layout and settings: a tracker's parameters (run settings follow as settings.<key>).
PARAM_COLUMNS: Final = (
    "framework", "model", "model_params", "nodes", "gpus_per_node", "world_size", "gpu", "dtype",
    "seq_len", "global_batch_sequences", "global_batch_tokens", "dp", "tp", "pp", "cp", "ep", "mbs",
    "grad_acc", "zero_stage", "recompute", "sp", "pp_schedule", "vpp", "layout_label", "steps",
    "warmup_steps")
# What the attempt measured: tokens/s, MFU under each convention, the memory peaks, step times.
METRIC_COLUMNS: Final = (
    "step_time_mean_s", "step_time_std_s", "step_time_n", "tokens_per_sec", "tokens_per_sec_per_gpu",
    "mfu_megatron", "mfu_full_attention", "mfu_6N", "mfu_reported", "peak_flops",
    "flops_per_token_megatron", "flops_per_token_full_attention", "flops_per_token_6N",
    "mem_allocated_bytes", "mem_reserved_bytes", "mem_oom_needed_bytes",
    "mem_outside_allocator_bytes", "mem_predicted_allocated_bytes", "mem_predicted_reserved_bytes",
    "mem_predicted_total_bytes", "final_loss", "last_step", "elapsed_s", "gpu_hours")
# The outcome, the rule and its evidence, the framework and its version, the nodes.
TAG_COLUMNS: Final = (
    "outcome", "reason", "rule", "evidence", "status_source", "framework", "framework_version",
    "node_list", "hostname", "slurm_job_id", "slurm_state", "mfu_reported_convention",
    "peak_flops_source", "metrics_source", "torch_version", "harness_version", "harness_git_sha",
    "collect_issues")
# Per-step series from the step records (metrics.jsonl, or the framework's log lines).
# (A series' name is none of the metrics': a tracker shows a series' last point as its value.)
SERIES: Final = {"step_time_s": "step_time_s", "loss": "loss", "step_tokens_per_sec": "tokens_per_sec"}
_SKIPPED_FILES: Final = (".lock", ".tmp")


@dataclass(frozen=True)
class Artifact:
    """A file to upload: where it is, the name it gets in the tracker run, its size."""

    path: Path
    name: str  # e.g. run/job.sbatch, attempt/logs/node0.out, report/heatmap_best.png
    size: int


@dataclass(frozen=True)
class AttemptRecord:
    """One tracker run: an attempt (kind `attempt`) or a sweep's report (kind `report`)."""

    sweep: str
    run_id: str
    attempt: int  # 0 for the report
    kind: str
    params: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    series: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    artifacts: tuple[Artifact, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def key(self) -> str:
        """What makes a second export update this run instead of adding one."""
        if self.kind == "report":
            return f"{self.sweep}/report"
        return f"{self.sweep}/{self.run_id}/{self.attempt}"

    @property
    def name(self) -> str:
        return "report" if self.kind == "report" else f"{self.run_id} #{self.attempt}"

    @property
    def outcome(self) -> str:
        return self.tags.get("outcome", "unknown")

    @property
    def fingerprint(self) -> str:
        """A hash of everything a tracker is sent: an unchanged attempt has the same one."""
        content = {"params": dict(self.params), "metrics": dict(self.metrics),
                   "series": {k: list(v) for k, v in self.series.items()}, "tags": dict(self.tags),
                   "artifacts": [(a.name, a.size) for a in self.artifacts],
                   "times": [self.started_at, self.ended_at]}
        text = json.dumps(content, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    @property
    def all_tags(self) -> dict[str, str]:
        """The tags with the identity a tracker finds the run by."""
        return {**self.tags, KEY_TAG: self.key, KIND_TAG: self.kind, "sweep.name": self.sweep,
                "sweep.run_id": self.run_id, "sweep.attempt": str(self.attempt)}


def runs_path(source: Path) -> Path:
    """The runs.parquet of a sweep folder, or the file given; a UserError naming the fix."""
    path = source / RUNS_FILE if source.is_dir() else source
    if not path.is_file():
        hint = (f"run `sweep collect {source}` first" if source.is_dir()
                else "give a sweep folder or its runs.parquet")
        raise UserError(f"{path}: no such file; {hint}")
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a runs.parquet, or a UserError that names the file and the fix."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as error:
        raise UserError(f"{path}: cannot read it as parquet ({error}); `sweep collect "
                        f"{path.parent} --full` rebuilds it from the attempt folders") from None


def sweep_records(source: Path) -> list[AttemptRecord]:
    """Every attempt of a sweep folder (or of a runs.parquet, with the folder beside it), then
    the report run when the folder has a report."""
    path = runs_path(source)
    folder = path.parent
    records = [attempt_record(row, folder) for row in read_rows(path)]
    sweeps = sorted({r.sweep for r in records})
    report = report_record(sweeps[0], folder / REPORT_DIR) if len(sweeps) == 1 else None
    return records + ([report] if report is not None else [])


def attempt_record(row: Mapping[str, Any], folder: Path) -> AttemptRecord:
    """One runs.parquet row, with its run folder's files and step series when they are there
    (a synthetic or imported table has none)."""
    run_id, attempt = str(row["run_id"]), int(row.get("attempt") or 1)
    attempt_dir = folder / str(row["attempt_dir"]) if row.get("attempt_dir") else None
    run_dir = folder / "runs" / run_id
    return AttemptRecord(
        sweep=str(row["sweep"]), run_id=run_id, attempt=attempt, kind="attempt",
        params=params_of(row), metrics=metrics_of(row), tags=tags_of(row),
        series=series_of(attempt_dir) if attempt_dir is not None else {},
        artifacts=tuple(attempt_artifacts(run_dir, attempt_dir)),
        started_at=_number(row.get("started_at")), ended_at=_number(row.get("ended_at")))


def report_record(sweep: str, report_dir: Path) -> AttemptRecord | None:
    """The report's figures and tables as one run of the sweep's experiment (group)."""
    files = [Artifact(p, f"report/{p.name}", p.stat().st_size)
             for p in sorted(report_dir.glob("*")) if p.is_file() and not p.name.startswith(".")]
    if not files:
        return None
    return AttemptRecord(sweep=sweep, run_id="report", attempt=0, kind="report",
                         artifacts=tuple(files))


def params_of(row: Mapping[str, Any]) -> dict[str, str]:
    """The layout and the run settings, as strings (trackers store parameters as text)."""
    params = {name: _text(row.get(name)) for name in PARAM_COLUMNS if row.get(name) is not None}
    try:
        settings = json.loads(row.get("settings_json") or "{}")
    except ValueError:
        settings = {}
    for key, value in sorted(settings.items()) if isinstance(settings, dict) else ():
        if value is not None and f"settings.{key}" not in params:
            params[f"settings.{key}"] = _text(value)
    return params


def metrics_of(row: Mapping[str, Any]) -> dict[str, float]:
    """The attempt's figures; a missing or NaN figure is left out, not sent as 0."""
    metrics = {}
    for name in METRIC_COLUMNS:
        value = _number(row.get(name))
        if value is not None:
            metrics[name] = value
    return metrics


def tags_of(row: Mapping[str, Any]) -> dict[str, str]:
    """The outcome and why, the framework and its version, the nodes; lists one item a line."""
    tags = {}
    for name in TAG_COLUMNS:
        value = row.get(name)
        if isinstance(value, (list, tuple)) or (value is not None and hasattr(value, "tolist")):
            value = "\n".join(str(v) for v in list(value))
        if value not in (None, ""):
            tags[name] = str(value)
    return tags


def series_of(attempt_dir: Path) -> dict[str, tuple[tuple[int, float], ...]]:
    """Per-step series of an attempt: the step records of its metrics.jsonl (the built-in
    workload). Frameworks that log to text have their step statistics in the metrics, not
    here."""
    steps, _summary = read_metrics(attempt_dir / METRICS_FILE, [])
    series: dict[str, tuple[tuple[int, float], ...]] = {}
    for name, key in SERIES.items():
        points = tuple((int(s["step"]), float(v)) for s in steps
                       if s.get("step") is not None and (v := _number(s.get(key))) is not None)
        if points:
            series[name] = points
    return series


def attempt_artifacts(run_dir: Path, attempt_dir: Path | None) -> Iterator[Artifact]:
    """The run's job.sbatch and run.json, and the attempt's files: status, metrics, watchdog
    records and logs (a link, such as job.out, is followed to the Slurm log it names)."""
    for name in ("job.sbatch", RUN_FILE):
        path = run_dir / name
        if path.is_file():
            yield Artifact(path, f"run/{name}", path.stat().st_size)
    if attempt_dir is None or not attempt_dir.is_dir():
        return
    yield from _files_under(attempt_dir, "attempt")


def _files_under(folder: Path, prefix: str) -> Iterator[Artifact]:
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name.endswith(_SKIPPED_FILES):
            continue
        if path.is_dir() and not path.is_symlink() and path.name != ATTEMPTS_DIR:
            yield from _files_under(path, f"{prefix}/{path.name}")
        elif path.is_file():
            yield Artifact(path, f"{prefix}/{path.name}", path.stat().st_size)


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """`items` in slices of at most `size` (trackers cap what one call carries)."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)
