"""The configuration space: every parallel layout of every (model, node count), and its verdict.

For each (model, nodes) the planner takes every factorisation dp·tp·pp·cp·ep = GPUs that the
axes allow, crosses it with the micro-batch sizes, ZeRO stages, recomputation modes, sequence
parallelism and pipeline schedules, and derives grad_acc from the global batch. Batch semantics
are the layout's (`sweep.core.layout`): sequences per step = dp·ep·mbs·grad_acc, because context
parallelism splits each sequence over cp ranks instead of adding a replica.

Every candidate stays in the plan. `PRUNE_RULES` run in their fixed order and a candidate's
status is `kept` or `pruned:<first rule it fails>`. Everything is vectorised with numpy: a rule is
one boolean expression over whole columns, so a million candidates take about a second. The memory
rule prunes only what its error band puts wholly over the limit; a kept candidate whose point
estimate is over it is a *probe* (column `probe`; `memory_over`).

Two choices keep the plan free of duplicate runs: at tp = 1 sequence parallelism changes
nothing, so such a layout appears once, recorded as sp = False (frameworks reject or ignore SP
without TP; nanotron's REDUCE_SCATTER and ALL_REDUCE modes are the same run at tp = 1); at
pp = 1 the pipeline schedule changes nothing, so it appears once (the first schedule listed,
vpp = 1); with a single replica (dp·ep·cp = 1) ZeRO has nothing to shard, so the layout appears
once, at the lowest ZeRO stage listed. The interleaved schedule uses vpp = 2 virtual stages per pipeline rank.

Pure, except where the memory rule's limit on a CPU spec comes from Slurm or this host
(`sweep.plan.device_memory`). The memory rule calls `sweep.models.memory.estimate_columns`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd
import pyarrow as pa
from numpy.typing import ArrayLike

from sweep.core.layout import LAYOUT_COLUMNS, LAYOUT_INT_COLUMNS, ROW_KEY, Layout
from sweep.core.model import ModelShape
from sweep.core.runconfig import RunConfig
from sweep.core.units import GiB
from sweep.frameworks import get_adapter
from sweep.frameworks.base import CapabilityContext
from sweep.frameworks.capability_check import capability_failures
from sweep.models import memory
from sweep.models.memory import reserved_interval
from sweep.models.memory_profiles import (
    RESERVED_BAND,
    Allocator,
    MemoryProfile,
    profile_with,
)
from sweep.plan.device_memory import DeviceMemory, device_memory
from sweep.plan.spec import OVERRIDE_COLUMNS, Spec


@dataclass(frozen=True)
class PruneRule:
    name: str
    why: str


PRUNE_RULES: Final = (
    PruneRule("tp_heads", "tp must divide the attention heads and the KV heads (no framework "
                          "here replicates KV heads across TP ranks)"),
    PruneRule("tp_width", "the built-in workload shards the FFN and the vocabulary over tp "
                          "without padding, so tp must divide both"),
    PruneRule("ep_experts", "ep > 1 needs a mixture-of-experts model whose expert count ep "
                            "divides, and a framework with expert parallelism (not builtin)"),
    PruneRule("cp_seq", "context parallelism splits the sequence into 2·cp load-balanced "
                        "chunks, so 2·cp must divide seq_len; with sequence parallelism each "
                        "chunk is split over tp too, so cp·tp must divide it"),
    PruneRule("pp_layers", "every pipeline stage must get at least one block, counted as the "
                           "framework places them (each adapter's `pipeline_fits`)"),
    PruneRule("batch", "the global batch must split into dp·ep replicas × mbs × an integer "
                       "grad_acc"),
    PruneRule("pp_grad_acc", "1F1B needs grad_acc ≥ pp − 1 micro-batches (nanotron asserts "
                             "it; `torch.distributed.pipelining`, under the built-in workload, "
                             "≥ pp); interleaved 1F1B needs grad_acc to be a multiple of pp"),
    PruneRule("tp_across_nodes", "a TP group must fit inside one node unless the spec sets "
                                 "`constraints.allow_tp_across_nodes`"),
    PruneRule("max_tp", "tp above `constraints.max_tp` (default: GPUs per node)"),
    PruneRule("max_pp", "pp above `constraints.max_pp`"),
    PruneRule("max_mbs", "micro-batch size above `constraints.max_mbs`"),
    PruneRule("framework", "the framework cannot run this configuration as labelled: a rule of "
                           "its adapter's capability table (`sweep/frameworks/<name>/"
                           "capabilities.py`); `prune_detail` gives the rule and the framework's "
                           "reason"),
    PruneRule("memory", "the memory model's total for the most loaded GPU exceeds its memory "
                        "× (1 − `constraints.memory_headroom`), and so does the low end of its "
                        "left-out error band (inside the band the run is kept as a probe; "
                        "`constraints.memory_probes: false` prunes on the point estimate); on "
                        "`gpu: cpu` without `gpu_memory_gb`, the tensors a rank holds "
                        "(mem_allocated_bytes) exceed its share of host memory "
                        "(`sweep.plan.device_memory`)"),
)
RULE_NAMES: Final = tuple(rule.name for rule in PRUNE_RULES)
KEPT: Final = "kept"
STATUSES: Final = (KEPT, *(f"pruned:{name}" for name in RULE_NAMES))
INTERLEAVED_VPP: Final = 2
MAX_CANDIDATES_PER_NODE_COUNT: Final = 10_000_000  # about 3 GB of columns: a typo, not a plan


class PlanError(ValueError):
    """The spec is valid YAML but no plan can be made from it: names the field and the fix."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def memory_budget_bytes(spec: Spec) -> int | None:
    """The device's fixed ceiling less the spec's headroom: the GPU's memory, or `gpu_memory_gb`
    (None: no fixed ceiling, as `gpu: cpu` without `gpu_memory_gb`). The self-calibrations judge
    attempts by it; the planner prunes by `memory_limit`, which also finds a CPU rank's share of
    Slurm's or the host's memory."""
    gpu_bytes = spec.gpu_spec.memory_bytes
    return None if gpu_bytes is None else int(gpu_bytes * (1.0 - spec.constraints.memory_headroom))


@dataclass(frozen=True)
class MemoryLimit:
    """What the memory rule allows per rank (the device's memory less the spec's headroom) and
    where the device's figure comes from (`sweep.plan.device_memory`)."""

    budget_bytes: int
    device: DeviceMemory

    def describe(self) -> str:
        return f"{self.budget_bytes / GiB:.1f} GiB per rank ({self.device.source})"



def memory_limit(spec: Spec) -> MemoryLimit | None:
    """The memory rule's limit per rank and its source; None: no figure, no memory rule."""
    device = device_memory(spec)
    if device is None:
        return None
    return MemoryLimit(int(device.bytes * (1.0 - spec.constraints.memory_headroom)), device)


def memory_prune_detail(limit: MemoryLimit) -> str:
    """The `prune_detail` of a candidate the memory rule prunes."""
    return f"memory: the predicted peak per rank is over {limit.describe()}"


@dataclass(frozen=True)
class RuleContext:
    """What the rules need besides the candidate columns: one model on one hardware setup."""

    model: ModelShape
    framework: str
    gpus_per_node: int
    seq_len: int
    global_batch_sequences: int
    dtype: str = "bf16"
    max_tp: int = 8
    max_pp: int | None = None
    max_mbs: int = 64
    allow_tp_across_nodes: bool = False
    memory_budget_bytes: int | None = None  # None: no memory rule (no fixed ceiling)
    memory_probes: bool = True  # keep what the memory band straddles as a probe (`memory_over`)
    framework_version: str = ""  # "": the adapter's default version
    overlap_communication: bool = True
    tp_comm_overlap: bool = False
    gpu: str = ""
    expert_tensor_parallel: int | str | None = None  # run.moe.expert_tensor_parallel
    allocator: Allocator | None = None  # the spec's allocator constants; None: the profile's own
    reserved_band: tuple[float, float] = RESERVED_BAND  # the probes' band (`memory_over`)
    memory_on_tensors: bool = False  # a CPU rank's share of host memory: judge its tensors

    @classmethod
    def from_spec(cls, spec: Spec, model: ModelShape,
                  limit: MemoryLimit | None | bool = True) -> RuleContext:
        """`limit`: the memory rule's (`memory_limit`, looked up when True)."""
        found = memory_limit(spec) if limit is True else limit or None
        budget = found.budget_bytes if found is not None else None
        return cls(model=model, framework=spec.framework,
                   gpus_per_node=spec.gpus_per_node_resolved, seq_len=spec.seq_len,
                   global_batch_sequences=spec.global_batch_sequences, dtype=spec.dtype,
                   max_tp=spec.max_tp, max_pp=spec.constraints.max_pp,
                   max_mbs=spec.constraints.max_mbs,
                   allow_tp_across_nodes=spec.constraints.allow_tp_across_nodes,
                   memory_budget_bytes=budget,
                   memory_probes=spec.constraints.memory_probes,
                   framework_version=spec.run.framework_version or "",
                   overlap_communication=spec.run.overlap_communication,
                   tp_comm_overlap=spec.run.tp_comm_overlap, gpu=spec.gpu,
                   expert_tensor_parallel=(spec.run.moe.expert_tensor_parallel
                                           if spec.run.moe else None),
                   allocator=spec.allocator, reserved_band=spec.reserved_band,
                   memory_on_tensors=found is not None and found.device.host_share)

    @property
    def version_key(self) -> str:
        """The framework version the runs are rendered for: the spec's, else the adapter's default."""
        return get_adapter(self.framework).version(self.framework_version or None).key

    def memory_profile(self) -> MemoryProfile:
        """The memory profile of the framework at that version, with the spec's allocator
        constants if it names them."""
        return profile_with(self.framework, self.allocator, self.version_key)

    def capability_context(self) -> CapabilityContext:
        return CapabilityContext(
            model=self.model, dtype=self.dtype, seq_len=self.seq_len,
            gpus_per_node=self.gpus_per_node, global_batch_sequences=self.global_batch_sequences,
            framework_version=self.version_key,
            overlap_communication=self.overlap_communication,
            tp_comm_overlap=self.tp_comm_overlap, gpu=self.gpu,
            expert_tensor_parallel=self.expert_tensor_parallel)


# Pipeline stage placement -----------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def pipeline_fits(model: ModelShape, stages: int, framework: str) -> bool:
    """Whether every one of `stages` pipeline stages gets at least one block, as the framework
    places them (its adapter's `pipeline_fits`, sweep/frameworks/<name>/__init__.py)."""
    return stages <= 1 or get_adapter(framework).pipeline_fits(model, stages)


# Rules ------------------------------------------------------------------------------------------

def rule_failures(columns: Mapping[str, np.ndarray], ctx: RuleContext,
                  skip: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """Each cheap rule's failure mask (the memory rule is separate: it needs the estimate)."""
    m = ctx.model
    tp, pp, cp, ep, dp = (columns[k] for k in ("tp", "pp", "cp", "ep", "dp"))
    mbs, grad_acc, vpp = columns["mbs"], columns["grad_acc"], columns["vpp"]
    schedule = columns["pp_schedule"]
    stages = pp * vpp
    unique_stages = np.unique(stages)
    fits = {int(s): pipeline_fits(m, int(s), ctx.framework) for s in unique_stages}
    stage_ok = np.array([fits[int(s)] for s in unique_stages])[np.searchsorted(unique_stages,
                                                                                 stages)]
    interleaved = schedule == "interleaved_1f1b"
    one_f_one_b = schedule == "1f1b"
    replicas_mbs = dp * ep * mbs
    adapter = get_adapter(ctx.framework)
    no_padding = adapter.shards_need_divisibility
    no_experts = not adapter.expert_parallel or m.num_experts == 0
    failures = {
        "tp_heads": (m.num_attention_heads % tp != 0) | (m.num_kv_heads % tp != 0),
        "tp_width": (no_padding & ((m.ffn_hidden_size % tp != 0) | (m.vocab_size % tp != 0))),
        "ep_experts": (ep > 1) & (no_experts | (m.num_experts % ep != 0)),
        "cp_seq": ((cp > 1) & (ctx.seq_len % (2 * cp) != 0))
        | (columns["sp"] & (ctx.seq_len % (cp * tp) != 0)),
        "pp_layers": ~stage_ok,
        "batch": ctx.global_batch_sequences % replicas_mbs != 0,
        "pp_grad_acc": (pp > 1) & ((one_f_one_b
                                    & (grad_acc < pp - adapter.one_f_one_b_microbatch_offset))
                                   | (interleaved & (grad_acc % pp != 0))),
        "tp_across_nodes": np.zeros(tp.shape, bool) if ctx.allow_tp_across_nodes
        else (tp > ctx.gpus_per_node) | (ctx.gpus_per_node % tp != 0),
        "max_tp": tp > ctx.max_tp,
        "max_pp": np.zeros(pp.shape, bool) if ctx.max_pp is None else pp > ctx.max_pp,
        "max_mbs": mbs > ctx.max_mbs,
        "framework": capability_rule_index(columns, ctx) >= 0,
    }
    for name in skip:
        failures.pop(name, None)
    return failures


def capability_rule_index(columns: Mapping[str, np.ndarray], ctx: RuleContext) -> np.ndarray:
    """The index, in the adapter's capability table, of the first rule each candidate fails
    (-1: the framework runs it as labelled)."""
    adapter = get_adapter(ctx.framework)
    return capability_failures(adapter, columns, ctx.capability_context())[1]


def capability_details(columns: Mapping[str, np.ndarray], ctx: RuleContext) -> np.ndarray:
    """For each candidate, the capability rule it fails with the framework's reason, or None."""
    rules = get_adapter(ctx.framework).capabilities
    index = capability_rule_index(columns, ctx)
    details = np.array([None, *(rule.detail() for rule in rules)], dtype=object)
    return details[index + 1]


def memory_columns(columns: Mapping[str, np.ndarray], ctx: RuleContext) -> dict[str, np.ndarray]:
    """The memory model's per-component bytes for these candidates (grad_acc >= 1 expected)."""
    return memory.estimate_columns(ctx.model, columns, seq_len=ctx.seq_len, dtype=ctx.dtype,
                                   profile=ctx.memory_profile())


def evaluate(columns: Mapping[str, np.ndarray], ctx: RuleContext,
             skip: frozenset[str] = frozenset(),
             memory_for_all: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Apply PRUNE_RULES in order.

    Returns each candidate's rule code (-1: kept, else the index in PRUNE_RULES of the first
    rule it fails) and the memory columns. Memory is estimated for the candidates that pass
    every earlier rule (or for all of them with `memory_for_all`); the others get -1.
    """
    n = len(columns["tp"])
    code = np.full(n, -1, dtype=np.int8)
    failures = rule_failures(columns, ctx, skip)
    for index, name in enumerate(RULE_NAMES):
        if name in failures:
            code[(code == -1) & failures[name]] = index
    wanted = np.ones(n, bool) if memory_for_all else code == -1
    wanted &= columns["grad_acc"] >= 1
    mem: dict[str, np.ndarray] = {}
    if wanted.any():
        subset = {k: v[wanted] for k, v in columns.items()}
        for key, values in memory_columns(subset, ctx).items():
            full = np.full(n, -1, dtype=np.int64)
            full[wanted] = values
            mem[key] = full
    if ctx.memory_budget_bytes is not None and "memory" not in skip and mem:
        if ctx.memory_on_tensors:  # host memory: no CUDA context, no caching allocator, no band
            over = np.asarray(mem["mem_allocated_bytes"]) > ctx.memory_budget_bytes
        else:
            over = memory_over(mem, ctx.memory_budget_bytes, probes=ctx.memory_probes,
                               band=ctx.reserved_band)
        code[(code == -1) & wanted & over] = RULE_NAMES.index("memory")
    return code, mem


def memory_over(mem: Mapping[str, ArrayLike], budget: int, probes: bool = True,
                band: tuple[float, float] = RESERVED_BAND) -> np.ndarray:
    """Which candidates the memory rule prunes, from the memory model's columns.

    The point estimate (`mem_total_bytes`) is over the budget, and, with `probes`, so is the low
    end of its band: the reserved peak's left-out error (`reserved_interval`, with `band`: the
    spec's own, `Spec.reserved_band`, else the shipped constants'; the CUDA/NCCL
    overhead outside the allocator is added as predicted). A candidate the band puts on both
    sides of the limit is not pruned: the model cannot tell, so the run is kept as a *probe*
    (`is_probe`), and its outcome decides it and, through the OOM proof of `sweep.search.strategies`, its
    neighbours. Why the band and not a larger headroom: the error is a share of the allocator's
    bytes, not of the GPU, and it was measured on models the constants were not fitted on.
    """
    total = np.asarray(mem["mem_total_bytes"], dtype=np.float64)
    over = total > budget
    if probes:
        low, _ = reserved_interval(mem["mem_reserved_bytes"], band,
                                   fixed_bytes=mem["mem_overhead_bytes"])
        over &= low > budget
    return over


def is_probe(frame: pd.DataFrame, budget: int | None) -> np.ndarray:
    """Kept candidates whose point estimate is over the budget: kept only because the band of
    `memory_over` reaches under it. Their run is the probe."""
    if budget is None or "mem_total_bytes" not in frame:
        return np.zeros(len(frame), bool)
    total = pd.to_numeric(frame["mem_total_bytes"], errors="coerce").to_numpy(np.float64)
    return ((frame["status"].astype(str) == KEPT).to_numpy() & (total > budget))


# Enumeration ------------------------------------------------------------------------------------

def _divisors(n: int) -> np.ndarray:
    ks = np.arange(1, n + 1, dtype=np.int64)
    return ks[n % ks == 0]


def _axis(values: object, gpus: int) -> np.ndarray:
    divisors = _divisors(gpus)
    if values == "auto":
        return divisors
    listed = [v for v in values if gpus % v == 0]  # type: ignore[attr-defined]
    return np.array(listed, dtype=np.int64)


def factorizations(spec: Spec, gpus: int) -> dict[str, np.ndarray]:
    """Every (dp, tp, pp, cp, ep) with dp·tp·pp·cp·ep = gpus that the spec's axes allow.

    Built one axis at a time on the GPUs still unassigned, so the work grows with the number
    of factorisations, not with the number of divisors to the fourth power.
    """
    axes = spec.axes
    found: dict[str, np.ndarray] = {"rest": np.array([gpus], dtype=np.int64)}
    for name in ("tp", "pp", "cp", "ep"):
        values = _axis(getattr(axes, name), gpus)
        row, col = (i.ravel() for i in np.indices((len(found["rest"]), len(values))))
        fits = found["rest"][row] % values[col] == 0
        found = {k: v[row[fits]] for k, v in found.items()}
        found[name] = values[col[fits]]
        found["rest"] = found["rest"] // found[name]
    dp = found.pop("rest")
    ok = np.ones(len(dp), bool) if axes.dp == "auto" else np.isin(dp, np.array(axes.dp))
    return {"dp": dp[ok], **{k: v[ok] for k, v in found.items()}}


def micro_batch_sizes(spec: Spec) -> np.ndarray:
    """The mbs axis; `auto` is the powers of two up to max_mbs and the global batch."""
    if spec.axes.mbs != "auto":
        return np.array(spec.axes.mbs, dtype=np.int64)
    limit = min(spec.constraints.max_mbs, spec.global_batch_sequences)
    return 2 ** np.arange(int(np.log2(limit)) + 1, dtype=np.int64)


def enumerate_candidates(spec: Spec, nodes: int) -> dict[str, np.ndarray]:
    """All candidates of one node count (model-independent: the rules bring in the model)."""
    gpus = nodes * spec.gpus_per_node_resolved
    layouts = factorizations(spec, gpus)
    if not len(layouts["dp"]):
        raise PlanError("nodes", f"{nodes} node(s) × {spec.gpus_per_node_resolved} GPUs = {gpus} "
                                 "GPUs, and no dp·tp·pp·cp·ep layout of the axes' values "
                                 "multiplies to that; drop this node count or widen the axes")
    sp_values = np.array(spec.axes.sp, dtype=bool)
    schedules = np.array(spec.axes.pp_schedule)
    recompute = np.array(spec.axes.recompute)
    axes = [np.arange(len(layouts["dp"])), micro_batch_sizes(spec),
            np.array(spec.zero_stages, dtype=np.int64), np.arange(len(recompute)),
            np.arange(len(sp_values)), np.arange(len(schedules))]
    sizes = [len(a) for a in axes]
    if int(np.prod(sizes)) > MAX_CANDIDATES_PER_NODE_COUNT:
        raise PlanError("axes", f"{nodes} node(s) would give {int(np.prod(sizes)):,} candidates "
                                f"(limit {MAX_CANDIDATES_PER_NODE_COUNT:,}); list fewer values "
                                "on the axes (cp, ep, mbs, recompute, ...) instead of `auto`")
    index = _cross(sizes)
    f, mbs, zero, rec, sp, sched = (a[i] for a, i in zip(axes, index))
    columns = {k: v[f] for k, v in layouts.items()}
    columns["sp"] = sp_values[sp]
    columns["pp_schedule"] = schedules[sched]
    # One candidate where an axis changes nothing: tp = 1 ignores sp, pp = 1 ignores schedules,
    # and with one data-parallel replica (dp·ep·cp = 1) there is nothing for ZeRO to shard, so
    # every stage is the same run as the lowest one listed.
    lowest_zero = zero == min(spec.zero_stages)
    unique = ~(((columns["tp"] == 1) & (sp != 0))
               | ((columns["pp"] == 1) & (sched != 0))
               | ((columns["dp"] * columns["ep"] * columns["cp"] == 1) & ~lowest_zero))
    columns = {k: v[unique] for k, v in columns.items()}
    columns["sp"] &= columns["tp"] > 1
    mbs, zero, rec = mbs[unique], zero[unique], rec[unique]
    n = len(mbs)
    replicas = columns["dp"] * columns["ep"] * mbs
    gbs = spec.global_batch_sequences
    columns.update(
        nodes=np.full(n, nodes, dtype=np.int64), gpus=np.full(n, gpus, dtype=np.int64), mbs=mbs,
        recompute_code=rec.astype(np.int8), schedule_code=sched[unique].astype(np.int8),
        grad_acc=np.where(gbs % replicas == 0, gbs // replicas, 0), zero_stage=zero,
        recompute=recompute[rec],
        vpp=np.where((columns["pp_schedule"] == "interleaved_1f1b") & (columns["pp"] > 1),
                     INTERLEAVED_VPP, 1))
    if not (columns["grad_acc"] > 0).any():
        raise PlanError("global_batch", f"{gbs} sequences cannot be split over any layout of "
                                        f"{gpus} GPUs ({nodes} node(s)): dp·ep·mbs must divide "
                                        "it; use a global batch with more factors of two, or "
                                        "fewer nodes")
    return columns


def _cross(sizes: list[int]) -> list[np.ndarray]:
    """Index arrays of the cartesian product of ranges of these sizes (first axis slowest)."""
    total = int(np.prod(sizes))
    out, inner = [], total
    for size in sizes:
        inner //= size
        out.append(np.tile(np.repeat(np.arange(size), inner), total // (inner * size)))
    return out


# The plan ---------------------------------------------------------------------------------------

def plan(spec: Spec) -> pd.DataFrame:
    """Every candidate of the spec with its status, prune rule, memory estimate and run id."""
    parts: list[dict[str, np.ndarray]] = []
    ids: list[str] = []  # the kept rows' run ids, in row order
    limit = memory_limit(spec)
    for nodes in spec.nodes:
        candidates = enumerate_candidates(spec, nodes)
        for m_index, model in enumerate(spec.model_shapes):
            ctx = RuleContext.from_spec(spec, model, limit)
            code, mem = evaluate(candidates, ctx)
            detail = np.full(len(code), None, dtype=object)
            if limit is not None:
                detail[code == RULE_NAMES.index("memory")] = memory_prune_detail(limit)
            by_framework = code == RULE_NAMES.index("framework")
            if by_framework.any():
                detail[by_framework] = capability_details(
                    {k: v[by_framework] for k, v in candidates.items()}, ctx)
            parts.append({**candidates, "code": code, **mem, "detail": detail,
                          "model": np.full(len(code), m_index, dtype=np.int16)})
            kept = code == -1
            ids += chunk_run_ids(spec, model, nodes, {k: v[kept] for k, v in candidates.items()})

    def joined(key: str) -> np.ndarray:
        return np.concatenate([p[key] for p in parts])

    code = joined("code").astype(np.int16)
    columns: dict[str, object] = {
        "model": pd.Categorical.from_codes(joined("model"),
                                           categories=[m.name for m in spec.model_shapes])}
    coded: dict[str, tuple[str, list[str]]] = {  # categoricals of the axes' values
        "recompute": ("recompute_code", list(spec.axes.recompute)),
        "pp_schedule": ("schedule_code", list(spec.axes.pp_schedule))}
    for key in ("nodes", "gpus", *LAYOUT_COLUMNS):
        if key in coded:
            codes, categories = coded[key]
            columns[key] = pd.Categorical.from_codes(joined(codes), categories=categories)
        else:
            columns[key] = joined(key)
    columns["status"] = pd.Categorical.from_codes(code + 1, categories=STATUSES)
    columns["prune_rule"] = pd.Categorical.from_codes(code, categories=RULE_NAMES)
    columns["prune_detail"] = pd.Categorical(joined("detail"))
    for key in dict.fromkeys(k for part in parts for k in part if k.startswith("mem_")):
        values = np.concatenate([p.get(key, np.full(len(p["code"]), -1, np.int64))
                                 for p in parts])
        columns[key] = pd.arrays.IntegerArray(values, values < 0)
    kept = code == -1
    slots = pa.array(np.cumsum(kept) - 1, mask=~kept)  # row → index into ids, null if pruned
    columns["run_id"] = pd.arrays.ArrowStringArray(pa.array(ids, pa.string()).take(slots))
    frame = pd.DataFrame(columns, copy=False)  # the arrays are fresh: no second copy
    probes = limit is not None and not limit.device.host_share  # else judged on its tensors
    frame["probe"] = is_probe(frame, limit.budget_bytes if probes and limit else None)
    return frame


def layout_of(row: Mapping[str, object]) -> Layout:
    """The Layout of one plan row."""
    return Layout(**{k: int(row[k]) for k in LAYOUT_INT_COLUMNS},  # type: ignore[call-overload]
                  recompute=str(row["recompute"]), sp=bool(row["sp"]),
                  pp_schedule=str(row["pp_schedule"]))


def run_config(spec: Spec, row: Mapping[str, object], *, with_settings: bool = True) -> RunConfig:
    """The RunConfig of one plan row; render and plan share it, so run ids agree."""
    model = next(m for m in spec.model_shapes if m.name == str(row["model"]))
    settings: dict[str, object] = {}
    if with_settings:
        selector = {k: _plain(row[k]) for k in OVERRIDE_COLUMNS}
        settings = spec.run_settings_for(selector).model_dump(mode="json")
    return RunConfig(sweep=spec.name, framework=spec.framework, model=model,
                     layout=layout_of(row), nodes=int(row["nodes"]),  # type: ignore[call-overload]
                     gpus_per_node=spec.gpus_per_node_resolved, gpu=spec.gpu, dtype=spec.dtype,
                     seq_len=spec.seq_len, global_batch_sequences=spec.global_batch_sequences,
                     settings=settings, spec_hash=spec.spec_hash() if with_settings else "")


def run_ids(spec: Spec, rows: pd.DataFrame) -> list[str]:
    """Run ids of plan rows, one RunConfig each (the one definition of a run's identity)."""
    records = rows[list(ROW_KEY)].astype(object).to_dict("records")
    return [run_config(spec, r, with_settings=False).run_id for r in records]


def chunk_run_ids(spec: Spec, model: ModelShape, nodes: int,
                  columns: Mapping[str, np.ndarray]) -> list[str]:
    """Run ids of one (model, nodes) chunk's candidates, about 20× faster than RunConfig each.

    RunConfig.run_id hashes its identity as sorted-key JSON; within a chunk only the layout
    varies, so the JSON is a fixed prefix and suffix around the layout's JSON. The first row is
    checked against RunConfig itself, and any disagreement (RunConfig's identity changed) falls
    back to RunConfig for every row: the ids stay RunConfig's by construction.
    """
    n = len(columns["dp"])
    if n == 0:
        return []
    base = RunConfig(sweep=spec.name, framework=spec.framework, model=model,
                     layout=Layout(dp=1, tp=1, pp=1), nodes=nodes,
                     gpus_per_node=spec.gpus_per_node_resolved, gpu=spec.gpu, dtype=spec.dtype,
                     seq_len=spec.seq_len, global_batch_sequences=spec.global_batch_sequences)
    identity = {"framework": base.framework, "layout": _LAYOUT_SLOT,
                "model": {k: v for k, v in dataclasses.asdict(model).items() if k != "source"},
                "nodes": nodes, "gpus_per_node": base.gpus_per_node, "gpu": base.gpu,
                "dtype": base.dtype, "seq_len": base.seq_len,
                "global_batch_sequences": base.global_batch_sequences}
    prefix, suffix = json.dumps(identity, sort_keys=True).split(json.dumps(_LAYOUT_SLOT))
    fields = sorted(f.name for f in dataclasses.fields(Layout))
    template = ("{" + ", ".join(f"{json.dumps(k)}: %s" for k in fields) + "}" + suffix).encode()
    encoded = []
    for name in fields:
        values = columns[name].tolist()
        codes = {v: json.dumps(v).encode() for v in set(values)}
        encoded.append(list(map(codes.__getitem__, values)))
    head = f"{model.name}-n{nodes}-"
    hashed_prefix = hashlib.sha256(prefix.encode())
    ids = []
    for row in zip(*encoded):
        digest = hashed_prefix.copy()
        digest.update(template % row)
        ids.append(head + digest.hexdigest()[:10])
    first = {k: v[0] for k, v in columns.items()}
    check = dataclasses.replace(base, layout=layout_of(first)).run_id
    if check != ids[0]:
        ids = [dataclasses.replace(base, layout=layout_of({k: v[i] for k, v in columns.items()}))
               .run_id for i in range(n)]
    return ids


_LAYOUT_SLOT: Final = "@@layout@@"


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value
