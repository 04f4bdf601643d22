"""The fabric check's pure half: the probes and their rounds, and which nodes the figures
exclude (the node's own figure against the median, and pairs pinned on a node)."""

from __future__ import annotations

import pytest

from sweep.backends.slurm.fabric_decision import (
    confirmation_probes,
    confirmed,
    decide,
    probe_arguments,
    probes_for,
    ring_pairs,
)

HEALTHY = {"n1": 10.0, "n2": 10.5, "n3": 9.8, "n4": 10.2}


def test_every_node_is_in_two_pairs_and_in_one_probe_per_round() -> None:
    nodes = [f"n{i}" for i in range(5)]
    probes = probes_for(nodes, gpus_per_node=None)
    singles = [p for p in probes if p.kind == "node"]
    pairs = [p for p in probes if p.kind == "pair"]
    assert [p.nodes for p in singles] == [(n,) for n in nodes] and {p.round for p in singles} == {0}
    assert all(sum(n in p.nodes for p in pairs) == 2 for n in nodes)
    for number in {p.round for p in probes}:
        members = [n for p in probes if p.round == number for n in p.nodes]
        assert len(members) == len(set(members)), number
    assert {p.round for p in pairs} == {1, 2, 3}  # an odd ring needs a third round
    assert ring_pairs(["a", "b"]) == [("a", "b")] and ring_pairs(["a"]) == []


def test_on_cpu_a_node_is_two_gloo_ranks_and_a_pair_one_rank_per_node_on_gpus_all_its_gpus() -> None:
    cpu = probes_for(["a", "b", "c"], gpus_per_node=None)
    assert {(p.kind, p.ranks_per_node) for p in cpu} == {("node", 2), ("pair", 1)}
    gpu = probes_for(["a", "b", "c"], gpus_per_node=8)
    assert {(p.kind, p.ranks_per_node) for p in gpu} == {("node", 8), ("pair", 8)}
    one_gpu = probes_for(["a", "b", "c"], gpus_per_node=1)
    assert {p.kind for p in one_gpu} == {"pair"}  # one rank moves no data within a node


def test_on_gpus_a_probe_waits_for_its_round_to_be_up_on_cpu_for_every_probe() -> None:
    """On GPUs the probes of different rounds cannot run at once on a node (each asks for all
    its GPUs), so waiting for a later round to be up would wait for nothing."""
    probes = probes_for(["a", "b", "c", "d"], gpus_per_node=8)
    pair = next(p for p in probes if p.kind == "pair" and p.round == 2)

    def argument(arguments: list[str], flag: str) -> set[str]:
        return set(filter(None, arguments[arguments.index(flag) + 1].split(",")))

    on_gpus = probe_arguments(pair, probes, all_up=False)
    assert argument(on_gpus, "--peers") == {p.name for p in probes if p.round == 2} - {pair.name}
    assert argument(on_gpus, "--after") == {p.name for p in probes if p.round < 2}
    on_cpu = probe_arguments(pair, probes, all_up=True)
    assert argument(on_cpu, "--peers") == {p.name for p in probes} - {pair.name}


def test_a_node_below_the_fraction_of_the_median_is_excluded_with_its_figure_as_the_reason() -> None:
    decision = decide({**HEALTHY, "n3": 2.5}, {}, fraction=0.7)
    assert decision.excluded == ["n3"]
    [slow] = [v for v in decision.verdicts if v.slow]
    assert slow.reason == ("fabric check: all-reduce busbw 2.5 GB/s within the node < 0.7 x the "
                           "median 10.1 GB/s")  # of 2.5, 10, 10.2, 10.5
    assert decision.node_median_gbps == pytest.approx(10.1)


def test_the_fraction_is_the_line_a_node_just_above_it_stays() -> None:
    median = 10.0
    assert decide({**HEALTHY, "n3": 0.71 * median}, {}, 0.7).excluded == []
    assert decide({**HEALTHY, "n3": 0.69 * median}, {}, 0.7).excluded == ["n3"]
    assert decide({**HEALTHY, "n3": 0.69 * median}, {}, 0.5).excluded == []


def test_a_node_whose_every_pair_is_slow_is_excluded_though_its_own_figure_is_fine() -> None:
    """NVLink fine, its InfiniBand link slow: only the pairs show it."""
    pairs: dict[tuple[str, str], float | None] = {
        ("n1", "n2"): 20.0, ("n2", "n3"): 5.0, ("n3", "n4"): 5.2, ("n4", "n1"): 19.0}
    decision = decide(HEALTHY, pairs, 0.7)
    assert decision.excluded == ["n3"]
    [slow] = [v for v in decision.verdicts if v.slow]
    assert "every pair with it (n2-n3 5 GB/s, n3-n4 5.2 GB/s)" in slow.reason


def test_a_neighbour_of_a_slow_node_with_one_noisy_pair_more_is_not_excluded() -> None:
    """n2 is slow, so n1-n2 is slow; n4-n1 is slow too by chance. n1's pairs are both slow,
    but the slowness follows n2 (its partner in n1-n2 has no good pair) and n4 (n4-n1's partner
    has a good pair, n3-n4, but the pair n1-n2 is not pinned on n1): n1 stays."""
    pairs: dict[tuple[str, str], float | None] = {
        ("n1", "n2"): 4.0, ("n2", "n3"): 4.0, ("n3", "n4"): 20.0, ("n4", "n1"): 5.0}
    decision = decide({**HEALTHY, "n2": 2.0}, pairs, 0.7)
    assert decision.excluded == ["n2"]


def test_a_slow_link_between_two_healthy_nodes_is_reported_not_pinned_on_either() -> None:
    pairs: dict[tuple[str, str], float | None] = {
        ("n1", "n2"): 20.0, ("n2", "n3"): 4.0, ("n3", "n4"): 20.0, ("n4", "n1"): 19.0}
    decision = decide(HEALTHY, pairs, 0.7)
    assert decision.excluded == [] and decision.slow_pairs == (("n2", "n3"),)


def test_nodes_without_figures_are_not_judged_and_one_figure_compares_with_nothing() -> None:
    decision = decide({"n1": 10.0, "n2": None, "n3": 1.0, "n4": 11.0}, {}, 0.7)
    assert decision.excluded == ["n3"] and decision.node_median_gbps == 10.0
    alone = decide({"n1": 10.0, "n2": None}, {}, 0.7)
    assert alone.excluded == [] and alone.node_median_gbps is None


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, -0.2])
def test_a_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        decide(HEALTHY, {}, fraction)


def test_a_suspect_is_measured_again_by_its_own_probes_only_and_in_rounds() -> None:
    probes = probes_for(["n1", "n2", "n3", "n4"], gpus_per_node=None)
    again = confirmation_probes(["n2"], probes)
    assert [(p.kind, p.nodes) for p in again] == [
        ("node", ("n2",)), ("pair", ("n1", "n2")), ("pair", ("n2", "n3"))]
    for number in {p.round for p in again}:  # still no node in two probes of a round
        members = [n for p in again if p.round == number for n in p.nodes]
        assert len(members) == len(set(members)), number
    assert [p.round for p in again] == [0, 1, 2]
    assert confirmation_probes([], probes) == []


def test_after_the_second_measurement_only_a_suspect_of_the_first_can_be_excluded() -> None:
    """The suspects' better figures can raise the median; a node measured once is not excluded
    for that."""
    first = decide({**HEALTHY, "n2": 3.0}, {}, fraction=0.98)  # median 9.9: n3's 9.8 passes
    assert first.excluded == ["n2"]
    second = decide({**HEALTHY, "n2": 20.0}, {}, fraction=0.98)  # median 10.1: n3 falls below
    assert second.excluded == ["n3"]
    assert confirmed(second, first.excluded).excluded == []
    still_slow = decide({**HEALTHY, "n2": 3.5}, {}, fraction=0.98)
    assert confirmed(still_slow, first.excluded).excluded == ["n2"]
