"""memory-check: the planner and the memory model judged against the playbook's real 1B/8B runs.

The reference files are read from $SWEEP_REFDATA (conftest's `refdata` fixture), never copied.
The thresholds are the issue's targets for the public runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweep.cli import main
from sweep.core.units import GiB, MiB
from sweep.models import memory
from sweep.plan.spec import Spec, load_spec
from sweep.validation import memory_check, memory_fit, memory_reference

CHARTS = "playbook_runs_1B_8B.csv"
FULL = "playbook_bench_full_1B_8B.csv"


@pytest.fixture(scope="module")
def playbook(repo_root: Path) -> Spec:
    return load_spec(repo_root / "examples" / "playbook.yaml")


@pytest.fixture(scope="module")
def charts(refdata: Path, playbook: Spec) -> memory_check.MemoryCheck:
    return memory_check.check(refdata / CHARTS, playbook)


@pytest.fixture(scope="module")
def full(refdata: Path, playbook: Spec) -> memory_check.MemoryCheck:
    return memory_check.check(refdata / FULL, playbook)


def test_formats_are_told_apart_by_their_columns(refdata: Path) -> None:
    assert memory_check.detect_format(list(pd.read_csv(refdata / CHARTS, nrows=1).columns)) == "charts"
    assert memory_check.detect_format(list(pd.read_csv(refdata / FULL, nrows=1).columns)) == "full"
    with pytest.raises(memory_check.RunsFileError,
                       match=r"x\.csv: not a runs format memory-check reads.*'gpu_memory_GB'"):
        memory_check.detect_format(["model_label", "nodes", "dp"], "x.csv")


def test_charts_format_counts_and_nulls(charts: memory_check.MemoryCheck) -> None:
    assert charts.n_success + charts.n_failed == 1643 and charts.n_skipped == 0
    assert charts.n_success > 1000
    for field in ("n_oom", "n_other", "oom_pruned_frac", "alloc_median_abs_rel_err",
                  "alloc_p90_abs_rel_err"):
        assert getattr(charts, field) is None, field


def test_full_format_maps_every_row_including_failed_ones(full: memory_check.MemoryCheck) -> None:
    # The failed rows lack KV heads and tying; shape columns and the name still place them.
    assert (full.n_success, full.n_oom, full.n_other) == (1027, 372, 244)
    assert full.n_failed == 372 + 244 and full.n_skipped == 0


@pytest.mark.parametrize("which", ["charts", "full"])
def test_planner_keeps_what_ran_and_prunes_what_failed(
        which: str, request: pytest.FixtureRequest) -> None:
    result: memory_check.MemoryCheck = request.getfixturevalue(which)
    assert result.success_kept_frac is not None and result.success_kept_frac >= 0.99
    assert result.best_kept is True
    assert result.failed_pruned_frac is not None and result.failed_pruned_frac >= 0.80


def test_full_format_targets_for_ooms_and_peaks(full: memory_check.MemoryCheck) -> None:
    assert full.oom_pruned_frac is not None and full.oom_pruned_frac >= 0.90
    assert full.alloc_median_abs_rel_err is not None and full.alloc_median_abs_rel_err <= 0.08
    assert full.alloc_p90_abs_rel_err is not None and full.alloc_p90_abs_rel_err <= 0.25
    assert full.reserved_median_abs_rel_err is not None
    assert full.reserved_median_abs_rel_err <= 0.15
    assert full.reserved_p90_abs_rel_err is not None and full.reserved_p90_abs_rel_err <= 0.45


def test_charts_reserved_peak_targets(charts: memory_check.MemoryCheck) -> None:
    assert charts.reserved_median_abs_rel_err is not None
    assert charts.reserved_median_abs_rel_err <= 0.15
    assert charts.reserved_p90_abs_rel_err is not None and charts.reserved_p90_abs_rel_err <= 0.45


def test_runs_are_judged_at_their_own_batch(refdata: Path, playbook: Spec) -> None:
    judged = memory_check.judge(memory_check.read_memory_runs(refdata / CHARTS, playbook), playbook)
    other_batch = judged.dp * judged.mbs * judged.grad_acc != 256
    assert other_batch.sum() == 20
    assert "batch" not in set(judged.prune_rule.dropna())
    assert judged.loc[other_batch & (judged.outcome == "success"), "kept"].mean() > 0.5


def test_rows_of_models_outside_the_spec_are_skipped_and_counted(
        refdata: Path, playbook: Spec) -> None:
    only_8b = with_models(playbook, ["playbook-8b"])
    result = memory_check.check(refdata / FULL, only_8b)
    names = pd.read_csv(refdata / FULL, usecols=["name"])["name"]
    assert result.n_skipped == names.str.startswith("1.34G_").sum() > 0
    assert result.n_success + result.n_failed + result.n_skipped == len(names)


def test_the_name_decides_between_models_of_the_same_shape_columns(
        refdata: Path, playbook: Spec) -> None:
    # An untied twin of the 1B shares every shape column the failed rows keep; the parameter
    # label at the start of `name` (1.34G: tied) picks the playbook model.
    twin = {"name": "untied-1b", "num_layers": 16, "hidden_size": 2048,
            "num_attention_heads": 32, "ffn_hidden_size": 8192, "vocab_size": 131072,
            "tie_word_embeddings": False}
    spec = with_models(playbook, ["playbook-1b", twin])
    runs = memory_check.read_memory_runs(refdata / FULL, spec)
    assert set(runs.frame.model) == {"playbook-1b"}
    assert runs.n_skipped == pd.read_csv(refdata / FULL, usecols=["name"])["name"] \
        .str.startswith("8.86G_").sum()


def with_models(spec: Spec, models: list[object]) -> Spec:
    return Spec.model_validate({**spec.model_dump(), "models": models})


def test_cli_json_is_one_object_with_exactly_the_fields(
        refdata: Path, repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(repo_root / "examples" / "playbook.yaml")
    assert main(["memory-check", str(refdata / CHARTS), "--spec", spec, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert tuple(data) == memory_check.FIELDS
    assert data["n_oom"] is None and data["alloc_median_abs_rel_err"] is None
    assert isinstance(data["best_kept"], bool)


def test_cli_prints_every_field(refdata: Path, repo_root: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(repo_root / "examples" / "playbook.yaml")
    assert main(["memory-check", str(refdata / FULL), "--spec", spec]) == 0
    printed = capsys.readouterr().out
    assert "full format" in printed
    assert all(field in printed for field in memory_check.FIELDS)


def test_cli_rejects_a_file_of_neither_format(refdata: Path, repo_root: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(repo_root / "examples" / "playbook.yaml")
    bad = refdata / "model_architectures.csv"
    assert main(["memory-check", str(bad), "--spec", spec]) == 2
    assert "not a runs format memory-check reads" in capsys.readouterr().err


def test_rows_without_a_layout_or_on_other_hardware_are_skipped(
        refdata: Path, playbook: Spec, tmp_path: Path) -> None:
    raw = pd.read_csv(refdata / CHARTS).head(10)
    raw.loc[0, "dp"] = None  # a row that lost its layout
    raw.loc[1, "nodes"] = raw.loc[1, "nodes"] * 2  # dp·tp·pp no longer fills the nodes
    path = tmp_path / "runs.csv"
    raw.to_csv(path, index=False)
    result = memory_check.check(path, playbook)
    assert result.n_skipped == 2 and result.n_success + result.n_failed == 8


def test_peaks_are_predicted_for_rank_0_and_the_verdict_for_the_most_loaded_stage(
        refdata: Path, playbook: Spec) -> None:
    """Both tables measured rank 0, the first pipeline stage: its peaks are compared with the
    first stage's prediction, while the planner's verdict weighs the most loaded stage."""
    import dataclasses

    import numpy as np

    from sweep.models import memory
    from sweep.plan import space

    runs = memory_check.read_memory_runs(refdata / FULL, playbook)
    judged = memory_check.judge(runs, playbook)
    group = judged[(judged.model == "playbook-1b") & (judged.grad_acc >= 1)]
    model = next(m for m in playbook.model_shapes if m.name == "playbook-1b")
    columns = memory_check.layout_columns(group, playbook)
    ctx = space.RuleContext.from_spec(playbook, model)
    first, loaded = (memory.estimate_columns(model, columns, seq_len=ctx.seq_len, dtype=ctx.dtype,
                                             profile=ctx.framework, stage=stage)
                     for stage in ("first", "most_loaded"))
    assert np.array_equal(group["pred_reserved_bytes"].to_numpy(), first["mem_reserved_bytes"])
    assert (first["mem_reserved_bytes"] != loaded["mem_reserved_bytes"]).any()
    point = dataclasses.replace(ctx, memory_probes=False)
    code, _ = space.evaluate(columns, point, skip=frozenset({"batch"}))
    assert np.array_equal(group["kept"].to_numpy(bool), code < 0)
    code, _ = space.evaluate(columns, ctx, skip=frozenset({"batch"}))  # the band: probes kept
    assert np.array_equal((group["kept"] | group["probed"]).to_numpy(bool), code < 0)
    assert group["probed"].any()


def test_the_tensor_parallel_tail_of_the_reserved_error_is_an_old_nanotron_version(
        refdata: Path, playbook: Spec) -> None:
    """The README's diagnosis, kept honest: pp = 1 runs with tp >= 16 made before job 14019000
    reserved far more than the model predicts; the same layouts made later do not."""
    raw = pd.read_csv(refdata / FULL)
    judged = memory_check.judge(memory_check.read_memory_runs(refdata / FULL, playbook), playbook)
    assert judged["reserved_bytes"].equals(raw["Mem Res (GB)"] * GiB)  # row for row
    ok = (judged.outcome == "success") & judged.pred_reserved_bytes.notna()
    signed = judged.pred_reserved_bytes / judged.reserved_bytes - 1
    wide = ok & (judged.pp == 1) & (judged.tp >= 16)
    early, late = wide & (raw.job_id < 14019000), wide & (raw.job_id >= 14019000)
    assert early.sum() >= 50 and late.sum() >= 15
    assert signed[early].median() < -0.25 < 0.0 < signed[late].median() < 0.15
    one_layout = judged[ok & (judged.model == "playbook-1b") & (judged.tp == 32)
                        & (judged.pp == 1) & (judged.mbs == 64)]
    by_job = one_layout.reserved_bytes.groupby(raw.job_id[one_layout.index]).first() / GiB
    assert by_job[13441891] == pytest.approx(51.8, abs=0.05)
    assert by_job[14113529] == pytest.approx(26.3, abs=0.05)


def test_the_missed_ooms_and_the_lost_successes_fall_on_either_side_of_that_version(
        refdata: Path, playbook: Spec) -> None:
    """The README's account of the verdict targets: judged by constants fitted without their
    model (leave-one-model-out), the OOMs kept are mostly runs of the older version, the
    successes pruned all of the newer, and only one layout has both outcomes."""
    raw = pd.read_csv(refdata / FULL)
    runs = memory_check.read_memory_runs(refdata / FULL, playbook)
    cv = memory_fit.cross_validate(runs, playbook, must_fit=memory_reference.llmfoundry_basis(
        refdata / memory_reference.LLMFOUNDRY_FILE))
    judged = pd.concat([memory_check.judge(memory_fit.subset(runs, [f.held_out]), playbook,
                                       f.allocator.apply(playbook.framework)).set_index(
                            runs.frame.index[runs.frame.model == f.held_out])
                        for f in cv.folds]).sort_index()
    late = raw.job_id >= 14019000
    oom, success = judged.outcome == "oom", judged.outcome == "success"
    assert (oom & ~late).sum() == 349 and oom.sum() == 372
    missed, lost = oom & judged.kept, success & ~judged.kept
    assert (missed.sum(), (missed & ~late).sum()) == (30, 25)
    assert lost.sum() == 14 and (lost & late).sum() == 14
    layout = ["model", "dp", "tp", "pp", "mbs", "zero_stage"]
    outcomes = judged[oom | success].groupby(layout).outcome.nunique()
    assert (outcomes > 1).sum() == 1


# ------------------------------------------------------------------ a sweep's own runs.parquet


def _attempt(**changes: object) -> dict[str, object]:
    """One runs.parquet attempt of the playbook's 8B on one node (256 sequences a step)."""
    row: dict[str, object] = {
        "model": "playbook-8b", "nodes": 1, "dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1,
        "mbs": 1, "grad_acc": 32, "zero_stage": 1, "recompute": "none", "sp": False,
        "pp_schedule": "1f1b", "vpp": 1, "outcome": "completed", "mem_source": "cuda",
        "mem_reserved_bytes": 60.0 * GiB, "mem_allocated_bytes": 50.0 * GiB,
        "tokens_per_sec_per_gpu": 7000.0}
    return {**row, **changes}


@pytest.fixture
def sweep_runs(tmp_path: Path, playbook: Spec) -> memory_check.Runs:
    # one micro-batch a step: the first stage holds one in flight, the last adds the logits
    piped = {"model": "playbook-1b", "dp": 4, "pp": 2, "mbs": 64, "grad_acc": 1}
    attempts = [
        _attempt(),
        _attempt(**piped),                                # every rank measured: the most loaded
        _attempt(**piped, mem_source="cuda:rank0"),       # an import: rank 0, the first stage
        _attempt(mbs=32, grad_acc=1, zero_stage=0, outcome="oom",
                 mem_reserved_bytes=None, mem_allocated_bytes=None),
        _attempt(outcome="crashed"),
        _attempt(outcome="cancelled"),                    # these say nothing about memory
        _attempt(outcome="node_fail"),
        _attempt(outcome=None),
        _attempt(mem_source="cpu-rss-anon"),              # not GPU memory
        _attempt(framework="nanotron", mem_source="log"),  # nanotron logs rank 0's peaks
        _attempt(model="no-such-model"),
        _attempt(cp=None),                                # a layout value missing
    ]
    path = tmp_path / "runs.parquet"
    pd.DataFrame(attempts).to_parquet(path)
    return memory_check.read_memory_runs(path, playbook)


def test_a_sweeps_runs_parquet_is_read_attempt_by_attempt(sweep_runs: memory_check.Runs) -> None:
    assert sweep_runs.format == "sweep" and sweep_runs.n_skipped == 5
    frame = sweep_runs.frame
    assert frame.outcome.tolist() == ["success"] * 3 + ["oom", "other", "success", "success"]
    assert frame.measured_stage.tolist() == (["most_loaded"] * 2 + ["first"]
                                             + ["most_loaded"] * 2 + ["first"] * 2)
    assert frame.alloc_peak.tolist()[:3] == ["run", "run", "step"]
    assert frame.alloc_peak.tolist()[-1] == "step"
    assert frame.reserved_bytes.isna().tolist() == [False] * 3 + [True, False, True, False]


def test_a_run_that_fitted_only_by_flushing_the_allocator_scores_no_reserved_peak(
        tmp_path: Path, playbook: Spec) -> None:
    """The caching allocator released its cache and retried (`mem_alloc_retries`): its reserved
    peak is the card's limit, not what the configuration reserves, so it is no measure of the
    model's reserve; its allocated peak and its outcome still count."""
    path = tmp_path / "runs.parquet"
    pd.DataFrame([_attempt(mem_alloc_retries=0.0), _attempt(mem_alloc_retries=2.0),
                  _attempt(mem_alloc_retries=None)]).to_parquet(path)
    frame = memory_check.read_memory_runs(path, playbook).frame
    assert frame.reserved_bytes.isna().tolist() == [False, True, False]
    assert frame.alloc_bytes.notna().all() and (frame.outcome == "success").all()


def test_a_sweeps_peaks_are_predicted_for_the_stage_and_window_that_were_measured(
        sweep_runs: memory_check.Runs, playbook: Spec) -> None:
    judged = memory_check.judge(sweep_runs, playbook)
    one_b = next(m for m in playbook.model_shapes if m.name == "playbook-1b")
    columns = memory_check.layout_columns(judged.iloc[[1]], playbook)
    first, loaded = (memory.estimate_columns(one_b, columns, seq_len=4096, dtype="bf16",
                                             profile="nanotron", stage=stage)
                     for stage in ("first", "most_loaded"))
    assert first["mem_reserved_bytes"][0] < loaded["mem_reserved_bytes"][0]
    assert judged.pred_reserved_bytes[1] == loaded["mem_reserved_bytes"][0]
    assert judged.pred_reserved_bytes[2] == first["mem_reserved_bytes"][0]
    assert judged.pred_alloc_bytes[1] == loaded["mem_allocated_bytes"][0]  # the whole run's peak
    assert judged.pred_alloc_bytes[2] == first["mem_step_allocated_bytes"][0]  # the step window
    assert not judged.kept[3]  # micro-batch 32 of the 8B on one GPU's share: the OOM is pruned
    figures = memory_check.score_judged(judged, sweep_runs.format, sweep_runs.n_skipped)
    assert figures.n_oom == 1 and figures.n_other == 1 and figures.oom_pruned_frac == 1.0


def test_the_allocator_fit_predicts_the_stage_judge_predicts(
        sweep_runs: memory_check.Runs, playbook: Spec) -> None:
    """The fit's fast path is the real path for a sweep's peaks too, at every point: which
    stage is the most loaded depends on the allocator constants."""
    b = memory_fit.basis(sweep_runs, playbook)
    assert b.measured_loaded is not None
    scored = np.isfinite(b.measured_reserved) & (b.outcome == "success")
    for point in (memory_fit.Allocator(0.0, 0.0, 0.0, 0), memory_fit.Allocator(0.5, 1.0, 1.0, 1024 * MiB),
                  memory_fit.Allocator(0.1, 0.4, 0.3, 192 * MiB)):
        grid = np.array([[point.sequential, point.pipelined, point.logits, point.floor_bytes]])
        fast = memory_fit._measured_reserved(b, grid, scored)[0]
        real = memory_check.judge(sweep_runs, playbook, point.apply("nanotron")).pred_reserved_bytes
        assert np.allclose(fast, real[scored].to_numpy(), rtol=0, atol=8), point


def test_a_row_run_at_another_sequence_length_is_refused(tmp_path: Path, playbook: Spec) -> None:
    path = tmp_path / "runs.parquet"
    pd.DataFrame([_attempt(seq_len=4096), _attempt(seq_len=8192)]).to_parquet(path)
    wanted = r"runs\.parquet: column 'seq_len' has \['8192'\] where the spec has 4096"
    with pytest.raises(memory_check.RunsFileError, match=wanted):
        memory_check.read_memory_runs(path, playbook)


def test_runs_of_another_framework_are_refused_not_judged_by_the_specs_profile(
        tmp_path: Path, playbook: Spec) -> None:
    """Megatron's runs judged under nanotron's profile (or fitted into constants for it by
    --write-constants) would be scored against memory they never held."""
    path = tmp_path / "runs.parquet"
    pd.DataFrame([_attempt(framework="nanotron"), _attempt(framework="megatron")]).to_parquet(path)
    wanted = r"column 'framework' has \['megatron'\] where the spec has 'nanotron'"
    with pytest.raises(memory_check.RunsFileError, match=wanted):
        memory_check.read_memory_runs(path, playbook)
    pd.DataFrame([_attempt(framework="nanotron")]).to_parquet(path)
    assert len(memory_check.read_memory_runs(path, playbook).frame) == 1


@pytest.mark.parametrize("table", [FULL, CHARTS])
def test_a_playbook_table_imported_as_runs_parquet_scores_as_its_csv_does(
        refdata: Path, playbook: Spec, tmp_path: Path, table: str) -> None:
    """`sweep import-playbook` writes runs.parquet with rank 0's peaks (`cuda:rank0`) and, for
    the charts, failures it cannot tell apart (`failed`): read back, every figure is the CSV's,
    and for the full table the allocator fit too."""
    out = tmp_path / "runs.parquet"
    assert main(["import-playbook", str(refdata / table), "--out", str(out)]) == 0
    from_parquet = memory_check.read_memory_runs(out, playbook)
    from_csv = memory_check.read_memory_runs(refdata / table, playbook)
    assert memory_check.score(from_parquet, playbook) == memory_check.score(from_csv, playbook)
    if table == FULL:
        assert memory_fit.fit_allocator(from_parquet, playbook).allocator == \
            memory_fit.fit_allocator(from_csv, playbook).allocator


def test_a_sweep_spanning_framework_versions_is_scored_per_version(
        tmp_path: Path, repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The allocator's reserve can change between versions of one framework (the playbook's
    table shows it): memory-check scores each version a sweep spans, and says nothing when it
    spans one."""
    path = tmp_path / "runs.parquet"
    rows = [_attempt(framework_version="v1", mem_reserved_bytes=70.0 * GiB),
            _attempt(framework_version="v1", mbs=2, grad_acc=16, mem_reserved_bytes=75.0 * GiB),
            _attempt(framework_version="v2", mem_reserved_bytes=40.0 * GiB),
            _attempt(framework_version=None)]
    pd.DataFrame(rows).to_parquet(path)
    spec = str(repo_root / "examples" / "playbook.yaml")
    assert main(["memory-check", str(path), "--spec", spec, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_version = data["by_framework_version"]
    assert list(by_version) == ["v1", "v2"]
    assert by_version["v1"]["n_success"] == 2 and by_version["v2"]["n_success"] == 1
    assert data["n_success"] == 4  # the row of no stated version counts in the whole
    assert by_version["v1"]["reserved_median_abs_rel_err"] != \
        by_version["v2"]["reserved_median_abs_rel_err"]
    assert main(["memory-check", str(path), "--spec", spec]) == 0
    printed = capsys.readouterr().out
    assert "by framework version" in printed and "\n  v1 " in printed and "\n  v2 " in printed
    pd.DataFrame([r for r in rows if r["framework_version"] == "v1"]).to_parquet(path)
    assert main(["memory-check", str(path), "--spec", spec]) == 0
    assert "by framework version" not in capsys.readouterr().out
