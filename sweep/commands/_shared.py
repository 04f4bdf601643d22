"""Arguments that several commands take, defined once: `--top` (run, submit, replay) and the
submission options (submit, resume), with the argparse types they parse with.

Argparse only: what the commands then call lives in domain modules, so that no command imports
another command.
"""

from __future__ import annotations

import argparse

from sweep.core.errors import UserError


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of GPU-hours")
    return value


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def add_top_argument(parser: argparse.ArgumentParser) -> None:
    """`--top K`, the shortlist strategy's length (shared by `run`, `submit` and `replay`)."""
    from sweep.search.strategies import Params

    parser.add_argument("--top", type=positive, default=None, metavar="K",
                        help="shortlist: run each cell's K fastest predicted candidates, the "
                             f"next one in place of any that fails (default {Params().top})")


def shortlist_top(args: argparse.Namespace) -> int | None:
    """`--top`, refused with any strategy but the shortlist (it would change nothing)."""
    if args.top is not None and args.strategy != "shortlist":
        raise UserError(f"--top applies to --strategy shortlist, not --strategy {args.strategy}")
    return args.top


def add_submit_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by `sweep submit` and `sweep resume`."""
    parser.add_argument("--dry-run", action="store_true",
                        help="print the sbatch command lines; submit nothing")
    parser.add_argument("--max-running", type=positive, default=None, metavar="N",
                        help="at most N tasks of each array run at once (--array=...%%N); "
                             "default: no limit")
    parser.add_argument("--hold", action="store_true",
                        help="submit held (release with `scontrol release JOBID`)")
    parser.add_argument("--no-preflight", action="store_true",
                        help="skip the preflight job (sweep.backends.slurm.preflight) that checks, before the "
                             "first array, that the runs' interpreter, framework, GPUs and the "
                             "shared sweep folder work on the target partition")
    parser.add_argument("--preflight-timeout", type=float, default=600.0, metavar="S",
                        help="give up on the preflight after S seconds, queue wait included "
                             "(default %(default)s)")
    parser.add_argument("--no-report", action="store_true",
                        help="do not collect and report on the cluster when the submitted runs "
                             "(or the search) end")
    parser.add_argument("--max-gpu-hours", type=positive_float, default=None, metavar="H",
                        help="cap the sweep at H GPU-hours (spent + in flight at its time limit); "
                             "runs that would exceed it wait for room, or are left out and "
                             "listed in budget_left_out.txt (default: the cap the sweep was "
                             "last submitted with, else the spec's max_gpu_hours)")
    parser.add_argument("--yes", action="store_true",
                        help="go ahead without asking, however many GPU-hours the worst case is")
