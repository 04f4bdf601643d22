"""Score the memory model and the prune rules against runs that really happened.

Three formats, told apart by their columns:
- `sweep`: a sweep's own runs.parquet (`sweep collect`, or `sweep import-playbook`): one row per
  attempt, outcome completed/oom/…, `mem_reserved_bytes` and `mem_allocated_bytes` as measured.
  Which rank measured them follows from `mem_source` and the framework (`MEASURED_RANK`):
  imports (`cuda:rank0`) and nanotron's log lines are rank 0, the first pipeline stage, with
  nanotron's step-window allocated peak; the built-in workload (`cuda`), Megatron's and
  torchtitan's logs are the largest over the ranks, compared with the most loaded stage and the
  whole run's allocated peak. `cpu-rss-anon` (CPU runs) is not GPU memory and is not scored.
  Attempts whose outcome says nothing about memory (cancelled, preempted, node_fail, unknown,
  none) are skipped. `failed` (an import's failure of no stated class) is a failure that was not
  an OOM where the table names OOMs (nanotron's full table: `Other`); where it names none (the
  charts table: OOM or crash, not told apart) it stays `failed`, and the OOM fields are None, as
  for the charts CSV. Every row must have been run at the spec's sequence length, dtype and GPUs
  per node.
- `charts`: the Ultra-Scale Playbook charts' table (`playbook_runs_1B_8B.csv`): status
  success/failed, `gpu_memory_GB` = rank 0's max_memory_reserved (GiB); the model by its label.
- `full`: the sweep's own results table (`playbook_bench_full_1B_8B.csv`): status
  Success/OOM/Other, `Mem Alloc (GB)` and `Mem Res (GB)` (GiB). Failed rows lack some model
  columns, so each row is mapped to a spec model by its shape columns (layers, hidden size,
  heads, vocab; KV heads and tying when given) and, when that leaves a choice, by the parameter
  label that starts its `name` ("1.34G_dp8_…").

Each run is judged as the planner would judge it, at its own layout and grad_acc: every prune
rule applies except `batch` (the run's global batch is what it ran; a few published runs did not
hold the sweep's). Rows that match no spec model, lack a layout value, or whose world size
(dp·tp·pp·cp·ep) is not nodes × the spec's GPUs per node, are skipped and counted. A field a
file cannot give is None.

The measured allocated peak of the playbook's tables is nanotron's: its `log_memory` resets the
peak counters after the forward/backward pass, so it is compared with the memory model's
`mem_step_allocated_bytes`. Both tables measured rank 0, so the peaks are predicted for the first
pipeline stage; the verdict, as the planner's, uses the most loaded stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.calibration.memory_self_calibration import fitted_by_flushing
from sweep.collect.attempts import unreadable_runs
from sweep.core import catalog
from sweep.core.layout import (
    CELL,
    LAYOUT_COLUMNS_BEYOND_PLAYBOOK,
    LAYOUT_INT_COLUMNS,
    PLAYBOOK_LAYOUT_COLUMNS,
)
from sweep.core.model import ModelShape, count_parameters
from sweep.core.units import GiB
from sweep.models import memory
from sweep.models.memory_profiles import MemoryProfile
from sweep.plan import space
from sweep.plan.spec import Spec

# The columns each format needs, by the names its table uses. The playbook's two tables record
# the layout as `PLAYBOOK_LAYOUT_COLUMNS`, under those names but for the results table's
# `batch_accum` (grad_acc); a sweep's runs.parquet uses the layout's own names.
CHARTS_COLUMNS: Final = ("model_label", "nodes", "dp", "tp", "pp", "mbs", "grad_acc",
                         "zero_stage", "status", "gpu_memory_GB", "tokens_per_sec_per_gpu")
FULL_COLUMNS: Final = ("name", "nodes", "dp", "tp", "pp", "mbs", "batch_accum", "zero_stage",
                       "status", "Mem Alloc (GB)", "Mem Res (GB)", "tok/s/gpu", "num_layers",
                       "hidden_size", "num_heads", "vocab_size")
SWEEP_COLUMNS: Final = (*CELL, *PLAYBOOK_LAYOUT_COLUMNS, "outcome", "mem_reserved_bytes",
                        "mem_allocated_bytes")
# runs.parquet outcomes (sweep.collect.schema.OUTCOMES) as memory evidence; None: an attempt that says
# nothing about memory (skipped); every other outcome is a failure that was not an OOM ("other")
SWEEP_OUTCOMES: Final = {"completed": "success", "oom": "oom", "failed": "failed",
                         "cancelled": None, "preempted": None, "node_fail": None,
                         "unknown": None}
# The rank whose peaks a runs.parquet row measured: (framework or "*", mem_source) → (stage the
# peak is predicted for, the allocated peak it is compared with); sweep.frameworks.<name>.parser
# says which rank each log's memory lines come from.
MEASURED_RANK: Final = {("*", "cuda:rank0"): ("first", "step"),
                        ("nanotron", "log"): ("first", "step"),
                        ("*", "cuda"): ("most_loaded", "run"),
                        ("*", "log"): ("most_loaded", "run")}
# Columns of a runs.parquet row that must equal the spec's for the spec to judge it
SAME_AS_SPEC: Final = ("framework", "seq_len", "dtype", "gpus_per_node")
# Layout columns a sweep's table carries and the playbook's tables leave at the plan's default
# (sp apart: each format says where its sp comes from)
EXTRA_LAYOUT: Final = tuple(c for c in LAYOUT_COLUMNS_BEYOND_PLAYBOOK if c != "sp")
FIELDS: Final = ("n_success", "n_oom", "n_other", "n_failed", "n_skipped", "success_kept_frac",
                 "oom_pruned_frac", "failed_pruned_frac", "success_probed_frac",
                 "success_lost_frac", "oom_probed_frac", "alloc_median_abs_rel_err",
                 "alloc_p90_abs_rel_err", "reserved_median_abs_rel_err",
                 "reserved_p90_abs_rel_err", "best_kept")


class RunsFileError(ValueError):
    """A runs file this command cannot read; names the file and what is missing."""


@dataclass(frozen=True)
class Runs:
    """Runs in one normalised table: model, nodes, layout columns, outcome, measurements."""

    format: str  # "charts" | "full" | "sweep"
    # outcome: success | oom | other | failed; *_bytes may be NaN; `measured_stage` (sweep
    # format): "first" or "most_loaded", the pipeline stage whose peak was measured
    frame: pd.DataFrame
    n_skipped: int


@dataclass(frozen=True)
class MemoryCheck:
    n_success: int
    n_oom: int | None
    n_other: int | None
    n_failed: int
    n_skipped: int
    success_kept_frac: float | None  # kept by the point estimate
    oom_pruned_frac: float | None  # pruned by the point estimate
    failed_pruned_frac: float | None
    # With the band (`sweep.plan.space.memory_over`): the successes and OOMs the point estimate prunes
    # but the band keeps as probes, and the successes pruned even so (lost without a probe).
    success_probed_frac: float | None
    success_lost_frac: float | None
    oom_probed_frac: float | None
    alloc_median_abs_rel_err: float | None
    alloc_p90_abs_rel_err: float | None
    reserved_median_abs_rel_err: float | None
    reserved_p90_abs_rel_err: float | None
    best_kept: bool | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Reading ----------------------------------------------------------------------------------------

def read_memory_runs(path: str | Path, spec: Spec) -> Runs:
    """Read a runs CSV of the playbook's formats, or a sweep's runs.parquet, and map its rows to
    the spec's models."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            raw = pd.read_parquet(path)
        except (OSError, ValueError) as error:
            raise RunsFileError(unreadable_runs(path, error)) from None
        return normalise(raw, spec, str(path))
    try:
        raw = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise RunsFileError(f"{path}: cannot read it as CSV ({error}); memory-check reads the "
                            "playbook's CSV tables and a sweep's runs.parquet") from None
    return normalise(raw, spec, str(path))


def detect_format(columns: list[str], source: str = "<runs>") -> str:
    present = set(columns)
    formats = (("sweep", SWEEP_COLUMNS), ("full", FULL_COLUMNS), ("charts", CHARTS_COLUMNS))
    for name, wanted in formats:
        if present >= set(wanted):
            return name
    missing = {name: sorted(set(wanted) - present) for name, wanted in formats}
    closest = min(missing, key=lambda k: len(missing[k]))
    raise RunsFileError(f"{source}: not a runs format memory-check reads; closest is "
                        f"`{closest}`, which also needs the column(s) {missing[closest]}")


def normalise(raw: pd.DataFrame, spec: Spec, source: str = "<runs>") -> Runs:
    fmt = detect_format(list(raw.columns), source)
    if fmt == "sweep":
        return _normalise_sweep(raw, spec, source)
    if fmt == "charts":
        frame = pd.DataFrame({
            "model": raw["model_label"].map(
                {label: _model_for_label(label, spec) for label in raw["model_label"].unique()}),
            "outcome": raw["status"].str.lower().map({"success": "success", "failed": "failed"}),
            "grad_acc": raw["grad_acc"], "sp": max(spec.axes.sp),
            "alloc_bytes": np.nan, "reserved_bytes": raw["gpu_memory_GB"] * GiB,
            "tokens_per_sec_per_gpu": raw["tokens_per_sec_per_gpu"]})
    else:
        frame = pd.DataFrame({
            "model": _full_models(raw, spec),
            "outcome": raw["status"].map({"Success": "success", "OOM": "oom", "Other": "other"}),
            "grad_acc": raw["batch_accum"],
            "sp": (raw["tp_mode"] != "ALL_REDUCE") if "tp_mode" in raw else max(spec.axes.sp),
            "alloc_bytes": raw["Mem Alloc (GB)"] * GiB, "reserved_bytes": raw["Mem Res (GB)"] * GiB,
            "tokens_per_sec_per_gpu": raw["tok/s/gpu"]})
    for column in ("nodes", *PLAYBOOK_LAYOUT_COLUMNS):
        if column not in frame:  # grad_acc: by the format's own name, above
            frame[column] = raw[column]
    if frame["outcome"].isna().any():
        bad = sorted(set(raw.loc[frame["outcome"].isna(), "status"].astype(str)))
        raise RunsFileError(f"{source}: status {bad} is not one this format uses")
    return _usable(frame, spec, fmt, skipped=pd.Series(False, index=frame.index))


def _normalise_sweep(raw: pd.DataFrame, spec: Spec, source: str) -> Runs:
    """A runs.parquet: the attempts that say something about memory, their own layout columns,
    and the stage and allocated peak their memory source measured (`MEASURED_RANK`)."""
    _check_same_as_spec(raw, spec, source)
    outcome = raw["outcome"].map(lambda o: SWEEP_OUTCOMES.get(o, "other") if isinstance(o, str)
                                 else None)
    if (outcome == "oom").any():  # a table that names OOMs: its other failures were not OOMs
        outcome = outcome.replace("failed", "other")
    mem_source = raw["mem_source"] if "mem_source" in raw else pd.Series(None, index=raw.index)
    framework = raw["framework"] if "framework" in raw else pd.Series(spec.framework,
                                                                      index=raw.index)
    rank = [MEASURED_RANK.get((str(f), str(m))) or MEASURED_RANK.get(("*", str(m)))
            for f, m in zip(framework, mem_source, strict=True)]
    on_gpu = pd.Series([r is not None for r in rank], index=raw.index)
    flushed = fitted_by_flushing(raw)
    frame = pd.DataFrame({
        "model": raw["model"].map({m: _model_for_label(m, spec) for m in raw["model"].unique()}),
        "outcome": outcome, "grad_acc": raw["grad_acc"],
        "sp": raw["sp"] if "sp" in raw else max(spec.axes.sp),
        "alloc_bytes": pd.to_numeric(raw["mem_allocated_bytes"]).astype("float64").where(on_gpu),
        "reserved_bytes": pd.to_numeric(raw["mem_reserved_bytes"]).astype("float64").where(
            on_gpu & ~flushed),
        "tokens_per_sec_per_gpu": raw.get("tokens_per_sec_per_gpu", np.nan),
        "measured_stage": [r[0] if r else "first" for r in rank],
        "alloc_peak": [r[1] if r else "step" for r in rank]})
    for column in ("nodes", *PLAYBOOK_LAYOUT_COLUMNS, *EXTRA_LAYOUT):
        if column in raw and column not in frame:
            frame[column] = raw[column]
    if "framework_version" in raw:  # the versions a sweep spans (`score_by_version`)
        frame["framework_version"] = raw["framework_version"]
    return _usable(frame, spec, "sweep", skipped=frame["outcome"].isna())


def _check_same_as_spec(raw: pd.DataFrame, spec: Spec, source: str) -> None:
    """A row run by another framework, or at another sequence length, dtype or node size than
    the spec's would be judged as the spec's: refuse it, naming the column and the fix."""
    wanted = {"framework": spec.framework, "seq_len": spec.seq_len, "dtype": spec.dtype,
              "gpus_per_node": spec.gpus_per_node_resolved}
    for column in SAME_AS_SPEC:
        if column not in raw:
            continue
        values = raw[column].dropna()
        other = sorted({str(v) for v in values if str(v) != str(wanted[column])})
        if other:
            raise RunsFileError(f"{source}: column {column!r} has {other} where the spec has "
                                f"{wanted[column]!r}: check these runs against the spec they "
                                "were planned from")


def _usable(frame: pd.DataFrame, spec: Spec, fmt: str, skipped: pd.Series) -> Runs:
    """The rows with a spec model, every layout value (the table's own cp, ep, vpp,
    recomputation, schedule and SP included), and a world size of nodes × the spec's GPUs per
    node; the others (and `skipped`) are counted as skipped."""
    layout = ["nodes", *PLAYBOOK_LAYOUT_COLUMNS]
    present = layout + [c for c in (*EXTRA_LAYOUT, "sp") if c in frame]
    world = frame.dp * frame.tp * frame.pp * frame.get("cp", 1) * frame.get("ep", 1)
    usable = (~skipped.astype(bool) & frame["model"].notna() & frame[present].notna().all(axis=1)
              & (world == frame.nodes * spec.gpus_per_node_resolved))
    usable = usable.fillna(False).astype(bool)
    frame = frame[usable].reset_index(drop=True)
    for column in layout + [c for c in EXTRA_LAYOUT if c in LAYOUT_INT_COLUMNS and c in frame]:
        frame[column] = frame[column].astype(np.int64)
    if "sp" in frame and frame["sp"].dtype != bool:
        frame["sp"] = frame["sp"].astype(bool)
    return Runs(format=fmt, frame=frame, n_skipped=int((~usable).sum()))


def _model_for_label(label: object, spec: Spec) -> str | None:
    """A charts label ("1B", "8B") → the spec model it names: by name, catalog alias, or
    parameter count ("1.34B")."""
    text = str(label)
    for model in spec.model_shapes:
        if text in (model.name, _param_label(model, "B")) or _resolves_to(text, model.name):
            return model.name
    return None


def _resolves_to(alias: str, name: str) -> bool:
    try:
        return catalog.get_model(alias).name == name
    except catalog.CatalogError:
        return False


def _param_label(model: ModelShape, unit: str) -> str:
    return f"{count_parameters(model).total / 1e9:.2f}{unit}"


def _full_models(raw: pd.DataFrame, spec: Spec) -> pd.Series:
    """Each row's spec model: shape columns first, then the `name`'s parameter label."""
    keys = ["num_layers", "hidden_size", "num_heads", "vocab_size"]
    optional = [c for c in ("num_kv_heads", "tie_word_embeddings") if c in raw.columns]
    label = raw["name"].astype(str).str.extract(r"^([0-9.]+[A-Za-z]?)_", expand=False)
    groups = raw[keys + optional].assign(label=label).astype(str)
    out = pd.Series([None] * len(raw), index=raw.index, dtype=object)
    for values, index in groups.groupby(list(groups.columns), dropna=False).groups.items():
        row = dict(zip(groups.columns, values))
        out[index] = _match_shape(row, spec)
    return out


def _match_shape(row: dict[str, object], spec: Spec) -> str | None:
    def same(value: object, wanted: int | bool) -> bool:
        if pd.isna(value) or str(value) in ("nan", "None", "<NA>", ""):
            return True  # the failed rows leave these empty: not evidence either way
        value = str(value)
        if isinstance(wanted, bool):
            return value.lower() in (("true", "1", "1.0") if wanted else ("false", "0", "0.0"))
        return float(value) == wanted

    candidates = [m for m in spec.model_shapes
                  if same(row["num_layers"], m.num_layers)
                  and same(row["hidden_size"], m.hidden_size)
                  and same(row["num_heads"], m.num_attention_heads)
                  and same(row["vocab_size"], m.vocab_size)
                  and same(row.get("num_kv_heads", ""), m.num_kv_heads)
                  and same(row.get("tie_word_embeddings", ""), m.tie_word_embeddings)]
    if len(candidates) > 1:
        label = str(row.get("label", ""))
        candidates = [m for m in candidates
                      if label in (_param_label(m, "G"), _param_label(m, "B"))
                      or _resolves_to(label, m.name)]
    return candidates[0].name if len(candidates) == 1 else None


# Scoring ----------------------------------------------------------------------------------------

def layout_columns(group: pd.DataFrame, spec: Spec) -> dict[str, np.ndarray]:
    """The planner's candidate columns for runs of one model (as `sweep.plan.space` builds them): a
    sweep's own table gives cp, ep, recomputation, schedule and vpp; the playbook's tables
    leave them at the spec's first value (what they ran)."""
    schedule = spec.axes.pp_schedule[0]
    n = len(group)
    columns = {k: group[k].to_numpy(np.int64) for k in PLAYBOOK_LAYOUT_COLUMNS}
    columns.update(cp=np.ones(n, np.int64), ep=np.ones(n, np.int64),
                   sp=group["sp"].to_numpy(bool) & (columns["tp"] > 1),  # as the plan
                   recompute=np.full(n, spec.axes.recompute[0]),
                   pp_schedule=np.full(n, schedule),
                   vpp=np.where((schedule == "interleaved_1f1b") & (columns["pp"] > 1),
                                space.INTERLEAVED_VPP, 1))
    for column in EXTRA_LAYOUT:
        if column in group:
            kind = np.int64 if column in LAYOUT_INT_COLUMNS else str
            columns[column] = group[column].to_numpy().astype(kind)
    return columns


def _evaluate_with(columns: dict[str, np.ndarray], ctx: space.RuleContext,
                   profile: MemoryProfile | str) -> tuple[np.ndarray, np.ndarray]:
    """The planner's verdict on each run, under `profile` (the spec framework's, or the allocator
    constants of a fit): the rules before memory as the planner runs them, then the memory rule
    as `space.evaluate` applies it, on this profile's estimate of the most loaded stage. Returns
    the rule codes of the point estimate (`ctx.memory_probes` off) and which runs the memory
    band would keep as probes (pruned by memory, the band's low end under the budget)."""
    code, _ = space.evaluate(columns, ctx, skip=frozenset({"batch", "memory"}))
    probed = np.zeros(len(code), bool)
    mem = _estimate(columns, ctx, profile, "most_loaded")
    if ctx.memory_budget_bytes is not None and mem:
        estimated = columns["grad_acc"] >= 1
        over = space.memory_over(mem, ctx.memory_budget_bytes, probes=False) & estimated
        beyond_band = space.memory_over(mem, ctx.memory_budget_bytes, probes=True,
                                        band=ctx.reserved_band)
        probed = (code == -1) & over & ~beyond_band
        code[(code == -1) & over] = space.RULE_NAMES.index("memory")
    return code, probed


def _estimate(columns: dict[str, np.ndarray], ctx: space.RuleContext, profile: MemoryProfile | str,
              stage: str) -> dict[str, np.ndarray]:
    """The memory model's columns for the runs with grad_acc >= 1 (-1 for the others)."""
    n = len(columns["tp"])
    wanted = columns["grad_acc"] >= 1
    mem: dict[str, np.ndarray] = {}
    if wanted.any():
        subset = {k: v[wanted] for k, v in columns.items()}
        estimated = memory.estimate_columns(ctx.model, subset, seq_len=ctx.seq_len,
                                            dtype=ctx.dtype, profile=profile, stage=stage)
        for key, values in estimated.items():
            full = np.full(n, -1, dtype=np.int64)
            full[wanted] = values
            mem[key] = full
    return mem


def judge(runs: Runs, spec: Spec, allocator: MemoryProfile | None = None) -> pd.DataFrame:
    """The runs with the planner's verdict (`kept`, `prune_rule`) and predicted bytes.

    The verdict is the planner's (the memory rule on the most loaded stage); the predicted peaks
    are those of the stage that was measured: rank 0's, the first pipeline stage, in the
    playbook's tables, and the most loaded stage where a sweep measured every rank.
    `allocator`: a memory profile to judge with instead of the spec framework's (what
    `sweep.validation.memory_fit` passes to score allocator constants fitted on other runs)."""
    frame = runs.frame.copy()
    frame["kept"] = False
    frame["probed"] = False
    frame["prune_rule"] = None
    frame["pred_alloc_bytes"] = np.nan
    frame["pred_reserved_bytes"] = np.nan
    for name, group in frame.groupby("model"):
        model = next(m for m in spec.model_shapes if m.name == name)
        columns = layout_columns(group, spec)
        ctx = space.RuleContext.from_spec(spec, model)
        profile: MemoryProfile = ctx.memory_profile() if allocator is None else allocator
        code, probed = _evaluate_with(columns, ctx, profile)
        frame.loc[group.index, "kept"] = code < 0
        frame.loc[group.index, "probed"] = probed
        frame.loc[group.index, "prune_rule"] = [None if c < 0 else space.RULE_NAMES[c]
                                                for c in code]
        measured = _estimate(columns, ctx, profile, "first")
        if not measured:
            continue
        if "measured_stage" in group:  # a sweep's own peaks: the largest over the ranks
            loaded = _estimate(columns, ctx, profile, "most_loaded")
            on_loaded = group["measured_stage"].to_numpy() == "most_loaded"
            measured = {k: np.where(on_loaded, loaded[k], v) for k, v in measured.items()}
        step = measured.get("mem_step_allocated_bytes", measured["mem_allocated_bytes"])
        if "alloc_peak" in group:  # the whole run's peak where nothing reset the counters
            step = np.where(group["alloc_peak"].to_numpy() == "run",
                            measured["mem_allocated_bytes"], step)
        for target, values in (("pred_alloc_bytes", step),
                               ("pred_reserved_bytes", measured["mem_reserved_bytes"])):
            values = np.asarray(values).astype(np.float64)
            frame.loc[group.index, target] = np.where(values < 0, np.nan, values)
    return frame


def score(runs: Runs, spec: Spec, allocator: MemoryProfile | None = None) -> MemoryCheck:
    """The planner and the memory model scored on the runs (`allocator`: see `judge`)."""
    return score_judged(judge(runs, spec, allocator), runs.format, runs.n_skipped)


def score_judged(judged: pd.DataFrame, fmt: str, n_skipped: int = 0) -> MemoryCheck:
    """The figures of judged runs (`judge`, or several judged frames concatenated)."""
    # the formats that tell OOMs apart (an imported charts table does not)
    full = fmt == "full" or (fmt == "sweep" and not (judged["outcome"] == "failed").any())
    outcome = judged["outcome"]
    success = outcome == "success"
    failed = ~success
    oom = outcome == "oom"
    alloc = _errors(judged.loc[success, "pred_alloc_bytes"], judged.loc[success, "alloc_bytes"])
    reserved = _errors(judged.loc[success, "pred_reserved_bytes"],
                       judged.loc[success, "reserved_bytes"])
    return MemoryCheck(
        n_success=int(success.sum()),
        n_oom=int(oom.sum()) if full else None,
        n_other=int((outcome == "other").sum()) if full else None,
        n_failed=int(failed.sum()),
        n_skipped=n_skipped,
        success_kept_frac=_mean(judged.loc[success, "kept"]),
        oom_pruned_frac=_mean(~judged.loc[oom, "kept"]) if full else None,
        failed_pruned_frac=_mean(~judged.loc[failed, "kept"]),
        success_probed_frac=_mean(judged.loc[success, "probed"]),
        success_lost_frac=_mean(~(judged.loc[success, "kept"] | judged.loc[success, "probed"])),
        oom_probed_frac=_mean(judged.loc[oom, "probed"]) if full else None,
        alloc_median_abs_rel_err=_quantile(alloc, 0.5) if full else None,
        alloc_p90_abs_rel_err=_quantile(alloc, 0.9) if full else None,
        reserved_median_abs_rel_err=_quantile(reserved, 0.5),
        reserved_p90_abs_rel_err=_quantile(reserved, 0.9),
        best_kept=best_kept(judged),
    )


def score_by_version(judged: pd.DataFrame, fmt: str) -> dict[str, MemoryCheck]:
    """The figures per framework version, where a sweep's runs span more than one: the
    allocator's reserve can change between versions of one framework (the playbook's table
    shows it, sweep.validation.memory_fit), and one set of constants then fits one version at the other's cost.
    Empty for one version or none."""
    if "framework_version" not in judged:
        return {}
    versions = judged["framework_version"].dropna().astype(str)
    if versions.nunique() < 2:
        return {}
    return {version: score_judged(judged.loc[versions.index[versions == version]], fmt)
            for version in sorted(versions.unique())}


def best_kept(judged: pd.DataFrame) -> bool | None:
    """Whether the fastest successful run (tokens/s/GPU) of every (model, nodes) cell is kept."""
    success = judged[(judged["outcome"] == "success") & judged["tokens_per_sec_per_gpu"].notna()]
    if success.empty:
        return None
    best = success.loc[success.groupby(["model", "nodes"])["tokens_per_sec_per_gpu"].idxmax()]
    return bool(best["kept"].all())


def _errors(predicted: pd.Series, measured: pd.Series) -> np.ndarray:
    ok = predicted.notna() & measured.notna() & (measured > 0)
    return (np.abs(predicted[ok] - measured[ok]) / measured[ok]).to_numpy()


def _quantile(values: np.ndarray, q: float) -> float | None:
    return float(np.quantile(values, q)) if len(values) else None


def _mean(values: pd.Series) -> float | None:
    return float(values.astype(bool).mean()) if len(values) else None


def check(path: str | Path, spec: Spec) -> MemoryCheck:
    """Read a runs file and score the spec's memory model and rules on it."""
    return score(read_memory_runs(path, spec), spec)

