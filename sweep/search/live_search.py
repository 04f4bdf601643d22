"""A search strategy over a live sweep: a strategy's oracle answered by running and collecting.

`sweep.search.strategies.search` asks an oracle for the outcomes of a batch of candidates. In a replay the
oracle is a published table; here it runs the candidates' rendered run folders (one round of
`sweep.backends.base.Rounds`, on the local backend or on Slurm) and reads their outcomes back from
the attempt folders through `sweep collect`, so a strategy sees exactly what the report will
show. A run that already
has a verdict is not run again: its latest attempt answers, so an interrupted adaptive sweep
resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from sweep.backends.base import Rounds
from sweep.backends.slurm.sweep_folder import SEARCH_RUNS_FILE
from sweep.collect.attempts import update_runs
from sweep.core.state import SEARCH_PROGRESS_FILE
from sweep.models.throughput import Coefficients
from sweep.models.throughput_inputs import Workload
from sweep.plan.space import KEPT
from sweep.search import search_report, strategies
from sweep.search.round_calibration import RoundCalibration

# the strategies' outcome classes: what the skipping rules and the model need to know.
_STATUS: Final = {"completed": "completed", "oom": "oom"}


@dataclass(frozen=True)
class LiveSearch:
    """What a strategy did on a live sweep."""

    result: strategies.Search
    candidates: pd.DataFrame  # kept plan rows, indexed 0..n-1, with run_id
    progress: pd.DataFrame  # search_report.progress: per cell

    @property
    def launched(self) -> int:
        return len(self.result.launched)

    @property
    def saved(self) -> int:
        return len(self.candidates) - self.launched

    def summary(self, sweep_dir: Path) -> str:
        return (f"{self.result.strategy}: launched {self.launched} of {len(self.candidates)} "
                f"run(s) in {self.result.rounds} round(s), saved {self.saved}; per-cell progress "
                f"in {sweep_dir / SEARCH_PROGRESS_FILE}")


def candidates_of(plan: pd.DataFrame) -> pd.DataFrame:
    """The kept plan rows as search candidates, indexed 0..n-1 (the strategies index by position)."""
    kept = plan[plan["status"] == KEPT] if "status" in plan else plan
    return kept.reset_index(drop=True)


def outcomes_from_runs(runs: pd.DataFrame, run_ids: Sequence[str]) -> pd.DataFrame:
    """The latest attempt of each run as the strategies' outcomes (status, tokens/s/GPU, GPU-hours).

    A completed run that logged no throughput cannot be ranked: it counts as failed, as does a
    run with no attempt at all (its job never started)."""
    latest = (runs.sort_values(["run_id", "attempt"]).groupby("run_id").tail(1)
              .set_index("run_id").reindex(list(run_ids)))
    tps = pd.to_numeric(latest["tokens_per_sec_per_gpu"], errors="coerce")
    status = latest["outcome"].map(_STATUS).fillna("failed")
    status = status.where((status != "completed") | tps.notna(), "failed")
    hours = pd.to_numeric(latest.get("gpu_hours"), errors="coerce").fillna(0.0)
    return pd.DataFrame({"status": status.to_numpy(),
                         "tokens_per_s_per_gpu": np.where(status == "completed", tps, np.nan),
                         "gpu_hours": hours.to_numpy(float)})


def search_sweep(sweep_dir: Path, plan: pd.DataFrame, strategy: str,
                 workloads: Mapping[str, Workload], rounds: Rounds,
                 params: strategies.Params = strategies.Params(),
                 calibration: RoundCalibration | None = None,
                 plan_coefficients: Coefficients | None = None) -> LiveSearch:
    """Run `strategy` over the sweep's kept runs: each round's runs go to `rounds` (those its
    backend has not `finished` yet), then the sweep is collected and the round's outcomes read
    back. With a `calibration`, the memory model is recalibrated on the sweep's own attempts
    before the first round and after every round, and the search follows the re-plan
    (`sweep.search.round_calibration`). What the search did is written beside runs.parquet
    (`write_search`).

    `plan_coefficients`: what the plan predicted with
    (`sweep.calibration.throughput_coefficients.sweep_coefficients`). The shortlist ranks with them, so that it runs
    what the plan shows as fastest, a candidate a re-plan releases included; the adaptive search
    starts from the physical prior, which made it launch fewer runs than the fitted one (docs/search.md, "Sweep economy")."""
    candidates = candidates_of(plan) if calibration is None else calibration.candidates

    def run_dir(i: int) -> Path:  # read when asked: a re-plan gives new candidates their run id
        return sweep_dir / "runs" / str(candidates.at[i, "run_id"])

    def oracle(ids: pd.Index) -> pd.DataFrame:
        rounds([run_dir(int(i)) for i in ids if not rounds.finished(run_dir(int(i)))])
        result, _ = update_runs(sweep_dir)
        runs = result.table.select(["run_id", "attempt", "outcome", "tokens_per_sec_per_gpu",
                                    "gpu_hours"]).to_pandas()
        answer = outcomes_from_runs(runs, [str(candidates.at[int(i), "run_id"]) for i in ids])
        return answer.set_axis(ids)

    prior = plan_coefficients if strategy == "shortlist" and plan_coefficients else Coefficients()
    result = strategies.search(candidates, oracle, strategy, workloads, prior=prior,
                               params=params,
                               held=None if calibration is None else calibration.held,
                               replan=calibration)
    considered = candidates.loc[result.considered]  # without what the plan never kept
    search = LiveSearch(result, considered, search_report.progress(result, considered))
    write_search(sweep_dir, search)
    return search


def write_search(sweep_dir: Path, search: LiveSearch) -> list[Path]:
    """Per-cell progress and every candidate's fate (launched in round r, or skipped and why),
    beside runs.parquet, so the report can show what was not run and why."""
    progress_path = sweep_dir / SEARCH_PROGRESS_FILE
    search.progress.rename_axis("cell").to_csv(progress_path)
    ids = search.candidates["run_id"]
    fates = pd.concat([
        search.result.launched.assign(fate="launched", reason=""),
        search.result.skipped.assign(fate="skipped", round=np.nan, status=""),
    ], ignore_index=True)
    fates["run_id"] = ids[fates.candidate].to_numpy()
    fates = fates[["run_id", "model", "nodes", "fate", "round", "status", "reason"]]
    runs_path = sweep_dir / SEARCH_RUNS_FILE
    fates.to_csv(runs_path, index=False)
    return [progress_path, runs_path]
