"""The allocator fit: it reproduces the committed constants, its fast path is the real path, and
leave-one-model-out measures the memory model on the model it was not fitted on.

The reference files are read from $SWEEP_REFDATA (conftest's `refdata` fixture): without them the
tests that need them skip. The figures asserted are the ones measured (see docs/validation.md,
"The memory model"); the issue's targets, which leave-one-model-out does not meet yet, are a strict xfail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from sweep.cli import main
from sweep.core.state import file_sha256
from sweep.core.units import GiB
from sweep.models import fitted_memory
from sweep.models.memory import reserved_interval
from sweep.models.memory_profiles import (
    FRAG_LOGITS,
    FRAG_PIPELINED,
    FRAG_SEQUENTIAL,
    PROFILES,
    RESERVED_BAND,
    RESERVED_FLOOR_BYTES,
    MiB,
)
from sweep.plan.spec import Spec, load_spec
from sweep.validation import memory_check, memory_fit, memory_reference


@pytest.fixture(scope="module")
def playbook(repo_root: Path) -> Spec:
    return load_spec(repo_root / memory_reference.SPEC_FILE)


@pytest.fixture(scope="module")
def reference(refdata: Path, playbook: Spec) -> tuple[memory_reference.ReferenceFit, float]:
    start = time.perf_counter()
    ref = memory_reference.fit_reference(refdata, playbook)
    return ref, time.perf_counter() - start


@pytest.fixture(scope="module")
def full_runs(refdata: Path, playbook: Spec) -> memory_check.Runs:
    return memory_check.read_memory_runs(refdata / memory_reference.RUNS_FILE, playbook)


@pytest.fixture(scope="module")
def cv(refdata: Path, playbook: Spec, full_runs: memory_check.Runs) -> memory_fit.CrossValidation:
    return memory_fit.cross_validate(full_runs, playbook,
                              must_fit=memory_reference.llmfoundry_basis(refdata / memory_reference.LLMFOUNDRY_FILE))


# ------------------------------------------------------------------ reproducible fit

def test_the_data_is_the_data_the_constants_were_fitted_on(refdata: Path) -> None:
    for name, digest in fitted_memory.PROVENANCE["data"].items():
        assert file_sha256(refdata / name) == digest, (
            f"{name} is not the file the committed constants were fitted on: "
            "rerun scripts/fit_memory.py if the reference data changed on purpose")


def test_rerunning_the_fit_reproduces_the_committed_constants(
        reference: tuple[memory_reference.ReferenceFit, float]) -> None:
    ref, seconds = reference
    a = ref.fit.allocator
    assert (a.sequential, a.pipelined, a.logits, a.floor_bytes) == (
        fitted_memory.FRAG_SEQUENTIAL, fitted_memory.FRAG_PIPELINED,
        fitted_memory.FRAG_LOGITS, fitted_memory.RESERVED_FLOOR_BYTES)
    assert ref.band == fitted_memory.RESERVED_BAND
    committed = {k: v for k, v in fitted_memory.PROVENANCE.items() if k != "date"}
    assert json.loads(json.dumps(ref.provenance)) == json.loads(json.dumps(committed))
    assert seconds < 60, seconds


def test_the_committed_constants_met_the_fits_gates() -> None:
    """scripts/fit_memory.py writes nothing from a fit that missed its gates (keep 99 % of the
    successes, prune 90 % of the OOMs): the planner's constants never come from the fallback."""
    assert fitted_memory.PROVENANCE["gates_met"] is True
    assert fitted_memory.PROVENANCE["feasible_points"] > 0


def test_every_profile_uses_the_fitted_constants() -> None:
    assert (FRAG_SEQUENTIAL, FRAG_PIPELINED, FRAG_LOGITS, RESERVED_FLOOR_BYTES) == (
        fitted_memory.FRAG_SEQUENTIAL, fitted_memory.FRAG_PIPELINED,
        fitted_memory.FRAG_LOGITS, fitted_memory.RESERVED_FLOOR_BYTES)
    for profile in PROFILES.values():
        assert memory_fit.Allocator.of(profile) == memory_fit.Allocator(
            FRAG_SEQUENTIAL, FRAG_PIPELINED, FRAG_LOGITS, RESERVED_FLOOR_BYTES), profile.name


def test_the_rendered_module_holds_the_fitted_values(
        reference: tuple[memory_reference.ReferenceFit, float]) -> None:
    ref, _ = reference
    namespace: dict[str, object] = {}
    exec(compile(memory_reference.render_constants(ref, "2000-01-01"), "fitted_constants.py", "exec"), namespace)
    a = ref.fit.allocator
    assert (namespace["FRAG_SEQUENTIAL"], namespace["FRAG_PIPELINED"], namespace["FRAG_LOGITS"],
            namespace["RESERVED_FLOOR_BYTES"], namespace["RESERVED_BAND"]) == (
        a.sequential, a.pipelined, a.logits, a.floor_bytes, ref.band)
    provenance = namespace["PROVENANCE"]
    assert isinstance(provenance, dict)
    assert provenance["objective"] == memory_fit.OBJECTIVE and provenance["date"] == "2000-01-01"
    assert provenance["grid"] == memory_fit.GRID.describe()


def test_the_chosen_point_meets_the_constraints_and_is_the_grid_minimum(
        reference: tuple[memory_reference.ReferenceFit, float], refdata: Path, playbook: Spec,
        full_runs: memory_check.Runs) -> None:
    ref, _ = reference
    f = ref.fit.figures
    assert f.success_kept_frac >= memory_fit.MIN_SUCCESS_KEPT
    assert f.oom_pruned_frac is not None and f.oom_pruned_frac >= memory_fit.MIN_OOM_PRUNED
    must_fit = memory_reference.llmfoundry_basis(refdata / memory_reference.LLMFOUNDRY_FILE)
    assert memory_reference.published_fit_frac(must_fit, ref.fit.allocator) == 1.0
    # a neighbour on every axis that also meets the constraints has no smaller mean error
    b = memory_fit.basis(full_runs, playbook)
    a = ref.fit.allocator
    here = np.array([a.sequential, a.pipelined, a.logits, float(a.floor_bytes)])
    steps = np.array([0.025, 0.05, 0.05, 64 * MiB])
    for axis in range(4):
        for sign in (-1, 1):
            point = here.copy()
            point[axis] += sign * steps[axis]
            if point[axis] < 0:
                continue
            kept, oom, mean, _, _ = memory_fit._evaluate(b, point[None])
            feasible = kept[0] >= memory_fit.MIN_SUCCESS_KEPT and oom is not None \
                and oom[0] >= memory_fit.MIN_OOM_PRUNED and memory_fit.kept_mask(must_fit, point[None]).all()
            if feasible:
                assert mean[0] >= f.reserved_mean_abs_rel_err, (axis, sign)


@pytest.mark.parametrize("point", [(0.1, 0.4, 0.3, 192), (0.2, 0.15, 0.45, 320), (0.0, 0.8, 0.0, 0)])
def test_the_fast_linear_path_is_the_memory_check_path(
        point: tuple[float, float, float, int], playbook: Spec, full_runs: memory_check.Runs) -> None:
    allocator = memory_fit.Allocator(point[0], point[1], point[2], point[3] * MiB)
    b = memory_fit.basis(full_runs, playbook)
    kept, oom, _, median, p90 = memory_fit._evaluate(b, np.array(
        [[allocator.sequential, allocator.pipelined, allocator.logits, allocator.floor_bytes]]))
    real = memory_check.score(full_runs, playbook, allocator.apply(playbook.framework))
    assert kept[0] == real.success_kept_frac
    assert oom is not None and oom[0] == real.oom_pruned_frac
    assert median[0] == pytest.approx(real.reserved_median_abs_rel_err, abs=1e-9)
    assert p90[0] == pytest.approx(real.reserved_p90_abs_rel_err, abs=1e-9)


# ------------------------------------------------------------------ leave one model out

def test_each_model_is_scored_by_constants_fitted_without_it(cv: memory_fit.CrossValidation) -> None:
    assert [fold.held_out for fold in cv.folds] == ["playbook-1b", "playbook-8b"]
    for fold in cv.folds:
        assert fold.held_out not in fold.trained_on and len(fold.trained_on) == 1
    assert cv.cross_validated.n_success == sum(f.cross_validated.n_success for f in cv.folds) == 1027
    assert cv.cross_validated.n_oom == sum(f.cross_validated.n_oom or 0 for f in cv.folds) == 372
    assert len(cv.signed_errors) == 1027
    assert cv.in_sample_allocator == memory_fit.Allocator.of("nanotron")


def test_cross_validated_figures_as_measured(cv: memory_fit.CrossValidation) -> None:
    """What leave-one-model-out measures on the playbook table (docs/validation.md, "The memory model"): a guard
    against regressions, not a target (see the xfail below)."""
    held = cv.cross_validated
    assert held.success_kept_frac is not None and held.success_kept_frac >= 0.986
    # with the H100's measured capacity (81079 MiB, not nvidia-smi's 81559) the folds pick other
    # constants: more OOMs pruned (0.914 -> 0.919), the reserved error a little wider
    assert held.oom_pruned_frac is not None and held.oom_pruned_frac >= 0.919
    assert held.reserved_median_abs_rel_err is not None and held.reserved_median_abs_rel_err <= 0.089
    assert held.reserved_p90_abs_rel_err is not None and held.reserved_p90_abs_rel_err <= 0.246
    assert held.best_kept is True
    assert cv.in_sample.reserved_p90_abs_rel_err is not None
    assert cv.in_sample.reserved_p90_abs_rel_err <= held.reserved_p90_abs_rel_err


@pytest.mark.xfail(strict=True, reason="issue 17's targets are not met leave-one-model-out: "
                                       "kept 0.986, OOM pruned 0.919, reserved median 0.088, p90 0.245")
def test_the_issue_targets_hold_on_the_model_left_out(cv: memory_fit.CrossValidation) -> None:
    held = cv.cross_validated
    for name, (op, bound) in memory_fit.TARGETS.items():
        assert memory_fit.meets(getattr(held, name), op, bound), (name, getattr(held, name), op, bound)


def test_with_probes_no_more_than_half_a_percent_of_successes_is_pruned_on_a_model_left_out(
        cv: memory_fit.CrossValidation) -> None:
    """The band keeps what it straddles as a probe: a successful run is lost only when even the
    band's low end is over the limit. The cost is the OOMs probed (each a run that fails at its
    first step)."""
    held = cv.cross_validated
    assert held.success_lost_frac is not None and held.success_lost_frac <= 0.005
    assert held.success_kept_frac is not None and held.success_probed_frac is not None
    assert held.success_kept_frac + held.success_probed_frac + held.success_lost_frac == \
        pytest.approx(1.0)
    assert held.oom_probed_frac is not None and 0 < held.oom_probed_frac < 0.25


def test_the_band_covers_ninety_percent_of_held_out_runs(cv: memory_fit.CrossValidation,
                                                         full_runs: memory_check.Runs) -> None:
    lo, hi = cv.band()
    assert (lo, hi) == pytest.approx(RESERVED_BAND, abs=1e-6)
    measured = np.ones_like(cv.signed_errors)
    low, high = reserved_interval(1.0 + cv.signed_errors, (lo, hi))
    inside = ((low <= measured * (1 + 1e-12)) & (measured <= high * (1 + 1e-12))).mean()
    assert 0.89 <= inside <= 0.91, inside


def test_leave_one_model_out_needs_two_models(playbook: Spec, full_runs: memory_check.Runs) -> None:
    with pytest.raises(ValueError, match="two models or more"):
        memory_fit.cross_validate(memory_fit.subset(full_runs, ["playbook-8b"]), playbook)


def test_cli_cv_prints_in_sample_beside_cross_validated(
        refdata: Path, repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(repo_root / memory_reference.SPEC_FILE)
    assert main(["memory-check", str(refdata / memory_reference.RUNS_FILE), "--spec", spec, "--cv", "model",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cv"] == "model" and data["objective"] == memory_fit.OBJECTIVE
    assert tuple(data["cross_validated"]) == tuple(data["in_sample"]) == memory_check.FIELDS
    assert [fold["held_out"] for fold in data["folds"]] == ["playbook-1b", "playbook-8b"]
    assert set(data["targets"]) == set(memory_fit.TARGETS)
    published = data["published_fit_frac"]
    assert set(published) == set(memory_reference.PUBLISHED)
    for fracs in published.values():
        assert list(fracs) == ["in-sample", "without playbook-1b", "without playbook-8b",
                               "this table alone"]
        assert fracs["in-sample"] == fracs["without playbook-1b"] == fracs["without playbook-8b"] == 1.0
    # BLOOM's sweep (sweep.validation.bloom_reference) under each column's constants: every run that ran fits
    bloom = data["bloom"]
    assert list(bloom) == list(published[memory_reference.LLMFOUNDRY_FILE])
    assert all(check["success_kept_frac"] == 1.0 for check in bloom.values())


def test_cli_cv_text_and_a_file_with_one_model(
        refdata: Path, repo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    spec = str(repo_root / memory_reference.SPEC_FILE)
    assert main(["memory-check", str(refdata / "playbook_runs_1B_8B.csv"), "--spec", spec,
                 "--cv", "model"]) == 0
    printed = capsys.readouterr().out
    assert "in-sample" in printed and "cross-validated" in printed
    assert "playbook-1b left out (fitted on playbook-8b" in printed
    raw = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    one = tmp_path / "one.csv"
    raw[raw["model_label"] == "8B"].to_csv(one, index=False)
    assert main(["memory-check", str(one), "--spec", spec, "--cv", "model"]) == 2
    assert "two models or more" in capsys.readouterr().err


@pytest.mark.parametrize("name, rows", [(memory_reference.LLMFOUNDRY_FILE, 138), (memory_reference.MEGATRON_CORE_FILE, 9),
                                        (memory_reference.NARAYANAN_FILE, 10)])
def test_published_configurations_fit_under_every_fold(
        name: str, rows: int, refdata: Path, cv: memory_fit.CrossValidation) -> None:
    """They ran, so they fit: under the committed constants and under each fold's. The Megatron
    tables are never fitted on; llm-foundry is the fit's constraint (tests/models/test_memory.py checks
    the same rows through `sweep.models.memory.estimate`)."""
    b = memory_reference.published_bases(refdata)[name]
    assert len(b.model) == rows
    assert memory_reference.published_fit_frac(b, cv.in_sample_allocator) == 1.0
    for fold in cv.folds:
        assert memory_reference.published_fit_frac(b, fold.allocator) == 1.0, fold.held_out


# ------------------------------------------------------------------ the interval (no reference data)

def test_the_interval_holds_the_point_and_widens_with_the_band() -> None:
    predicted = np.array([10.0, 20.0, 40.0]) * GiB
    low, high = reserved_interval(predicted, (-0.2, 0.1))
    assert np.all(low < predicted) and np.all(predicted < high)
    assert np.allclose(low, predicted / 1.1) and np.allclose(high, predicted / 0.8)
    wide_low, wide_high = reserved_interval(predicted, (-0.3, 0.2))
    assert np.all(wide_low < low) and np.all(wide_high > high)
    fixed_low, fixed_high = reserved_interval(predicted, (-0.2, 0.1), fixed_bytes=512 * MiB)
    assert np.allclose(fixed_low - low, 512 * MiB) and np.allclose(fixed_high - high, 512 * MiB)


@pytest.mark.parametrize("band", [(0.1, -0.1), (-1.0, 0.1), (-1.5, 0.0)])
def test_an_impossible_band_is_rejected(band: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="band must satisfy"):
        reserved_interval(1.0, band)


def test_the_committed_band_is_the_one_the_profiles_use() -> None:
    assert RESERVED_BAND == fitted_memory.RESERVED_BAND
    lo, hi = RESERVED_BAND
    assert -1.0 < lo < 0.0 < hi


def _two_successes_and_an_oom() -> memory_fit.Basis:
    """Three runs under an 80-byte budget, by hand: a success too big at every point (90 bytes
    before any share), a success kept while sequential <= 0.75 (50 + 40 s) and an OOM pruned
    once sequential > 0.5 (70 + 20 s). No point keeps 99 % of the successes."""
    n = 3
    frag = np.zeros((2, 3, n))
    frag[:, 0] = [0.0, 40.0, 20.0]
    total0 = np.tile([90.0, 50.0, 70.0], (2, 1))
    return memory_fit.Basis(np.ones(n, bool), np.ones(n, bool), np.ones(n, bool), total0.copy(), total0,
                     frag, 80.0, np.array(["success", "success", "oom"]),
                     np.array([90.0, 80.0, np.nan]), np.array(["m"] * n))


def test_a_table_no_grid_point_can_satisfy_gets_the_closest_point_not_an_error() -> None:
    grid = memory_fit.Grid(sequential=(0.0, 0.25, 0.5, 0.75, 1.0), pipelined=(0.0,), logits=(0.0,),
                    floor_mib=(0,))
    result = memory_fit.fit_basis(_two_successes_and_an_oom(), grid)
    # shortfall: s <= 0.5 misses both gates (0.49 + 0.9), s = 1 keeps no success (0.99);
    # s = 0.75 keeps one success of two and prunes the OOM (0.49)
    assert not result.gates_met and result.feasible_points == 0
    assert result.allocator.sequential == 0.75
    assert result.figures.success_kept_frac == 0.5 and result.figures.oom_pruned_frac == 1.0
    assert result.to_dict()["gates_met"] is False


def test_a_table_with_no_measured_success_has_nothing_to_fit() -> None:
    b = _two_successes_and_an_oom()
    unmeasured = memory_fit.Basis(b.rules_ok, b.estimated, b.single, b.alloc, b.total0, b.frag, b.budget,
                           b.outcome, np.full(3, np.nan), b.model)
    with pytest.raises(ValueError, match="no successful run of m has a measured reserved peak"):
        memory_fit.fit_basis(unmeasured, memory_fit.GRID)


def _one_success_that_reserves_three_quarters_of_its_transients() -> memory_fit.Basis:
    """One run under a budget nothing reaches: 50 bytes live, 40 transient, 80 reserved. The
    objective's optimum is sequential 0.75 (50 + 40 s = 80)."""
    frag = np.zeros((2, 3, 1))
    frag[:, 0] = [40.0]
    total0 = np.full((2, 1), 50.0)
    return memory_fit.Basis(np.ones(1, bool), np.ones(1, bool), np.ones(1, bool), total0.copy(), total0,
                     frag, 1e9, np.array(["success"]), np.array([80.0]), np.array(["m"]))


def test_a_fit_on_the_grids_edge_widens_the_grid_until_it_is_inside() -> None:
    """The grid's largest value is where the search stopped, not an answer: on another cluster's
    stack the reserve can be larger than any playbook run's (our H200's floor: past 1 GiB)."""
    grid = memory_fit.Grid(sequential=(0.0, 0.25, 0.5), pipelined=(0.0,), logits=(0.0,), floor_mib=(0,))
    b = _one_success_that_reserves_three_quarters_of_its_transients()
    stopped = memory_fit.fit_basis(b, grid, widen=False)
    assert stopped.allocator.sequential == 0.5 and stopped.at_edge() == {"sequential": 0.5}
    wide = memory_fit.fit_basis(b, grid)
    assert wide.allocator.sequential == 0.75 and wide.at_edge() == {}
    assert wide.grid.sequential == (0.0, 0.25, 0.5, 0.75, 1.0) and wide.widened == ("sequential",)
    assert wide.figures.reserved_median_abs_rel_err == 0.0
    # a point inside the grid is the answer: no widening
    inside = memory_fit.fit_basis(b, memory_fit.Grid(sequential=(0.0, 0.75, 1.0), pipelined=(0.0,),
                                       logits=(0.0,), floor_mib=(0,)))
    assert inside.widened == () and inside.allocator.sequential == 0.75


def test_widening_stops_at_the_limits_a_spec_accepts() -> None:
    from sweep.plan.spec import ALLOCATOR_SHARE_MAX, FLOOR_MIB_MAX

    grid = memory_fit.Grid(sequential=(3.0, 3.5, 4.0), pipelined=(0.0, 1.0), logits=(0.0,),
                    floor_mib=(FLOOR_MIB_MAX - 1024, FLOOR_MIB_MAX - 512))
    assert memory_fit.widened(grid, ["sequential"], base=grid) is None  # at the limit already
    wider = memory_fit.widened(grid, ["floor_mib", "pipelined"], base=grid)
    assert wider is not None
    assert wider.floor_mib == (FLOOR_MIB_MAX - 1024, FLOOR_MIB_MAX - 512, FLOOR_MIB_MAX)
    assert wider.pipelined == (0.0, 1.0, 2.0) and wider.pipelined[-1] <= ALLOCATOR_SHARE_MAX
    assert wider.sequential == grid.sequential
