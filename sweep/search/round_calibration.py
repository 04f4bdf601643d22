"""Self-calibration between the rounds of a live search: what each round measured re-plans the rest.

`sweep plan --calibrate-from RUNS` corrects the memory model once, when asked. A search
(`sweep run`/`sweep submit --strategy pruned|adaptive|shortlist`, the driver, `sweep resume` of a
search) does it by itself: before its first round (from the attempts a sweep folder already
holds, so a resumed search starts calibrated) and after every round, it fits the memory factor of
`sweep.calibration.memory_self_calibration` on the sweep's own completed and OOM attempts and re-plans every
candidate the memory rule judges (`self_calibration.replan`, band and probes included). A
candidate the re-plan keeps joins the search (its run folder is rendered then); an untried one it
no longer keeps is held back, and runs if a later round keeps it again. What each decision was
based on is recorded in the sweep folder:

- `calibration_rounds.jsonl`: one line per re-plan: the round, the memory factor, its target and
  bounds and what set it, the attempts it saw, the throughput coefficients the round's picks were
  made with (adaptive), and how many candidates it released and held back;
- `calibration.json` and `plan.parquet`: the latest calibration and the plan it gives, as `sweep
  plan --calibrate-from` writes them (predictions from the round's throughput coefficients, the
  prior where the strategy has none), so `sweep status`, `report`, the budget and a later `sweep
  plan` agree with what the search did.

The adaptive strategy corrects the throughput model's predictions by the measured ratio of each
candidate's family and cell after every round (`sweep.search.strategies`); it keeps the plan's coefficients,
which are recorded here per round, as the ones its picks were made with.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.calibration import memory_self_calibration
from sweep.collect.attempts import RUNS_FILE
from sweep.core.layout import ROW_KEY
from sweep.core.state import append_jsonl, atomic_write_json, atomic_write_with, read_jsonl
from sweep.models.throughput import Coefficients
from sweep.plan import space
from sweep.plan.plan_file import PLAN_FILE
from sweep.plan.predictions import with_predictions
from sweep.plan.render import render_runs
from sweep.plan.spec import Spec
from sweep.search.strategies import Replanned

ROUNDS_FILE: Final = "calibration_rounds.jsonl"
MEMORY_RULE: Final = f"pruned:{space.RULE_NAMES[-1]}"


class NotCalibratable(ValueError):
    """The plan cannot be re-planned from the spec (a hand-made plan, another spec): the search
    runs on the plan as it is."""


@dataclass
class RoundCalibration:
    """The re-plan an `strategies.search` calls between rounds (`strategies.Replan`).

    `candidates` are the prior plan's rows the memory rule judges (kept or pruned:memory),
    indexed 0..n-1, with their run ids (None until a re-plan keeps them); `initially_kept` are
    the ones the sweep's current plan keeps."""

    sweep_dir: Path
    spec: Spec
    prior: pd.DataFrame  # space.plan(spec): the uncalibrated plan, memory estimates unscaled
    candidates: pd.DataFrame
    initially_kept: pd.Index
    spec_dir: Path | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def for_sweep(cls, sweep_dir: Path, spec: Spec, plan: pd.DataFrame,
                  spec_dir: Path | None = None) -> RoundCalibration:
        """The calibration of a sweep whose current plan is `plan` (the prior, or a calibrated
        re-plan of it); NotCalibratable when `plan` is not a plan of `spec`."""
        prior = space.plan(spec)  # `plan` lists the same rows (`ROW_KEY`) if it is a plan of `spec`
        if len(prior) != len(plan) or any(
                not prior[c].astype(str).reset_index(drop=True).equals(
                    plan[c].astype(str).reset_index(drop=True)) for c in ROW_KEY if c in plan):
            raise NotCalibratable("the plan's rows are not those the spec plans (a plan given "
                                  "with --plan, or planned by another version)")
        status = plan["status"].astype(str).reset_index(drop=True)
        judged = prior["status"].astype(str).isin([space.KEPT, MEMORY_RULE]) \
            | status.isin([space.KEPT, MEMORY_RULE])
        rows = pd.Series(np.flatnonzero(judged.to_numpy()))
        candidates = prior.iloc[rows].reset_index(drop=True).assign(plan_row=rows.to_numpy())
        candidates["run_id"] = pd.Series([None if pd.isna(run_id) else str(run_id) for run_id
                                          in plan["run_id"].iloc[rows]], dtype=object)
        kept = status.iloc[rows].reset_index(drop=True) == space.KEPT
        candidates["status"] = np.where(kept, space.KEPT, MEMORY_RULE)
        return cls(sweep_dir, spec, prior, candidates, candidates.index[kept.to_numpy()],
                   spec_dir)

    @property
    def held(self) -> pd.Index:
        """The candidates the search starts without."""
        return self.candidates.index.difference(self.initially_kept)

    def __call__(self, known: pd.DataFrame, round_no: int,
                 coefficients: Coefficients | None) -> Replanned:
        outcomes = ({str(k): int(v) for k, v in known["status"].value_counts().items()}
                    if len(known) else {})
        return self.replan(round_no, outcomes, coefficients)

    def replan(self, round_no: int | str, outcomes: dict[str, int] | None = None,
               coefficients: Coefficients | None = None) -> Replanned:
        """Calibrate on the sweep's runs.parquet as it is now, re-plan, render what the re-plan
        keeps for the first time, and record it all; `round_no` labels the record (a round of a
        search, or "resume")."""
        record: dict[str, Any] = {
            "round": round_no, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "outcomes_so_far": outcomes or {},
            "throughput_coefficients": None if coefficients is None else asdict(coefficients)}
        current = self.candidates["status"] == space.KEPT
        try:
            calibration = memory_self_calibration.calibrate(self.sweep_dir / RUNS_FILE, self.spec)
        except memory_self_calibration.CalibrationError as error:
            record.update(calibrated=False, reason=str(error))
            self._append(record)
            return Replanned(self.candidates.index[current.to_numpy()],
                             f"{MEMORY_RULE} (no calibration yet: {error})")
        factor = calibration.memory.factor
        replanned = memory_self_calibration.replan(
            self.prior, self.spec, factor, calibration.memory.overhead_delta_bytes,
            memory_self_calibration.completed_run_ids(calibration.residuals))
        status = replanned["status"].astype(str).iloc[self.candidates["plan_row"]].to_numpy()
        kept = status == space.KEPT
        released = int((kept & ~current.to_numpy()).sum())
        held_back = int((~kept & current.to_numpy()).sum())
        self._render_new(replanned, kept)
        self.candidates["status"] = np.where(kept, space.KEPT, MEMORY_RULE)
        changed = memory_self_calibration.changes(self.prior, replanned)
        summary = {k: v for k, v in calibration.to_dict().items()
                   if k not in ("residuals", "rule")}  # per-attempt residuals: calibration.json
        record.update(calibrated=True, **summary, plan_changes=changed, released=released,
                      held_back=held_back)
        self._append(record)
        self._write_plan(with_predictions(replanned, self.spec,
                                          coefficients or self._plan_coefficients()),
                         {**calibration.to_dict(), "status_changes": changed, "round": round_no})
        when = f"after round {round_no}" if isinstance(round_no, int) else f"at {round_no}"
        return Replanned(self.candidates.index[kept],
                         f"{MEMORY_RULE} (self-calibrated {when}: reserved peak × {factor:.3f})")

    def _plan_coefficients(self) -> Coefficients:
        """What the re-plan predicts with when the round's search made no refit: what `sweep
        plan` predicts with (the sweep's throughput.json, else the default prior)."""
        from sweep.calibration.throughput_coefficients import sweep_coefficients

        return sweep_coefficients(self.sweep_dir, self.spec)

    def _render_new(self, replanned: pd.DataFrame, kept: np.ndarray) -> None:
        """Run folders (and run ids) for candidates kept for the first time."""
        new = kept & self.candidates["run_id"].isna().to_numpy()
        if not new.any():
            return
        rows = replanned.iloc[self.candidates.loc[new, "plan_row"]]
        render_runs(self.spec, rows, self.sweep_dir, spec_dir=self.spec_dir, workers=1)
        self.candidates.loc[new, "run_id"] = rows["run_id"].astype(object).to_numpy()

    def _write_plan(self, replanned: pd.DataFrame, calibration: dict[str, Any]) -> None:
        atomic_write_with(self.sweep_dir / PLAN_FILE,
                          lambda tmp: replanned.to_parquet(tmp, index=False))
        atomic_write_json(self.sweep_dir / memory_self_calibration.CALIBRATION_FILE, calibration)

    def _append(self, record: dict[str, Any]) -> None:
        self.rounds.append(record)
        append_jsonl(self.sweep_dir / ROUNDS_FILE, record)


def read_rounds(sweep_dir: Path) -> list[dict[str, Any]]:
    """The re-plans a sweep's searches recorded, oldest first (a torn last line is skipped)."""
    return list(read_jsonl(sweep_dir / ROUNDS_FILE))


def for_search(sweep_dir: Path, spec: Spec, plan: pd.DataFrame, *, enabled: bool = True,
               spec_dir: Path | None = None) -> tuple[RoundCalibration | None, str]:
    """The calibration a search of this sweep runs with, and a line saying so (None and why not
    when it is off, or the plan is not the spec's)."""
    if not enabled:
        return None, "self-calibration: off (--no-calibrate); the plan's memory verdicts stand"
    try:
        calibration = RoundCalibration.for_sweep(sweep_dir, spec, plan, spec_dir)
    except NotCalibratable as error:
        return None, f"self-calibration: off, {error}"
    return calibration, (f"self-calibration: on; the memory model is refitted on this sweep's "
                         f"attempts after every round and re-plans {len(calibration.candidates)} "
                         f"candidate(s) ({len(calibration.held)} held back now); each re-plan "
                         f"is recorded in {sweep_dir / ROUNDS_FILE}")


def describe_latest(sweep_dir: Path) -> str | None:
    """`sweep status`'s line on self-calibration: the latest re-plan, and the candidates the
    re-plans released and held back in all (None: the sweep has not recalibrated)."""
    rounds = read_rounds(sweep_dir)
    if not rounds:
        return None
    latest = rounds[-1]
    when = (f"after round {latest['round']}" if isinstance(latest.get("round"), int)
            else f"at {latest.get('round')}")
    released = sum(int(r.get("released", 0)) for r in rounds)
    held = sum(int(r.get("held_back", 0)) for r in rounds)
    if not latest.get("calibrated"):
        return f"self-calibration {when}: not yet ({latest.get('reason', '?')})"
    memory = latest.get("memory", {})
    return (f"self-calibration {when}: reserved peak × {float(memory.get('factor', 1.0)):.3f} "
            f"(set by {memory.get('bound_by', '?')}) from {memory.get('n_completed', 0)} "
            f"completed and {memory.get('n_oom', 0)} OOM attempt(s); {len(rounds)} re-plan(s) "
            f"released {released} and held back {held} candidate(s) (`{ROUNDS_FILE}`)")
