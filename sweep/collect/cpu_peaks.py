"""The raise rule: no run of a sweep is above 100 % MFU of its CPU peak.

A CPU peak is measured (sweep.workload.peak: the best of several trials with the run's ranks and
threads), and a measurement can still come out below what a run then achieves: a neighbour's load
during the trials, turbo clocks, a kernel faster than the square matmul. Such a run is flagged
(`peak_exceeded`), and at collect the sweep's peak for that host and shape becomes the largest of
the measured peak and the achieved FLOP/s per rank of every run on it, so every run of the
sweep divides by the same, raised number and MFU never exceeds 1. A run's achieved FLOP/s per rank
is its MFU rate (tokens_per_sec_per_gpu, over the on-core time on CPU: `mfu_rate_per_gpu`) ×
flops_per_token under each convention, and what its reported MFU implies.

The rule is recomputed over the whole table at every collect, from the measured peak
(`peak_flops_raised_from` keeps it), so reused rows and new ones agree and collecting twice gives
the same table. What was raised, by which attempt and why is written to `<sweep>/peaks/raised.json`.

A raised peak also raises the host record of that host, dtype and shape (the user-level record of
sweep.workload.peak, named like the sweep's `peaks/<file>` that the source names): a run proved
the host can do that much, so later sweeps on it start from there. The record only rises, so
collecting again changes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from sweep.collect.rows import mfu_rate_per_gpu
from sweep.collect.schema import CONVENTIONS, to_table
from sweep.workload.peak import host_record_file, raise_host_record

RAISED_MARK: Final = " | raised at collect"
RAISED_FILE: Final = "raised.json"
PEAK_FILE_IN_SOURCE: Final = re.compile(r"peaks/([^;)|/\s]+\.json)")


def _achieved(row: Mapping[str, Any]) -> dict[str, float]:
    """The run's FLOP/s per rank, by what counted the FLOPs."""
    rate = mfu_rate_per_gpu(row)
    if not rate:
        return {}
    counts = {f"the {c} convention": row.get(f"flops_per_token_{c}") for c in CONVENTIONS}
    counts["its reported MFU"] = row.get("flops_per_token_reported")
    return {name: float(rate) * float(value) for name, value in counts.items() if value}


def _measured(row: Mapping[str, Any]) -> tuple[float, str]:
    raised_from = row.get("peak_flops_raised_from")
    source = str(row["peak_flops_source"]).split(RAISED_MARK)[0]
    return float(raised_from if raised_from is not None else row["peak_flops"]), source


def raise_measured_peaks(table: pa.Table) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Apply the raise rule to every row whose peak was measured; returns the table and, per
    measured peak, what it became and why (for peaks/raised.json)."""
    if table.num_rows == 0 or "peak_flops_source" not in table.column_names:
        return table, []
    measured_mask = pc.fill_null(pc.starts_with(table.column("peak_flops_source"), "measured:"), False)
    if not pc.any(measured_mask).as_py():
        return table, []
    rows = table.to_pylist()
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("peak_flops") and str(row.get("peak_flops_source") or "").startswith("measured:"):
            groups.setdefault(_measured(row), []).append(row)
    records = []
    for (measured, source), members in sorted(groups.items(), key=lambda item: item[0][1]):
        best, best_row, best_by, why = measured, None, "", ""
        for row in members:
            achieved = _achieved(row)
            row["peak_exceeded"] = any(value > measured for value in achieved.values())
            for name, value in achieved.items():
                if value > best:
                    best, best_row, best_by = value, row, name
        record: dict[str, Any] = {"peak_flops_source": source, "measured_peak_flops": measured,
                                  "peak_flops": best, "raised": best_row is not None,
                                  "runs": len(members),
                                  "exceeded_by": sorted(r["attempt_dir"] for r in members
                                                        if r["peak_exceeded"])}
        if best_row is not None:
            why = (f"{RAISED_MARK} to {best:.6g} FLOP/s per rank (from the measured {measured:.6g}): "
                   f"{best_row['attempt_dir']} achieved that under {best_by}, above the measured "
                   f"peak, so the host can do at least that much")
            record["raised_by"] = best_row["attempt_dir"]
            record["why"] = why[len(RAISED_MARK) + 1:]
        for row in members:
            was_raised = row.get("peak_flops_raised_from") is not None
            if best_row is None and not was_raised:
                continue  # the measured peak stands, and the row's MFU is already against it
            row["peak_flops"] = best
            row["peak_flops_source"] = source + why if best_row is not None else source
            row["peak_flops_raised_from"] = measured if best_row is not None else None
            _rescale_mfu(row, best)
        records.append(record)
    return to_table(rows), records


def _rescale_mfu(row: dict[str, Any], peak: float) -> None:
    rate = mfu_rate_per_gpu(row)
    if not rate:
        return
    for c in CONVENTIONS:
        if row.get(f"flops_per_token_{c}") is not None:
            row[f"mfu_{c}"] = float(rate) * float(row[f"flops_per_token_{c}"]) / peak
    if row.get("flops_per_token_reported") is not None:
        row["mfu_reported"] = float(rate) * float(row["flops_per_token_reported"]) / peak


def raise_host_records(sweep_dir: Path, records: list[dict[str, Any]]) -> None:
    """Raise the host record of every peak a run beat to what the run achieved (adds, to each
    such record, `host_record`: the file and its peak before and after). A peak whose source
    names no `peaks/<file>` has no host record to raise."""
    for record in records:
        if not record["raised"]:
            continue
        match = PEAK_FILE_IN_SOURCE.search(record["peak_flops_source"])
        if match is None:
            record["host_record"] = None
            continue
        path = host_record_file(match.group(1))
        before, after = raise_host_record(
            path, float(record["peak_flops"]),
            f"achieved at collect by {Path(sweep_dir).resolve() / record['raised_by']}: "
            f"{record['why']}")
        record["host_record"] = {"file": str(path),
                                 "peak_flops_before": before["peak_flops"] if before else None,
                                 "peak_flops_after": after["peak_flops"]}


def write_raised(sweep_dir: Path, records: list[dict[str, Any]]) -> Path | None:
    """Record in the sweep folder what each measured CPU peak became at collect, and why; a
    raised peak raises its host record too (`raise_host_records`)."""
    if not records:
        return None
    raise_host_records(sweep_dir, records)
    path = sweep_dir / "peaks" / RAISED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RAISED_FILE}.tmp")
    tmp.write_text(json.dumps({"rule": "the sweep's peak for a host and shape is the largest of "
                                       "the measured peak and the achieved FLOP/s per rank of any "
                                       "run on it; every run's MFU divides by it",
                               "peaks": records}, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path
