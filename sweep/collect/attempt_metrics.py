"""What one attempt measured, as runs.parquet columns: its step records (the built-in
workload's metrics.jsonl, or the framework's own log lines, read by its parser), their
steady-state statistics, the memory peaks, and the MFU under each FLOPs convention.

Like `sweep.collect.attempts`, which calls it for every attempt folder, it never raises for a bad file:
a torn line, an unparsable log or a figure that disagrees with ours becomes an entry of
`issues`, and the row keeps what could be read.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.collect.rows import dense_peak, mfu_columns, mfu_rate_per_gpu, step_statistics
from sweep.collect.stragglers import DEFAULT_FACTOR, from_builtin, from_node_logs
from sweep.collect.stragglers import columns as straggler_columns
from sweep.core.runconfig import RunConfig
from sweep.core.state import METRICS_FILE, json_record
from sweep.frameworks import get_adapter

METRICS_FORMAT = "metrics.jsonl@1"


def read_metrics(path: Path, issues: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Step records and the summary record of a metrics.jsonl; bad lines become issues."""
    steps: list[dict[str, Any]] = []
    summary = None
    bad = 0
    try:
        handle = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return steps, None
    with handle:
        for line in handle:
            if not line.strip():
                continue
            record = json_record(line)
            if record is None:
                bad += 1
            elif record.get("kind") == "step":
                steps.append(record)
            elif record.get("kind") == "summary":
                summary = record
    if bad:
        issues.append(f"{path.name}: {bad} unreadable line(s) skipped (torn or corrupt write)")
    return steps, summary


def metric_columns(row: dict[str, Any], attempt_dir: Path, config: RunConfig | None,
                   issues: list[str], nodes: Sequence[str] = ()) -> None:
    """Fill `row` with what the attempt measured: step statistics over the steps after warm-up,
    memory peaks, the framework's own MFU and ours (`config`: the run.json, None if unreadable),
    and each node's step time with the straggler verdict (`nodes`: env.json's node list, in
    node-index order)."""
    warmup = int((config.settings.get("warmup_steps") if config else None) or 0)
    world = config.world_size if config else None
    gbt = row.get("global_batch_tokens")
    summary = None
    # the framework whose log lines hold the steps; None: the run wrote metrics.jsonl (without
    # a run.json, the folder is read as the built-in workload's)
    logged_by = (config.framework if config is not None
                 and not _writes_metrics_file(config.framework) else None)
    if logged_by is None:
        steps, summary = read_metrics(attempt_dir / METRICS_FILE, issues)
        row["parser"] = METRICS_FORMAT
    else:
        steps = _steps_from_logs(row, attempt_dir, logged_by, issues)
    stats = step_statistics(steps, warmup, gbt, world)
    check_logged_rate(steps, warmup, stats, issues)
    last_step = row.get("last_step")
    row.update({k: v for k, v in stats.items() if v is not None})
    if last_step is not None:
        row["last_step"] = last_step
    if summary is not None:
        _apply_summary(row, summary, world)
    elif steps:
        row["metrics_source"] = row.get("metrics_source") or "steps"
        if row.get("outcome") == "completed":
            issues.append(f"{METRICS_FILE}: no summary record; steady state recomputed from "
                          f"{len(steps)} step records")
        mem = [s for s in steps if s.get("mem_reserved_bytes") is not None]
        log_memory = row.pop("_log_memory", None)
        if log_memory is not None and any(v is not None for v in log_memory):
            row["mem_allocated_bytes"], row["mem_reserved_bytes"] = log_memory
            row["mem_source"] = "log"
        elif mem:
            row["mem_allocated_bytes"] = max(float(s.get("mem_allocated_bytes") or 0) for s in mem)
            row["mem_reserved_bytes"] = max(float(s["mem_reserved_bytes"]) for s in mem)
            row["mem_source"] = mem[-1].get("mem_source")
            outside = [float(s["mem_outside_allocator_bytes"]) for s in mem
                       if s.get("mem_outside_allocator_bytes") is not None]
            if outside:
                row["mem_outside_allocator_bytes"] = max(outside)
            retries = [float(s["mem_alloc_retries"]) for s in mem if s.get("mem_alloc_retries") is not None]
            if retries:
                row["mem_alloc_retries"] = max(retries)
        mfus = [s["mfu_pct"] for s in steps if s.get("mfu_pct") is not None and s.get("step", 0) > warmup]
        if mfus:
            row["mfu_reported"] = statistics.fmean(mfus) / 100.0
            row["mfu_reported_convention"] = ("full_attention" if logged_by is None
                                              else f"{logged_by}-log")
    elif row.get("outcome") == "completed":
        issues.append(f"{METRICS_FILE}: no step records for a completed attempt")
    if stats["step_time_n"] == 0 and steps and summary is None:
        issues.append(f"only {len(steps)} step(s) recorded, all within the {warmup} warm-up "
                      f"steps: no steady-state figures")
    if config is not None:
        _apply_mfu(row, config, summary, issues)
    _straggler_columns(row, config, summary, steps, warmup, nodes)


def _straggler_columns(row: dict[str, Any], config: RunConfig | None,
                       summary: Mapping[str, Any] | None, steps: list[dict[str, Any]],
                       warmup: int, nodes: Sequence[str]) -> None:
    """Each node's steady-state step time, where the run gives them, and whether its slowest
    node is a straggler (sweep.collect.stragglers)."""
    node_steps = row.pop("_node_steps", None)
    if config is None or config.nodes < 2:
        return
    factor = float(config.settings.get("straggler_factor") or DEFAULT_FACTOR)
    if node_steps is None:
        times = from_builtin(summary, nodes, config.gpus_per_node)
    else:
        times = from_node_logs(node_steps, warmup, nodes, config.framework,
                               row.get("global_batch_tokens"), config.world_size)
    row.update(straggler_columns(times, factor))


def check_logged_rate(steps: list[dict[str, Any]], warmup: int, stats: Mapping[str, Any],
                       issues: list[str]) -> None:
    """A framework's own tokens/s should agree with the planned batch over the measured step time.

    The per-step rates are averaged harmonically: with the same tokens in every step that is
    exactly tokens / mean step time, so the check tests the batch, not the step-time spread (an
    arithmetic mean of rates exceeds it by Jensen's inequality, by more than 5 % on a busy CPU)."""
    logged = [float(s["tokens_per_sec"]) for s in steps
              if (s.get("step") or 0) > warmup and s.get("tokens_per_sec") is not None]
    ours = stats.get("tokens_per_sec")
    if not logged or not ours or min(logged) <= 0:
        return
    theirs = statistics.harmonic_mean(logged)
    if abs(theirs - ours) > 0.05 * ours:
        issues.append(f"the log's tokens/s ({theirs:.6g}, harmonic mean over the measured steps) "
                      f"differs by more than 5 % from global batch tokens / mean step time "
                      f"({ours:.6g}): does the run's batch match run.json?")


def _apply_summary(row: dict[str, Any], summary: Mapping[str, Any], world: int | None) -> None:
    row["metrics_source"] = "summary"
    mapping = {"warmup_steps_skipped": "warmup_steps_skipped",
               "step_time_mean_s": "step_time_mean_s", "step_time_std_s": "step_time_std_s",
               "step_time_n": "step_time_n", "tokens_per_sec": "tokens_per_sec",
               "tokens_per_sec_per_gpu": "tokens_per_sec_per_gpu", "final_loss": "final_loss",
               "mem_allocated_bytes": "mem_allocated_bytes", "mem_reserved_bytes": "mem_reserved_bytes",
               "mem_outside_allocator_bytes": "mem_outside_allocator_bytes",
               "mem_alloc_retries": "mem_alloc_retries", "mem_source": "mem_source",
               "ended_by": "ended_by", "torch_version": "torch_version",
               "steady_state_policy": "steady_state_policy", "cpu_wait_mean_s": "cpu_wait_mean_s",
               "mfu_time_basis": "mfu_time_basis"}
    for key, column in mapping.items():
        if summary.get(key) is not None:
            row[column] = summary[key]
    if row.get("tokens_per_sec_per_gpu") is None and row.get("tokens_per_sec") and world:
        row["tokens_per_sec_per_gpu"] = row["tokens_per_sec"] / world
    if summary.get("mfu_pct") is not None:
        row["mfu_reported"] = float(summary["mfu_pct"]) / 100.0
        row["mfu_reported_convention"] = "full_attention"
    if summary.get("peak_flops") is not None:
        row["_summary_peak"] = (float(summary["peak_flops"]),
                                str(summary.get("peak_flops_source") or "metrics"))


def _apply_mfu(row: dict[str, Any], config: RunConfig, summary: Mapping[str, Any] | None,
               issues: list[str]) -> None:
    reported_peak = row.pop("_summary_peak", None)
    peak = dense_peak(config.gpu, config.dtype) or reported_peak
    if peak is not None and reported_peak is not None and reported_peak[1].startswith("catalog") \
            and abs(reported_peak[0] - peak[0]) > 1e-9 * peak[0]:
        issues.append(f"metrics.jsonl: peak_flops {reported_peak[0]:g} differs from the catalog's "
                      f"dense peak {peak[0]:g}; MFU uses the catalog")
    rate = mfu_rate_per_gpu(row)
    row.update(mfu_columns(config.model, config.seq_len, rate, peak))
    reported = (summary or {}).get("flops_per_token") or {}
    for name, value in reported.items():
        ours = row.get(f"flops_per_token_{name}")
        if ours is not None and value is not None and abs(float(value) - ours) > 1e-9 * ours:
            issues.append(f"metrics.jsonl: flops_per_token[{name}] = {value} differs from "
                          f"sweep.models.flops ({ours}); stored the sweep.models.flops value")
    if row.get("mfu_reported") is not None and rate and peak:
        row["flops_per_token_reported"] = row["mfu_reported"] * peak[0] / rate


def _writes_metrics_file(framework: str) -> bool:
    """Whether the framework's runs write metrics.jsonl (`FrameworkAdapter.writes_metrics_file`);
    False for a name no adapter has, whose logs then say so (`_steps_from_logs`)."""
    try:
        return get_adapter(framework).writes_metrics_file
    except ValueError:
        return False


def _steps_from_logs(row: dict[str, Any], attempt_dir: Path, framework: str,
                     issues: list[str]) -> list[dict[str, Any]]:
    """Step records of a Megatron/nanotron/torchtitan attempt, and its peak memory.

    Steps come from the node log whose step lines carry a loss, then from the one with the most
    step lines: frameworks print them on one rank (Megatron: the last; nanotron: the first of the
    last PP stage), so on multi-node runs most node logs have none; torchtitan prints them on
    every rank, and only the last pipeline stage's have a loss. Memory is the peak over every node's log: each rank that reports memory
    reports its own, and the most loaded GPU is on any node (Megatron prints memory on DP-rank-0
    ranks of every stage, and the first stage usually holds the most)."""
    from sweep.frameworks import get_parser
    from sweep.frameworks.log_parser import LogParseError

    try:
        parser = get_parser(framework)
    except ValueError as error:
        issues.append(str(error))
        return []
    best: list[dict[str, Any]] = []
    node_steps: dict[int, list[dict[str, Any]]] = {}  # node index → its log's steps
    peaks: list[tuple[int | None, int | None]] = []
    logs = sorted((attempt_dir / "logs").glob("node*.out"))
    if not logs:
        issues.append("logs/: no node*.out log to parse")
    for path in logs:
        try:
            parsed = parser.parse_file(path)
        except LogParseError as error:
            issues.append(f"logs/{path.name}: {error}")
            continue
        steps = [dataclasses.asdict(step) for step in parsed.steps]
        if (index := _node_index(path)) is not None:
            node_steps[index] = steps
        peaks.append((parsed.peak_mem_allocated_bytes, parsed.peak_mem_reserved_bytes))
        if _log_rank(steps) > _log_rank(best) or not best:
            best = steps
            row["parser"] = row["metrics_source"] = f"log:{framework}@{parsed.format_version or '?'}"
            if parsed.truncated:
                issues.append(f"logs/{path.name}: last line cut off (writer killed); skipped")
            issues.extend(f"logs/{path.name}: {problem}" for problem in parsed.problems[:5])
    if peaks:
        row["_log_memory"] = tuple(_max_known(values) for values in zip(*peaks))
    row["_node_steps"] = node_steps
    return best


def _log_rank(steps: list[dict[str, Any]]) -> tuple[int, int]:
    """Which node log speaks for the run: the one whose steps carry a loss (the last pipeline
    stage's node, where every node prints every step), then the one with the most steps."""
    return sum(1 for step in steps if step.get("loss") is not None), len(steps)


def _node_index(path: Path) -> int | None:
    """The node index of `logs/node<i>.out` (the watchdog names each node's log so)."""
    digits = path.stem.removeprefix("node")
    return int(digits) if digits.isdigit() else None


def _max_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
