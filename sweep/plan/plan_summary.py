"""What `sweep plan` tells its user about a plan: candidates per (model, nodes) cell, the kept
candidates with their predictions, what the memory rule decided against its uncertainty band,
what the framework cannot run, warnings about the spec, the memory breakdown of one run, and the
error of a plan that keeps nothing with what to change.

Pure: plan frames and specs in, text out. The tables are `TextTable`s, plain strings, so that this
module knows what to show and the command alone how to draw it (with rich). Kept out of
`sweep/commands/plan.py` so that the command is only its arguments, calls and printing, and so
that these summaries can be tested without running the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pandas as pd

from sweep.core.errors import UserError
from sweep.core.units import GiB
from sweep.models import memory
from sweep.models.memory import reserved_interval
from sweep.models.memory_config import fsdp_reduction_deferred
from sweep.models.memory_profiles import Allocator, allocator_settings
from sweep.plan import space
from sweep.plan.plan_file import PLAN_FILE
from sweep.plan.spec import Spec


@dataclass(frozen=True)
class TextTable:
    """A table as the strings to show, with the columns that hold names and labels (drawn
    left-aligned; the rest are numbers, drawn right-aligned)."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    text_columns: frozenset[str]


@dataclass(frozen=True)
class MemoryVerdicts:
    """What the memory rule decided, and where its uncertainty band could flip the verdict."""

    kept_with_room: int  # the band's high end is under the budget
    kept_could_oom: int  # the point estimate fits, the band's high end does not
    probes: int  # the point estimate is over, the band's low end under: kept, the run decides
    pruned: int  # pruned:memory (with probes on, the band's low end is over too)
    pruned_could_fit: int  # pruned although the band reaches under (only with probes off)
    band: tuple[float, float] | None  # None: a CPU rank's share of host memory, no band
    limit: str = ""  # the limit per rank and its source (`space.MemoryLimit.describe`)

    def describe(self) -> str:
        limit = f"limit {self.limit}; " if self.limit else ""
        if self.band is None:
            return (f"memory ({limit}a CPU rank's predicted tensors against it): "
                    f"{self.kept_with_room} kept, {self.pruned} pruned")
        low, high = self.band
        text = (f"memory ({limit}band: the reserved peak's left-out error, "
                f"{low:+.0%} .. {high:+.0%}): "
                f"{self.kept_with_room} kept with room to spare, {self.kept_could_oom} kept "
                f"that could run out, {self.probes} probe(s) (over the limit by the point "
                f"estimate, under it by the band: kept, and the run decides), {self.pruned} "
                "pruned")
        if self.pruned_could_fit:
            text += (f", of which {self.pruned_could_fit} could fit (constraints.memory_probes "
                     "is false: the point estimate decides)")
        return text


def memory_verdicts(frame: pd.DataFrame, spec: Spec) -> MemoryVerdicts | None:
    """Counts of the memory rule's verdicts against the model's uncertainty band
    (sweep.models.memory.reserved_interval), and the limit with its source; None when there is
    no memory limit (`space.memory_limit`)."""
    limit = space.memory_limit(spec)
    if limit is None or "mem_reserved_bytes" not in frame:
        return None
    budget = limit.budget_bytes
    if limit.device.host_share:  # a CPU rank's tensors against its share of host memory: no band
        status = frame["status"]
        return MemoryVerdicts(kept_with_room=int((status == space.KEPT).sum()), kept_could_oom=0,
                              probes=0, pruned=int((status == "pruned:memory").sum()),
                              pruned_could_fit=0, band=None, limit=limit.describe())
    judged = frame["status"].isin([space.KEPT, "pruned:memory"]) \
        & frame["mem_reserved_bytes"].notna()
    rows = frame[judged]
    low, high = reserved_interval(rows["mem_reserved_bytes"].to_numpy(float), spec.reserved_band,
                                  fixed_bytes=rows["mem_overhead_bytes"].to_numpy(float))
    kept = (rows["status"] == space.KEPT).to_numpy()
    probe = space.is_probe(rows, budget)
    return MemoryVerdicts(kept_with_room=int((kept & (high <= budget)).sum()),
                          kept_could_oom=int((kept & ~probe & (high > budget)).sum()),
                          probes=int(probe.sum()), pruned=int((~kept).sum()),
                          pruned_could_fit=int(((low <= budget) & ~kept).sum()),
                          band=spec.reserved_band, limit=limit.describe())


# The built-in workload, Llama-3.2-3B at micro-batch 4, seq 2048, on an H200 (PyTorch 2.11):
# max_memory_reserved - max_memory_allocated without and with expandable segments.
EXPANDABLE_MEASURED: Final = ("12.2 to 0.3 GiB with full recomputation and from 4.4 to 2.2 GiB "
                              "without, at the same step time")


def allocator_notes(spec: Spec) -> list[str]:
    """What `sweep plan` says of the caching allocator: the spec's own allocator constants, where
    it names them; and where the runs configure the allocator, that the memory model's reserve
    beyond live tensors was fitted without such settings, and how to calibrate rather than guess a
    correction. For expandable segments it adds what one measurement saw (docs/workload.md,
    "Checks on a real GPU"): two runs are not a model of it."""
    notes = []
    constants = spec.constraints.allocator
    if constants is not None:
        low, high = spec.reserved_band
        band = (f"their band {low:+.1%} .. {high:+.1%} (left out)" if constants.band is not None
                else f"no band of their own: the probes use the shipped constants' left-out band "
                     f"{low:+.1%} .. {high:+.1%} (`sweep memory-check --write-constants --cv "
                     "model` measures theirs)")
        notes.append(f"memory: the spec's allocator constants (constraints.allocator: "
                     f"{constants.to_allocator().describe()}) instead "
                     f"of the profile's fitted ones ({Allocator.of(spec.framework).describe()}); "
                     f"{band}")
    envs = [spec.run.env] + [o.set.get("env") or {} for o in spec.overrides]
    settings = allocator_settings(envs)
    if not settings:
        return notes
    note = (f"memory: the runs set {', '.join(settings)}; the allocator's reserve beyond live "
            "tensors was fitted on runs without it (nanotron's defaults), so the reserved peaks, "
            "and what is pruned or probed near the limit, may be off; after a first round, "
            "`sweep plan --calibrate-from RUNS` rescales them to what your runs measured")
    if any("expandable_segments:true" in s.lower() for s in settings):
        note += ("; with expandable_segments:True on an H200 (the built-in workload) that "
                 f"reserve fell from {EXPANDABLE_MEASURED}, so expect the reserved peaks "
                 "over-predicted: candidates pruned or probed that would fit")
    return [*notes, note]


# What to change when a rule prunes everything: the smallest edit of the spec that may keep some.
RULE_HINTS: Final = {
    "memory": "more nodes, a smaller micro-batch (axes.mbs), recomputation "
              "(axes.recompute: [none, selective, full]), ZeRO (axes.zero_stage) or more "
              "pipeline stages (axes.pp)",
    "batch": "a global batch with more factors of two, or fewer nodes",
    "tp_heads": "tp values that divide the model's attention and KV heads (axes.tp)",
    "pp_layers": "fewer pipeline stages (axes.pp, constraints.max_pp)",
    "pp_grad_acc": "a larger global batch or smaller micro-batches, so that grad_acc >= pp",
    "tp_across_nodes": "tp values up to the GPUs of one node, or "
                       "constraints.allow_tp_across_nodes: true",
    "framework": "another framework or framework_version, or axes this framework implements "
                 "(see prune_detail in plan.parquet)",
    "max_tp": "a larger constraints.max_tp",
    "max_pp": "a larger constraints.max_pp",
    "max_mbs": "a larger constraints.max_mbs",
}


RULE_TABLE: Final = 'see what the rule checks in docs/planning.md ("The rules")'


def nothing_kept(spec_path: Path, frame: pd.DataFrame) -> str:
    """The error of a plan that keeps nothing: the rules that pruned the most, and what to change."""
    counts = frame["prune_rule"].value_counts()
    counts = counts[counts > 0]
    lines = [f"{spec_path}: every one of the {len(frame)} candidates was pruned; "
             "nothing would run. The rules that pruned the most:"]
    for rule, count in counts.head(3).items():
        hint = RULE_HINTS.get(str(rule))
        advice = f"try {hint}" if hint else RULE_TABLE
        lines.append(f"  {rule}: {count} candidates — {advice}")
    return "\n".join(lines)


def framework_prunes(spec: Spec, frame: pd.DataFrame) -> list[str]:
    """One line per capability rule that pruned something: how many, and the framework's reason."""
    if "prune_detail" not in frame:
        return []
    by_framework = frame["status"] == "pruned:framework"  # memory prunes carry details too
    details = frame.loc[by_framework, "prune_detail"].dropna().value_counts()
    details = details[details > 0]
    if details.empty:
        return []
    version = spec.run.framework_version or "its default version"
    lines = [f"pruned because {spec.framework} ({version}) cannot run them as labelled:"]
    lines += [f"  {count:>6} × {detail}" for detail, count in details.items()]
    return lines


def _best_predicted(frame: pd.DataFrame) -> pd.DataFrame:
    kept = frame[(frame["status"] == space.KEPT) & frame["pred_tokens_per_s_per_gpu"].notna()]
    return kept.sort_values("pred_tokens_per_s_per_gpu", ascending=False, kind="stable")


def _rate(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:,.0f}"


def _percent(value: float) -> str:
    return "–" if pd.isna(value) else f"{100 * value:.1f}%"


def summary_table(frame: pd.DataFrame) -> TextTable:
    """One row per (model, nodes): candidates, kept (and how many of them are memory probes), how
    many each rule pruned, and the kept candidate the throughput model predicts fastest."""
    counts = (frame.groupby(["model", "nodes", "status"], observed=True).size()
              .unstack("status", fill_value=0))
    rules = [r for r in space.RULE_NAMES if f"pruned:{r}" in counts.columns]
    best = (_best_predicted(frame).groupby(["model", "nodes"], observed=True).head(1)
            .set_index(["model", "nodes"]) if "pred_tokens_per_s_per_gpu" in frame else None)
    probes = (frame.assign(_probe=frame["probe"].astype(bool))
              .groupby(["model", "nodes"], observed=True)["_probe"].sum()
              if "probe" in frame else None)
    columns = ["model", "nodes", "candidates", "kept", *(["of them probes"] if probes is not None
                                                          else []), *rules]
    columns += ["predicted best", "tok/s/GPU", "MFU"] if best is not None else []
    rows = []
    for (model, nodes), row in counts.iterrows():
        kept = int(row.get(space.KEPT, 0))
        cells = [str(model), str(nodes), str(int(row.sum())), str(kept),
                 *([str(int(probes.get((model, nodes), 0)))] if probes is not None else []),
                 *(str(int(row.get(f"pruned:{r}", 0))) for r in rules)]
        if best is not None:
            top = best.loc[(model, nodes)] if (model, nodes) in best.index else None
            cells += ["–", "–", "–"] if top is None else [
                space.layout_of(top).label(), _rate(top["pred_tokens_per_s_per_gpu"]),
                _percent(top["pred_mfu"])]
        rows.append(cells)
    return TextTable(title="sweep plan: candidates per (model, nodes)", columns=columns,
                     rows=rows, text_columns=frozenset({"model", "predicted best"}))


def candidates_table(frame: pd.DataFrame) -> TextTable:
    """Every kept candidate with its predictions, best first within each (model, nodes), and its
    place there (`pred_rank`: the order `--strategy shortlist` runs them in)."""
    columns = ["model", "nodes", "rank", "configuration", "run_id", "tok/s/GPU", "MFU",
               "step time", "memory"]
    ranked = _best_predicted(frame).sort_values(["model", "nodes"], kind="stable")
    rows = []
    for _, row in ranked.iterrows():
        memory_gib = row.get("mem_total_bytes", float("nan")) / GiB
        rank = row.get("pred_rank")
        rows.append([str(row["model"]), str(row["nodes"]), "–" if pd.isna(rank) else str(rank),
                     space.layout_of(row).label(),
                     str(row["run_id"]),
                     _rate(row["pred_tokens_per_s_per_gpu"]), _percent(row["pred_mfu"]),
                     f"{row['pred_step_time_s']:.3f} s",
                     "–" if pd.isna(memory_gib) else f"{memory_gib:.1f} GiB"])
    return TextTable(title="sweep plan: kept candidates, predicted (throughput model)",
                     columns=columns, rows=rows,
                     text_columns=frozenset({"model", "configuration", "run_id"}))


def explain(spec: Spec, frame: pd.DataFrame, run_id: str) -> str:
    """The memory breakdown of one kept run, with its layout and the GPU's budget."""
    match = frame[frame["run_id"] == run_id]
    if match.empty:
        example = frame["run_id"].dropna().head(1).tolist()
        hint = f" (e.g. {example[0]})" if example else ""
        raise UserError(f"--explain: no kept configuration has run id {run_id!r}; pick one "
                        f"from the run_id column of {PLAN_FILE}{hint}")
    row = match.iloc[0]
    layout = space.layout_of(row)
    model = next(m for m in spec.model_shapes if m.name == str(row["model"]))
    estimate = memory.estimate(model, layout, seq_len=spec.seq_len, dtype=spec.dtype,
                               profile=spec.memory_profile)
    limit = space.memory_limit(spec)
    budget = space.RuleContext.from_spec(spec, model, limit).memory_budget_bytes
    lines = [f"{run_id}: {model.name} on {int(row['nodes'])} node(s), {layout.label()}",
             f"framework profile: {spec.memory_profile.name}"
             + (" (the spec's allocator constants)" if spec.allocator else "")
             + f", seq {spec.seq_len}, {spec.dtype}", "",
             estimate.explain()]
    profile = spec.memory_profile
    if fsdp_reduction_deferred(profile, layout.zero_stage, layout.pp, layout.grad_acc):
        shards = layout.dp * layout.ep * (layout.cp if profile.zero_shards_over_cp else 1)
        by = ("the pipeline schedule (torch.distributed.pipelining)" if layout.pp > 1
              else "the gradient accumulation")
        lines.append(f"gradients: whole, not 1/{shards} of them: {by} defers FSDP's "
                     "reduce-scatter to the step's last micro-batch")
    elif (profile.grads_freed_each_step and layout.grad_acc == 1
          and memory.cuda_graphed(profile, layout.pp, layout.ep).item()):
        lines.append("gradients: held at the activation peak: the step is a CUDA graph, which "
                     "zeroes them in place instead of freeing them")
    if profile.loss_chunks > 1 and (layout.pp == 1 or estimate.stage == "last"):
        lines.append(f"logits: one of the loss's {profile.loss_chunks} chunks at a time, beside "
                     "its buffers of the whole hidden states (a chunked loss)")
    if budget is not None:
        source = limit.device.source if limit is not None else spec.gpu
        # a CPU rank's share of host memory is judged on the tensors it holds (space.evaluate)
        tensors = limit is not None and limit.device.host_share
        judged = estimate.allocated_bytes if tensors else estimate.total_bytes
        lines.append(f"budget: {budget / GiB:.2f} GiB ({source}, headroom "
                     f"{spec.constraints.memory_headroom:.0%}) → fits with "
                     f"{(budget - judged) / GiB:.2f} GiB to spare"
                     + (" (the live tensors against a rank's share)" if tensors else ""))
    return "\n".join(lines)


def axes_beyond_constraints(spec: Spec) -> list[str]:
    """Axis values a spec lists explicitly that its own constraints then prune (e.g. mbs 128
    with the default max_mbs of 64): most likely a forgotten constraint."""
    limits = (("mbs", "max_mbs", spec.constraints.max_mbs), ("tp", "max_tp", spec.max_tp),
              ("pp", "max_pp", spec.constraints.max_pp))
    warnings = []
    for axis, constraint, limit in limits:
        values = getattr(spec.axes, axis)
        above = sorted(v for v in values if limit is not None and v > limit) \
            if isinstance(values, list) else []
        if above:
            warnings.append(f"axes.{axis} lists {above}, above constraints.{constraint} "
                            f"({limit}): rule {constraint} prunes them; raise "
                            f"constraints.{constraint} to sweep them")
    return warnings


def unmatched_overrides(spec: Spec, frame: pd.DataFrame) -> list[str]:
    """Overrides whose `where` selects no kept run: most likely a typo in the spec."""
    kept = frame[frame["status"] == space.KEPT]
    warnings = []
    for index, override in enumerate(spec.overrides):
        mask = pd.Series(True, index=kept.index)
        for column, wanted in override.where.items():
            mask &= kept[column].astype(str) == str(wanted)
        if not mask.any():
            warnings.append(f"overrides[{index}].where {override.where} matches no kept run")
    return warnings
