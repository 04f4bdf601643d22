"""Self-calibration between rounds: a search re-plans with what each round measured."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweep.cli import main
from sweep.plan import space
from sweep.plan.spec import load_spec
from sweep.search.round_calibration import (
    ROUNDS_FILE,
    NotCalibratable,
    RoundCalibration,
    describe_latest,
    for_search,
    read_rounds,
)

REPO = Path(__file__).resolve().parents[2]


def tight_spec(tmp_path: Path) -> Path:
    """The demo on one node, tiny-4l only, on a "GPU" of 1.08 GiB, probes off: the prior prunes
    DP2 (1132 MiB predicted) and keeps TP2 and PP2 (1071, 1083 MiB); the built-in workload on
    CPU measures 65-130 MiB of the ~300 MiB the model puts in the allocator."""
    spec = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec.update(name="round-calibration", models=["tiny-4l"], nodes=[1], gpu_memory_gb=1.08,
                overrides=[])
    spec["constraints"] = {**spec.get("constraints", {}), "memory_probes": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_search_starts_from_the_sweeps_plan_and_holds_back_what_it_prunes(
        tmp_path: Path) -> None:
    spec = load_spec(tight_spec(tmp_path))
    plan = space.plan(spec)
    calibration = RoundCalibration.for_sweep(tmp_path, spec, plan)
    assert len(calibration.candidates) == 3 and len(calibration.held) == 1
    held = calibration.candidates.loc[calibration.held[0]]
    assert (held["dp"], held["tp"], held["pp"]) == (2, 1, 1) and held["run_id"] is None
    # no attempts yet: the re-plan before the first round keeps the plan as it is
    verdict = calibration(pd.DataFrame(columns=["status"]), 0, None)
    assert list(verdict.eligible) == list(calibration.initially_kept)
    assert "no calibration yet" in verdict.reason
    (record,) = read_rounds(tmp_path)
    assert record["round"] == 0 and record["calibrated"] is False
    assert "self-calibration after round 0: not yet" in str(describe_latest(tmp_path))


def test_a_plan_of_another_spec_is_not_calibrated(tmp_path: Path) -> None:
    spec = load_spec(tight_spec(tmp_path))
    plan = space.plan(spec)
    with pytest.raises(NotCalibratable, match="not those the spec plans"):
        RoundCalibration.for_sweep(tmp_path, spec, plan.iloc[:2])
    calibration, line = for_search(tmp_path, spec, plan.iloc[::-1])
    assert calibration is None and "self-calibration: off" in line
    calibration, line = for_search(tmp_path, spec, plan, enabled=False)
    assert calibration is None and "--no-calibrate" in line


def test_a_torn_last_line_of_the_rounds_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / ROUNDS_FILE).write_text('{"round": 0}\n{"round": 1, "calib')
    assert read_rounds(tmp_path) == [{"round": 0}]


@pytest.mark.slow  # about 30 s: three real runs of the built-in workload, in two rounds
def test_a_first_round_teaches_the_model_and_the_search_runs_what_it_now_keeps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Real processes on the local backend: round 1 runs what the prior keeps; their measured
    peaks (far below the prior) recalibrate the memory model, the re-plan keeps DP2, and round 2
    renders and runs it."""
    spec_path, out = tight_spec(tmp_path), tmp_path / "sweep"
    assert main(["run", str(spec_path), "--out", str(out), "--strategy", "pruned",
                 "--no-report"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "self-calibration: on" in printed and "(1 held back now)" in printed

    runs = pd.read_parquet(out / "runs.parquet")
    assert len(runs) == 3 and (runs["outcome"] == "completed").all()
    fates = pd.read_csv(out / "search_runs.csv")
    assert sorted(fates["round"]) == [1, 1, 2] and (fates["fate"] == "launched").all()
    plan = pd.read_parquet(out / "plan.parquet")
    assert (plan["status"] == "kept").all()  # the sweep's plan is the re-plan
    late = plan[plan["dp"] == 2].iloc[0]
    assert fates.set_index("run_id").loc[late["run_id"], "round"] == 2
    assert (out / "runs" / late["run_id"] / "job.sbatch").is_file()

    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    first = rounds[1]
    assert first["calibrated"] and first["released"] == 1 and first["held_back"] == 0
    assert first["memory"]["n_completed"] == 2 and first["memory"]["factor"] < 0.5
    assert first["outcomes_so_far"] == {"completed": 2}
    assert rounds[2]["memory"]["n_completed"] == 3
    line = describe_latest(out)
    assert line is not None and line.startswith("self-calibration after round 2: reserved peak")
    assert "3 re-plan(s) released 1 and held back 0 candidate(s)" in line
    recorded = json.loads((out / "calibration.json").read_text())
    assert recorded["round"] == 2 and recorded["spec_hash"] == load_spec(spec_path).spec_hash()


@pytest.mark.slow  # about 20 s: two real runs
def test_without_calibration_the_plans_verdicts_stand(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec_path, out = tight_spec(tmp_path), tmp_path / "sweep"
    assert main(["run", str(spec_path), "--out", str(out), "--strategy", "pruned",
                 "--no-report", "--no-calibrate"]) == 0
    assert "self-calibration: off (--no-calibrate)" in capsys.readouterr().out
    assert len(pd.read_parquet(out / "runs.parquet")) == 2
    assert not (out / ROUNDS_FILE).exists()


@pytest.mark.slow  # about 20 s: two real runs
def test_resume_of_a_one_round_sweep_renders_what_the_re_plan_keeps_for_the_first_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sweep resume` re-plans a one-round sweep from its attempts before resubmitting: the
    newly kept run is rendered and, never submitted, is what resume submits (on Slurm; here its
    re-plan step alone, on runs of the local backend)."""
    from sweep.commands.resume import _recalibrate
    from sweep.plan.render import run_dirs_of

    spec_path, out = tight_spec(tmp_path), tmp_path / "sweep"
    assert main(["render", str(spec_path), "--out", str(out)]) == 0
    capsys.readouterr()
    _recalibrate(out, enabled=True)  # nothing ran yet: one short line, no path
    assert capsys.readouterr().out.startswith(
        "self-calibration: nothing to learn from yet (no completed or OOM attempt of ")
    assert main(["run", str(spec_path), "--out", str(out), "--no-report"]) == 0
    assert len(run_dirs_of(out)) == 2
    capsys.readouterr()
    _recalibrate(out, enabled=True)
    printed = " ".join(capsys.readouterr().out.split())
    assert "from 2 completed and 0 OOM attempt(s); 1 run(s) the re-plan keeps for the first " \
           "time are rendered" in printed
    assert len(run_dirs_of(out)) == 3
    assert read_rounds(out)[-1]["round"] == "resume"
    _recalibrate(out, enabled=True)  # again: nothing new
    assert "; 0 run(s) the re-plan keeps" in " ".join(capsys.readouterr().out.split())
