"""The `sweep` command. Each subcommand lives in `sweep/commands/<name>.py`.

A command module defines `add_arguments(parser)` and `run(args) -> int`. Modules are imported
only when their command runs, so `sweep status` on a login node never imports torch or
matplotlib. Known user errors exit with code 2 and one clear line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sweep import __version__
from sweep.core.errors import exit_code_of

COMMANDS: dict[str, str] = {
    "plan": "enumerate and prune the configurations of a spec; write plan.parquet",
    "render": "write run directories: run.json, job.sbatch and the framework's launch files",
    "run": "plan, render, run locally, collect and report: a whole sweep on this machine",
    "submit": "submit rendered runs to Slurm as throttled job arrays",
    "status": "show the state of every run of a sweep",
    "resume": "resubmit the runs whose latest attempt failed",
    "cancel": "cancel a sweep's queued and running jobs",
    "nodes": "list the nodes a sweep avoids after failures; forgive or exclude nodes",
    "collect": "turn attempt folders into runs.parquet",
    "report": "draw heatmaps and best-config tables from runs.parquet",
    "export": "send every attempt of a sweep to MLflow or W&B (idempotent)",
    "compare": "a performance-regression gate: what got slower or fails since a baseline sweep",
    "import-playbook": "convert the Ultra-Scale Playbook's published runs into runs.parquet",
    "memory-check": "score the memory model and the pruning rules against runs that really happened",
    "calibrate": "fit the throughput model's coefficients to completed runs",
    "replay": "replay a published sweep under a search strategy",
    "frameworks": "the framework versions llm-sweep renders for, and what each cannot run",
}


DESCRIPTION = ("Benchmark sweeps of distributed LLM training: plan the parallel configurations\n"
               "of a spec, run them on Slurm (or on this machine), collect and report.")
EPILOG = """a sweep, from a spec to a report:
  sweep run examples/local-cpu.yaml            everything, on this machine
  sweep submit SPEC                            plan, render, preflight, submit job arrays
  sweep status results/NAME --watch            follow it; `sweep resume` reruns what failed
  sweep collect results/NAME --sacct && sweep report results/NAME

`sweep COMMAND --help` explains each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sweep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        sub.add_parser(name, help=summary, description=summary, add_help=False)
    return parser


def _module_for(name: str):  # noqa: ANN202 - a command module
    return importlib.import_module(f"sweep.commands.{name.replace('-', '_')}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # prints help or the "invalid choice" error
        return 2
    name = argv[0]
    command = argparse.ArgumentParser(prog=f"sweep {name}", description=COMMANDS[name])
    try:
        module = _module_for(name)
    except ModuleNotFoundError as error:
        if error.name != f"sweep.commands.{name.replace('-', '_')}":
            raise
        print(f"sweep {name}: not available in this version", file=sys.stderr)
        return 2
    module.add_arguments(command)
    args = command.parse_args(argv[1:])
    return exit_code_of(name, lambda: module.run(args))


if __name__ == "__main__":
    sys.exit(main())
