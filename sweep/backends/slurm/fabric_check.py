"""The fabric check: which nodes' links are too slow to take part in the sweep.

One node with a slow NVLink or InfiniBand link drags every multi-node run it lands in, and the
heatmap then shows a wrong best configuration with no failure to catch. Before the sweep,
`sweep nodes DIR --check` (or `sweep submit --fabric-check`) runs one small job per node and one
per pair of nodes, all at once: an all-reduce of growing sizes (sweep.backends.slurm.fabric_probe:
NCCL on GPUs, gloo on CPU), measured as nccl-tests measures it (busbw). A node whose own figure,
or every pair it is in, falls below a stated fraction of the median is excluded from the
sweep's later submissions through bad_nodes.json, with the figure as the reason, once a second
measurement of its probes confirms it (the better of the two figures counts); `sweep nodes
DIR --forgive NODE` brings it back. Which probes, in which rounds, and which nodes the figures
exclude is the pure half, sweep.backends.slurm.fabric_decision.

This is the Slurm side: `run_check` writes `fabric/<time>/probe.sh`, submits every probe, waits
for their results, and writes `fabric.json` (every figure, the fraction and the medians) into
the sweep folder.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sweep.backends.slurm.fabric_decision import (
    DEFAULT_FRACTION,
    FabricDecision,
    Probe,
    confirmation_probes,
    confirmed,
    decide,
    gbps,
    probe_arguments,
    probes_for,
)
from sweep.core.state import atomic_write_json, atomic_write_text, read_json

if TYPE_CHECKING:
    from sweep.backends.slurm.client import Slurm
    from sweep.backends.slurm.preflight import PreflightTarget
    from sweep.backends.slurm.tracker import Tracker

FABRIC_DIR: Final = "fabric"
FABRIC_FILE: Final = "fabric.json"
SCRIPT_FILE: Final = "probe.sh"
DEFAULT_TIMEOUT_S: Final = 600.0  # queue wait included
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


def better_of(first: Sequence[Measured], again: Sequence[Measured]) -> list[Measured]:
    """Each probe of `first` as the better of its two measurements by busbw (a probe measured
    once, or whose second try gave no figure, keeps its first). Interference only ever makes a
    link look slower, so the better figure is the truer one."""
    by_name = {m.probe.name: m for m in again}
    chosen = []
    for measured in first:
        other = by_name.get(measured.probe.name)
        if other is not None and other.busbw_gbps is not None and (
                measured.busbw_gbps is None or other.busbw_gbps > measured.busbw_gbps):
            measured = replace(other, probe=measured.probe)
        chosen.append(measured)
    return chosen


def _probe_record(m: Measured) -> dict[str, Any]:
    return {"kind": m.probe.kind, "nodes": list(m.probe.nodes),
            "ranks": m.probe.ranks_per_node * len(m.probe.nodes), "round": m.probe.round,
            "job_id": m.job_id,
            "busbw_gbps": m.busbw_gbps, "error": m.error,
            "sizes": (m.result or {}).get("sizes"),
            "stopped_early": (m.result or {}).get("stopped_early"),
            "ready_s": (m.result or {}).get("ready_s"),
            "seconds": (m.result or {}).get("seconds")}


def fabric_record(decision: FabricDecision, measured: Sequence[Measured], seconds: float,
                  backend: str, sizes: ProbeSizes, again: Sequence[Measured] = ()
                  ) -> dict[str, Any]:
    """fabric.json: every figure (the better of two for a probe measured again, whose second
    measurement `again` also lists), the fraction, the medians and what was excluded."""
    return {
        "time": time.time(), "seconds": round(seconds, 3), "backend": backend,
        "sizes": {"min_bytes": sizes.min_bytes, "max_bytes": sizes.max_bytes},
        "fraction": decision.fraction, "node_median_gbps": decision.node_median_gbps,
        "pair_median_gbps": decision.pair_median_gbps, "excluded": decision.excluded,
        "slow_pairs": ["-".join(pair) for pair in decision.slow_pairs],
        "nodes": [{"node": v.node, "busbw_gbps": v.busbw_gbps, "pairs": dict(v.pairs),
                   "excluded": v.slow, "reason": v.reason if v.slow else None}
                  for v in decision.verdicts],
        "probes": [_probe_record(m) for m in measured],
        "again": [_probe_record(m) for m in again],
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
        raise UserError(f"fabric check: the fraction {fraction:g} of the median below which a "
                        f"node is excluded must be between 0 and 1 (default {DEFAULT_FRACTION})")
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
    suspects, again = decision.excluded, []
    if suspects:
        say(f"fabric check: {', '.join(suspects)} below {fraction:g} x the median; measuring "
            f"again before excluding ...")
        try:
            again = run_probes(tracker.slurm, target, confirmation_probes(suspects, probes),
                               unique(folder.with_name(f"{folder.name}-again")),
                               f"sweep-fabric={tracker.sweep_name()}", timeout_s)
        except SlurmError as error:
            raise UserError(f"fabric check: {error}") from None
        measured = better_of(measured, again)
        decision = confirmed(decision_of(measured, fraction), suspects)
    seconds = time.monotonic() - started
    atomic_write_json(tracker.dir / FABRIC_FILE,
                      fabric_record(decision, measured, seconds, backend, sizes, again))
    before = set(tracker.excluded())
    slow = {v.node: v.reason for v in decision.verdicts if v.slow}
    if slow:
        tracker.change_exclusions(exclude=sorted(slow), reasons=slow)
    for line in summary_lines(decision, measured, suspects):
        say(line)
    return FabricReport(decision, tuple(measured), seconds,
                        tuple(sorted(set(slow) - before)))


def summary_lines(decision: FabricDecision, measured: Sequence[Measured],
                  suspects: Sequence[str] = ()) -> list[str]:
    """What the check tells the user: the medians, each excluded node with its reason, each
    suspect that its second measurement cleared, the slow pairs not pinned on a node, and the
    probes without a figure."""
    medians = ", ".join(f"{what} {gbps(value)}" for what, value in
                        (("node median", decision.node_median_gbps),
                         ("pair median", decision.pair_median_gbps)) if value is not None)
    lines = [f"fabric check: busbw {medians}; a node below {decision.fraction:g} x the median "
             f"is excluded"]
    lines += [f"fabric check: excluding {v.node}{' (measured twice)' if v.node in suspects else ''}: "
              f"{'; '.join(v.reasons)}" for v in decision.verdicts if v.slow]
    excluded = set(decision.excluded)
    lines += [f"fabric check: {node} measured again is within the line: not excluded"
              for node in suspects if node not in excluded]
    lines += [f"fabric check: slow pair {'-'.join(pair)} (not pinned on a node: a slow link "
              "between them?)" for pair in decision.slow_pairs if not set(pair) & excluded]
    lines += [f"fabric check: no figure from {m.probe.name}: {m.error}"
              for m in measured if m.busbw_gbps is None]
    if not excluded:
        lines.append("fabric check: no node excluded")
    return lines
