"""Pure row builders: a RunConfig, step records and env.json → runs.parquet columns.

Shared by collect (attempt folders) and the importers (published runs), so that a column means
the same thing whatever its source. No I/O.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Mapping
from typing import Any

from sweep.collect.schema import CONVENTIONS, DEFAULT_STEADY_STATE_POLICY
from sweep.core import catalog
from sweep.core.layout import LAYOUT_COLUMNS
from sweep.core.model import ModelShape, count_parameters
from sweep.core.runconfig import RunConfig
from sweep.frameworks import ADAPTER_MODULES, get_adapter
from sweep.models import flops
from sweep.workload.metrics import core_time_s, mfu_time_basis


def config_columns(config: RunConfig, run_id: str | None = None) -> dict[str, Any]:
    """The configuration columns of a run (shared by collect and the importers).

    `run_id`: the id RunConfig.from_json already checked against the content (hashing costs).
    """
    shape, layout, settings = config.model, config.layout, config.settings
    return {
        "sweep": config.sweep, "run_id": run_id or config.run_id, "framework": config.framework,
        "model": shape.name, "model_label": shape.name,
        "model_params": count_parameters(shape).total,
        "num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_attention_heads, "num_kv_heads": shape.num_kv_heads,
        "ffn_hidden_size": shape.ffn_hidden_size, "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings, "num_experts": shape.num_experts,
        "nodes": config.nodes, "gpus_per_node": config.gpus_per_node,
        "world_size": config.world_size, "gpu": config.gpu, "dtype": config.dtype,
        "seq_len": config.seq_len, "global_batch_sequences": config.global_batch_sequences,
        "global_batch_tokens": config.global_batch_sequences * config.seq_len,
        **{k: getattr(layout, k) for k in LAYOUT_COLUMNS},
        "layout_label": layout.label(),
        "steps": settings.get("steps"), "warmup_steps": settings.get("warmup_steps"),
        "settings_json": json.dumps(settings, sort_keys=True),
        "spec_hash": config.spec_hash,
        "mem_predicted_allocated_bytes": config.predicted.get("mem_allocated_bytes"),
        "mem_predicted_reserved_bytes": config.predicted.get("mem_reserved_bytes"),
        "mem_predicted_total_bytes": config.predicted.get("mem_total_bytes"),
        "predicted_json": json.dumps(config.predicted, sort_keys=True),
    }


def dense_peak(gpu: str, dtype: str) -> tuple[float, str] | None:
    """The catalog's dense peak FLOP/s per GPU and where it came from; None if it has none."""
    try:
        return catalog.get_gpu(gpu).dense_peak(dtype), f"catalog:{catalog.get_gpu(gpu).name}:{dtype}"
    except (catalog.CatalogError, KeyError):
        return None


@functools.cache
def _flops_all(shape: ModelShape, seq_len: int) -> dict[str, float]:
    return flops.flops_per_token_all(shape, seq_len)


def mfu_columns(shape: ModelShape, seq_len: int, tokens_per_sec_per_gpu: float | None,
                peak: tuple[float, str] | None) -> dict[str, Any]:
    """FLOPs per token under every convention, and MFU under each when throughput is known."""
    per_token = _flops_all(shape, seq_len)
    row: dict[str, Any] = {f"flops_per_token_{c}": per_token[c] for c in CONVENTIONS}
    if peak is not None:
        row["peak_flops"], row["peak_flops_source"] = peak
        if tokens_per_sec_per_gpu is not None:
            for c in CONVENTIONS:
                row[f"mfu_{c}"] = flops.mfu(tokens_per_sec_per_gpu, per_token[c], peak[0])
    return row


def mfu_rate_per_gpu(row: Mapping[str, Any]) -> float | None:
    """The tokens/s per rank that MFU counts: tokens_per_sec_per_gpu, or on CPU, where the steps
    say how long the ranks waited for a core another process held (`cpu_wait_mean_s`), the same
    tokens over the on-core time (`sweep.workload.metrics.core_time_s`)."""
    rate, mean, wait = (row.get("tokens_per_sec_per_gpu"), row.get("step_time_mean_s"),
                        row.get("cpu_wait_mean_s"))
    if not rate or wait is None or not mean:
        return rate
    return float(rate) * float(mean) / core_time_s(float(mean), float(wait))


def step_statistics(steps: list[dict[str, Any]], warmup: int, global_batch_tokens: int | None,
                    world_size: int | None) -> dict[str, Any]:
    """Statistics over the step records after the warm-up (by step number), nothing rounded."""
    ordered = sorted(steps, key=lambda s: s.get("step") or 0)
    kept = [s for s in ordered if (s.get("step") or 0) > warmup]
    timed = [s for s in kept if s.get("step_time_s") is not None]
    row: dict[str, Any] = {"steps_recorded": len(steps), "warmup_steps_skipped": warmup,
                           "step_time_n": len(timed)}
    if ordered:
        row["last_step"] = ordered[-1].get("step")
        row["final_loss"] = ordered[-1].get("loss")
    if kept:
        row["steady_state_policy"] = DEFAULT_STEADY_STATE_POLICY.format(
            warmup=warmup, first=kept[0].get("step"), last=kept[-1].get("step"))
    if timed:
        times = [float(s["step_time_s"]) for s in timed]
        row["step_time_mean_s"] = statistics.fmean(times)
        row["step_time_std_s"] = statistics.stdev(times) if len(times) > 1 else None
        waits = [float(s["cpu_wait_s"]) for s in timed if s.get("cpu_wait_s") is not None]
        if len(waits) == len(timed):
            row["cpu_wait_mean_s"] = statistics.fmean(waits)
            row["mfu_time_basis"] = mfu_time_basis(row["cpu_wait_mean_s"])
        if all(s.get("tokens") is not None for s in timed):
            row["tokens_per_sec"] = sum(float(s["tokens"]) for s in timed) / sum(times)
        elif global_batch_tokens:
            row["tokens_per_sec"] = global_batch_tokens / row["step_time_mean_s"]
    if row.get("tokens_per_sec") is not None and world_size:
        row["tokens_per_sec_per_gpu"] = row["tokens_per_sec"] / world_size
    for key in ("tokens_per_sec", "tokens_per_sec_per_gpu"):  # frameworks that log only rates
        values = [float(s[key]) for s in kept if s.get(key) is not None]
        if row.get(key) is None and values and len(values) == len(kept):
            row[key] = statistics.fmean(values)
    if world_size:
        if row.get("tokens_per_sec") is not None and row.get("tokens_per_sec_per_gpu") is None:
            row["tokens_per_sec_per_gpu"] = row["tokens_per_sec"] / world_size
        if row.get("tokens_per_sec_per_gpu") is not None and row.get("tokens_per_sec") is None:
            row["tokens_per_sec"] = row["tokens_per_sec_per_gpu"] * world_size
    return row


def env_job_id(env: Mapping[str, Any]) -> str | None:
    """env.json's Slurm id as sacct names it: `<array>_<task>` for array jobs."""
    job = env.get("slurm_array") or env.get("slurm_job_id")
    return str(job) if job is not None else None


def _git_sha(state: Any) -> str | None:
    if not isinstance(state, dict) or not state.get("sha"):
        return None
    return str(state["sha"]) + ("-dirty" if state.get("dirty") else "")


def _section(record: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def provenance_columns(env: Mapping[str, Any], framework: str | None) -> dict[str, Any]:
    """Provenance from env.json (sweep.job.provenance): versions, commits, host."""
    harness = _section(env, "harness")
    packages = _section(env, "packages")
    frame = _section(env, "framework")
    framework_sha = _git_sha(frame.get("git"))
    adapter = get_adapter(framework) if framework in ADAPTER_MODULES else None
    package = packages.get(adapter.package) if adapter is not None and adapter.package else None
    detected = _section(frame, "detected")
    framework_version: str | None
    if detected.get("found") and detected.get("found") != "unknown":
        framework_version = str(detected["found"])  # what the adapter found before launch
    elif adapter is not None and adapter.bundled:  # an env.json written before detection
        framework_version = f"llm-sweep {harness.get('version')}" if harness.get("version") else None
    else:
        framework_version = " @ ".join(v for v in (package, framework_sha) if v) or None
    return {"harness_version": harness.get("version"), "harness_git_sha": _git_sha(harness.get("git")),
            "framework_version": framework_version, "torch_version": packages.get("torch"),
            "python_version": env.get("python"), "hostname": env.get("hostname")}
