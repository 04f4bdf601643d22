"""The one budget rule of a sweep on Slurm, as `sweep submit`, `sweep resume` and the search
driver apply it: one estimate, one cap, one confirmation.

- The estimate: the runs about to be submitted, each at the plan's predicted step time
  (expected) and at its time limit (worst case), `sweep.plan.budget.estimate`.
- The cap: `--max-gpu-hours`, else the cap this sweep was last submitted or resumed with
  (`submit.json`, or the search's options in `driver.json`), else the spec's `max_gpu_hours`.
  A resume never drops a cap that the submit was given.
- The confirmation: a worst case (under the cap) above
  sweep.plan.budget.CONFIRM_ABOVE_GPU_HOURS is asked about at a terminal, refused without
  one, and `--yes` lets it go (`sweep.plan.budget.confirmation`).

What then launches runs, the one-round submission, resume's and every round of a search
(sweep.backends.slurm.backend), fits them under the cap with `Tracker.fit_budget`: spent plus
in flight (at its time limit) plus each new run at its time limit stays under the cap.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sweep.backends.slurm.submit_record import read_submit
from sweep.backends.slurm.tracker import Tracker
from sweep.core.errors import UserError
from sweep.core.state import read_json
from sweep.plan.plan_file import budget_cap


def sweep_cap(folder: Path, given: float | None) -> float | None:
    """The sweep's GPU-hour cap: the one given, else the one it was last submitted or resumed
    with, else the spec's."""
    if given is not None:
        return given
    for recorded in (read_submit(folder).get("max_gpu_hours"),
                     ((read_json(folder / "driver.json") or {}).get("options") or {})
                     .get("max_gpu_hours")):
        if isinstance(recorded, (int, float)) and recorded > 0:
            return float(recorded)
    return budget_cap(folder, None)


def step_times(folder: Path) -> dict[str, float]:
    """The plan's predicted step time of each run (run id → seconds), where it has one."""
    import pandas as pd

    from sweep.plan.plan_file import PLAN_FILE

    path = folder / PLAN_FILE
    if not path.is_file():
        return {}
    plan = pd.read_parquet(path, columns=None)
    if "pred_step_time_s" not in plan or "run_id" not in plan:
        return {}
    known = plan.dropna(subset=["pred_step_time_s", "run_id"])
    return dict(zip(known["run_id"].astype(str), known["pred_step_time_s"].astype(float),
                    strict=True))


def describe(tracker: Tracker, run_ids: Sequence[str], cap: float | None) -> tuple[str, float]:
    """The estimate's line for these runs and the cap, and the most they can spend (their worst
    case, or the cap when lower)."""
    from sweep.plan.budget import capped_worst, estimate

    times = step_times(tracker.dir)
    found = estimate(tracker.run_costs(list(run_ids), times),
                     predicted=sum(r in times for r in run_ids))
    line = found.describe() + (f"; capped at {cap:g} (--max-gpu-hours)" if cap is not None else "")
    return line, capped_worst(found.worst_gpu_hours, cap)


def announce_budget(tracker: Tracker, run_ids: Sequence[str], cap: float | None, *,
                    dry_run: bool, yes: bool, verb: str = "submit",
                    say: Callable[[str], None] = print) -> None:
    """Print the GPU-hours of `run_ids` (expected and worst case) and the cap; ask before a
    worst case above the confirmation threshold (UserError when declined, or with no terminal
    to ask and no --yes). Nothing to say about no runs."""
    from sweep.plan.budget import confirmation

    if not run_ids:
        return
    line, worst = describe(tracker, run_ids, cap)
    say(line)
    if dry_run:
        return
    decision = confirmation(worst, yes=yes, interactive=sys.stdin.isatty())
    if decision == "refuse":
        raise UserError(f"this sweep may use up to {worst:,.0f} GPU-hours and there is no terminal "
                        f"to confirm it: pass --yes to {verb} anyway, or --max-gpu-hours H to cap "
                        "it")
    if decision == "ask":
        answer = input(f"this sweep may use up to {worst:,.0f} GPU-hours; {verb}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise UserError(f"nothing done (answer y, or pass --yes to {verb})")
