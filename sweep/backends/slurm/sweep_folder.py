"""What a sweep folder says of its runs, read from its files alone: no Slurm call.

The reading side of `sweep.backends.slurm.tracker.Tracker` (which adds submitting and observing): the rendered
runs and their shapes (job.sbatch), their model, GPUs, steps and time limits (run.json), the
ledger's submissions, the nodes the sweep excludes, and each run's cost for a GPU-hour budget.
Split out so that what only reads (a budget estimate, the search driver's cell counts, status
without a cluster) needs no Slurm and cannot submit by mistake.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.backends.slurm.submission import RunJob, Submission, SubmissionError, shape_of, submissions
from sweep.core.errors import UserError
from sweep.core.state import LEDGER_FILE, RUN_FILE, read_json, read_jsonl
from sweep.plan.budget import RunCost, expected_seconds
from sweep.plan.render import JOB_FILE, RUNS_DIR, run_dirs_of

# Every candidate's fate in the sweep's last search, launched or skipped (`sweep.search.live_search`).
SEARCH_RUNS_FILE: Final = "search_runs.csv"


def skipped_by_search(folder: Path) -> frozenset[str]:
    """The runs the sweep's last search chose not to run (`search_runs.csv`; none without one):
    rendered, never submitted, and nothing left to do for them, unlike a run still to come."""
    import csv

    path = folder / SEARCH_RUNS_FILE
    if not path.is_file():
        return frozenset()
    with path.open(newline="", encoding="utf-8") as handle:
        return frozenset(row["run_id"] for row in csv.DictReader(handle)
                         if row.get("fate") == "skipped" and row.get("run_id"))


@dataclass(frozen=True)
class RunInfo:
    """What status needs of a run folder: its id, model, nodes and GPUs, and its time limit."""

    run_id: str
    model: str
    nodes: int
    gpus: int
    time_limit_s: int
    steps: int | None = None  # run.json's settings.steps (the budget's expected time)


def time_seconds(text: str) -> int:
    """Slurm's --time in seconds; 0 if unreadable (a hand-made script's odd value must not stop
    `sweep status`)."""
    from sweep.backends.local.backend import slurm_seconds

    try:
        return slurm_seconds(text)
    except ValueError:
        return 0


class SweepFolder:
    """A rendered sweep folder (it must hold runs/), read lazily and cached per instance."""

    def __init__(self, sweep_dir: Path) -> None:
        self.dir = sweep_dir.resolve()
        if not (self.dir / RUNS_DIR).is_dir():
            raise UserError(f"{sweep_dir}: no runs/ folder; pass a sweep folder that "
                            "`sweep render` wrote, or a spec file")
        self.ledger = self.dir / LEDGER_FILE
        self._run_ids: list[str] | None = None
        self._name: str | None = None

    def run_ids(self, refresh: bool = False) -> list[str]:
        """The rendered runs, listed once per poll (a directory scan of the whole sweep)."""
        if refresh or self._run_ids is None:
            self._run_ids = [p.name for p in run_dirs_of(self.dir)]
        return self._run_ids

    def run_jobs(self, run_ids: Sequence[str]) -> list[RunJob]:
        """Each run's shape, read from its job.sbatch (what `sbatch job.sbatch` would ask)."""
        from sweep.backends.local.backend import parse_directives

        jobs = []
        for run_id in run_ids:
            script = self.dir / RUNS_DIR / run_id / JOB_FILE
            try:
                directives = parse_directives(script.read_text(encoding="utf-8"))
            except OSError as error:
                raise UserError(f"{script}: cannot read it ({error.strerror}); "
                                "run `sweep render` again") from None
            try:
                jobs.append(RunJob(run_id=run_id, shape=shape_of(directives, str(script))))
            except SubmissionError as error:
                raise UserError(str(error)) from None
        return jobs

    def sweep_name(self) -> str:
        """The sweep's name (run.json's `sweep`), for job names and comments."""
        if self._name is None:
            first = self.run_ids()[:1]
            name = (read_json(self.dir / RUNS_DIR / first[0] / RUN_FILE) or {}).get("sweep") \
                if first else None
            self._name = name if isinstance(name, str) and name else self.dir.name
        return self._name

    def run_info(self) -> dict[str, RunInfo]:
        """Model, nodes, GPUs and time limit of every run, from run.json (job.sbatch's --time
        only when run.json has no time limit, e.g. a hand-made run folder)."""
        from sweep.backends.local.backend import parse_directives

        infos = {}
        for run_id in self.run_ids():
            run_dir = self.dir / RUNS_DIR / run_id
            doc = read_json_safe(run_dir / RUN_FILE) or {}
            nodes = int(doc.get("nodes") or 1)
            limit = str((doc.get("settings") or {}).get("time_limit") or "")
            if not limit:
                with contextlib.suppress(OSError):
                    limit = parse_directives((run_dir / JOB_FILE).read_text()).get("time", "")
            infos[run_id] = RunInfo(
                run_id=run_id, model=str((doc.get("model") or {}).get("name", "?")),
                nodes=nodes, gpus=nodes * int(doc.get("gpus_per_node") or 1),
                time_limit_s=time_seconds(limit),
                steps=_int_or_none((doc.get("settings") or {}).get("steps")))
        return infos

    def submissions(self) -> list[Submission]:
        return submissions(read_jsonl(self.ledger))

    def excluded(self) -> list[str]:
        return BadNodes(self.dir).exclude()

    def run_costs(self, run_ids: Sequence[str],
                  step_times: dict[str, float] | None = None) -> list[RunCost]:
        """Each run's GPUs, time limit and expected time (from the plan's predicted step time
        in `step_times`, by run id, where there is one)."""
        infos = self.run_info()
        step_times = step_times or {}
        return [RunCost(run_id=r, gpus=infos[r].gpus, time_limit_s=infos[r].time_limit_s,
                        expected_s=expected_seconds(infos[r].time_limit_s, infos[r].steps,
                                                    step_times.get(r)))
                for r in run_ids]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_json_safe(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None for a missing, torn or non-object file (a job still writing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
