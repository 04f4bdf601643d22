"""`sweep frameworks [--capabilities]`: the framework versions llm-sweep renders for, the newest
release of each that the matrix was checked against (and when), and what each framework cannot run
as labelled (the configurations the planner prunes as `framework`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--capabilities", action="store_true",
                        help="also list every capability rule with the framework's reason")


def run(args: argparse.Namespace) -> int:
    from sweep.frameworks.matrix import capability_tables, freshness_table, support_matrix

    print(support_matrix())
    print()
    print(freshness_table())
    if args.capabilities:
        print()
        print(capability_tables())
    return 0
