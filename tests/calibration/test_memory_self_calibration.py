"""The memory correction fitted on a sweep's own attempts (`sweep.calibration.memory_self_calibration`): the rule of
its docstring on hand-made evidence, its refusals, and the re-plan it drives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sweep.calibration.memory_self_calibration import (
    Calibration,
    CalibrationError,
    calibrate,
    changes,
    completed_run_ids,
    describe,
    fit_correction,
    replan,
    residuals,
)
from sweep.core.units import MiB
from sweep.plan import space
from sweep.plan.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def evidence(*rows: tuple[str, float | None, float, float | None]) -> pd.DataFrame:
    """Rows of (outcome, measured reserved MiB or None, predicted reserved MiB, limit MiB or
    None), each with 100 MiB of predicted overhead."""
    return pd.DataFrame({
        "run_id": [f"r{i}" for i in range(len(rows))], "attempt": 1, "model": "m",
        "outcome": [r[0] for r in rows],
        "measured_reserved": [np.nan if r[1] is None else r[1] * MiB for r in rows],
        "pred_reserved": [r[2] * MiB for r in rows], "pred_overhead": 100.0 * MiB,
        "limit": [np.nan if r[3] is None else r[3] * MiB for r in rows]})


def test_completed_attempts_alone_scale_the_prediction_by_their_central_ratio() -> None:
    fit = fit_correction(evidence(("completed", 30, 100, None), ("completed", 40, 200, None)))
    assert fit.factor == pytest.approx((0.3 * 0.2) ** 0.5)  # geometric mean of 30/100, 40/200
    assert (fit.lower, fit.upper, fit.bound_by) == (None, None, "measured peaks")
    assert (fit.n_completed, fit.n_oom, fit.n_measured, fit.n_unbounded) == (2, 0, 2, 2)


def test_a_run_that_fitted_only_by_flushing_the_allocator_does_not_set_the_factor() -> None:
    """Its reserved peak is the card's limit (the allocator released its cache and retried), not
    what its configuration reserves: an H100 cut one from 79.2 to 75.3 GiB. Counted in the target
    it would pull k down; its bound (it ran, so its configuration fits) is reported, and binds
    only where no peak was measured."""
    rows = (("completed", 100, 100, 1000), ("completed", 700, 1000, 800))
    plain = fit_correction(evidence(*rows))
    flushed = fit_correction(evidence(*rows).assign(flushed=[False, True]))
    assert plain.target == pytest.approx((1.0 * 0.7) ** 0.5)  # the flushed peak counted: too low
    assert flushed.target == pytest.approx(1.0) and flushed.n_flushed == 1 and flushed.n_measured == 1
    assert flushed.upper == pytest.approx((800 - 100) / 1000)  # it ran: k * 1000 + 100 <= 800
    assert flushed.factor == pytest.approx(1.0) and flushed.bound_by == "measured peaks"
    alone = fit_correction(evidence(rows[1]).assign(flushed=[True]))
    assert alone.n_measured == 0 and alone.factor == pytest.approx(0.7)
    assert alone.bound_by == "completed"


def test_without_measured_peaks_the_prior_stands_unless_an_outcome_moves_it() -> None:
    assert fit_correction(evidence(("completed", None, 100, 1000))).factor == 1.0
    fit = fit_correction(evidence(("completed", None, 400, 400)))  # ran: 400k + 100 <= 400
    assert fit.factor == pytest.approx(0.75) and fit.bound_by == "completed"


def test_with_a_measured_peak_the_outcomes_bound_nothing() -> None:
    """The peak measured at twice the prediction sets k = 2, although the other completed run
    (no peak measured) would then be predicted over its 300 MiB: 2 × 200 + 100. Its bound, 1.0,
    is reported; it does not cap k, which would move every other prediction by the one attempt
    furthest from the model's centre (a re-plan keeps that run's configuration anyway: it ran)."""
    fit = fit_correction(evidence(("completed", 200, 100, 300), ("completed", None, 200, 300)))
    assert fit.target == pytest.approx(2.0) and fit.factor == pytest.approx(2.0)
    assert fit.upper == pytest.approx(1.0) and fit.bound_by == "measured peaks"
    with_oom = fit_correction(evidence(("completed", 150, 200, 500), ("oom", None, 300, 500)))
    assert with_oom.factor == pytest.approx(0.75) and with_oom.lower == pytest.approx(400 / 300)


def test_an_oom_the_prior_predicted_to_fit_raises_the_factor_just_over_its_edge() -> None:
    # nothing measured; prior: 300 + 100 <= 500 fits, yet it ran out: k > (500 - 100) / 300
    fit = fit_correction(evidence(("completed", None, 200, 500), ("oom", None, 300, 500)))
    edge = 400 / 300
    assert fit.factor > edge and fit.factor == pytest.approx(edge)
    assert fit.bound_by == "oom" and fit.unexplained_ooms == ()
    assert 1.0 * 300 + 100 <= 500 < fit.factor * 300 + 100  # the prior kept it; now pruned


def test_an_oom_that_contradicts_a_completed_attempt_is_left_out_not_obeyed() -> None:
    # the OOM'd layout is predicted smaller (200) than one that completed (400) under the same
    # limit: no factor prunes the first and keeps the second, so the completed run wins
    fit = fit_correction(evidence(("completed", 100, 400, 500), ("oom", None, 200, 500)))
    assert fit.unexplained_ooms == ("r1#1",) and fit.lower is None
    assert fit.factor == pytest.approx(0.25)  # the measured peak, within the upper bound 1.0
    assert fit.upper == pytest.approx(1.0)


def test_the_plan_names_an_oom_no_factor_explains() -> None:
    def described(ev: pd.DataFrame) -> str:
        fit = fit_correction(ev)
        calibration = Calibration("runs.parquet", "0" * 64, "s", "h", fit,
                                  residuals(ev, fit.factor), {})
        return "\n".join(describe(calibration, {"pruned_to_kept": 0, "kept_to_pruned": 0}))

    measured = described(evidence(("completed", 100, 400, 500), ("oom", None, 200, 500)))
    assert "1 OOM(s) no factor explains beside the completed runs" in measured
    assert "r1#1" in measured and "left out of the bounds" not in measured
    unmeasured = described(evidence(("completed", None, 400, 500), ("oom", None, 200, 500)))
    assert "left out of the bounds: r1#1" in unmeasured


def test_an_attempt_under_its_own_cap_or_without_a_limit_bounds_nothing() -> None:
    fit = fit_correction(evidence(("oom", None, 300, None), ("completed", 50, 100, None)))
    assert fit.factor == pytest.approx(0.5) and fit.lower is None and fit.n_unbounded == 2


def test_the_overhead_is_raised_by_the_largest_excess_the_oom_messages_measured() -> None:
    """A CUDA OOM's message says what the process held outside the allocator (sweep.collect.cuda_oom):
    160 MiB against the 100 MiB predicted moves every prediction's overhead up by 60 MiB, and
    with it the OOM's edge: k > (500 - 100 - 60) / 300 instead of (500 - 100) / 300."""
    ev = evidence(("completed", None, 200, 500), ("oom", None, 300, 500))
    ev["measured_outside"] = [np.nan, 160.0 * MiB]
    fit = fit_correction(ev)
    assert fit.overhead_delta_bytes == pytest.approx(60 * MiB) and fit.n_overhead_measured == 1
    assert fit.factor == pytest.approx(340 / 300) and fit.upper == pytest.approx(340 / 200)
    ev["measured_outside"] = [np.nan, 50.0 * MiB]  # before NCCL set up its buffers, say
    assert fit_correction(ev).overhead_delta_bytes == 0.0  # a smaller reading lowers nothing


def test_a_completed_run_s_measured_overhead_counts_as_well() -> None:
    """The built-in workload samples the memory outside the allocator at every step on CUDA, so a
    first round that never ran out of memory still teaches the overhead: 180 MiB measured against
    100 MiB predicted tightens the completed run's edge to (500 - 100 - 80) / 200."""
    ev = evidence(("completed", 150, 200, 500), ("oom", None, 300, 500))
    ev["measured_outside"] = [180.0 * MiB, np.nan]
    fit = fit_correction(ev)
    assert fit.overhead_delta_bytes == pytest.approx(80 * MiB) and fit.n_overhead_measured == 1
    assert fit.upper == pytest.approx(320 / 200) and fit.lower == pytest.approx(320 / 300)


# Reading and refusing -----------------------------------------------------------------------------

@pytest.fixture()
def spec_path(tmp_path: Path) -> Path:
    spec = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec.update(gpu_memory_gb=1.08, models=["tiny-4l"], nodes=[1], overrides=[])
    # the point estimate decides here (DP2 sits inside the memory band: with probes it is kept)
    spec["constraints"] = {**spec.get("constraints", {}), "memory_probes": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def runs_table(spec_path: Path, outcomes: dict[str, tuple[str, float | None]]) -> pd.DataFrame:
    """A runs.parquet-shaped table of the spec's planned candidates: {layout label: (outcome,
    measured reserved MiB)}."""
    spec = load_spec(spec_path)
    plan = space.plan(spec)
    rows = []
    for _, row in plan.iterrows():
        label = space.layout_of(row).label()
        if label not in outcomes:
            continue
        outcome, measured = outcomes[label]
        rows.append({"run_id": space.run_ids(spec, plan.loc[[row.name]])[0], "attempt": 1,
                     "framework": spec.framework, "model": str(row["model"]),
                     "gpus_per_node": spec.gpus_per_node_resolved, "seq_len": spec.seq_len,
                     "dtype": spec.dtype,
                     **{k: int(row[k]) for k in space.LAYOUT_INT_COLUMNS},
                     "recompute": str(row["recompute"]), "sp": bool(row["sp"]),
                     "pp_schedule": str(row["pp_schedule"]), "outcome": outcome,
                     "mem_reserved_bytes": None if measured is None else measured * MiB,
                     "mem_allocated_bytes": None if measured is None else measured * MiB,
                     "mem_source": "cpu-rss-anon", "settings_json": json.dumps({})})
    return pd.DataFrame(rows)


def test_no_usable_attempt_is_refused_naming_the_file_and_the_fix(
        spec_path: Path, tmp_path: Path) -> None:
    spec = load_spec(spec_path)
    missing = tmp_path / "nothing.parquet"
    with pytest.raises(CalibrationError, match="nothing.parquet: no such file"):
        calibrate(missing, spec)
    table = runs_table(spec_path, {"DP1 TP2 PP1 GAS4 MBS2 ZeRO-0": ("hang", None)})
    path = tmp_path / "runs.parquet"
    table.to_parquet(path)
    with pytest.raises(CalibrationError) as error:
        calibrate(path, spec)
    assert str(path) in str(error.value) and "1 outcome not completed or oom" in str(error.value)
    assert "sweep run SPEC --out DIR" in str(error.value)
    table.drop(columns=["mem_source"]).to_parquet(path)
    with pytest.raises(CalibrationError, match=r"no column\(s\) \['mem_source'\]"):
        calibrate(path, spec)


def test_a_replan_applies_the_band_and_marks_its_probes_again(spec_path: Path,
                                                              tmp_path: Path) -> None:
    text = yaml.safe_load(spec_path.read_text())
    text["constraints"]["memory_probes"] = True
    (tmp_path / "probes.yaml").write_text(yaml.safe_dump(text))
    spec = load_spec(tmp_path / "probes.yaml")
    prior = space.plan(spec)
    assert (prior["status"] == space.KEPT).all() and prior["probe"].sum() == 1  # DP2
    same = replan(prior, spec, 1.0)
    assert same["probe"].tolist() == prior["probe"].tolist()
    assert not replan(prior, spec, 0.5)["probe"].any()  # measured far below: no doubt left
    assert (replan(prior, spec, 3.0)["status"] == "pruned:memory").all()
    raised = replan(prior, spec, 1.0, overhead_delta=512 * MiB)
    assert (raised["mem_overhead_bytes"] == prior["mem_overhead_bytes"] + 512 * MiB).all()
    assert (raised["mem_total_bytes"] == prior["mem_total_bytes"] + 512 * MiB).all()
    assert (raised["status"] == "pruned:memory").sum() > (same["status"] == "pruned:memory").sum()


def test_measured_peaks_far_below_the_prior_keep_what_the_prior_pruned(
        spec_path: Path, tmp_path: Path) -> None:
    spec = load_spec(spec_path)
    prior = space.plan(spec)
    kept = prior[prior["status"] == space.KEPT]
    assert (prior["status"] == "pruned:memory").sum() == 1  # DP2: 1132 MiB > 1106 MiB
    labels = [space.layout_of(row).label() for _, row in kept.iterrows()]
    table = runs_table(spec_path, {label: ("completed", 90.0) for label in labels})
    path = tmp_path / "runs.parquet"
    table.to_parquet(path)
    calibration = calibrate(path, spec)
    assert calibration.memory.factor < 0.35 and calibration.memory.n_completed == 2
    assert len(calibration.residuals) == 2 and calibration.left_out == {}
    replanned = replan(prior, spec, calibration.memory.factor)
    assert changes(prior, replanned) == {"pruned_to_kept": 1, "kept_to_pruned": 0}
    assert (replanned["status"] == space.KEPT).all()
    # the newly kept candidate has the run id an unconstrained plan gives it
    text = yaml.safe_load(spec_path.read_text())
    del text["gpu_memory_gb"]
    (tmp_path / "unconstrained.yaml").write_text(yaml.safe_dump(text))
    unconstrained = space.plan(load_spec(tmp_path / "unconstrained.yaml"))
    assert sorted(replanned["run_id"]) == sorted(unconstrained["run_id"])
    assert (replanned["mem_prior_total_bytes"] == prior["mem_total_bytes"]).all()
    assert (replanned["mem_total_bytes"] < prior["mem_total_bytes"]).all()
    # and the other way: a factor above the prior prunes what it kept
    stricter = replan(prior, spec, 3.0)
    assert changes(prior, stricter) == {"pruned_to_kept": 0, "kept_to_pruned": 2}
    assert stricter["run_id"].isna().all()


def test_a_replan_never_prunes_a_configuration_that_completed(spec_path: Path,
                                                              tmp_path: Path) -> None:
    """Whatever the factor predicts for it, a run that ran is proof that its configuration
    fits: the re-plan keeps it, with its run id, and prunes the rest as the factor says."""
    spec = load_spec(spec_path)
    prior = space.plan(spec)
    label = "DP1 TP2 PP1 GAS4 MBS2 ZeRO-0"
    table = runs_table(spec_path, {label: ("completed", 900.0)})  # measured far over the prior
    path = tmp_path / "runs.parquet"
    table.to_parquet(path)
    calibration = calibrate(path, spec)
    completed = completed_run_ids(calibration.residuals)
    assert completed == {table["run_id"].iloc[0]} and calibration.memory.factor > 2.5
    assert calibration.memory.upper is not None and calibration.memory.upper < 1.2  # reported
    replanned = replan(prior, spec, calibration.memory.factor, completed=completed)
    ran = replanned["run_id"].isin(completed)
    assert ran.sum() == 1 and replanned.loc[ran, "status"].eq(space.KEPT).all()
    assert (replanned.loc[~ran, "status"] == "pruned:memory").all()
    assert completed_run_ids(json.loads(json.dumps(calibration.to_dict()))["residuals"]) == completed


def test_calibration_json_records_the_overhead_the_oom_messages_measured(
        spec_path: Path, tmp_path: Path) -> None:
    table = runs_table(spec_path, {"DP1 TP2 PP1 GAS4 MBS2 ZeRO-0": ("completed", 90.0),
                                   "DP2 TP1 PP1 GAS2 MBS2 ZeRO-0": ("oom", None)})
    predicted_dp2 = 512 + 256  # the CUDA context and one NCCL group (dp), MiB
    table["mem_outside_allocator_bytes"] = np.where(table["outcome"] == "oom",
                                                    (predicted_dp2 + 132) * MiB, np.nan)
    path = tmp_path / "runs.parquet"
    table.to_parquet(path)
    calibration = calibrate(path, load_spec(spec_path))
    assert calibration.memory.overhead_delta_bytes == pytest.approx(132 * MiB)
    assert calibration.to_dict()["memory"]["overhead_delta_bytes"] == pytest.approx(132 * MiB)
