"""`sweep compare`: the regression gate end to end, on two real sweeps of the demo.

The demo (examples/local-cpu.yaml) runs twice, unchanged, on this machine (the session's run
and one more): the real run-to-run variation of CPU timings under whatever else the machine
runs is the noise the gate must not flag. The slowdown is injected: one configuration's
measured step times are scaled in a copy of the second sweep's runs.parquet, as if every one of
its steps had taken twenty times as long (the CPU default tolerance, docs/compare.md, lets a
configuration take 5 times as long as the rest of its sweep would have it: that is how much
this shared machine's load moves one run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.compare_output import CELLS_CSV, FIGURE, MARKDOWN, RUNS_CSV
from sweep.cli import main

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "local-cpu.yaml"
SLOWDOWN = 20.0


@pytest.fixture(scope="module")
def demo_sweeps(demo_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo twice, unchanged: the session's run (tests/conftest.py's demo_sweep, which
    tests/commands/test_run.py checks) and one more here (about 3 minutes)."""
    second = tmp_path_factory.mktemp("current") / "local-cpu"
    assert main(["run", str(DEMO), "--out", str(second), "--no-report"]) == 0
    return demo_sweep, second


def steadiest_run(baseline: pd.DataFrame, current: pd.DataFrame) -> str:
    """The completed configuration whose steps scatter least on both sides (the larger of its
    two coefficients of variation is the smallest): with 4 steady-state steps a run, the
    steadier the configuration, the clearer Welch's test sees its slowdown."""
    def cv(runs: pd.DataFrame) -> pd.Series:
        done = runs[runs["outcome"] == "completed"]
        return (done["step_time_std_s"] / done["step_time_mean_s"]).set_axis(done["run_id"])
    both = pd.concat([cv(baseline), cv(current)], axis=1).dropna().max(axis=1)
    return str(both.idxmin())


def slowed_copy(sweep: Path, out: Path, run_id: str, factor: float) -> Path:
    """A copy of `sweep`'s runs.parquet in which `run_id`'s step times (mean and spread) are
    `factor` times longer and its throughput and MFU `factor` times lower: the injected slowdown."""
    runs = pd.read_parquet(sweep / "runs.parquet")
    chosen = runs["run_id"] == run_id
    assert chosen.sum() == 1
    for column in ("step_time_mean_s", "step_time_std_s"):
        runs.loc[chosen, column] *= factor
    for column in [c for c in runs.columns
                   if c.startswith("tokens_per_sec") or c.startswith("mfu_")]:
        if pd.api.types.is_float_dtype(runs[column]):
            runs.loc[chosen, column] /= factor
    out.mkdir(parents=True)
    runs.to_parquet(out / "runs.parquet")
    return out


@pytest.mark.slow
def test_two_unchanged_demo_sweeps_pass_the_gate(
        demo_sweeps: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    baseline, current = demo_sweeps
    code = main(["compare", str(baseline), str(current)])
    out = capsys.readouterr().out
    compared = pd.read_csv(current / "compare" / RUNS_CSV)
    assert code == 0, out
    assert "no regression" in out
    assert not compared["status"].isin(["slower", "newly failing"]).any()
    # Every configuration of the demo is matched: none is missing or new.
    assert len(compared) == len(pd.read_parquet(baseline / "runs.parquet")) == 11
    assert not compared["status"].isin(["missing", "new"]).any()
    # The deliberate OOM fails in both sweeps: reported, not a regression.
    oom = compared[compared["baseline_outcome"] == "oom"]
    assert list(oom["status"]) == ["still failing"]
    for name in (RUNS_CSV, CELLS_CSV, MARKDOWN, FIGURE):
        assert (current / "compare" / name).stat().st_size > 200, name


@pytest.mark.slow
def test_a_slowdown_injected_into_one_configuration_fails_the_gate_and_names_it(
        demo_sweeps: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    baseline, current = demo_sweeps
    slowed = steadiest_run(pd.read_parquet(baseline / "runs.parquet"),
                           pd.read_parquet(current / "runs.parquet"))
    injected = slowed_copy(current, tmp_path / "slowed", slowed, SLOWDOWN)
    code = main(["compare", str(baseline), str(injected), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1, out
    compared = pd.read_csv(tmp_path / "out" / RUNS_CSV)
    regressions = compared[compared["status"].isin(["slower", "newly failing"])]
    assert list(regressions["run_id"]) == [slowed]
    row = regressions.iloc[0]
    assert row["status"] == "slower" and row["test"] == "welch" and row["p_value"] < 0.05
    assert "REGRESSION" in out and row["layout_label"] in out
    assert "Welch's t-test" in (tmp_path / "out" / MARKDOWN).read_text()


@pytest.mark.slow
def test_a_configuration_that_completed_and_now_fails_is_a_regression(
        demo_sweeps: tuple[Path, Path], tmp_path: Path) -> None:
    baseline, current = demo_sweeps
    runs = pd.read_parquet(current / "runs.parquet")
    broken = runs[runs["outcome"] == "completed"]["run_id"].iloc[0]
    runs.loc[runs["run_id"] == broken, "outcome"] = "crashed"
    (tmp_path / "crashed").mkdir()
    runs.to_parquet(tmp_path / "crashed" / "runs.parquet")
    assert main(["compare", str(baseline), str(tmp_path / "crashed")]) == 1
    compared = pd.read_csv(tmp_path / "crashed" / "compare" / RUNS_CSV).set_index("run_id")
    assert compared.loc[broken, "status"] == "newly failing"
    assert compared.loc[broken, "current_outcome"] == "crashed"


@pytest.mark.slow
def test_a_references_file_written_from_one_sweep_gates_the_next(
        demo_sweeps: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    baseline, current = demo_sweeps
    references = tmp_path / "references.yaml"
    assert main(["compare", "--write-references", str(references), str(baseline)]) == 0
    assert "10 reference(s)" in capsys.readouterr().out  # the 10 completed configurations
    assert main(["compare", str(references), str(current), "--out", str(tmp_path / "a")]) == 0
    slowed = steadiest_run(pd.read_parquet(baseline / "runs.parquet"),
                           pd.read_parquet(current / "runs.parquet"))
    injected = slowed_copy(current, tmp_path / "slowed", slowed, SLOWDOWN)
    assert main(["compare", str(references), str(injected), "--out", str(tmp_path / "b")]) == 1


@pytest.mark.slow
def test_a_configuration_absent_from_the_current_sweep_is_reported_missing(
        demo_sweeps: tuple[Path, Path], tmp_path: Path) -> None:
    baseline, current = demo_sweeps
    partial = tmp_path / "partial"
    shutil.copytree(current, partial, ignore=shutil.ignore_patterns("runs", "compare"))
    runs = pd.read_parquet(current / "runs.parquet")
    gone = runs["run_id"].iloc[-1]
    runs[runs["run_id"] != gone].to_parquet(partial / "runs.parquet")
    assert main(["compare", str(baseline), str(partial)]) == 0  # reported, not a regression
    compared = pd.read_csv(partial / "compare" / RUNS_CSV).set_index("run_id")
    assert compared.loc[gone, "status"] == "missing"


def test_a_missing_sweep_is_a_user_error_naming_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "nowhere"), str(tmp_path)]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_write_references_takes_exactly_one_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--write-references", str(tmp_path / "r.yaml"),
                 str(tmp_path), str(tmp_path)]) == 2
    assert "takes one sweep folder" in capsys.readouterr().err


def test_a_significance_level_outside_zero_and_one_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path), str(tmp_path), "--alpha", "5"]) == 2
    assert "--alpha" in capsys.readouterr().err
