"""Attempt folders (+ Slurm accounting rows) → one runs.parquet row per attempt.

Collect must never lose a sweep to one bad run: a missing, truncated or corrupt file becomes a
`collect_issues` entry on that row, never an exception. It is incremental (a row whose files did
not change is reused from the previous runs.parquet, by fingerprint) and idempotent (the same
folders give the same table). What an attempt measured (steps, memory, MFU) is read by
`sweep.collect.attempt_metrics`; this module adds its outcome, Slurm's accounting and its provenance.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sweep.backends.local.backend import ACCOUNTING_FILE as LOCAL_ACCOUNTING_FILE
from sweep.collect import cuda_oom
from sweep.collect.attempt_metrics import metric_columns
from sweep.collect.cpu_peaks import raise_measured_peaks, write_raised
from sweep.collect.rows import (
    config_columns,
    env_job_id,
    provenance_columns,
)
from sweep.collect.schema import OUTCOMES, SCHEMA_VERSION, arrow_schema, to_table
from sweep.collect.suspects import record_suspects
from sweep.core.runconfig import RunConfig
from sweep.core.slurm_states import node_failures_in_srun_output
from sweep.core.state import ENV_FILE, RUN_FILE, STATUS_FILE, attempt_dirs
from sweep.job.verdict import SRUN_BLAME_SETTLED, srun_blame_lines

RUNS_FILE = "runs.parquet"


@dataclass(frozen=True)
class CollectResult:
    table: pa.Table
    computed: int
    reused: int
    with_issues: list[str] = field(default_factory=list)  # attempt_dir of rows with issues
    raised_peaks: list[dict[str, Any]] = field(default_factory=list)  # sweep.collect.cpu_peaks
    suspects: dict[str, dict[str, Any]] = field(default_factory=dict)  # sweep.collect.suspects


# ---------------------------------------------------------------- file readers

def _read_json(path: Path, issues: list[str]) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        issues.append(f"{path.name}: unreadable ({type(error).__name__}: {error})")
        return None


def _fingerprint(attempt_dir: Path, run_dir: Path, extra: str) -> str:
    parts = []
    for directory in (run_dir, attempt_dir, attempt_dir / "logs"):
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_file() and (directory != run_dir or entry.name == RUN_FILE):
                stat = entry.stat()
                parts.append(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts) + (f"|acct:{extra}" if extra else "")


# ---------------------------------------------------------------- one attempt

def _first(mapping: Mapping[str, Any] | None, *keys: str) -> Any:
    for key in keys:
        if mapping and mapping.get(key) not in (None, ""):
            return mapping[key]
    return None


def _status_from_nodes(attempt_dir: Path, issues: list[str]) -> dict[str, Any] | None:
    verdicts = [v for p in sorted(attempt_dir.glob("node*.json"))
                if isinstance(v := _read_json(p, issues), dict)]
    if not verdicts:
        return None
    failed = [v for v in verdicts if v.get("outcome") != "completed"]
    return failed[0] if failed else verdicts[0]


def _outcome_from_accounting(acct: Mapping[str, Any]) -> tuple[str, str]:
    from sweep.core.slurm_states import outcome_from_sacct

    job = acct["job"]
    state = str(_first(job, "State", "state") or "")
    try:
        verdict = outcome_from_sacct(state, _first(job, "ExitCode"), _first(job, "DerivedExitCode"),
                                     [str(_first(step, "State", "state") or "") for step in acct["steps"]])
    except ValueError as error:
        return "unknown", f"sacct:{state} ({error})"
    if verdict is None:
        return "unknown", f"sacct:{state} (may still run)"
    return verdict[0], f"sacct:{state} ({verdict[1]})"


def _parse_time(value: Any) -> float | None:
    if value in (None, "", "Unknown", "None"):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    from datetime import datetime
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def collect_attempt(sweep_dir: Path, run_dir: Path, attempt_dir: Path,
                    accounting: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One row; every problem lands in `collect_issues`, nothing raises for bad files.

    `accounting`: sacct rows grouped by job id, as `_accounting_index` builds them.
    """
    issues: list[str] = []
    row: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "run_id": run_dir.name, "source": "collect",
        "attempt": int(attempt_dir.name), "attempt_dir": attempt_dir.relative_to(sweep_dir).as_posix(),
        "collected_at": time.time(),
    }
    config, checked_run_id = _load_config(run_dir, issues)
    if config is not None:
        row.update(config_columns(config, run_id=checked_run_id))
    env = _read_json(attempt_dir / ENV_FILE, issues)
    env = env if isinstance(env, dict) else {}
    status = _read_json(attempt_dir / STATUS_FILE, issues)
    row["status_source"] = STATUS_FILE
    if not isinstance(status, dict):
        status = _status_from_nodes(attempt_dir, issues)
        row["status_source"] = "node-files" if status else "none"
        if status:
            issues.append("status.json missing: verdict taken from the node files")
    status = status or {}
    blame = srun_blame_lines(attempt_dir) if status.get("outcome") not in SRUN_BLAME_SETTLED else []
    if (blamed := node_failures_in_srun_output("\n".join(blame))) is not None:
        # srun lost a node or could not start the step on one: that is the cause, whatever a
        # watchdog concluded before the line was written (and sacct reads a failed step launch
        # as a crash). `sweep status` decides the same way.
        status = {**status, "outcome": "node_fail", "rule": "slurm_node_failure",
                  "reason": f"{blamed[0]}: {','.join(blamed[1])}", "evidence": blame}
        row["status_source"] = "srun"
    # An array task is `<array>_<task>` in sacct, while its status.json has the task's own id.
    job_id = env_job_id(env) if env.get("slurm_array") else \
        (_first(status, "slurm_job_id") or env_job_id(env) or job_id_from_output_link(attempt_dir))
    acct = _accounting_of(accounting or {}, job_id)
    if acct is None:  # the local backend leaves its sacct-like row in the attempt folder
        local_row = _read_json(attempt_dir / LOCAL_ACCOUNTING_FILE, issues)
        if isinstance(local_row, dict) and local_row.get("State"):
            acct = {"job": local_row, "steps": []}
            job_id = job_id if job_id is not None else local_row.get("JobID")
    _outcome_columns(row, status, acct, issues)
    nodes = env.get("nodes") if isinstance(env.get("nodes"), list) else status.get("nodes")
    metric_columns(row, attempt_dir, config, issues, nodes=[str(n) for n in nodes or []])
    _oom_columns(row)
    summary_torch = row.pop("torch_version", None)
    _slurm_columns(row, status, env, acct, job_id)
    row.update(provenance_columns(env, row.get("framework")))
    row["hostname"] = _first(status, "hostname") or row["hostname"]
    row["torch_version"] = row["torch_version"] or summary_torch
    row["collect_issues"] = issues
    return row


def _oom_columns(row: dict[str, Any]) -> None:
    """What PyTorch's OOM message says the run needed (sweep.collect.cuda_oom): its sampled peaks stop
    before the peak it could not reach."""
    if row.get("outcome") != "oom":
        return
    figures = cuda_oom.largest(row.get("evidence") or [])
    if figures is not None:
        row["mem_oom_needed_bytes"] = float(figures.needed_bytes)
        if figures.outside_allocator_bytes is not None:
            # the message's figure is taken at the failure, later than any step's sample
            row["mem_outside_allocator_bytes"] = max(float(figures.outside_allocator_bytes),
                                                     float(row.get("mem_outside_allocator_bytes") or 0))


def _accounting_of(accounting: Mapping[str, Mapping[str, Any]], job_id: Any) -> Any:
    """The sacct entry of an attempt's job. An array task is `<array>_<task>`, except where sacct
    still shows the array by its master id alone (a one-task array, or one never split off, as
    `sweep status` also reads it)."""
    if job_id is None:
        return None
    job = str(job_id)
    return accounting.get(job) or (accounting.get(job.split("_")[0]) if "_" in job else None)


def _load_config(run_dir: Path, issues: list[str]) -> tuple[RunConfig | None, str | None]:
    """run.json's configuration, and its run_id once RunConfig.from_json has checked it
    against the content (so it need not be hashed again)."""
    data = _read_json(run_dir / RUN_FILE, issues)
    if data is None:
        if not any(i.startswith(RUN_FILE) for i in issues):
            issues.append(f"{RUN_FILE}: missing; configuration columns are empty")
        return None, None
    try:
        return RunConfig.from_json(data), data.get("run_id")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        issues.append(f"{RUN_FILE}: invalid ({type(error).__name__}: {error})")
        return None, None


def _outcome_columns(row: dict[str, Any], status: Mapping[str, Any],
                     acct: Mapping[str, Any] | None, issues: list[str]) -> None:
    outcome = status.get("outcome")
    if outcome is None and acct is not None:
        outcome, row["reason"] = _outcome_from_accounting(acct)
        row["status_source"] = "sacct"
    elif outcome is None:
        outcome = "unknown"
        row["reason"] = "no status.json, node files or Slurm accounting: still running, or killed"
    elif outcome not in OUTCOMES:
        issues.append(f"status.json: outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        outcome = "unknown"
    row["outcome"] = outcome
    row.setdefault("reason", status.get("reason"))
    row["rule"] = status.get("rule")
    evidence = status.get("evidence") or []
    row["evidence"] = evidence if isinstance(evidence, list) else [str(evidence)]
    row["last_step"] = status.get("last_step")
    row["ended_by"] = status.get("ended_by")  # the watchdog's word; a builtin summary's wins
    if status.get("exit_codes") is not None:
        row["exit_codes_json"] = json.dumps(status["exit_codes"], sort_keys=True)


def _slurm_columns(row: dict[str, Any], status: Mapping[str, Any], env: Mapping[str, Any],
                   entry: Mapping[str, Any] | None, job_id: Any) -> None:
    acct = entry["job"] if entry is not None else None
    row["slurm_job_id"] = str(job_id) if job_id is not None else None
    nodes = status.get("nodes")
    nodes = nodes or env.get("nodes")
    row["node_list"] = ",".join(nodes) if isinstance(nodes, list) else nodes
    started, ended = _parse_time(status.get("started_at")), _parse_time(status.get("ended_at"))
    elapsed = ended - started if started is not None and ended is not None else None
    if acct is not None:
        row["slurm_state"] = _first(acct, "State", "state")
        row["node_list"] = _first(acct, "NodeList", "node_list") or row["node_list"]
        started = started if started is not None else _parse_time(_first(acct, "Start", "start"))
        ended = ended if ended is not None else _parse_time(_first(acct, "End", "end"))
        raw = _first(acct, "ElapsedRaw", "elapsed_s")
        elapsed = float(raw) if raw is not None else elapsed
        if elapsed is None and started is not None and ended is not None:
            elapsed = ended - started
    row["started_at"], row["ended_at"], row["elapsed_s"] = started, ended, elapsed
    if elapsed is not None and row.get("world_size"):
        row["gpu_hours"] = elapsed * row["world_size"] / 3600.0


# ---------------------------------------------------------------- a whole sweep

def _accounting_index(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """sacct rows by job id: the allocation row, and its steps (`123.batch`, `123.0`)."""
    index: dict[str, dict[str, Any]] = {}
    for row in rows:
        job_id = str(_first(row, "JobID", "job_id") or "")
        if not job_id:
            continue
        base, _, step = job_id.partition(".")
        entry = index.setdefault(base, {"job": {}, "steps": []})
        if step:
            entry["steps"].append(row)
        else:
            entry["job"] = row
    return {job: entry for job, entry in index.items() if entry["job"]}


def collect_sweep(sweep_dir: str | Path, previous: pa.Table | None = None,
                  accounting: Iterable[Mapping[str, Any]] = ()) -> CollectResult:
    """Rows for every attempt folder under SWEEP_DIR/runs; unchanged rows come from `previous`."""
    sweep_dir = Path(sweep_dir)
    acct = _accounting_index(accounting)
    acct_key = {job: json.dumps(row, sort_keys=True, default=str) for job, row in acct.items()}
    known: dict[str, tuple[int, str]] = {}
    if previous is not None and previous.num_rows and "source_fingerprint" in previous.column_names:
        for index, (path, print_) in enumerate(zip(previous.column("attempt_dir").to_pylist(),
                                                   previous.column("source_fingerprint").to_pylist())):
            known[path] = (index, print_)
    reuse: list[int] = []
    fresh: list[dict[str, Any]] = []
    runs_root = sweep_dir / "runs"
    run_dirs = sorted(p for p in runs_root.iterdir() if p.is_dir()) if runs_root.is_dir() else []
    for run_dir in run_dirs:
        for attempt_dir in attempt_dirs(run_dir):
            rel = attempt_dir.relative_to(sweep_dir).as_posix()
            job = _job_hint(attempt_dir) if acct else None
            fingerprint = _fingerprint(attempt_dir, run_dir, acct_key.get(job, "") if job else "")
            hit = known.get(rel)
            if hit is not None and hit[1] == fingerprint:
                reuse.append(hit[0])
                continue
            try:
                row = collect_attempt(sweep_dir, run_dir, attempt_dir, acct)
            except Exception as error:  # noqa: BLE001 - one bad attempt must not stop the sweep
                row = {"schema_version": SCHEMA_VERSION, "run_id": run_dir.name,
                       "attempt": int(attempt_dir.name), "attempt_dir": rel, "source": "collect",
                       "outcome": "unknown", "collected_at": time.time(),
                       "collect_issues": [f"collect failed: {type(error).__name__}: {error}"]}
            row["source_fingerprint"] = fingerprint
            fresh.append(row)
    parts = [to_table(fresh)]
    if reuse and previous is not None:
        parts.insert(0, previous.select(list(arrow_schema().names)).cast(arrow_schema()).take(reuse))
    table = pa.concat_tables(parts).sort_by([("run_id", "ascending"), ("attempt", "ascending")])
    # a CPU peak that a run beat is raised for every run of the sweep (after reuse: the rule
    # spans the whole table)
    table, raised = raise_measured_peaks(table)
    issues = [r["attempt_dir"] for r in fresh if r.get("collect_issues")]
    return CollectResult(table=table, computed=len(fresh), reused=len(reuse), with_issues=issues,
                         raised_peaks=raised)


def update_runs(sweep_dir: str | Path, out: str | Path | None = None,
                accounting: Iterable[Mapping[str, Any]] = (),
                full: bool = False) -> tuple[CollectResult, Path]:
    """Collect SWEEP_DIR into OUT (default SWEEP_DIR/runs.parquet), reusing its unchanged rows."""
    out = Path(out) if out is not None else Path(sweep_dir) / RUNS_FILE
    previous = None if full else read_runs(out)
    result = collect_sweep(sweep_dir, previous=previous, accounting=accounting)
    write_raised(Path(sweep_dir), result.raised_peaks)
    write_runs(result.table, out)
    # straggler nodes counted over the whole table, into bad_nodes.json (never excluded)
    result = dataclasses.replace(result, suspects=record_suspects(Path(sweep_dir), result.table))
    return result, out


def job_ids(sweep_dir: str | Path) -> list[str]:
    """The Slurm job ids the sweep's attempts ran under (for one sacct query)."""
    runs_root = Path(sweep_dir) / "runs"
    run_dirs = sorted(p for p in runs_root.iterdir() if p.is_dir()) if runs_root.is_dir() else []
    hints = (_job_hint(attempt) for run_dir in run_dirs for attempt in attempt_dirs(run_dir))
    return sorted({job for job in hints if job})


_SLURM_OUTPUT = re.compile(r"slurm-(\d+(?:_\d+)?)\.(?:out|err)$")


def job_id_from_output_link(attempt_dir: Path) -> str | None:
    """The job id in the name of Slurm's own output file, which job.sbatch links into the
    attempt folder as its first act (`slurm-<job>.out`, `slurm-<array>_<task>.out`): the one
    record of a job that died before it wrote env.json (a missing interpreter, say)."""
    for name in ("job.out", "job.err"):
        try:
            target = os.readlink(attempt_dir / name)
        except OSError:
            continue
        match = _SLURM_OUTPUT.search(target)
        if match:
            return match[1]
    return None


def _job_hint(attempt_dir: Path) -> str | None:
    """The Slurm job id an attempt ran under (env.json, status.json, or the name of Slurm's
    output file), cheaply."""
    for name in (ENV_FILE, STATUS_FILE):
        try:
            data = json.loads((attempt_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        job = _first(data, "slurm_job_id") if name == STATUS_FILE else env_job_id(data)
        if job is not None:
            return str(job)
    return job_id_from_output_link(attempt_dir)


def unreadable_runs(path: str | Path, error: object) -> str:
    """The error of a runs table that cannot be read as parquet, with the fix: `sweep collect`
    rebuilds a sweep's runs.parquet from its attempt folders (an unreadable one is recomputed)."""
    path = Path(path)
    folder = path.parent if path.name == RUNS_FILE else Path("SWEEP_DIR")
    return (f"{path}: cannot read it as parquet ({error}); if it is a sweep's runs.parquet (cut "
            f"short by a crash or a copy), `sweep collect {folder} --full` rebuilds it from the "
            "attempt folders (add --sacct for a Slurm sweep's accounting)")


def read_runs(path: str | Path) -> pa.Table | None:
    """A previous runs.parquet to reuse rows from; None when absent, unreadable (a crash while
    writing it), from another schema version, or written before a column was added: then every
    row is computed again."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return None
    meta = table.schema.metadata or {}
    if meta.get(b"llm_sweep_schema_version") != str(SCHEMA_VERSION).encode():
        return None
    if not set(arrow_schema().names) <= set(table.column_names):
        return None
    return table


def write_runs(table: pa.Table, path: str | Path) -> None:
    """Write atomically: a reader sees the old table or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
