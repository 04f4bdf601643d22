"""Stragglers: the node of a run whose step time stands out from its nodes' median.

A synchronous training step is as slow as its slowest rank, so a run on one slow node (a GPU with
throttled clocks, a busy host, a degraded link) measures that node, not the configuration. Collect
compares the step times each node of a run reports, where the run gives them per node or per
rank (docs/runs-parquet.md, "Stragglers"):

- the built-in workload: each rank's own time of each step (sweep.workload.node_times), its
  steady-state median per rank in the summary record, with the rank's node;
- torchtitan: every rank logs every step, so each node's log (`logs/node<i>.out`) gives that
  node's step times;
- Megatron-LM (the last rank) and nanotron (the first rank of the last stage) log steps on one
  rank only: no comparison, the columns stay empty.

A node's figure is the median over the steady-state steps (after the warm-up) of its slowest rank:
a median, so that one step in which the OS took a core away does not name a node.
A run is a straggler run when its slowest node's figure exceeds `factor` × the median of its
nodes' figures (`DEFAULT_FACTOR`, or `run.straggler_factor` of the spec), with at least
`MIN_STEPS` steady-state steps on every node. Pure functions, no I/O.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

# slowest node > 1.2 × the median of the run's nodes: a node 20 % slower than the typical node
# costs a synchronous run that 20 %; run-to-run noise of step times on a quiet cluster is a few %
DEFAULT_FACTOR: Final = 1.2
MIN_STEPS: Final = 3  # steady-state steps each node must have for its mean to count


@dataclass(frozen=True)
class NodeTimes:
    """Each node's steady-state median step time (s), over at least `steps` steps on every node,
    and what the figures are (`source`)."""

    times: Mapping[str, float]
    steps: int
    source: str


@dataclass(frozen=True)
class Verdict:
    """How a run's slowest node compares with the median of its nodes."""

    slowest: str
    ratio: float  # slowest node's time / median of the nodes' times
    factor: float
    straggler: bool


def judge(node_times: NodeTimes, factor: float = DEFAULT_FACTOR) -> Verdict | None:
    """The verdict, or None where there is nothing to compare: fewer than two nodes with figures,
    too few steps, or a median that is not positive."""
    times = node_times.times
    if len(times) < 2 or node_times.steps < MIN_STEPS:
        return None
    median = statistics.median(times.values())
    if median <= 0:
        return None
    slowest = max(sorted(times), key=lambda node: times[node])
    ratio = times[slowest] / median
    return Verdict(slowest, ratio, factor, ratio > factor)


def columns(node_times: NodeTimes | None, factor: float = DEFAULT_FACTOR) -> dict[str, Any]:
    """The runs.parquet columns of the comparison (none where the run gives no per-node times)."""
    if node_times is None or not node_times.times:
        return {}
    row: dict[str, Any] = {
        "node_step_time_json": json.dumps(dict(sorted(node_times.times.items()))),
        "node_step_time_source": node_times.source, "straggler_factor": factor}
    verdict = judge(node_times, factor)
    if verdict is not None:
        row["straggler_ratio"] = verdict.ratio
        row["straggler_node"] = verdict.slowest if verdict.straggler else None
    return row


def per_node(rank_times: Sequence[float | None], rank_nodes: Sequence[str], steps: int,
             source: str) -> NodeTimes | None:
    """Per-rank steady-state medians → each node's figure, the slowest of its ranks."""
    times: dict[str, float] = {}
    for node, value in zip(rank_nodes, rank_times):
        if value is not None:
            times[node] = max(times.get(node, 0.0), float(value))
    return NodeTimes(times, steps, source) if times else None


BUILTIN_SOURCE: Final = "builtin: each rank's own step time (to the step's closing all-reduce)"


def from_builtin(summary: Mapping[str, Any] | None, env_nodes: Sequence[str],
                 ranks_per_node: int) -> NodeTimes | None:
    """The built-in workload's per-rank step times: the summary's steady-state medians
    (`rank_step_time_median_s`) on the summary's `rank_nodes`, else on the node env.json lists at
    `rank // ranks_per_node` (the launcher's global rank order). None without a summary (a run
    killed before its end gathered nothing)."""
    if summary is None or not isinstance(summary.get("rank_step_time_median_s"), list):
        return None
    medians = summary["rank_step_time_median_s"]
    nodes = summary.get("rank_nodes") or _nodes_of(len(medians), env_nodes, ranks_per_node)
    return per_node(medians, nodes, int(summary.get("step_time_n") or 0), BUILTIN_SOURCE)


def _nodes_of(ranks: int, env_nodes: Sequence[str], ranks_per_node: int) -> list[str]:
    """Rank r's node: env.json's node list at r // ranks_per_node, else `node<i>`."""
    per = max(ranks_per_node, 1)
    return [env_nodes[r // per] if r // per < len(env_nodes) else f"node{r // per}"
            for r in range(ranks)]


def from_node_logs(node_steps: Mapping[int, Sequence[Mapping[str, Any]]], warmup: int,
                   env_nodes: Sequence[str], framework: str,
                   tokens_per_step: int | None, world_size: int | None) -> NodeTimes | None:
    """Each node log's steady-state median step time (`node_steps`: node index → its parsed step
    records). A step without a step time counts by its logged tokens/s per GPU: the time to
    process the global batch at that rate. None unless two or more nodes logged timed steps."""
    times: dict[str, float] = {}
    counts: list[int] = []
    for index, steps in sorted(node_steps.items()):
        values = [value for s in steps if (s.get("step") or 0) > warmup
                  and (value := _step_time(s, tokens_per_step, world_size)) is not None]
        if values:
            name = env_nodes[index] if index < len(env_nodes) else f"node{index}"
            times[name] = statistics.median(values)
            counts.append(len(values))
    if len(times) < 2:
        return None
    return NodeTimes(times, min(counts), f"log:{framework}: each node's log")


def _step_time(step: Mapping[str, Any], tokens_per_step: int | None,
               world_size: int | None) -> float | None:
    if step.get("step_time_s") is not None:
        return float(step["step_time_s"])
    rate = step.get("tokens_per_sec_per_gpu")
    if rate and tokens_per_step and world_size:
        return tokens_per_step / (float(rate) * world_size)
    return None


@dataclass(frozen=True)
class Sighting:
    """One run in which a node was the straggler: the evidence a suspect is listed with."""

    node: str
    run: str  # run_id#attempt
    ratio: float
    factor: float


def sightings(rows: Iterable[Mapping[str, Any]]) -> list[Sighting]:
    """Every straggler run of a runs table's rows (dicts), in order."""
    return [Sighting(str(row["straggler_node"]), f"{row['run_id']}#{row['attempt']}",
                     float(row["straggler_ratio"]), float(row["straggler_factor"]))
            for row in rows if row.get("straggler_node")]


def suspects(found: Iterable[Sighting]) -> dict[str, dict[str, Any]]:
    """bad_nodes.json's `suspects`: per node, how many runs it was the straggler of, and those
    runs with the ratio and factor each was judged by (the evidence). A node listed here is never
    excluded automatically: a straggler run still completed, and one slow run can be the job's own
    noise; `sweep nodes --exclude` keeps a repeat offender out by hand."""
    out: dict[str, dict[str, Any]] = {}
    for sighting in found:
        entry = out.setdefault(sighting.node, {"count": 0, "runs": []})
        entry["count"] += 1
        entry["runs"].append({"run": sighting.run, "ratio": round(sighting.ratio, 4),
                              "factor": sighting.factor})
    return dict(sorted(out.items()))
