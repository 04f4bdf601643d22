"""`sweep frameworks [--capabilities]`: the framework versions llm-sweep renders for, and what
each framework cannot run as labelled (the configurations the planner prunes as `framework`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--capabilities", action="store_true",
                        help="also list every capability rule with the framework's reason")


def run(args: argparse.Namespace) -> int:
    from sweep.frameworks.matrix import capability_tables, support_matrix

    print(support_matrix())
    if args.capabilities:
        print()
        print(capability_tables())
    return 0
