"""Each rank's own step time and node, as the built-in workload gathers them for collect's
straggler check; and the test-only simulated straggler (SWEEP_TEST_STRAGGLER)."""

from __future__ import annotations

import statistics

import pytest
import torch.distributed as dist

from sweep.workload.node_times import gather, node_name, simulated_slowdown, steady_median


def test_the_node_is_slurms_name_for_it_else_the_host() -> None:
    assert node_name({"SLURMD_NODENAME": "node3"}) == "node3"
    assert node_name({}) != ""


@pytest.mark.parametrize(("value", "node", "index", "slowdown"), [
    ("node2:1.5", "node2", "1", 1.5),   # by name
    ("node2:1.5", "node1", "0", 0.0),   # another node
    ("#1:2", "node7", "1", 2.0),        # the job's second node, whatever Slurm named it
    ("#1:2", "node6", "0", 0.0),
    ("", "node2", "1", 0.0),            # unset
])
def test_the_simulated_straggler_slows_only_the_named_node(value: str, node: str, index: str,
                                                           slowdown: float) -> None:
    environ = {"SWEEP_TEST_STRAGGLER": value, "SLURM_NODEID": index}
    assert simulated_slowdown(node, environ) == slowdown


@pytest.mark.parametrize("value", ["node2", "node2:fast", ":1", "node2:-1", "node2:nan"])
def test_a_malformed_simulated_straggler_is_refused_not_ignored(value: str) -> None:
    with pytest.raises(ValueError, match="SWEEP_TEST_STRAGGLER.*NODE:SLOWDOWN"):
        simulated_slowdown("node2", {"SWEEP_TEST_STRAGGLER": value})


def test_a_ranks_figure_is_the_median_of_its_steps_after_the_warm_up() -> None:
    times = [9.0, 8.0, 1.0, 1.2, 5.0, 1.1]  # two warm-up steps, then one step the OS stalled
    assert steady_median(times, 2) == statistics.median([1.0, 1.2, 5.0, 1.1])
    assert steady_median(times[:2], 2) is None


def test_rank_0_gathers_every_ranks_median_and_node() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        fields = gather([3.0, 1.0, 2.0, 4.0], 1, "node5", 1.0)
    finally:
        dist.destroy_process_group()
    assert fields["rank_nodes"] == ["node5"]
    assert fields["rank_step_time_median_s"] == [statistics.median([1.0, 2.0, 4.0])]
    assert "node5" in fields["simulated_straggler"]
