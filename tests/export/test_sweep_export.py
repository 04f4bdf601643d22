"""A sweep exported to real trackers, end to end: `sweep run` of a spec with an `export:`
section sends every attempt to an MLflow tracking server that the test starts (SQLite store,
local artifact root, free port) and to W&B in offline mode; both are read back through the
trackers' own formats (MLflow's client; W&B's protobuf records in its run files). A second
export changes nothing; no credential reaches the sweep folder; an unreachable tracker never
fails a sweep.

The sweeps are the tiny CPU spec of tests/specs.py (two runs, about 15 s each), not the README's
demo: the demo's spec has no `export:` section, and the export is part of what is tested."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sweep.cli import main
from sweep.export.records import KEY_TAG
from sweep.search.driver import export_if_asked
from tests.export.mlflow_server import closed_port, mlflow_server
from tests.export.wandb_files import OfflineRun, offline_runs
from tests.specs import tiny_cpu_spec

pytestmark = pytest.mark.slow

MLFLOW_SECRET = "mlflow-secret-token-5be1c0de9f"
WANDB_SECRET = "0123456789abcdef0123456789abcdef5ec2e7ff"  # a W&B API key is 40 hex characters
PROJECT = "sweep-tests/export"


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture(scope="module")
def tracker_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """W&B offline, every folder of it in tmp; fake credentials of both trackers in the
    environment, as a user's would be. Yields WANDB_DIR."""
    wandb_dir = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        for name, sub in (("WANDB_DIR", ""), ("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                          ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")):
            patch.setenv(name, str(wandb_dir / sub))
        patch.setenv("MLFLOW_TRACKING_TOKEN", MLFLOW_SECRET)
        patch.setenv("WANDB_API_KEY", WANDB_SECRET)
        yield wandb_dir


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str, tracker_env: Path) -> Path:
    """A two-run sweep whose spec exports to both trackers, run with `sweep run`."""
    folder = tmp_path_factory.mktemp("exported")
    spec = tiny_cpu_spec(folder / "spec.yaml", "export-e2e", axes={"mbs": [1, 2]},
                         export={"to": [f"mlflow:{mlflow_uri}", f"wandb:{PROJECT}"]})
    assert main(["run", str(spec), "--out", str(folder / "sweep")]) == 0
    return folder / "sweep"


def _mlflow_runs(uri: str, sweep: str) -> list[Any]:  # mlflow.entities.Run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(sweep)
    assert experiment is not None, f"no MLflow experiment named {sweep}"
    return client.search_runs([experiment.experiment_id], max_results=1000)


def _mlflow_files(uri: str, run_id: str, path: str | None = None) -> dict[str, int]:
    from mlflow.tracking import MlflowClient

    files: dict[str, int] = {}
    for info in MlflowClient(uri).list_artifacts(run_id, path):
        files.update(_mlflow_files(uri, run_id, info.path) if info.is_dir
                     else {info.path: info.file_size})
    return files


def _runs_table(folder: Path) -> pd.DataFrame:
    return pd.read_parquet(folder / "runs.parquet")


def test_every_attempt_reaches_mlflow_with_its_parameters_metrics_tags_and_files(
        exported: Path, mlflow_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    table = _runs_table(exported)
    runs = {run.data.tags[KEY_TAG]: run for run in _mlflow_runs(mlflow_uri, "export-e2e")}
    assert len(table) == 2 and set(runs) == {f"export-e2e/{r.run_id}/{r.attempt}"
                                             for r in table.itertuples()} | {"export-e2e/report"}
    for row in table.itertuples():
        run = runs[f"export-e2e/{row.run_id}/{row.attempt}"]
        assert run.info.status == "FINISHED" and row.outcome == "completed"
        params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
        assert {k: params[k] for k in ("dp", "tp", "pp", "mbs", "zero_stage", "model", "nodes")} == {
            "dp": str(row.dp), "tp": str(row.tp), "pp": str(row.pp), "mbs": str(row.mbs),
            "zero_stage": str(row.zero_stage), "model": row.model, "nodes": str(row.nodes)}
        assert params["settings.steps"] == "3" and params["settings.mem"] == "800M"
        assert metrics["tokens_per_sec"] == pytest.approx(row.tokens_per_sec)
        for convention in ("megatron", "full_attention", "6N"):
            assert metrics[f"mfu_{convention}"] == pytest.approx(getattr(row, f"mfu_{convention}"))
        assert metrics["mem_allocated_bytes"] == pytest.approx(row.mem_allocated_bytes)
        history = MlflowClient(mlflow_uri).get_metric_history(run.info.run_id, "step_time_s")
        assert sorted(m.step for m in history) == [1, 2, 3]
        assert tags["outcome"] == "completed" and tags["rule"] == row.rule
        assert tags["evidence"] == "\n".join(row.evidence) and tags["framework"] == "builtin"
        assert tags["framework_version"] == row.framework_version and tags["node_list"] == row.node_list
        files = _mlflow_files(mlflow_uri, run.info.run_id)
        attempt_dir = exported / row.attempt_dir
        assert files["run/job.sbatch"] == (exported / "runs" / row.run_id / "job.sbatch").stat().st_size
        assert files["run/run.json"] == (exported / "runs" / row.run_id / "run.json").stat().st_size
        assert files["attempt/logs/node0.out"] == (attempt_dir / "logs" / "node0.out").stat().st_size
        assert {"attempt/status.json", "attempt/metrics.jsonl", "attempt/job.out"} <= set(files)
    report = _mlflow_files(mlflow_uri, runs["export-e2e/report"].info.run_id)
    assert report["report/heatmap_best.png"] == (exported / "report" / "heatmap_best.png").stat().st_size


def _wandb_by_key(wandb_dir: Path) -> dict[str, OfflineRun]:
    return {run.config["tags"][KEY_TAG]: run for run in offline_runs(wandb_dir)}


def test_every_attempt_reaches_wandb_offline_as_a_run_of_the_sweeps_group(
        exported: Path, tracker_env: Path) -> None:
    table = _runs_table(exported)
    runs = _wandb_by_key(tracker_env)
    assert set(runs) == {f"export-e2e/{r.run_id}/{r.attempt}" for r in table.itertuples()} | {
        "export-e2e/report"}
    for row in table.itertuples():
        run = runs[f"export-e2e/{row.run_id}/{row.attempt}"]
        assert (run.group, run.entity, run.project, run.job_type) == (
            "export-e2e", "sweep-tests", "export", "attempt")
        assert run.config["mbs"] == str(row.mbs) and run.config["dp"] == str(row.dp)
        assert run.config["tags"]["rule"] == row.rule and "outcome:completed" in run.tags
        assert run.summary["tokens_per_sec"] == pytest.approx(row.tokens_per_sec)
        assert run.summary["mfu_6N"] == pytest.approx(row.mfu_6N)
        assert [h["_step"] for h in run.history if "step_time_s" in h] == [1, 2, 3]
        assert run.artifact_files["run/job.sbatch"] == (
            exported / "runs" / row.run_id / "job.sbatch").stat().st_size
        assert "attempt/logs/node0.out" in run.artifact_files and run.exit_code == 0
    assert "report/heatmap_best.png" in runs["export-e2e/report"].artifact_files


def test_a_second_export_changes_nothing(exported: Path, mlflow_uri: str, tracker_env: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    before = {r.info.run_id: (r.data.tags, r.data.metrics, r.data.params)
              for r in _mlflow_runs(mlflow_uri, "export-e2e")}
    wandb_before = sorted((tracker_env / "wandb").glob("offline-run-*"))
    capsys.readouterr()
    assert main(["export", str(exported)]) == 0  # the trackers of the spec's export: section
    said = capsys.readouterr().out
    assert said.count("0 run(s) created, 0 updated, 3 unchanged") == 2, said
    after = {r.info.run_id: (r.data.tags, r.data.metrics, r.data.params)
             for r in _mlflow_runs(mlflow_uri, "export-e2e")}
    assert after == before
    assert sorted((tracker_env / "wandb").glob("offline-run-*")) == wandb_before


def test_a_changed_attempt_updates_its_run_and_adds_none(
        exported: Path, mlflow_uri: str, tracker_env: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    row = _runs_table(exported).iloc[0]
    log = exported / row["attempt_dir"] / "logs" / "node0.out"
    log.write_text(log.read_text() + "a line written after the first export\n")
    capsys.readouterr()
    assert main(["export", str(exported), "--to", f"mlflow:{mlflow_uri}"]) == 0
    assert "0 run(s) created, 1 updated, 2 unchanged; 1 file(s) uploaded" in capsys.readouterr().out
    runs = [r for r in _mlflow_runs(mlflow_uri, "export-e2e")
            if r.data.tags[KEY_TAG] == f"export-e2e/{row['run_id']}/{row['attempt']}"]
    assert len(runs) == 1
    assert _mlflow_files(mlflow_uri, runs[0].info.run_id)["attempt/logs/node0.out"] == log.stat().st_size


def test_no_credential_is_written_to_any_file_of_the_sweep(exported: Path) -> None:
    files = [p for p in exported.rglob("*") if p.is_file()]
    assert len(files) > 30  # the runs, their attempts and logs, the report, the export ledger
    for path in files:
        data = path.read_bytes()
        assert MLFLOW_SECRET.encode() not in data and WANDB_SECRET.encode() not in data, path


def test_a_sweep_whose_tracker_does_not_answer_completes_and_says_how_to_retry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port, folder = closed_port(), tmp_path / "sweep"
    spec = tiny_cpu_spec(tmp_path / "spec.yaml", "export-down",
                         export={"to": [f"mlflow:http://127.0.0.1:{port}"]})
    assert main(["run", str(spec), "--out", str(folder)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"mlflow:http://127.0.0.1:{port}: export failed: mlflow at http://127.0.0.1:{port} " \
           "does not answer" in said
    assert f"retry with `sweep export {folder}`" in said
    assert list(_runs_table(folder)["outcome"]) == ["completed"]
    # the detached driver's end-of-sweep step says the same, and does not fail either
    assert export_if_asked(folder) is False
    assert "does not answer" in capsys.readouterr().err


def test_the_drivers_end_of_sweep_step_exports_what_the_spec_asks(
        exported: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export_if_asked(exported) is True
    assert "unchanged" in capsys.readouterr().out


def test_a_tracker_client_is_imported_only_when_exporting() -> None:
    import subprocess
    import sys

    code = ("import sys, sweep.cli, sweep.commands.status, sweep.commands.export, "
            "sweep.export.sweep_export, sweep.export.base, sweep.export.records; "
            "print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.stdout.strip() == "[]"
