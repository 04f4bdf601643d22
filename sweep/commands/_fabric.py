"""The fabric check's options and output, shared by `sweep nodes --check` and `sweep submit
--fabric-check` (sweep.backends.slurm.fabric_check does the work)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sweep.backends.slurm.tracker import Tracker

FRACTION_HELP = ("the fabric check excludes a node whose all_reduce bus bandwidth (or that of "
                 "every pair it is in) is below F times the median (default %(default)s)")


def add_fabric_options(parser: argparse.ArgumentParser, prefix: str) -> None:
    """--{prefix}fraction, --{prefix}check-nodes and --{prefix}check-timeout: `sweep nodes`
    names them plainly, `sweep submit` with prefix "fabric-"."""
    from sweep.backends.slurm.fabric_check import DEFAULT_TIMEOUT_S
    from sweep.backends.slurm.fabric_decision import DEFAULT_FRACTION

    parser.add_argument(f"--{prefix}fraction", type=float, default=DEFAULT_FRACTION, metavar="F",
                        help=FRACTION_HELP)
    parser.add_argument(f"--{prefix}check-nodes", default=None, metavar="NODES",
                        help="the nodes the fabric check measures (a Slurm host list; default: "
                             "the partition's usable nodes the sweep does not exclude)")
    parser.add_argument(f"--{prefix}check-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        metavar="S", help="give up on the fabric check's jobs after S seconds, "
                                          "queue wait included (default %(default)s)")


def check_fabric(tracker: Tracker, args: argparse.Namespace, prefix: str) -> None:
    """Run the fabric check with the options `add_fabric_options` added under `prefix`;
    the slow nodes it finds are excluded from the sweep's later submissions."""
    from sweep.backends.slurm.fabric_check import run_check
    from sweep.backends.slurm.fabric_decision import DEFAULT_FRACTION
    from sweep.commands.nodes import node_names
    from sweep.core.errors import UserError

    option = prefix.replace("-", "_")
    fraction, timeout_s = getattr(args, f"{option}fraction"), getattr(args, f"{option}check_timeout")
    if not 0 < fraction < 1:
        raise UserError(f"--{prefix}fraction {fraction:g}: the share of the median below which a "
                        f"node is excluded must be between 0 and 1 (default {DEFAULT_FRACTION})")
    if timeout_s <= 0:
        raise UserError(f"--{prefix}check-timeout {timeout_s:g}: must be a positive number of "
                        "seconds")
    nodes = getattr(args, f"{option}check_nodes")
    run_check(tracker, nodes=node_names(f"--{prefix}check-nodes", [nodes]) if nodes else None,
              fraction=fraction, timeout_s=timeout_s, say=lambda line: print(line, flush=True))


def _figure(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "-"


def print_fabric_table(sweep_dir: Path) -> None:
    """The last fabric check's figures (fabric.json), one row per node; nothing without one."""
    from sweep.backends.slurm.fabric_check import read_fabric
    from sweep.commands._output import output_console, titled_table

    fabric = read_fabric(sweep_dir)
    if not fabric or not fabric.get("nodes"):
        return
    medians = "".join(f"; {what} {_figure(fabric.get(key))}" for what, key in
                      (("node median", "node_median_gbps"), ("pair median", "pair_median_gbps"))
                      if fabric.get(key) is not None)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(fabric.get("time") or 0)))
    table = titled_table(f"{sweep_dir.name}: fabric check {when} ({fabric.get('backend')}), "
                         f"busbw in GB/s{medians}; excluded below {fabric.get('fraction')} x "
                         "the median")
    for column in ("node", "node busbw", "pairs busbw", "verdict"):
        table.add_column(column, justify="right" if column == "node busbw" else "left")
    for row in fabric["nodes"]:
        pairs = ", ".join(f"{pair} {_figure(bw)}" for pair, bw in (row.get("pairs") or {}).items())
        table.add_row(str(row.get("node")), _figure(row.get("busbw_gbps")), pairs or "-",
                      "excluded" if row.get("excluded") else "ok")
    output_console().print(table)
