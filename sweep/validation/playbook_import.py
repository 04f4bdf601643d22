"""The Ultra-Scale Playbook's published runs → runs.parquet rows, so the analysis runs on real data.

Two published formats are read (see $SWEEP_REFDATA/README.md):
- the charts' runs table (`playbook_runs_*.csv`: model_label, status success/failed, mfu_pct, …);
- the sweep's own results table (`playbook_bench_full_*.csv`: job_id, name, status
  Success/OOM/Other, `Mem Alloc (GB)`, `Mem Res (GB)`, …), which tells OOM from other failures.

Every published number is kept as published: the reported MFU in `mfu_reported` (its basis is
not one convention, see `flops_per_token_reported`), memory in bytes (the playbook's "GB" are GiB,
rank 0's max_memory_reserved). MFU under each named convention is recomputed from tokens/s/GPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

import pandas as pd

from sweep.calibration.runs_table import measured_inter_node
from sweep.calibration.throughput_fit import fit_exclusion_reasons
from sweep.collect.rows import config_columns, dense_peak, mfu_columns
from sweep.collect.schema import SCHEMA_VERSION
from sweep.core import catalog
from sweep.core.layout import Layout
from sweep.core.runconfig import RunConfig
from sweep.core.units import GiB

SWEEP: Final = "ultrascale-playbook"
GPU: Final = "h100-sxm"
DTYPE: Final = "bf16"
GPUS_PER_NODE: Final = 8
POLICY: Final = ("as published: nanotron's benchmark mode logs one throughput sample per run "
                 "(iteration 4); no step-time statistics were published")
RUNS_COLUMNS: Final = ("model_label", "nodes", "dp", "tp", "pp", "mbs", "grad_acc", "zero_stage",
                       "seq_len", "status", "mfu_pct", "tokens_per_sec_per_gpu", "tokens_per_sec",
                       "gpu_memory_GB")
BENCH_COLUMNS: Final = ("job_id", "name", "nodes", "seq_len", "mbs", "batch_accum", "dp", "tp",
                        "pp", "zero_stage", "status", "mfu", "tok/s/gpu", "Mem Alloc (GB)",
                        "Mem Res (GB)", "oom_error")


class PlaybookFormatError(ValueError):
    """A published file that does not have the expected shape; the message names file and fix."""


def import_playbook(path: str | Path) -> list[dict[str, Any]]:
    """Rows in the runs.parquet schema, one per published run (file order kept)."""
    path = Path(path)
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise PlaybookFormatError(f"{path}: cannot read it as CSV ({error})") from None
    if "model_label" in frame.columns:
        _require(frame, RUNS_COLUMNS, path, "playbook_runs_*.csv")
        convert = _runs_row
    elif "job_id" in frame.columns and "name" in frame.columns:
        _require(frame, BENCH_COLUMNS, path, "playbook_bench_full_*.csv")
        convert = _bench_row
    else:
        raise PlaybookFormatError(f"{path}: neither the playbook runs format (a `model_label` column) nor "
                           "its results-table format (`job_id` and `name` columns); pass a file "
                           "shaped like $SWEEP_REFDATA/playbook_runs_1B_8B.csv")
    rows = [convert(record, path, line) for line, record in enumerate(frame.to_dict("records"), 2)]
    if convert is _bench_row:
        _fit_conditions(rows, frame)
    seen: dict[str, int] = {}
    for row in rows:  # a repeated configuration is another attempt of the same run
        seen[row["run_id"]] = row["attempt"] = seen.get(row["run_id"], 0) + 1
    return rows


def _fit_conditions(rows: list[dict[str, Any]], frame: pd.DataFrame) -> None:
    """What nanotron's results table says about the conditions each run met, kept so that a fit
    on the imported runs.parquet is the fit on the table: the network its job measured across
    its nodes (`AllReduce (GB/s)`, multi-node runs only), and why a run is left out of
    throughput fits (`sweep.calibration.throughput_fit.fit_exclusion_reasons`: pipeline runs from before
    nanotron's 1F1B fix, runs on a node whose NVLink measured degraded). Both need the whole
    table: the second compares each job with the table's median."""
    reasons = fit_exclusion_reasons(frame)
    for row, reason, busbw in zip(rows, reasons, measured_inter_node(frame), strict=True):
        row["throughput_fit_exclusion"] = None if pd.isna(reason) else str(reason)
        row["inter_node_busbw_GBps"] = None if pd.isna(busbw) else float(busbw)


def _require(frame: pd.DataFrame, columns: tuple[str, ...], path: Path, shape: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise PlaybookFormatError(f"{path}: missing columns {', '.join(missing)}; the file must have "
                           f"the columns of {shape}")


def _num(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _model(label: str, path: Path, line: int) -> Any:
    try:
        return catalog.get_model(label)
    except catalog.CatalogError:
        raise PlaybookFormatError(f"{path}:{line}: model {label!r} is not in the catalog (known playbook "
                           "labels: 1B, 3B, 8B, 80B, 1.34G, 3.57G, 8.86G, 80G)") from None


def _base_row(label: str, model: Any, layout: Layout, nodes: int, seq_len: int, path: Path,
              line: int, attempt: int) -> dict[str, Any]:
    config = RunConfig(sweep=SWEEP, framework="nanotron", model=model, layout=layout, nodes=nodes,
                       gpus_per_node=GPUS_PER_NODE, gpu=GPU, dtype=DTYPE, seq_len=seq_len,
                       global_batch_sequences=layout.sequences_per_step)
    row = config_columns(config)
    row.update({"schema_version": SCHEMA_VERSION, "attempt": attempt, "model_label": str(label),
                "attempt_dir": f"{path.name}:{line}", "source": f"import:{path.name}",
                "status_source": "published", "steady_state_policy": POLICY,
                "metrics_source": "published", "parser": "published-csv",
                "settings_json": None, "predicted_json": None, "evidence": [],
                "collect_issues": []})
    return row


def _layout(record: dict[str, Any], grad_acc_key: str) -> Layout:
    tp = int(record["tp"])
    return Layout(dp=int(record["dp"]), tp=tp, pp=int(record["pp"]), mbs=int(record["mbs"]),
                  grad_acc=int(record[grad_acc_key]), zero_stage=int(record["zero_stage"]),
                  sp=tp > 1)  # every playbook run used tp_mode=REDUCE_SCATTER


def _throughput(row: dict[str, Any], model: Any, tps_gpu: float | None, mfu_pct: float | None,
                tps: float | None) -> None:
    peak = dense_peak(GPU, DTYPE)
    row["tokens_per_sec_per_gpu"] = tps_gpu
    row["tokens_per_sec"] = tps if tps is not None else (
        tps_gpu * row["world_size"] if tps_gpu is not None else None)
    row.update(mfu_columns(model, row["seq_len"], tps_gpu, peak))
    if mfu_pct is not None:
        row["mfu_reported"] = mfu_pct / 100.0
        row["mfu_reported_convention"] = "published"
        if tps_gpu and peak is not None:
            row["flops_per_token_reported"] = row["mfu_reported"] * peak[0] / tps_gpu
    if row["outcome"] != "completed" and (tps_gpu is not None or mfu_pct is not None):
        row["collect_issues"].append("published as failed, yet carries throughput figures")


def _runs_row(record: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    model = _model(str(record["model_label"]), path, line)
    row = _base_row(record["model_label"], model, _layout(record, "grad_acc"), int(record["nodes"]),
                    int(record["seq_len"]), path, line, 1)
    status = str(record["status"]).strip().lower()
    if status not in ("success", "failed"):
        raise PlaybookFormatError(f"{path}:{line}: status {record['status']!r}; expected success or failed")
    row["outcome"] = "completed" if status == "success" else "failed"
    row["reason"] = ("playbook:success" if status == "success"
                     else "playbook:failed (crash or OOM: the published data does not tell)")
    _throughput(row, model, _num(record["tokens_per_sec_per_gpu"]), _num(record["mfu_pct"]),
                _num(record["tokens_per_sec"]))
    memory = _num(record["gpu_memory_GB"])
    row["mem_reserved_bytes"] = memory * GiB if memory is not None else None
    row["mem_source"] = "cuda:rank0" if memory is not None else None
    return row


_BENCH_OUTCOMES: Final = {"Success": ("completed", "playbook:Success"),
                          "OOM": ("oom", "playbook:OOM"),
                          "Other": ("failed", "playbook:Other (crash or timeout)")}


_SHORT_LABELS: Final = {"1.34G": "1B", "3.57G": "3B", "8.86G": "8B", "80G": "80B"}


def _bench_row(record: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    size = str(record["name"]).split("_", 1)[0]
    label = _SHORT_LABELS.get(size, size)
    model = _model(label, path, line)
    row = _base_row(label, model, _layout(record, "batch_accum"), int(record["nodes"]),
                    int(record["seq_len"]), path, line, 1)
    status = str(record["status"])
    if status not in _BENCH_OUTCOMES:
        raise PlaybookFormatError(f"{path}:{line}: status {status!r}; expected one of "
                           f"{', '.join(_BENCH_OUTCOMES)}")
    row["outcome"], row["reason"] = _BENCH_OUTCOMES[status]
    row["slurm_job_id"] = str(record["job_id"])
    if isinstance(record.get("log_file"), str):
        row["evidence"] = [f"log file: {record['log_file']}"]
    _throughput(row, model, _num(record["tok/s/gpu"]), _num(record["mfu"]), None)
    for column, key in (("mem_allocated_bytes", "Mem Alloc (GB)"), ("mem_reserved_bytes", "Mem Res (GB)")):
        value = _num(record[key])
        row[column] = value * GiB if value is not None else None
    row["mem_source"] = "cuda:rank0" if row["mem_reserved_bytes"] is not None else None
    return row
