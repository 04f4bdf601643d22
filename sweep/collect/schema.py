"""The runs.parquet schema, as data: one source for collect, the importers, the checks and the
docs (docs/runs-parquet.md).

One row is one attempt of one run. Every column has an Arrow type, a unit and a description; the
table of docs/runs-parquet.md is generated from this list (`markdown_table()`), so the
documentation cannot drift.
Bump `SCHEMA_VERSION` when a column changes meaning or type; adding a column at the end keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

SCHEMA_VERSION: Final = 1

OUTCOMES: Final = ("completed", "oom", "hang", "timeout", "crashed", "node_fail", "cancelled",
                   "preempted", "failed", "unknown")
CONVENTIONS: Final = ("megatron", "full_attention", "6N")  # sweep.models.flops.CONVENTIONS, as columns

_ARROW: Final = {
    "string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
    "list<string>": pa.list_(pa.field("element", pa.string())),  # the Parquet name
}


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # a key of _ARROW
    unit: str
    description: str
    group: str

    @property
    def arrow_type(self) -> pa.DataType:
        return _ARROW[self.dtype]


def _cols(group: str, *specs: tuple[str, str, str, str]) -> list[Column]:
    return [Column(name, dtype, unit, text, group) for name, dtype, unit, text in specs]


_IDENTITY = _cols(
    "identity",
    ("schema_version", "int64", "", "version of this schema"),
    ("sweep", "string", "", "sweep name (spec `name`)"),
    ("run_id", "string", "", "stable id of the configuration (RunConfig.run_id)"),
    ("attempt", "int64", "", "attempt number, 1 = first submission (imports: the n-th time the "
     "file lists this configuration)"),
    ("attempt_dir", "string", "", "attempt folder relative to the sweep directory; import: source file"),
    ("source", "string", "", "`collect` or `import:<file name>`"),
)
_CONFIG = _cols(
    "configuration",
    ("framework", "string", "", "megatron, nanotron, torchtitan or builtin"),
    ("model", "string", "", "model name (catalog name or inline shape name)"),
    ("model_label", "string", "", "display label (the playbook's `1B`, or the model name)"),
    ("model_params", "int64", "parameters", "total parameters, a tied embedding once"),
    ("num_layers", "int64", "", "decoder layers"),
    ("hidden_size", "int64", "", "model width"),
    ("num_attention_heads", "int64", "", "query heads"),
    ("num_kv_heads", "int64", "", "key/value heads"),
    ("ffn_hidden_size", "int64", "", "MLP inner width"),
    ("vocab_size", "int64", "", "vocabulary"),
    ("tie_word_embeddings", "bool", "", "input embedding shared with the LM head"),
    ("num_experts", "int64", "", "experts per MoE layer, 0 = dense"),
    ("nodes", "int64", "", "nodes"),
    ("gpus_per_node", "int64", "", "GPUs (ranks) per node"),
    ("world_size", "int64", "GPUs", "nodes × gpus_per_node"),
    ("gpu", "string", "", "GPU type (catalog name)"),
    ("dtype", "string", "", "compute dtype"),
    ("seq_len", "int64", "tokens", "sequence length"),
    ("global_batch_sequences", "int64", "sequences", "sequences per optimizer step"),
    ("global_batch_tokens", "int64", "tokens", "global_batch_sequences × seq_len"),
    ("dp", "int64", "", "data-parallel size"),
    ("tp", "int64", "", "tensor-parallel size"),
    ("pp", "int64", "", "pipeline-parallel size"),
    ("cp", "int64", "", "context-parallel size"),
    ("ep", "int64", "", "expert-parallel size"),
    ("mbs", "int64", "sequences", "micro-batch size"),
    ("grad_acc", "int64", "", "gradient-accumulation steps (micro-batches per step per replica)"),
    ("zero_stage", "int64", "", "ZeRO stage 0-3"),
    ("recompute", "string", "", "activation recomputation: none, selective, full"),
    ("sp", "bool", "", "sequence parallelism with TP"),
    ("pp_schedule", "string", "", "1f1b, gpipe, interleaved_1f1b"),
    ("vpp", "int64", "", "virtual pipeline stages per rank"),
    ("layout_label", "string", "", "DP/TP/PP/GAS/MBS/ZeRO annotation (Layout.label)"),
    ("steps", "int64", "steps", "steps the run was asked for (run settings)"),
    ("warmup_steps", "int64", "steps", "warm-up steps the run settings ask to skip"),
    ("settings_json", "string", "JSON", "all run settings, as run.json holds them"),
)
_OUTCOME = _cols(
    "outcome",
    ("outcome", "string", "", "completed, oom, hang, timeout, crashed, node_fail, cancelled, "
     "preempted; `failed` = failed, class not published (imports); `unknown` = no verdict found"),
    ("reason", "string", "", "finer reason (e.g. cuda_oom, sacct:TIMEOUT, playbook:failed)"),
    ("rule", "string", "", "classifier rule that decided the outcome"),
    ("evidence", "list<string>", "", "exact log lines behind the verdict"),
    ("status_source", "string", "", "status.json, node-files, srun (its line blaming a node), sacct, published or none"),
    ("last_step", "int64", "steps", "last step reached"),
    ("exit_codes_json", "string", "JSON", "exit code per node"),
    ("collect_issues", "list<string>", "",
     "what collect found wrong with this attempt's files; empty = clean"),
)
_STEADY = _cols(
    "steady state",
    ("steps_recorded", "int64", "steps", "step records read"),
    ("warmup_steps_skipped", "int64", "steps", "leading steps left out of the statistics"),
    ("step_time_mean_s", "float64", "s", "mean step time over the steady-state steps"),
    ("step_time_std_s", "float64", "s", "sample standard deviation (ddof=1) of the same steps"),
    ("step_time_n", "int64", "steps", "steps averaged"),
    ("cpu_wait_mean_s", "float64", "s", "CPU runs: mean over the same steps of the time the run "
     "waited for cores that other processes held (per step, the largest run-queue wait of any "
     "thread of any rank, from /proc schedstat); MFU counts step_time_mean_s less it. Null on GPUs"),
    ("steady_state_policy", "string", "", "which steps were averaged, in words"),
    ("metrics_source", "string", "", "summary (the trainer's own summary record), steps "
     "(recomputed from step records), log:<parser>@<format version>, or published"),
    ("ended_by", "string", "", "step_budget or steady_state (run.early_stop: the workload, or the watchdog for other frameworks)"),
    ("final_loss", "float64", "", "last loss"),
    ("tokens_per_sec", "float64", "tokens/s", "global throughput over the steady-state steps"),
    ("tokens_per_sec_per_gpu", "float64", "tokens/s/GPU", "tokens_per_sec / world_size"),
    ("inter_node_busbw_GBps", "float64", "GB/s", "all-reduce bus bandwidth the job measured across "
     "its nodes before it ran (imports of nanotron's results table, `AllReduce (GB/s)`, multi-node "
     "runs): the throughput fit uses it in place of the catalog's network"),
    ("throughput_fit_exclusion", "string", "", "why the throughput fit leaves this run out "
     "(imports: nanotron's pipeline runs from before its 1F1B fix, runs on a node with degraded "
     "NVLink); null: it counts"),
)
_FLOPS = _cols(
    "FLOPs and MFU",
    *[(f"flops_per_token_{c}", "float64", "FLOP/token",
       f"training FLOPs per token, `{c}` convention (sweep.models.flops)") for c in CONVENTIONS],
    ("flops_per_token_reported", "float64", "FLOP/token",
     "FLOPs per token implied by the reported MFU: mfu_reported × peak / tokens_per_sec_per_gpu"),
    ("peak_flops", "float64", "FLOP/s", "peak FLOP/s per GPU that MFU divides by: the catalog's "
     "dense peak for the GPU and dtype, or, on CPU, the sweep's measured peak for the host and run "
     "shape, raised at collect to the achieved FLOP/s per rank of any run of the sweep that beat "
     "it (sweep.collect.cpu_peaks)"),
    ("peak_flops_source", "string", "", "catalog:<gpu>:<dtype>, or measured:<how> (CPU: `measured:"
     "cpu-matmul-<dtype> best of N trials, R ranks × T threads at once on <host> …`, followed by "
     "` | raised at collect …` and why, where a run beat the measured peak)"),
    ("peak_flops_raised_from", "float64", "FLOP/s", "CPU: the measured peak before collect raised "
     "it to peak_flops because a run of the sweep on the same host and shape achieved more per "
     "rank; null where the measured peak stands (and for catalog peaks)"),
    ("peak_exceeded", "bool", "", "CPU: this run's achieved FLOP/s per rank exceeded its host's "
     "measured peak (under some FLOPs convention, or by its reported MFU), so it raised the "
     "sweep's peak; false where it did not; null for catalog peaks"),
    *[(f"mfu_{c}", "float64", "fraction", f"tokens_per_sec_per_gpu × flops_per_token_{c} / "
       "peak_flops; CPU runs: over the on-core time, tokens_per_sec_per_gpu × step_time_mean_s / "
       "(step_time_mean_s − cpu_wait_mean_s) in place of tokens_per_sec_per_gpu") for c in CONVENTIONS],
    ("mfu_time_basis", "string", "", "the time MFU divides by: `wall` (the step time), or on CPU "
     "`on-core: …` (the step time less cpu_wait_mean_s)"),
    ("mfu_reported", "float64", "fraction", "MFU as the trainer or the publication reported it "
     "(a raised CPU peak rescales it: flops_per_token_reported × tokens_per_sec_per_gpu / peak_flops)"),
    ("mfu_reported_convention", "string", "", "convention of mfu_reported: full_attention "
     "(builtin), <framework>-log (the framework's own formula), published (basis not stated)"),
)
_MEMORY = _cols(
    "memory",
    ("mem_allocated_bytes", "float64", "bytes", "measured peak allocated (max over ranks; imports: rank 0)"),
    ("mem_reserved_bytes", "float64", "bytes", "measured peak reserved by the allocator (imports: "
     "the published GB, which are GiB, × 2^30)"),
    ("mem_source", "string", "", "cuda, cpu-rss-anon, log (the framework's memory lines) or cuda:rank0 (imports)"),
    ("mem_oom_needed_bytes", "float64", "bytes", "CUDA OOMs: allocated by PyTorch + the request that "
     "failed, from PyTorch's message (largest over ranks): a lower bound of the peak the run needed"),
    ("mem_outside_allocator_bytes", "float64", "bytes", "CUDA: what the device held beyond the "
     "caching allocator (CUDA context, libraries, NCCL), max over ranks: the built-in workload "
     "measures it each step (cudaMemGetInfo less memory_reserved); an OOM's PyTorch ≥ 2.1 message "
     "gives it at the failure"),
    ("mem_alloc_retries", "float64", "count", "CUDA (built-in workload): how often the caching "
     "allocator released its cache and retried cudaMalloc (num_alloc_retries, max over ranks); > 0: "
     "the run fitted only by flushing, so its reserved peak is the device's limit, not its own"),
    ("mem_predicted_allocated_bytes", "float64", "bytes", "memory model: peak allocated per GPU "
     "(plan column mem_allocated_bytes, via run.json `predicted`)"),
    ("mem_predicted_reserved_bytes", "float64", "bytes", "memory model: peak reserved per GPU, "
     "comparable to mem_reserved_bytes"),
    ("mem_predicted_total_bytes", "float64", "bytes", "memory model: reserved + CUDA context, "
     "NCCL and runtime overhead (what must fit the GPU)"),
    ("predicted_json", "string", "JSON", "everything the planner predicted (run.json `predicted`)"),
)
_SLURM = _cols(
    "Slurm",
    ("slurm_job_id", "string", "", "Slurm job id (array jobs: <array>_<task>)"),
    ("slurm_state", "string", "", "sacct State (or the local backend's emulated one)"),
    ("node_list", "string", "", "nodes the attempt ran on"),
    ("started_at", "float64", "s (Unix time)", "start of the attempt"),
    ("ended_at", "float64", "s (Unix time)", "end of the attempt"),
    ("elapsed_s", "float64", "s", "sacct ElapsedRaw when accounting is known, else ended_at − started_at"),
    ("gpu_hours", "float64", "GPU·h", "elapsed_s × world_size / 3600"),
)
_PROVENANCE = _cols(
    "provenance",
    ("spec_hash", "string", "", "hash of the spec the run was planned from"),
    ("harness_version", "string", "", "llm-sweep version that ran the attempt"),
    ("harness_git_sha", "string", "", "llm-sweep git commit that ran the attempt"),
    ("framework_version", "string", "", "framework version or checkout SHA"),
    ("torch_version", "string", "", "PyTorch version on the compute node"),
    ("python_version", "string", "", "Python version on the compute node"),
    ("hostname", "string", "", "host of node 0"),
    ("parser", "string", "", "reader and format version: metrics.jsonl@1, log:<framework>@<format>, "
     "published-csv"),
    ("collected_at", "float64", "s (Unix time)", "when this row was computed"),
    ("source_fingerprint", "string", "", "sizes and mtimes of the files read; collect reuses a row "
     "whose fingerprint is unchanged"),
)

_STRAGGLERS = _cols(
    "stragglers",
    ("node_step_time_json", "string", "JSON", "each node's steady-state mean step time in s, its "
     "slowest rank's (sweep.collect.stragglers): the built-in workload and torchtitan give them; "
     "null where the framework logs steps on one rank only (Megatron-LM, nanotron)"),
    ("node_step_time_source", "string", "", "what the per-node times are: `builtin: each rank's "
     "own step time …` or `log:<framework>: each node's log`"),
    ("straggler_ratio", "float64", "", "slowest node's step time / median of the nodes' (two or "
     "more nodes, each with enough steady-state steps)"),
    ("straggler_factor", "float64", "", "the factor the run was judged by (run.straggler_factor, "
     "default 1.2)"),
    ("straggler_node", "string", "", "the slowest node, where straggler_ratio > straggler_factor; "
     "null: no straggler (or nothing to compare)"),
)

COLUMNS: Final[tuple[Column, ...]] = tuple(
    _IDENTITY + _CONFIG + _OUTCOME + _STEADY + _FLOPS + _MEMORY + _SLURM + _PROVENANCE
    + _STRAGGLERS)
COLUMN_NAMES: Final = tuple(c.name for c in COLUMNS)
BY_NAME: Final = {c.name: c for c in COLUMNS}
DEFAULT_STEADY_STATE_POLICY: Final = ("skip the first {warmup} steps; "
                                      "mean and std (ddof=1) over steps {first}..{last}")


def arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(c.name, c.arrow_type) for c in COLUMNS],
                     metadata={b"llm_sweep_schema_version": str(SCHEMA_VERSION).encode()})


def to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts) to an Arrow table with exactly the schema's columns; a missing key is null."""
    rows = list(rows)
    for row in rows:
        unknown = set(row) - set(BY_NAME)
        if unknown:
            raise KeyError(f"row {row.get('run_id')!r}: columns not in sweep.collect.schema: {sorted(unknown)}")
    arrays = [_column(c, [row.get(c.name) for row in rows]) for c in COLUMNS]
    return pa.Table.from_arrays(arrays, schema=arrow_schema())


def _column(column: Column, values: list[Any]) -> pa.Array:
    """Fast path: Arrow converts the values as they are; odd ones (an int job id in a string
    column, a NaN in an int column) go through _clean."""
    fast = column.dtype != "int64" or not any(isinstance(v, float) for v in values)
    try:
        if fast:  # (Arrow would truncate 7.5 to 7 in an int column: floats take the slow path)
            return pa.array(values, type=column.arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        pass
    return pa.array([_clean(v, column.dtype) for v in values], type=column.arrow_type)


def _clean(value: Any, dtype: str) -> Any:
    if value is None:
        return None
    if dtype == "float64":
        return float(value)
    if dtype == "int64":
        if isinstance(value, float) and not value.is_integer():
            return None  # NaN or a fraction where a count belongs: unknown, never truncated
        return int(value)
    if dtype == "list<string>":
        return [str(v) for v in value]
    if dtype == "bool":
        return bool(value)
    return str(value)


def check_frame(columns: Iterable[str], path: str = "runs.parquet") -> None:
    """Refuse a table that lacks schema columns, naming them and the fix."""
    missing = [name for name in COLUMN_NAMES if name not in set(columns)]
    if missing:
        raise ValueError(f"{path}: missing columns {', '.join(missing[:8])}"
                         f"{' …' if len(missing) > 8 else ''}; it was not written by this version "
                         f"of llm-sweep (schema {SCHEMA_VERSION}); re-run `sweep collect`")


def markdown_table() -> str:
    """The schema table of docs/runs-parquet.md."""
    lines = ["| column | type | unit | description |", "|---|---|---|---|"]
    group = None
    for column in COLUMNS:
        if column.group != group:
            group = column.group
            lines.append(f"| **{group}** | | | |")
        description = column.description.replace("|", "\\|")
        lines.append(f"| `{column.name}` | {column.dtype} | {column.unit} | {description} |")
    return "\n".join(lines)
