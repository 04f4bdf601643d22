"""`sweep nodes DIR [--forgive NODES] [--exclude NODES] [--check]`: the nodes a sweep avoids, and why.

A node with two node failures or NCCL errors is excluded from the sweep's later submissions
(`bad_nodes.json`, kept up to date by `sweep status`, `submit` and `resume`). This command lists
every node that failed or is excluded (`counting`: its failures since it was last forgiven),
gives a repaired node another chance (`--forgive`: its failures so far stop counting, two new
ones exclude it again) or keeps one out by hand (`--exclude`). These read and write only the
sweep folder: no Slurm command runs. `--check` runs the fabric check first
(sweep.backends.slurm.fabric_check: an all-reduce job per node and per pair of nodes; a node
below `--fraction` of the median bus bandwidth is excluded with its figure as the reason), and
the last check's figures (fabric.json) are listed with the nodes.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.commands._fabric import add_fabric_options, check_fabric, print_fabric_table
from sweep.core.errors import UserError

if TYPE_CHECKING:
    from rich.table import Table

    from sweep.backends.slurm.submission import NodeRecord

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", type=Path, help="the sweep folder")
    parser.add_argument("--forgive", action="append", default=[], metavar="NODES",
                        help="take nodes out of the exclude list (a Slurm host list such as "
                             "gpu[03-04],gpu09; repeatable)")
    parser.add_argument("--exclude", action="append", default=[], metavar="NODES",
                        help="keep nodes out of later submissions (a Slurm host list; repeatable)")
    parser.add_argument("--check", action="store_true",
                        help="run the fabric check on the cluster first: an all_reduce job per "
                             "node and per pair of nodes; the nodes below --fraction of the "
                             "median bus bandwidth are excluded")
    add_fabric_options(parser, prefix="")


def node_names(flag: str, values: Sequence[str]) -> list[str]:
    """The nodes of `--flag` host lists; a name that Slurm would not accept is an input error."""
    from sweep.core.hostlist import expand

    names: list[str] = []
    for value in values:
        try:
            expanded = expand(value)
        except ValueError as error:
            raise UserError(f"{flag} {value!r}: {error}; write nodes as a Slurm host list, "
                            "e.g. gpu[03-04],gpu09") from None
        for name in expanded:
            if not NODE_NAME.fullmatch(name):
                raise UserError(f"{flag} {value!r}: {name!r} is not a node name (letters, digits, "
                                ". _ -, starting with a letter or digit)")
            names.append(name)
    return sorted(set(names))


def describe(record: NodeRecord) -> str:
    """What later submissions do with the node, and since when."""
    def at(seconds: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))

    if record.excluded_at is not None and record.reason:
        return f"excluded since {at(record.excluded_at)}, {record.reason}"
    if record.excluded_at is not None:
        why = "by hand" if record.excluded_by_hand() else f"after {record.counted} failures"
        return f"excluded {why} since {at(record.excluded_at)}"
    if record.forgiven_at is not None:
        return f"in use, forgiven at {at(record.forgiven_at)}"
    return "in use"


def suspects_table(sweep: str, suspects: dict[str, dict[str, Any]]) -> Table:
    """The straggler suspects `sweep collect` counted: each node, the runs it was the slowest
    node of, with the ratio to its run's median; listed, never excluded."""
    from sweep.commands._output import titled_table

    table = titled_table(f"{sweep}: straggler suspects (slowest node of a run, beyond its factor "
                         "× the nodes' median step time; never excluded automatically)")
    for column in ("node", "straggler runs", "evidence", "later submissions"):
        table.add_column(column, justify="right" if column == "straggler runs" else "left")
    for node, entry in suspects.items():
        runs = entry.get("runs") or []
        evidence = ", ".join(f"{r['run']} {r['ratio']:.2f}× (> {r['factor']:g})" for r in runs[:4])
        table.add_row(node, str(entry.get("count", len(runs))),
                      evidence + (" …" if len(runs) > 4 else ""),
                      "in use (`sweep nodes --exclude` keeps it out)")
    return table


def run(args: argparse.Namespace) -> int:
    from sweep.backends.slurm.tracker import Tracker
    from sweep.commands._output import output_console, titled_table

    forgive, exclude = node_names("--forgive", args.forgive), node_names("--exclude", args.exclude)
    both = sorted(set(forgive) & set(exclude))
    if both:
        raise UserError(f"{','.join(both)}: both in --forgive and --exclude; choose one")
    if args.check and (forgive or exclude):
        raise UserError("--check runs the fabric check; run --forgive and --exclude on their own")
    tracker = Tracker(args.sweep_dir)
    if args.check:
        check_fabric(tracker, args, prefix="")
    if forgive:
        excluded = set(tracker.excluded())
        unknown = [node for node in forgive if node not in excluded]
        if unknown:
            raise UserError(f"--forgive {','.join(unknown)}: not excluded by this sweep (excluded: "
                            f"{','.join(sorted(excluded)) or 'none'}); see `sweep nodes "
                            f"{args.sweep_dir}`")
    if forgive or exclude:
        changed = tracker.change_exclusions(forgive=forgive, exclude=exclude)
        print(f"{tracker.dir.name}: forgave {len(forgive)}, excluded {len(exclude)} node(s); "
              f"later submissions exclude: {','.join(changed.exclude) or 'none'}")
        return 0
    records = tracker.nodes()
    print_fabric_table(tracker.dir)
    suspects = tracker.bad_nodes.suspects()
    if suspects:
        output_console().print(suspects_table(tracker.dir.name, suspects))
    if not records:
        print(f"{tracker.dir.name}: no node has failed, none is excluded")
        return 0
    table = titled_table(f"{tracker.dir.name}: nodes that failed or are excluded")
    for column in ("node", "failures", "counting", "later submissions"):
        table.add_column(column, justify="right" if column in ("failures", "counting") else "left")
    for record in records:
        table.add_row(record.node, str(record.failures), str(record.counted), describe(record))
    output_console().print(table)
    return 0
