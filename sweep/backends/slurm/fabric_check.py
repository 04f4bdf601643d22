"""The fabric check: which nodes' links are too slow to take part in the sweep.

One node with a slow NVLink or InfiniBand link drags every multi-node run it lands in, and the
heatmap then shows a wrong best configuration with no failure to catch. Before the sweep,
`sweep nodes DIR --check` (or `sweep submit --fabric-check`) runs one small job per node and one
per pair of nodes, all at once: an all-reduce of growing sizes (sweep.backends.slurm.fabric_probe:
NCCL on GPUs, gloo on CPU), measured as nccl-tests measures it (busbw). A node whose own figure,
or every pair it is in, falls below a stated fraction of the median (`DEFAULT_FRACTION`) is
excluded from the sweep's later submissions through bad_nodes.json, with the figure as the
reason; `sweep nodes DIR --forgive NODE` brings it back.

The pairs form a ring (n0-n1, n1-n2, …, n(k-1)-n0), so every node is in two pairs and a slow
node shows in both, while a slow link between two healthy nodes shows in one pair only and is
reported, not pinned on either node. On GPUs a node job uses the node's GPUs and a pair job the
GPUs of both nodes; on CPU a node job is two gloo processes and a pair job one per node.

The probes are submitted at once but measure in rounds (the node probes, then the pairs, no
node in two pairs of a round: sweep.backends.slurm.fabric_probe waits for its turn), so that no
two probes share a node's links, or, on CPU, its cores, while they measure.

The decision (`decide`) is a pure function over figures; `run_check` is the Slurm side: it
writes `fabric/<time>/probe.sh`, submits every probe, waits for their results, and writes
`fabric.json` (every figure, the fraction and the medians) into the sweep folder.
"""

from __future__ import annotations

import shlex
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sweep.core.state import atomic_write_json, atomic_write_text, read_json

if TYPE_CHECKING:
    from sweep.backends.slurm.client import Slurm
    from sweep.backends.slurm.preflight import PreflightTarget
    from sweep.backends.slurm.tracker import Tracker

FABRIC_DIR: Final = "fabric"
FABRIC_FILE: Final = "fabric.json"
SCRIPT_FILE: Final = "probe.sh"
DEFAULT_FRACTION: Final = 0.7  # of the median busbw: below it, a node is excluded
DEFAULT_TIMEOUT_S: Final = 600.0  # queue wait included
CPU_RANKS_PER_NODE: Final = 2
POLL_S: Final = 0.5
JOB_TIME: Final = "00:10:00"
MASTER_PORT_BASE: Final = 30000  # the runs use 20000 + job id % 10000
KIB: Final = 1024
MIB: Final = 1024 * KIB
GIB: Final = 1024 * MIB


@dataclass(frozen=True)
class ProbeSizes:
    """The all-reduce sizes a probe grows through, and the time after which it stops growing."""

    min_bytes: int
    max_bytes: int
    budget_s: float

    def describe(self) -> str:
        return f"{human_bytes(self.min_bytes)}-{human_bytes(self.max_bytes)}"


CPU_SIZES: Final = ProbeSizes(64 * KIB, 16 * MIB, 20.0)  # gloo over TCP: ~1 GB/s per node
GPU_SIZES: Final = ProbeSizes(8 * MIB, 1 * GIB, 60.0)  # NCCL: busbw flattens by ~1 GiB


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class Probe:
    """One job of the check: an all-reduce over `ranks_per_node` ranks on each of `nodes`,
    measured in its round (no node is in two probes of one round)."""

    kind: str  # "node" (one node) or "pair" (two)
    nodes: tuple[str, ...]
    ranks_per_node: int
    round: int = 0

    @property
    def label(self) -> str:
        return "-".join(self.nodes)

    @property
    def name(self) -> str:
        """The probe's file names in fabric/: node-gpu01, pair-gpu01-gpu02."""
        return f"{self.kind}-{self.label}"


def ring_pairs(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs in which every node is twice (once with 2 nodes, none with fewer): a slow node
    shows in both of its pairs, a slow link between two nodes in one."""
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [(nodes[0], nodes[1])]
    return [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]


def pair_rounds(pairs: Sequence[tuple[str, str]]) -> list[int]:
    """Each pair's round, first fit: no node in two pairs of a round, so that two pairs never
    share a node's link while they measure (a ring of k nodes takes 2 rounds, 3 when k is odd)."""
    busy: list[set[str]] = []
    rounds = []
    for pair in pairs:
        index = next((i for i, used in enumerate(busy) if not used & set(pair)), len(busy))
        if index == len(busy):
            busy.append(set())
        busy[index] |= set(pair)
        rounds.append(index)
    return rounds


def probes_for(nodes: Sequence[str], gpus_per_node: int | None) -> list[Probe]:
    """The node probes of `nodes` (round 0), then the pair probes in their rounds. A node job
    needs two ranks (one rank moves no data), so a node of one GPU gets pair probes only."""
    node_ranks = gpus_per_node or CPU_RANKS_PER_NODE
    pair_ranks = gpus_per_node or 1
    singles = [Probe("node", (node,), node_ranks) for node in nodes] if node_ranks >= 2 else []
    pairs = ring_pairs(nodes)
    first = 1 if singles else 0
    return singles + [Probe("pair", pair, pair_ranks, first + r)
                      for pair, r in zip(pairs, pair_rounds(pairs), strict=True)]


def probe_arguments(probe: Probe, probes: Sequence[Probe], all_up: bool) -> list[str]:
    """The probe's turn: the peers it waits to be up (every probe of the check when they all
    run at once, `all_up`, else its round's) and the probes of the earlier rounds it waits to
    end. On GPUs a node's probes of different rounds cannot run at once (each asks for all of
    its GPUs), so waiting there for a later round to be up would wait for nothing."""
    peers = [p.name for p in probes if p != probe and (all_up or p.round == probe.round)]
    after = [p.name for p in probes if p.round < probe.round]
    return ["--name", probe.name, "--peers", ",".join(peers), "--after", ",".join(after)]


# The decision -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeVerdict:
    """One node's figures and, when it is too slow, why."""

    node: str
    busbw_gbps: float | None  # its node probe's; None: not measured (no probe, or it failed)
    pairs: tuple[tuple[str, float | None], ...]  # (pair label, busbw) of the pairs it is in
    reasons: tuple[str, ...] = ()

    @property
    def slow(self) -> bool:
        return bool(self.reasons)

    @property
    def reason(self) -> str:
        """The reason bad_nodes.json records and `sweep nodes` shows."""
        return "fabric check: " + "; ".join(self.reasons)


@dataclass(frozen=True)
class FabricDecision:
    fraction: float
    node_median_gbps: float | None  # None: fewer than two node figures, nothing to compare
    pair_median_gbps: float | None
    verdicts: tuple[NodeVerdict, ...]
    slow_pairs: tuple[tuple[str, str], ...]  # every pair below the fraction, pinned on a node or not

    @property
    def excluded(self) -> list[str]:
        return [v.node for v in self.verdicts if v.slow]


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the measured figures; None with fewer than two (nothing to compare)."""
    measured = [v for v in values if v is not None]
    return statistics.median(measured) if len(measured) >= 2 else None


def gbps(value: float) -> str:
    return f"{value:.3g} GB/s"


def pinned_on(node: str, pair: tuple[str, str], pair_bw: Mapping[tuple[str, str], float | None],
              slow_pairs: set[tuple[str, str]]) -> bool:
    """A slow pair is the fault of `node` when its partner has a pair that is not slow: the
    slowness follows `node`, not the partner (a healthy neighbour of a slow node has one slow
    pair, and one noisy pair more must not exclude it)."""
    if pair not in slow_pairs:
        return False
    partner = pair[1] if pair[0] == node else pair[0]
    return any(partner in other and other != pair and bw is not None and other not in slow_pairs
               for other, bw in pair_bw.items())


def decide(node_bw: Mapping[str, float | None], pair_bw: Mapping[tuple[str, str], float | None],
           fraction: float = DEFAULT_FRACTION) -> FabricDecision:
    """Which nodes are too slow: a node whose own busbw is below `fraction` of the nodes'
    median, or every one of whose (two or more) measured pairs is below `fraction` of the
    pairs' median while each partner has a pair that is not (`pinned_on`). A node without
    figures is not judged; a slow pair pinned on neither node is reported (`slow_pairs`)."""
    if not 0 < fraction < 1:
        raise ValueError(f"the fraction of the median must be between 0 and 1, got {fraction}")
    node_median, pair_median = median_of(list(node_bw.values())), median_of(list(pair_bw.values()))
    slow_pairs = {pair for pair, bw in pair_bw.items()
                  if bw is not None and pair_median is not None and bw < fraction * pair_median}
    nodes = sorted(set(node_bw) | {node for pair in pair_bw for node in pair})
    verdicts = []
    for node in nodes:
        own = node_bw.get(node)
        pairs = [(pair, bw) for pair, bw in pair_bw.items() if node in pair]
        reasons = []
        if own is not None and node_median is not None and own < fraction * node_median:
            reasons.append(f"all-reduce busbw {gbps(own)} within the node < {fraction:g} x "
                           f"the median {gbps(node_median)}")
        measured = [(pair, bw) for pair, bw in pairs if bw is not None]
        if pair_median is not None and len(measured) >= 2 \
                and all(pinned_on(node, p, pair_bw, slow_pairs) for p, _ in measured):
            listed = ", ".join(f"{'-'.join(p)} {gbps(bw)}" for p, bw in measured)
            reasons.append(f"every pair with it ({listed}) < {fraction:g} x the pairs' median "
                           f"{gbps(pair_median)}")
        verdicts.append(NodeVerdict(node, own, tuple(("-".join(p), bw) for p, bw in pairs),
                                    tuple(reasons)))
    return FabricDecision(fraction, node_median, pair_median, tuple(verdicts),
                          tuple(sorted(slow_pairs)))


# The Slurm side ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """What one probe job gave: its result JSON, or why there is none."""

    probe: Probe
    job_id: str | None
    result: Mapping[str, Any] | None
    error: str | None = None

    @property
    def busbw_gbps(self) -> float | None:
        value = (self.result or {}).get("busbw_gbps")
        return float(value) if isinstance(value, (int, float)) else None


def script_text(target: PreflightTarget, folder: Path, sizes: ProbeSizes) -> str:
    """The probe job: the runs' setup lines, then `srun` of the probe with the runs'
    interpreter; its arguments (`probe_arguments`) go to the probe. Every value is quoted."""
    probe = [target.python, "-m", "sweep.backends.slurm.fabric_probe", "--dir", str(folder),
             "--min-bytes", str(sizes.min_bytes), "--max-bytes", str(sizes.max_bytes),
             "--budget-s", f"{sizes.budget_s:g}"]
    srun = ["srun", "--kill-on-bad-exit=1"]
    if target.container_image:
        mounts = ",".join([f"{folder.parent}:{folder.parent}", *target.container_mounts])
        srun += [f"--container-image={target.container_image}", f"--container-mounts={mounts}"]
    return "\n".join([
        "#!/bin/bash",
        "# llm-sweep fabric check (written by `sweep nodes --check`): an all-reduce of growing",
        "# sizes over this job's ranks; the arguments name the probe and when its turn comes.",
        "set -u", *target.setup,
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export MASTER_PORT=$(({MASTER_PORT_BASE} + SLURM_JOB_ID % 10000))",
        f'exec {shlex.join(srun + probe)} "$@"', ""])


def sbatch_options(probe: Probe, target: PreflightTarget, folder: Path, comment: str) -> list[str]:
    """One probe's job: its nodes by name, its ranks, the runs' own Slurm options."""
    options = [f"--job-name=llm-sweep-fabric-{probe.kind}", f"--nodes={len(probe.nodes)}",
               f"--ntasks-per-node={probe.ranks_per_node}", f"--nodelist={','.join(probe.nodes)}",
               f"--time={JOB_TIME}", f"--output={folder}/{probe.name}.out",
               f"--comment={comment}", "--no-requeue"]
    options += [f"--{name}={value}" for name, value in target.slurm]
    if target.gpus_per_node:
        options.append(f"--gpus-per-node={target.gpus_per_node}")
    return options


def run_probes(slurm: Slurm, target: PreflightTarget, probes: Sequence[Probe], folder: Path,
               comment: str, timeout_s: float) -> list[Measured]:
    """Submit every probe at once into the check's own `folder` and wait until each has
    written its result or left the queue (then `NAME.failed` tells the probes waiting for it
    to go on); after `timeout_s` (queue wait included) the rest are cancelled. Whatever ends
    the wait early (Ctrl-C, an error) cancels the probes still queued or running."""
    from sweep.backends.slurm.client import SlurmError

    sizes = GPU_SIZES if target.gpus_per_node else CPU_SIZES
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SCRIPT_FILE
    atomic_write_text(script, script_text(target, folder, sizes))
    jobs: dict[str, Probe] = {}
    errors: dict[str, str] = {}

    def failed(probe: Probe, why: str) -> None:
        errors[probe.name] = why
        (folder / f"{probe.name}.failed").write_text(why + "\n", encoding="utf-8")

    all_up = not target.gpus_per_node
    try:
        for probe in probes:
            try:
                job = slurm.submit(str(script), sbatch_options(probe, target, folder, comment),
                                   probe_arguments(probe, probes, all_up))
                jobs[job] = probe
            except SlurmError as error:
                failed(probe, f"not submitted: {error}")
        waiting, deadline = set(jobs), time.monotonic() + timeout_s
        while waiting:
            waiting = {job for job in waiting if not (folder / f"{jobs[job].name}.json").exists()}
            if waiting:
                live = {entry.job_id.split("_")[0] for entry in slurm.queue(sorted(waiting))}
                for job in sorted(waiting - live):
                    if not (folder / f"{jobs[job].name}.json").exists():
                        failed(jobs[job], f"job {job} ended without a result; its output: "
                                          f"{folder / f'{jobs[job].name}.out'}")
                waiting &= live
            if waiting and time.monotonic() > deadline:
                slurm.cancel(sorted(waiting))
                for job in sorted(waiting):
                    failed(jobs[job], f"job {job} did not finish within {timeout_s:.0f} s "
                                      "(queued behind other jobs?); cancelled")
                waiting = set()
            if waiting:
                time.sleep(POLL_S)
    except BaseException:
        if jobs:
            slurm.cancel(sorted(jobs))
        raise
    by_probe = {probe.name: job for job, probe in jobs.items()}
    measured = []
    for probe in probes:
        result = read_json(folder / f"{probe.name}.json")
        measured.append(Measured(probe, by_probe.get(probe.name),
                                 result if isinstance(result, dict) else None,
                                 None if isinstance(result, dict) else errors.get(probe.name)))
    return measured


def decision_of(measured: Sequence[Measured], fraction: float) -> FabricDecision:
    node_bw = {m.probe.nodes[0]: m.busbw_gbps for m in measured if m.probe.kind == "node"}
    pair_bw = {(m.probe.nodes[0], m.probe.nodes[1]): m.busbw_gbps
               for m in measured if m.probe.kind == "pair"}
    return decide(node_bw, pair_bw, fraction)


def fabric_record(decision: FabricDecision, measured: Sequence[Measured], seconds: float,
                  backend: str, sizes: ProbeSizes) -> dict[str, Any]:
    """fabric.json: every figure, the fraction, the medians and what was excluded."""
    return {
        "time": time.time(), "seconds": round(seconds, 3), "backend": backend,
        "sizes": {"min_bytes": sizes.min_bytes, "max_bytes": sizes.max_bytes},
        "fraction": decision.fraction, "node_median_gbps": decision.node_median_gbps,
        "pair_median_gbps": decision.pair_median_gbps, "excluded": decision.excluded,
        "slow_pairs": ["-".join(pair) for pair in decision.slow_pairs],
        "nodes": [{"node": v.node, "busbw_gbps": v.busbw_gbps, "pairs": dict(v.pairs),
                   "excluded": v.slow, "reason": v.reason if v.slow else None}
                  for v in decision.verdicts],
        "probes": [{"kind": m.probe.kind, "nodes": list(m.probe.nodes),
                    "ranks": m.probe.ranks_per_node * len(m.probe.nodes), "round": m.probe.round,
                    "job_id": m.job_id,
                    "busbw_gbps": m.busbw_gbps, "error": m.error,
                    "sizes": (m.result or {}).get("sizes"),
                    "stopped_early": (m.result or {}).get("stopped_early"),
                    "seconds": (m.result or {}).get("seconds")} for m in measured],
    }


def unique(folder: Path) -> Path:
    """`folder`, or folder-2, -3, … when a check of the same second has it already."""
    candidate, number = folder, 1
    while candidate.exists():
        number += 1
        candidate = folder.with_name(f"{folder.name}-{number}")
    return candidate


def read_fabric(sweep_dir: Path) -> dict[str, Any] | None:
    """The sweep's last fabric check (fabric.json), if any."""
    data = read_json(sweep_dir / FABRIC_FILE)
    return data if isinstance(data, dict) else None


def fabric_target(sweep_dir: Path) -> PreflightTarget:
    """What the runs need on a node (interpreter, setup, Slurm options, GPUs), from the first
    rendered run; a UserError when the folder has no rendered run."""
    from sweep.backends.slurm.preflight import target_of
    from sweep.core.errors import UserError
    from sweep.plan.render import run_dirs_of

    run_dirs = run_dirs_of(sweep_dir)
    document = read_json(run_dirs[0] / "run.json") if run_dirs else None
    if not isinstance(document, dict) or "framework" not in document:
        raise UserError(f"{sweep_dir}: no run rendered by `sweep render` (runs/*/run.json), so "
                        "nothing says which interpreter, partition and GPUs the fabric check "
                        f"should use; render the sweep first (`sweep render SPEC --out {sweep_dir}`)")
    try:
        return target_of(document)
    except ValueError as error:
        raise UserError(f"fabric check: {run_dirs[0] / 'run.json'}: {error}") from None


@dataclass(frozen=True)
class FabricReport:
    decision: FabricDecision
    measured: tuple[Measured, ...]
    seconds: float
    newly_excluded: tuple[str, ...]


def run_check(tracker: Tracker, *, nodes: Sequence[str] | None = None,
              fraction: float = DEFAULT_FRACTION, timeout_s: float = DEFAULT_TIMEOUT_S,
              say: Callable[[str], None] = print) -> FabricReport:
    """The whole check on a sweep folder: the probes of `nodes` (default: the partition's
    usable nodes the sweep does not exclude yet), fabric.json, and the slow nodes excluded
    with their figures as the reasons. UserError when there is nothing to check or nothing
    was measured."""
    from sweep.backends.slurm.client import SlurmError
    from sweep.core.errors import UserError

    if not 0 < fraction < 1:
        raise UserError(f"--fraction {fraction:g}: the share of the median below which a node is "
                        f"excluded must be between 0 and 1 (default {DEFAULT_FRACTION})")
    target = fabric_target(tracker.dir)
    started = time.monotonic()
    partition = dict(target.slurm).get("partition")
    try:
        if nodes is None:
            excluded = set(tracker.excluded())
            nodes = [n for n in tracker.slurm.usable_nodes(partition) if n not in excluded]
        if len(nodes) < 2:
            raise UserError(f"fabric check: {len(nodes)} node(s) to check on "
                            f"{partition or 'the default partition'} ({','.join(nodes) or 'none'}); "
                            "it compares nodes with each other, so it needs at least two")
        probes = probes_for(nodes, target.gpus_per_node)
        sizes = GPU_SIZES if target.gpus_per_node else CPU_SIZES
        backend = "nccl" if target.gpus_per_node else "gloo"
        kinds = [p.kind for p in probes]
        say(f"fabric check: {kinds.count('node')} node job(s) and {kinds.count('pair')} pair "
            f"job(s) on {partition or 'the default partition'} ({len(nodes)} nodes), an "
            f"all-reduce of {sizes.describe()} with {backend} ...")
        folder = tracker.dir / FABRIC_DIR / time.strftime("%Y%m%d-%H%M%S")
        measured = run_probes(tracker.slurm, target, probes, unique(folder),
                              f"sweep-fabric={tracker.sweep_name()}", timeout_s)
    except SlurmError as error:
        raise UserError(f"fabric check: {error}") from None
    if all(m.busbw_gbps is None for m in measured):
        raise UserError("fabric check: no probe gave a figure:\n"
                        + "\n".join(f"  - {m.probe.name}: {m.error}" for m in measured))
    decision = decision_of(measured, fraction)
    seconds = time.monotonic() - started
    atomic_write_json(tracker.dir / FABRIC_FILE,
                      fabric_record(decision, measured, seconds, backend, sizes))
    before = set(tracker.excluded())
    slow = {v.node: v.reason for v in decision.verdicts if v.slow}
    if slow:
        tracker.change_exclusions(exclude=sorted(slow), reasons=slow)
    for line in summary_lines(decision, measured):
        say(line)
    return FabricReport(decision, tuple(measured), seconds,
                        tuple(sorted(set(slow) - before)))


def summary_lines(decision: FabricDecision, measured: Sequence[Measured]) -> list[str]:
    """What the check tells the user: the medians, each excluded node with its reason, the
    slow pairs not pinned on a node, and the probes without a figure."""
    medians = ", ".join(f"{what} {gbps(value)}" for what, value in
                        (("node median", decision.node_median_gbps),
                         ("pair median", decision.pair_median_gbps)) if value is not None)
    lines = [f"fabric check: busbw {medians}; a node below {decision.fraction:g} x the median "
             f"is excluded"]
    lines += [f"fabric check: excluding {v.node}: {'; '.join(v.reasons)}"
              for v in decision.verdicts if v.slow]
    excluded = set(decision.excluded)
    lines += [f"fabric check: slow pair {'-'.join(pair)} (not pinned on a node: a slow link "
              "between them?)" for pair in decision.slow_pairs if not set(pair) & excluded]
    lines += [f"fabric check: no figure from {m.probe.name}: {m.error}"
              for m in measured if m.busbw_gbps is None]
    if not excluded:
        lines.append("fabric check: no node excluded")
    return lines
