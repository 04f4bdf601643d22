"""analysis.compare, analysis.welch and analysis.references: the regression gate's rules, on
small runs tables built by hand (tests/analysis/conftest.py's rows, the demo's shape)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.compare import (
    DEFAULT_TOLERANCE_CPU,
    DEFAULT_TOLERANCE_GPU,
    MATCH_KEY,
    Comparison,
    compare,
    expected_from_runs,
    latest_attempts,
)
from analysis.compare_output import FIGURE, MARKDOWN, MARKDOWN_ALL_ROWS, RUNS_CSV, write_comparison
from analysis.references import read_references, write_references
from analysis.welch import t_sf, welch_t
from sweep.core.errors import UserError

Rows = Callable[..., dict[str, Any]]
Table = Callable[[list[dict[str, Any]]], pd.DataFrame]


@pytest.fixture
def timed(run_row: Rows) -> Rows:
    """A completed attempt with a steady-state step time (`mean` s, `std`, over `n` steps)."""
    def row(run_id: str, mean: float | None, std: float | None = 0.01, n: int = 20,
            **extra: Any) -> dict[str, Any]:
        tps = None if mean is None else 1024.0 / mean
        return run_row(run_id, tps, step_time_mean_s=mean, step_time_std_s=std, step_time_n=n,
                       **extra)
    return row


def by_run(comparison: Comparison) -> pd.DataFrame:
    runs = comparison.runs
    return runs.assign(run_id=runs["ref_run_id"].fillna(runs["cur_run_id"])).set_index("run_id")


def gate(make_runs: Table, baseline: list[dict[str, Any]], current: list[dict[str, Any]],
         tolerance: float | None = 0.05, alpha: float = 0.05) -> Comparison:
    return compare(expected_from_runs(make_runs(baseline), tolerance), make_runs(current), alpha)


# ------------------------------------------------------------------------ Welch's t-test

@pytest.mark.parametrize(("t", "df", "tail"), [
    (2.228, 10, 0.025), (2.015, 5, 0.05), (1.0, 1, 0.25), (3.747, 4, 0.01), (1.645, 1e6, 0.05),
    (0.0, 7, 0.5), (-2.228, 10, 0.975)])
def test_the_t_tail_matches_students_t_tables(t: float, df: float, tail: float) -> None:
    assert t_sf(np.array([t]), np.array([df]))[0] == pytest.approx(tail, abs=2e-4)


def test_welchs_t_and_degrees_of_freedom_follow_the_welch_satterthwaite_formulas() -> None:
    t, df = welch_t(np.array([10.0]), np.array([1.0]), np.array([10.0]),
                    np.array([11.0]), np.array([2.0]), np.array([5.0]))
    # se² = 1/10 + 4/5 = 0.9; df = 0.81 / ((0.1²)/9 + (0.8²)/4)
    assert t[0] == pytest.approx(1.0 / np.sqrt(0.9))
    assert df[0] == pytest.approx(0.81 / (0.01 / 9 + 0.64 / 4))


def test_welchs_test_cannot_be_made_on_fewer_than_two_steps() -> None:
    t, df = welch_t(np.array([1.0]), np.array([np.nan]), np.array([1.0]),
                    np.array([2.0]), np.array([0.1]), np.array([10.0]))
    assert np.isnan(t[0]) and np.isnan(df[0])


# ------------------------------------------------------------------------ noise and tolerance

def test_a_change_within_the_steps_own_scatter_is_within_noise_not_slower(
        make_runs: Table, timed: Rows) -> None:
    noisy = gate(make_runs, [timed("a", 1.0, std=0.5, n=5)], [timed("a", 1.2, std=0.5, n=5)])
    assert by_run(noisy).loc["a", "status"] == "within noise"
    assert noisy.regressions == 0


def test_the_same_change_with_steady_steps_is_slower(make_runs: Table, timed: Rows) -> None:
    steady = gate(make_runs, [timed("a", 1.0, std=0.01, n=20)], [timed("a", 1.2, std=0.01, n=20)])
    row = by_run(steady).loc["a"]
    assert row["status"] == "slower" and row["test"] == "welch" and row["p_value"] < 1e-6
    assert row["change"] == pytest.approx(0.2)
    assert steady.regressions >= 1


def test_a_significant_change_inside_the_tolerance_is_not_a_regression(
        make_runs: Table, timed: Rows) -> None:
    small = gate(make_runs, [timed("a", 1.0, std=0.001)], [timed("a", 1.04, std=0.001)])
    row = by_run(small).loc["a"]
    assert row["status"] == "within tolerance" and row["p_value"] < 1e-6


def test_a_change_of_exactly_the_tolerance_is_inside_it_and_a_hair_more_is_not(
        make_runs: Table, timed: Rows) -> None:
    baseline = [timed("a", 2.0, std=0.001), timed("b", 2.0, std=0.001, tp=2)]
    current = [timed("a", 2.2, std=0.001), timed("b", 2.2002, std=0.001, tp=2)]
    verdicts = by_run(gate(make_runs, baseline, current, tolerance=0.10))["status"]
    assert verdicts.to_dict() == {"b": "slower", "a": "within tolerance"}


def test_a_significant_speedup_beyond_the_tolerance_is_faster_and_passes(
        make_runs: Table, timed: Rows) -> None:
    faster = gate(make_runs, [timed("a", 1.0)], [timed("a", 0.5)])
    assert by_run(faster).loc["a", "status"] == "faster"
    assert faster.regressions == 0


def test_without_a_spread_the_tolerance_alone_decides_and_says_so(
        make_runs: Table, timed: Rows) -> None:
    one_step = gate(make_runs, [timed("a", 1.0, std=None, n=1)], [timed("a", 1.5, std=None, n=1)])
    row = by_run(one_step).loc["a"]
    assert row["status"] == "slower" and np.isnan(row["p_value"])
    assert row["test"].startswith("tolerance only")


def test_the_default_tolerance_is_wide_on_cpu_and_narrow_on_gpus(
        make_runs: Table, timed: Rows) -> None:
    cpu = expected_from_runs(make_runs([timed("a", 1.0)]))
    gpu = expected_from_runs(make_runs([timed("a", 1.0, gpu="h100-sxm")]))
    assert (cpu["lower"].iloc[0], cpu["upper"].iloc[0]) == (-DEFAULT_TOLERANCE_CPU,
                                                            DEFAULT_TOLERANCE_CPU)
    assert gpu["upper"].iloc[0] == DEFAULT_TOLERANCE_GPU
    # A 50 % slowdown on CPU is inside the default; the same on a GPU is a regression.
    assert by_run(gate(make_runs, [timed("a", 1.0)], [timed("a", 1.5)], tolerance=None)
                  ).loc["a", "status"] == "within tolerance"
    assert by_run(gate(make_runs, [timed("a", 1.0, gpu="h100-sxm")],
                       [timed("a", 1.5, gpu="h100-sxm")], tolerance=None)
                  ).loc["a", "status"] == "slower"


# ------------------------------------------------------------------------ the host's speed

def five_layouts(timed: Rows, scale: list[float], **extra: Any) -> list[dict[str, Any]]:
    """Five configurations of one cell, the i-th with a step time of scale[i] s."""
    layouts = [{}, {"tp": 2}, {"pp": 2}, {"zero_stage": 1}, {"mbs": 1}]
    return [timed(f"r{i}", factor, **layout, **extra)
            for i, (factor, layout) in enumerate(zip(scale, layouts))]


def test_on_cpu_a_host_that_slows_every_configuration_alike_is_not_a_regression(
        make_runs: Table, timed: Rows) -> None:
    result = gate(make_runs, five_layouts(timed, [1.0] * 5), five_layouts(timed, [6.0] * 5),
                  tolerance=None)
    assert result.normalized and result.shift == pytest.approx(6.0)
    assert set(result.runs["status"]) == {"within tolerance"}
    # As measured (--normalize none), the same sweep is 500 % slower everywhere: beyond +400 %.
    measured = compare(expected_from_runs(make_runs(five_layouts(timed, [1.0] * 5))),
                       make_runs(five_layouts(timed, [6.0] * 5)), normalize="none")
    assert set(measured.runs["status"]) == {"slower"}


def test_on_cpu_one_configuration_slower_than_the_rest_of_its_sweep_is_named(
        make_runs: Table, timed: Rows) -> None:
    result = gate(make_runs, five_layouts(timed, [1.0] * 5),
                  five_layouts(timed, [1.1, 1.1, 8.8, 1.1, 1.1]), tolerance=None)
    assert result.shift == pytest.approx(1.1)
    assert by_run(result)["status"].to_dict() == {
        "r2": "slower", "r0": "within tolerance", "r1": "within tolerance",
        "r3": "within tolerance", "r4": "within tolerance"}


def test_on_gpus_a_slowdown_of_every_configuration_is_a_regression(
        make_runs: Table, timed: Rows) -> None:
    result = gate(make_runs, five_layouts(timed, [1.0] * 5, gpu="h100-sxm"),
                  five_layouts(timed, [1.2] * 5, gpu="h100-sxm"), tolerance=None)
    assert not result.normalized and result.shift == pytest.approx(1.2)
    assert set(result.runs["status"]) == {"slower"}


def test_the_hosts_speed_needs_three_configurations_completed_on_both_sides(
        make_runs: Table, timed: Rows) -> None:
    two = gate(make_runs, five_layouts(timed, [1.0] * 2), five_layouts(timed, [6.0] * 2),
               tolerance=None)
    assert two.shift == 1.0
    assert set(two.runs["status"]) == {"slower"}


# ------------------------------------------------------------------------ failures, gaps, attempts

def test_a_configuration_that_fails_now_is_newly_failing_and_a_regression(
        make_runs: Table, timed: Rows) -> None:
    result = gate(make_runs, [timed("a", 1.0)], [timed("a", None, outcome="oom")])
    assert by_run(result).loc["a", "status"] == "newly failing"
    assert result.regressions >= 1


def test_failing_in_both_and_recovering_are_reported_not_regressions(
        make_runs: Table, timed: Rows) -> None:
    baseline = [timed("a", None, outcome="oom"), timed("b", None, outcome="hang", tp=2)]
    current = [timed("a", None, outcome="oom"), timed("b", 1.0, tp=2)]
    result = gate(make_runs, baseline, current)
    assert by_run(result)["status"].to_dict() == {"a": "still failing", "b": "now completing"}
    assert result.regressions == 0


def test_a_configuration_absent_now_is_missing_and_one_absent_before_is_new(
        make_runs: Table, timed: Rows) -> None:
    result = gate(make_runs, [timed("a", 1.0), timed("b", 1.0, tp=2)],
                  [timed("a", 1.0), timed("c", 1.0, pp=2)])
    assert by_run(result)["status"].to_dict() == {
        "b": "missing", "a": "within tolerance", "c": "new"}
    assert result.regressions == 0


def test_configurations_match_on_their_layout_not_their_run_id(
        make_runs: Table, timed: Rows) -> None:
    result = gate(make_runs, [timed("old-id", 1.0)], [timed("new-id", 1.5)])
    row = result.runs.iloc[0]
    assert len(result.runs) == 1 and row["status"] == "slower"
    assert (row["ref_run_id"], row["cur_run_id"]) == ("old-id", "new-id")


def test_each_configuration_is_its_latest_completed_attempt(
        make_runs: Table, timed: Rows) -> None:
    current = [timed("a", 3.0, attempt=1), timed("a", 1.0, attempt=2),
               timed("a", None, attempt=3, outcome="crashed")]
    latest = latest_attempts(make_runs(current))
    assert list(latest["attempt"]) == [2]
    result = gate(make_runs, [timed("a", 1.0)], current)
    assert by_run(result).loc["a", "status"] == "within tolerance"
    assert by_run(result).loc["a", "cur_attempt"] == 2


# ------------------------------------------------------------------------ cells

def test_a_cell_compares_its_best_configuration_and_counts_its_runs_statuses(
        make_runs: Table, timed: Rows) -> None:
    baseline = [timed("a", 1.0), timed("b", 2.0, tp=2)]
    current = [timed("a", 1.0), timed("b", 4.0, tp=2)]
    cells = gate(make_runs, baseline, current).cells
    assert len(cells) == 1
    cell = cells.iloc[0]
    assert cell["status"] == "within tolerance"  # the best, "a", did not move
    assert (cell["runs slower"], cell["runs within tolerance"]) == (1, 1)


def test_a_cell_whose_every_configuration_fails_now_is_newly_failing(
        make_runs: Table, timed: Rows) -> None:
    cells = gate(make_runs, [timed("a", 1.0)], [timed("a", None, outcome="timeout")]).cells
    assert cells.iloc[0]["status"] == "newly failing"


# ------------------------------------------------------------------------ references files

@pytest.mark.parametrize("suffix", [".yaml", ".csv"])
def test_a_references_file_round_trips_the_baselines_expectations(
        make_runs: Table, timed: Rows, tmp_path: Path, suffix: str) -> None:
    runs = make_runs([timed("a", 1.0, std=0.02, n=8), timed("b", 2.5, tp=2, std=0.1, n=4),
                      timed("c", None, pp=2, outcome="oom")])
    path = tmp_path / f"references{suffix}"
    assert write_references(runs, path, tolerance=0.07) == 2  # the failed run has no reference
    read = read_references(path)
    direct = expected_from_runs(runs, 0.07)
    direct = direct[direct["value"].notna()]
    columns = ["value", "lower", "upper", "std", "n"]
    assert read[columns].to_numpy(dtype=float) == pytest.approx(direct[columns].to_numpy(dtype=float))
    assert list(read["run_id"]) == ["a", "b"] and set(read["level"]) == {"run"}
    # Compared with the sweep it came from, nothing changed.
    assert compare(read, runs).regressions == 0
    assert set(by_run(compare(read, runs))["status"]) == {"within tolerance", "new"}


def test_a_cell_reference_on_throughput_with_an_unbounded_upper_side(
        make_runs: Table, timed: Rows, tmp_path: Path) -> None:
    path = tmp_path / "cells.yaml"
    path.write_text(yaml.safe_dump({"references": [
        {"model": "tiny-4l", "nodes": 1, "metric": "tokens_per_sec_per_gpu", "value": 1024.0,
         "lower": -0.05, "upper": None}]}))
    expected = read_references(path)
    assert list(expected["level"]) == ["cell"]
    quicker = compare(expected, make_runs([timed("a", 0.25)])).cells.iloc[0]
    slower = compare(expected, make_runs([timed("a", 1.1)])).cells.iloc[0]
    assert quicker["status"] == "within tolerance"  # 4× the throughput, no upper bound
    assert slower["status"] == "slower"  # 9 % fewer tokens/s, below -5 %
    assert slower["test"] == "tolerance only: the metric is not the step time"


@pytest.mark.parametrize(("reference", "field", "says"), [
    ({"model": "m", "nodes": 1, "value": 1.0, "speed": 3}, "speed", "not a field"),
    ({"model": "m", "nodes": 1}, "value", "missing"),
    ({"model": "m", "nodes": 1, "value": "fast"}, "value", "not a number"),
    ({"model": "m", "nodes": 1, "value": 1.0, "lower": 0.05}, "lower", "above 0"),
    ({"model": "m", "nodes": 1, "value": 1.0, "upper": -0.05}, "upper", "below 0"),
    ({"model": "m", "nodes": 1, "value": 1.0, "metric": "mfu"}, "metric", "not one of"),
    ({"model": "m", "nodes": 1, "value": 1.0, "std": 0.1}, "n", "both"),
    ({"nodes": 1, "value": 1.0}, "model", "missing"),
    ({"model": "m", "nodes": 1, "value": 1.0, "dp": 2}, "seq_len", "every one of"),
])
def test_a_malformed_reference_names_the_file_the_row_the_field_and_the_fix(
        tmp_path: Path, reference: dict[str, Any], field: str, says: str) -> None:
    path = tmp_path / "refs.yaml"
    path.write_text(yaml.safe_dump({"references": [
        {"model": "m", "nodes": 2, "value": 1.0}, reference]}))
    with pytest.raises(UserError) as error:
        read_references(path)
    message = str(error.value)
    assert str(path) in message and "references[1]" in message
    assert f"field `{field}`" in message and says in message
    assert "docs/compare.md" in message


def test_a_malformed_csv_reference_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "refs.csv"
    path.write_text("model,nodes,value,lower,upper\nm,1,1.0,,0.05\nm,2,1.0,,-1\n")
    with pytest.raises(UserError, match=r"refs\.csv: row 3, field `upper`: .* below 0"):
        read_references(path)


def test_a_references_file_that_is_not_yaml_or_csv_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\*\.yaml or \*\.csv"):
        read_references(tmp_path / "refs.json")


def test_a_file_without_a_references_list_says_what_it_expected(tmp_path: Path) -> None:
    path = tmp_path / "refs.yaml"
    path.write_text("model: m\n")
    with pytest.raises(UserError, match=r"refs\.yaml: field `references`: expected a list"):
        read_references(path)


# ------------------------------------------------------------------------ the written files

def test_the_comparison_is_written_as_csv_markdown_and_a_figure(
        make_runs: Table, timed: Rows, tmp_path: Path) -> None:
    result = gate(make_runs, [timed("a", 1.0), timed("b", 1.0, tp=2), timed("d", 1.0, pp=2)],
                  [timed("a", 1.5), timed("b", None, tp=2, outcome="oom")])
    written = write_comparison(result, tmp_path / "compare")
    table = pd.read_csv(written.runs_csv)
    assert dict(zip(table["run_id"], table["status"])) == {
        "a": "slower", "b": "newly failing", "d": "missing"}
    assert set(MATCH_KEY) <= set(table.columns)
    text = (tmp_path / "compare" / MARKDOWN).read_text()
    assert "REGRESSION" in text and "Welch's t-test" in text and "latest completed attempt" in text
    assert (tmp_path / "compare" / FIGURE).read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "compare" / RUNS_CSV) == written.runs_csv


def test_the_references_files_shown_in_the_docs_read_as_they_say(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text()
    blocks = {kind: page.split(f"```{kind}\n", 1)[1].split("```", 1)[0] for kind in ("yaml", "text")}
    (tmp_path / "refs.yaml").write_text(blocks["yaml"])
    (tmp_path / "refs.csv").write_text(blocks["text"])
    from_yaml = read_references(tmp_path / "refs.yaml")
    assert list(from_yaml["level"]) == ["run", "cell"]
    assert (from_yaml["upper"].iloc[0], np.isnan(from_yaml["upper"].iloc[1])) == (4.0, True)
    from_csv = read_references(tmp_path / "refs.csv")
    assert list(from_csv["level"]) == ["cell"]
    assert from_csv["metric"].iloc[0] == "tokens_per_sec_per_gpu"


def test_a_large_comparisons_markdown_leaves_what_is_within_tolerance_to_the_csv(
        make_runs: Table, timed: Rows, tmp_path: Path) -> None:
    baseline = [timed(f"r{i}", 1.0, mbs=i + 1) for i in range(MARKDOWN_ALL_ROWS + 5)]
    current = [timed(f"r{i}", 1.6 if i == 0 else 1.0, mbs=i + 1)
               for i in range(MARKDOWN_ALL_ROWS + 5)]
    written = write_comparison(gate(make_runs, baseline, current), tmp_path)
    text = written.markdown.read_text()
    assert f"{MARKDOWN_ALL_ROWS + 4} configuration(s) within tolerance are in compare.csv" in text
    assert text.count("| within tolerance |") == 1  # the cell's row only
    assert len(pd.read_csv(written.runs_csv)) == MARKDOWN_ALL_ROWS + 5
