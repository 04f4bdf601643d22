"""The parser reads the lines Megatron's own format strings make, at each tested version.

The builders below reproduce, field for field, `training_log` in megatron/training/training.py
(0.17.1: lines 2205-2261; 0.19.2: lines 2844-2909) and `report_memory` (0.17.1:
megatron/training/utils.py:281; 0.19.2: megatron/training/utils/common_utils.py:313). The
iteration line is printed by the last rank only (print_rank_last); the memory line by every
data-parallel-rank-0 rank, after iterations 1 and 2 and every --log-memory-interval iterations
(launch/megatron.args sets 1). A node's log therefore holds the memory lines of its own ranks
and, on the last node only, the iteration lines.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sweep.core.units import MiB
from sweep.frameworks import get_parser

WHEN = datetime(2026, 8, 22, 15, 22, 22, 125000)


def iteration_line(version: str, iteration: int, *, moe: bool = False, train_iters: int = 6,
                   elapsed_ms: float = 812.34, loss: float = 10.8765) -> str:
    """training_log's line with --log-throughput, bf16 and (moe) an aux loss."""
    line = f" [{WHEN.strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    line += f" iteration {iteration:8d}/{train_iters:8d} |"
    line += f" consumed samples: {iteration * 32:12d} |"
    line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    line += f" throughput per GPU (TFLOP/s/GPU): {401.27:.1f} |"
    line += f" learning rate: {1.5e-4:.6E} |"
    line += f" global batch size: {32:5d} |"
    losses = {"lm loss": loss}
    if moe and version == "0.17.1":  # track_moe_metrics adds it to total_loss_dict
        losses["load_balancing_loss"] = 1.0123
    for key, value in losses.items():
        line += f" {key}: {value:.6E} |"
    if moe and version == "0.19.2":  # the MoE metrics tracker's own string (moe_logging.py:384)
        line += "".join(f" {k}: {v:.2f} |" for k, v in {"load_balancing_loss": 1.0123}.items())
    line += f" loss scale: {1.0:.1f} |"
    line += f" grad norm: {2.345:.3f} |"
    line += f" number of skipped iterations: {0:3d} |"
    line += f" number of nan iterations: {0:3d} |"
    return line


def memory_line(rank: int, iteration: int, max_allocated_mb: float) -> str:
    mb = max_allocated_mb
    string = f"(after {iteration} iterations)" + " memory (MB)"
    string += f" | allocated: {mb * 0.6:.2f}"
    string += f" | max allocated: {mb:.2f}"
    string += f" | reserved: {mb * 1.1:.2f}"
    string += f" | max reserved: {mb * 1.2:.2f}"
    return f"[Rank {rank}] {string}"


VERSIONS = ("0.17.1", "0.19.2")


@pytest.fixture(scope="module")
def parser():
    return get_parser("megatron")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("moe", [False, True])
def test_iteration_line_of_each_version(parser, version: str, moe: bool) -> None:
    record = parser.match_step(iteration_line(version, 3, moe=moe))
    assert record is not None and record.format_version == "megatron-2025"
    assert (record.step, record.total_steps, record.step_time_s) == (3, 6, 0.8123)  # logged as {:.1f} ms: 812.3
    assert (record.loss, record.tflops_per_gpu, record.grad_norm) == (10.8765, 401.3, 2.345)
    assert (record.global_batch_size, record.learning_rate, record.skipped_iterations) == \
        (32, 1.5e-4, 0)
    assert record.timestamp == WHEN.replace(tzinfo=UTC).timestamp()


def node_log(version: str, ranks: dict[int, list[float]], last_node: bool, steps: int = 6) -> str:
    """One node's log: its DP-rank-0 ranks' memory lines after each iteration (max allocated
    growing to the rank's peak), and on the last node the iteration lines, in print order."""
    lines = []
    for iteration in range(1, steps + 1):
        if last_node:
            lines.append(iteration_line(version, iteration))
        for rank, (early, peak) in ranks.items():
            lines.append(memory_line(rank, iteration, early if iteration == 1 else peak))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("version", VERSIONS)
def test_memory_is_the_most_loaded_rank_and_steps_are_counted_once(parser, version: str) -> None:
    # PP2 x TP2 on two nodes of 2 GPUs: node 0 holds stage 0 (ranks 0, 1), node 1 stage 1.
    first = parser.parse_text(node_log(version, {0: [9000.5, 12000.25], 1: [8999.0, 11990.0]},
                                       last_node=False), "node0.out")
    last = parser.parse_text(node_log(version, {2: [7000.0, 9500.75], 3: [7000.0, 9400.0]},
                                      last_node=True), "node1.out")
    assert first.steps == () and len(first.memory) == 12
    assert first.peak_mem_allocated_bytes == round(12000.25 * MiB)  # rank 0, not the last line
    assert first.peak_mem_reserved_bytes == round(12000.25 * 1.2 * MiB)
    assert [r.step for r in last.steps] == [1, 2, 3, 4, 5, 6] and last.duplicate_steps == 0
    assert last.peak_mem_allocated_bytes == round(9500.75 * MiB)
    assert {m.rank for m in last.memory} == {2, 3}
    # collect takes the steps from the log with the most step lines and the memory peak over all
    assert max(first.peak_mem_allocated_bytes, last.peak_mem_allocated_bytes) == \
        round(12000.25 * MiB)


def test_a_repeated_iteration_line_is_one_step(parser) -> None:
    line = iteration_line("0.19.2", 2)
    log = parser.parse_text("\n".join([iteration_line("0.19.2", 1), line, line]) + "\n")
    assert [r.step for r in log.steps] == [1, 2] and log.duplicate_steps == 1


def test_memory_line_fields(parser) -> None:
    sample = parser.match_memory(memory_line(5, 2, 4096.5))
    assert (sample.rank, sample.after_step) == (5, 2)
    assert sample.max_allocated_bytes == round(4096.5 * MiB)
    assert sample.allocated_bytes == round(4096.5 * 0.6 * MiB)
    assert sample.max_reserved_bytes == round(4096.5 * 1.2 * MiB)
