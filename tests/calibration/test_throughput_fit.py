"""Calibration: least squares that recovers what generated the data and shrugs off outliers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sweep.calibration.throughput_fit import (
    FIT_EXCLUSION,
    INTRA_NODE_BUSBW,
    SICK_NODE,
    STALE_PIPELINE,
    fit,
    fit_exclusion_reasons,
    fit_matrix,
    observed_step_time,
    relative_errors,
    without_fit_exclusions,
)
from sweep.core.catalog import get_gpu, get_model
from sweep.models.throughput import Coefficients, features, predict, tokens_per_step
from sweep.models.throughput_inputs import Workload

H100 = get_gpu("h100-sxm")
WORK = Workload(get_model("playbook-1b"), 4096, H100)


def layouts() -> pd.DataFrame:
    """A spread of valid layouts of 1B on 1-8 nodes at 256 sequences."""
    out = []
    for gpus in (8, 16, 32, 64):
        for tp in (1, 2, 4, 8, 16):
            for pp in (1, 2, 4):
                dp = gpus // (tp * pp)
                if dp < 1 or dp * tp * pp != gpus or 256 % dp:
                    continue
                for mbs in (1, 2, 4, 8):
                    if (256 // dp) % mbs == 0:
                        out.append({"dp": dp, "tp": tp, "pp": pp, "mbs": mbs,
                                    "grad_acc": 256 // dp // mbs, "zero_stage": 1})
    return pd.DataFrame(out)


def with_throughput(frame: pd.DataFrame, step: np.ndarray) -> pd.DataFrame:
    gpus = frame.dp * frame.tp * frame.pp
    return frame.assign(tokens_per_s_per_gpu=tokens_per_step(frame, WORK) / (step * gpus))


def test_fit_recovers_the_step_times_of_a_known_model() -> None:
    frame = layouts()
    truth = Coefficients(compute=2.1, layer_passes=3e-4, layer_comm=0.8, dp_comm=0.4,
                         step_overhead=0.1, inter_scaling=0.5)
    runs = with_throughput(frame, predict(frame, WORK, truth)["pred_step_time_s"].to_numpy())
    result = fit([(runs, WORK)])
    assert result.coefficients.inter_scaling == 0.5
    assert result.median_abs_error < 0.01
    assert result.coefficients.compute == pytest.approx(2.1, rel=0.05)  # the dominant term


def test_fit_is_robust_to_runs_a_sick_node_slowed_tenfold() -> None:
    frame = layouts()
    truth = Coefficients(compute=2.0, layer_passes=2e-4, step_overhead=0.1)
    step = predict(frame, WORK, truth)["pred_step_time_s"].to_numpy()
    sick = np.arange(len(step)) % 8 == 0  # 12.5 % of the runs
    runs = with_throughput(frame, np.where(sick, 10 * step, step))
    errors = relative_errors(runs[~sick], WORK, fit([(runs, WORK)]).coefficients)
    assert np.median(np.abs(errors)) < 0.03


@pytest.mark.parametrize("overlap_power", [0.0, 8.0])
def test_the_fit_is_the_minimum_so_it_reproduces_on_another_machine(overlap_power: float) -> None:
    """Another CPU's exp and log, or another NumPy, round the last bit differently. Adam alone
    stopped where its 3,000th step left it, and one unit in the last place of the step times
    moved the playbook fit's coefficients by 0.4 %. The fit now ends at the minimum: the same
    to 1e-9 whatever the rounding, and whatever path reached it."""
    frame = layouts()
    truth = Coefficients(compute=2.0, layer_passes=2e-4, layer_comm=0.7, step_overhead=0.1,
                         overlap_power=overlap_power)
    step = predict(frame, WORK, truth)["pred_step_time_s"].to_numpy()
    step = step * np.exp(0.2 * np.sin(np.arange(len(step))))  # noise no model can fit
    feats = features(frame, WORK).to_numpy()
    reference = fit_matrix(feats, step, overlap_power=overlap_power).vector()
    for other in (fit_matrix(feats, step * (1 + 2.2e-16), overlap_power=overlap_power),
                  fit_matrix(feats, step, overlap_power=overlap_power, iterations=3000)):
        assert np.allclose(other.vector(), reference, rtol=1e-9, atol=0)


def test_observed_step_time_inverts_tokens_per_second() -> None:
    frame = pd.DataFrame([{"dp": 4, "tp": 2, "pp": 1, "mbs": 2, "grad_acc": 32, "zero_stage": 0,
                           "tokens_per_s_per_gpu": 1000.0}])
    # 4 · 2 · 32 sequences of 4096 tokens over 8 GPUs at 1000 tokens/s each.
    assert observed_step_time(frame, 4096, "tokens_per_s_per_gpu")[0] == pytest.approx(
        4 * 2 * 32 * 4096 / 8000)


def test_fit_refuses_too_few_or_non_physical_runs() -> None:
    feats = features(layouts().head(2), WORK).to_numpy()
    with pytest.raises(ValueError, match="at least 3"):
        fit_matrix(feats, np.array([1.0, 2.0]))
    feats = features(layouts().head(3), WORK).to_numpy()
    with pytest.raises(ValueError, match="positive"):
        fit_matrix(feats, np.array([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="completed runs"):
        fit([])


def playbook(refdata, label: str) -> tuple[pd.DataFrame, Workload]:
    runs = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    runs = runs[(runs.model_label == label) & (runs.status == "success")
                & (runs.tokens_per_sec_per_gpu > 0)]
    runs = runs.rename(columns={"tokens_per_sec_per_gpu": "tokens_per_s_per_gpu"})
    model = {"1B": "playbook-1b", "8B": "playbook-8b"}[label]
    return runs, Workload(get_model(model), 4096, H100)


@pytest.mark.parametrize("train, test", [("1B", "8B"), ("8B", "1B")])
def test_calibrated_on_one_playbook_model_predicts_the_other_on_small_jobs(
        refdata, train: str, test: str) -> None:
    """Held out: fit on one model, score the other. On 1-4 nodes the playbook's runs are
    repeatable (ZeRO-0/1 twins differ by ≤ 3 %). Measured: 19 % (1B→8B), 23 % (8B→1B)."""
    coeffs = fit([playbook(refdata, train)]).coefficients
    runs, work = playbook(refdata, test)
    small = runs[runs.nodes <= 4]
    errors = np.abs(relative_errors(small, work, coeffs))
    assert len(small) > 90
    assert np.median(errors) < 0.27


def test_every_row_of_a_real_plan_gets_a_prediction() -> None:
    from sweep.plan.predictions import predict_plan
    from sweep.plan.space import plan
    from sweep.plan.spec import parse_spec

    spec = parse_spec("name: tiny\nframework: nanotron\ngpu: h100-sxm\nmodels: [playbook-1b, "
                      "playbook-8b]\nnodes: [1, 2]\nseq_len: 4096\nglobal_batch: {sequences: 64}\n"
                      "axes: {mbs: [1, 2, 4], zero_stage: [0, 1]}\n")
    frame = plan(spec)
    out = predict_plan(frame, spec)
    assert out.index.equals(frame.index)
    assert (out.pred_tokens_per_s_per_gpu > 0).all() and (out.pred_mfu < 1).all()
    one = frame[(frame.model == "playbook-8b") & (frame.nodes == 1)].iloc[[0]]
    direct = predict(one, Workload(get_model("playbook-8b"), 4096, H100))
    assert out.loc[one.index, "pred_step_time_s"].iloc[0] == pytest.approx(
        direct.pred_step_time_s.iloc[0])


def test_a_plan_ranks_its_kept_rows_within_each_cell_by_predicted_throughput() -> None:
    """`pred_rank` is the shortlist's order: 1 is the cell's fastest prediction."""
    from sweep.plan.predictions import default_prior, with_predictions
    from sweep.plan.space import plan
    from sweep.plan.spec import parse_spec

    spec = parse_spec("name: tiny\nframework: nanotron\ngpu: h100-sxm\nmodels: [playbook-1b, "
                      "playbook-8b]\nnodes: [1, 2]\nseq_len: 4096\nglobal_batch: {sequences: 64}\n"
                      "axes: {mbs: [1, 2, 4], zero_stage: [0, 1]}\n")
    out = with_predictions(plan(spec), spec, default_prior(spec))
    kept = out[out.status == "kept"]
    assert out.loc[out.status != "kept", "pred_rank"].isna().all()
    for _, cell in kept.groupby(["model", "nodes"]):
        ordered = cell.sort_values("pred_rank")
        assert list(ordered.pred_rank) == list(range(1, len(cell) + 1))
        assert ordered.pred_tokens_per_s_per_gpu.is_monotonic_decreasing


def test_calibrate_leaves_out_the_pipeline_runs_made_before_nanotrons_fix(refdata, capsys) -> None:
    """nanotron's results table flags 265 successful pipeline runs as made before its 1F1B fix
    (2-10x slower than the same layouts after it), and ten successful runs measured their
    node's NVLink all-reduce at a tenth of the others (a sick node). Without them the median
    error is 12.5 % (17.6 % before the model charged pipeline runs their per-layer TP cost,
    `pipe_tp_sync`)."""
    from pathlib import Path

    from sweep.calibration.runs_table import completed_groups
    from sweep.plan.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "playbook.yaml")
    groups = completed_groups(refdata / "playbook_bench_full_1B_8B.csv", spec, on_left_out=print)
    printed = capsys.readouterr().out
    assert "left out 771 pipeline runs" in printed  # 266 completed, 505 not
    assert "left out 10 runs on a node whose NVLink all-reduce measured under half" in printed
    result = fit([(frame, work) for _, frame, work in groups])
    assert result.rows == 751
    assert result.median_abs_error < 0.13


def test_the_calibrated_model_is_within_15_percent_on_the_playbook_runs(refdata, capsys) -> None:
    """Issue 8's target: median |error| of tokens/s/GPU ≤ 15 % over the completed playbook runs
    (nanotron's results table, pre-fix pipeline runs and sick-node runs left out): 12.5 %. Each
    model, predicted by a fit to the other one only, stays near 20 % (18.9 % for 1B, 20.6 % for
    8B)."""
    from pathlib import Path

    from sweep.calibration.runs_table import completed_groups
    from sweep.plan.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "playbook.yaml")
    groups = completed_groups(refdata / "playbook_bench_full_1B_8B.csv", spec, on_left_out=print)
    capsys.readouterr()
    assert fit([(frame, work) for _, frame, work in groups]).median_abs_error <= 0.15
    for name, frame, work in groups:
        held = fit([(f, w) for n, f, w in groups if n != name]).coefficients
        assert np.median(np.abs(relative_errors(frame, work, held))) < 0.22, name


def test_a_fit_leaves_out_what_the_table_flags_or_what_runs_parquet_recorded() -> None:
    """nanotron's results table says it in its own columns (a stale pipeline run, a job whose
    NVLink measured degraded); `sweep import-playbook` records the reason in runs.parquet, which
    has neither column. A row counts once, the stale flag first."""
    published = pd.DataFrame({"pp": [1, 2, 2, 1, 1], "after_pp_fix": [False, False, True, True, True],
                              INTRA_NODE_BUSBW: [450.0, 40.0, 440.0, 45.0, 460.0]})
    assert fit_exclusion_reasons(published).tolist() == [None, STALE_PIPELINE, None, SICK_NODE, None]
    kept, left_out = without_fit_exclusions(published)
    assert kept.index.tolist() == [0, 2, 4] and left_out == {STALE_PIPELINE: 1, SICK_NODE: 1}
    imported = pd.DataFrame({"pp": [1, 2, 1], FIT_EXCLUSION: [None, STALE_PIPELINE, "another reason"]})
    kept, left_out = without_fit_exclusions(imported)
    assert kept.index.tolist() == [0] and left_out == {STALE_PIPELINE: 1, "another reason": 1}
    assert without_fit_exclusions(pd.DataFrame({"pp": [1, 2]}))[1] == {}  # nothing flagged
