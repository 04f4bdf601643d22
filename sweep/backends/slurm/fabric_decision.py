"""The fabric check's pure half: which probes it runs, in which rounds, and which nodes their
figures exclude (sweep.backends.slurm.fabric_check runs them on Slurm).

The pairs form a ring (n0-n1, n1-n2, …, n(k-1)-n0), so every node is in two pairs and a slow
node shows in both, while a slow link between two healthy nodes shows in one pair only and is
reported, not pinned on either node. On GPUs a node probe uses the node's GPUs and a pair probe
the GPUs of both nodes; on CPU a node probe is two gloo processes and a pair probe one per node.
The probes measure in rounds, the node probes first, then the pairs, no node in two probes of a
round, so that no two probes share a node's links (or, on CPU, its cores) while they measure.

A node is excluded when its own busbw is below a stated fraction (`DEFAULT_FRACTION`) of the
nodes' median, or when every pair it is in is below that fraction of the pairs' median and the
slowness follows it (`pinned_on`). A node below the line is measured once more before it is
excluded (`confirmation_probes`), and each of its probes counts with the better of its two
figures (`sweep.backends.slurm.fabric_check.better_of`): interference from another job or a
passing burst of traffic only ever makes a link look slower, never faster, so a node whose
second figure is fine was unlucky, not slow, and stays.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

DEFAULT_FRACTION: Final = 0.7  # of the median busbw: below it, a node is excluded
CPU_RANKS_PER_NODE: Final = 2


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
    return in_rounds(singles, [Probe("pair", pair, pair_ranks) for pair in ring_pairs(nodes)])


def in_rounds(singles: Sequence[Probe], pairs: Sequence[Probe]) -> list[Probe]:
    """The node probes in round 0, then the pairs in the rounds after it (`pair_rounds`)."""
    first = 1 if singles else 0
    rounds = pair_rounds([(p.nodes[0], p.nodes[1]) for p in pairs])
    return [replace(p, round=0) for p in singles] + [
        replace(p, round=first + r) for p, r in zip(pairs, rounds, strict=True)]


def probe_arguments(probe: Probe, probes: Sequence[Probe], all_up: bool) -> list[str]:
    """The probe's turn: the peers it waits to be up (every probe of the check when they all
    run at once, `all_up`, else its round's) and the probes of the earlier rounds it waits to
    end. On GPUs a node's probes of different rounds cannot run at once (each asks for all of
    its GPUs), so waiting there for a later round to be up would wait for nothing."""
    peers = [p.name for p in probes if p != probe and (all_up or p.round == probe.round)]
    after = [p.name for p in probes if p.round < probe.round]
    return ["--name", probe.name, "--peers", ",".join(peers), "--after", ",".join(after)]


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


def confirmation_probes(suspects: Sequence[str], probes: Sequence[Probe]) -> list[Probe]:
    """The probes of `probes` that a suspect node is in, to measure again: its node probe first
    (round 0), then its pairs, in rounds as the first measurement had them (no node in two
    probes of a round)."""
    chosen = [p for p in probes if set(p.nodes) & set(suspects)]
    return in_rounds([p for p in chosen if p.kind == "node"], [p for p in chosen if p.kind == "pair"])


def confirmed(decision: FabricDecision, suspects: Sequence[str]) -> FabricDecision:
    """The decision on the figures after the second measurement, excluding only nodes the first
    found slow too: a node measured once is never excluded because the suspects' better figures
    moved the median."""
    return replace(decision, verdicts=tuple(
        v if v.node in suspects else replace(v, reasons=()) for v in decision.verdicts))
