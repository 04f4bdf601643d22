"""`sweep run`: the README's main job, a whole sweep on this machine, end to end.

Real processes throughout: the local backend runs each rendered job.sbatch, which starts one
watchdog per emulated node, torchrun and the built-in workload on gloo.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from sweep.cli import main
from sweep.core.state import SEARCH_PROGRESS_FILE, attempt_dirs, read_json
from sweep.models.throughput import Coefficients, predict
from sweep.plan.predictions import workloads_for
from sweep.plan.spec import load_spec
from sweep.search.live_search import SEARCH_RUNS_FILE, outcomes_from_runs

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "local-cpu.yaml"
BEST_COLUMNS = ["model", "nodes", "dp", "tp", "pp", "cp", "ep", "mbs", "grad_acc", "zero_stage",
                "recompute", "mfu_pct", "tokens_per_sec_per_gpu", "gpu_memory_GB"]


def attempts_by_run(sweep_dir: Path) -> dict[str, int]:
    return {d.name: len(attempt_dirs(d)) for d in sorted((sweep_dir / "runs").iterdir())}


def alive_job(attempt: Path) -> bool:
    """Whether the batch shell the local backend recorded for this attempt still runs."""
    record = read_json(attempt / "local_job.json")
    if not record or (attempt / "local_sacct.json").exists():
        return False
    try:
        return psutil.Process(record["pid"]).create_time() == record["create_time"]
    except psutil.Error:
        return False


def outcome(run_dir: Path) -> str | None:
    attempts = attempt_dirs(run_dir)
    status = read_json(attempts[-1] / "status.json") if attempts else None
    return status["outcome"] if status else None


@pytest.fixture
def demo(demo_sweep: Path) -> Path:
    """The README's demo sweep, run once per session (tests/conftest.py's demo_sweep)."""
    return demo_sweep


@pytest.mark.slow
def test_the_demo_completes_with_metrics_and_its_deliberate_oom(demo: Path) -> None:
    runs = pd.read_parquet(demo / "runs.parquet")
    assert len(runs) == 11 and runs["run_id"].is_unique
    oom = runs[runs["outcome"] == "oom"]
    assert list(zip(oom["model"], oom["nodes"], oom["dp"])) == [("tiny-gqa-4l", 1, 2)]
    evidence = "\n".join(oom["evidence"].iloc[0])
    assert "DefaultCPUAllocator: can't allocate memory" in evidence
    completed = runs[runs["outcome"] == "completed"]
    assert len(completed) == 10
    assert (completed["tokens_per_sec_per_gpu"] > 0).all()
    assert (completed["step_time_n"] >= 1).all()
    assert (completed["mfu_full_attention"] > 0).all()
    for run_dir in (demo / "runs").iterdir():
        attempt = attempt_dirs(run_dir)[-1]
        assert (attempt / "status.json").is_file() and (attempt / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_the_demo_report_has_the_heatmap_and_the_best_config_tables(demo: Path) -> None:
    report = demo / "report"
    for stem in ("heatmap_best", "scaling", "failures", "mfu_distribution"):
        for suffix in (".png", ".pdf", ".svg"):
            assert (report / f"{stem}{suffix}").stat().st_size > 1000, stem + suffix
    best = pd.read_csv(report / "best_configs.csv")
    assert list(best.columns) == BEST_COLUMNS
    assert sorted(zip(best["model"], best["nodes"])) == [
        ("tiny-4l", 1), ("tiny-4l", 2), ("tiny-gqa-4l", 1), ("tiny-gqa-4l", 2)]
    runs = pd.read_parquet(demo / "runs.parquet")
    # The tiny-gqa-4l cell on one node has one OOM and one completed run: the completed one wins.
    gqa1 = best[(best["model"] == "tiny-gqa-4l") & (best["nodes"] == 1)].iloc[0]
    assert (gqa1["dp"], gqa1["tp"]) == (1, 2)
    assert gqa1["tokens_per_sec_per_gpu"] == pytest.approx(runs[
        (runs["model"] == "tiny-gqa-4l") & (runs["nodes"] == 1)
        & (runs["outcome"] == "completed")]["tokens_per_sec_per_gpu"].iloc[0], rel=1e-12)
    assert "heatmap_best.png" in (report / "index.html").read_text()


@pytest.mark.slow
def test_running_a_finished_sweep_again_does_nothing(
        demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = attempts_by_run(demo)
    assert main(["run", str(DEMO), "--out", str(demo), "--no-report"]) == 0
    assert attempts_by_run(demo) == before
    assert "11 already have a verdict" in capsys.readouterr().out


@pytest.mark.slow
def test_adaptive_finds_the_exhaustive_best_of_every_cell(
        demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Adaptive over the demo's measured runs (a copy: nothing runs twice, so measurement noise
    cannot decide the comparison) picks, in every cell, the run exhaustive found best."""
    copy = tmp_path / "adaptive"
    shutil.copytree(demo, copy, ignore=shutil.ignore_patterns("report", "runs.parquet"))
    assert main(["run", str(DEMO), "--out", str(copy), "--strategy", "adaptive"]) == 0
    assert "adaptive: launched" in capsys.readouterr().out
    fates = pd.read_csv(copy / SEARCH_RUNS_FILE)
    assert set(fates["fate"]) <= {"launched", "skipped"} and len(fates) == 11
    assert (fates.loc[fates["fate"] == "skipped", "reason"].astype(str).str.len() > 0).all()
    progress = pd.read_csv(copy / SEARCH_PROGRESS_FILE)
    assert progress["candidates"].sum() == 11
    runs = pd.read_parquet(demo / "runs.parquet")
    ok = runs[runs["outcome"] == "completed"]
    exhaustive = ok.loc[ok.groupby(["model", "nodes"])["tokens_per_sec_per_gpu"].idxmax()]
    launched = ok[ok["run_id"].isin(fates.loc[fates["fate"] == "launched", "run_id"])]
    found = launched.loc[launched.groupby(["model", "nodes"])["tokens_per_sec_per_gpu"].idxmax()]
    assert sorted(found["run_id"]) == sorted(exhaustive["run_id"])


@pytest.mark.slow
def test_shortlist_runs_the_plans_fastest_predicted_candidate_of_every_cell(
        demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--strategy shortlist --top 1` over the demo's measured runs (a copy: nothing runs twice):
    per cell, the candidate the plan predicts fastest, and the next only where it failed. The
    plan predicts with the sweep's calibration (throughput.json), here one that ranks every cell
    differently from the default prior: the shortlist follows the plan, not its own prior."""
    copy = tmp_path / "shortlist"
    shutil.copytree(demo, copy, ignore=shutil.ignore_patterns("report", "runs.parquet"))
    optimizer_bound = {"optimizer": Coefficients().optimizer * 1e4}
    (copy / "throughput.json").write_text(json.dumps({"coefficients": optimizer_bound}))
    assert main(["run", str(DEMO), "--out", str(copy), "--strategy", "shortlist",
                 "--top", "1"]) == 0
    assert "shortlist: launched" in capsys.readouterr().out
    fates = pd.read_csv(copy / SEARCH_RUNS_FILE)
    assert len(fates) == 11
    skipped = fates[fates["fate"] == "skipped"]
    assert skipped["reason"].str.startswith("shortlist: 1 runs predicted faster").all()
    plan = pd.read_parquet(copy / "plan.parquet").query("status == 'kept'")
    workloads = workloads_for(load_spec(DEMO))
    launched = fates[fates["fate"] == "launched"]
    for (model, nodes), cell in plan.groupby(["model", "nodes"]):
        ran = launched[(launched["model"] == model) & (launched["nodes"] == nodes)]
        assert (ran["status"] == "completed").sum() == 1
        first = cell.loc[cell["pred_tokens_per_s_per_gpu"].idxmax(), "run_id"]
        assert first in set(ran["run_id"])
        by_prior = predict(cell, workloads[model])["pred_tokens_per_s_per_gpu"]
        assert cell.loc[by_prior.idxmax(), "run_id"] != first  # the calibration decided


@pytest.mark.slow
@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_an_interrupted_sweep_finishes_the_rest_without_redoing_completed_runs(
        kill: signal.Signals, tmp_path: Path) -> None:
    """TERM (kill, Ctrl-C) cancels the jobs on the way out; KILL leaves them running, and the
    next `sweep run` ends them (as scancel would) before it runs what has no verdict."""
    spec = yaml.safe_load(DEMO.read_text())
    spec.update(name="interrupted", models=["tiny-4l"], nodes=[1], overrides=[])
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sweep"
    argv = [sys.executable, "-m", "sweep.cli", "run", str(spec_path), "--out", str(out),
            "--no-report"]
    first = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        runs = list((out / "runs").glob("*")) if (out / "runs").is_dir() else []
        if any(outcome(d) == "completed" for d in runs):
            break
        time.sleep(0.5)
    assert first.poll() is None, first.communicate()[0]
    first.send_signal(kill)
    log = first.communicate(timeout=60)[0]
    assert first.returncode != 0, log
    done = {d.name for d in (out / "runs").iterdir() if outcome(d) == "completed"}
    assert 1 <= len(done) < 3, log
    if kill == signal.SIGTERM:
        leftovers = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
        assert leftovers.stdout.strip() == "", "processes of the cancelled jobs survived"

    orphaned = [d for d in (out / "runs").iterdir() if attempt_dirs(d)
                and outcome(d) is None and alive_job(attempt_dirs(d)[-1])]
    again = subprocess.run(argv, cwd=REPO, check=True, capture_output=True, text=True,
                           timeout=400)
    if orphaned:  # KILL left a job running: the second run ended it before going on
        assert f"ended {len(orphaned)} job(s)" in again.stdout, again.stdout
    counts = attempts_by_run(out)
    assert all(outcome(out / "runs" / name) == "completed" for name in counts), again.stdout
    assert all(counts[name] == 1 for name in done), counts  # never redone
    leftovers = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "an orphaned job outlived the second run"


def test_a_second_runner_on_the_same_sweep_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sweep.backends.local.backend import runner_lock

    out = tmp_path / "sweep"
    with runner_lock(out):
        assert main(["run", str(DEMO), "--out", str(out), "--no-report"]) == 2
    assert "another `sweep run`" in capsys.readouterr().err
    assert not list((out / "runs").glob("*/attempts/*"))  # nothing ran


def test_a_run_with_no_attempt_or_no_throughput_is_a_failure_to_the_search() -> None:
    runs = pd.DataFrame({
        "run_id": ["a", "a", "b", "c", "d"], "attempt": [1, 2, 1, 1, 1],
        "outcome": ["cancelled", "completed", "oom", "completed", "hang"],
        "tokens_per_sec_per_gpu": [None, 10.0, None, None, None],
        "gpu_hours": [0.1, 0.2, 0.05, 0.3, 0.4]})
    answer = outcomes_from_runs(runs, ["a", "b", "c", "d", "never-ran"])
    assert list(answer["status"]) == ["completed", "oom", "failed", "failed", "failed"]
    assert answer["tokens_per_s_per_gpu"].iloc[0] == 10.0
    assert answer["tokens_per_s_per_gpu"].iloc[1:].isna().all()
    assert list(answer["gpu_hours"]) == [0.2, 0.05, 0.3, 0.4, 0.0]


def test_bad_slots_are_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(DEMO), "--out", str(tmp_path / "x"), "--slots", "0"]) == 2
    assert "--slots" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_invalid_spec_is_one_clear_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    spec = yaml.safe_load(DEMO.read_text())
    spec["nodes"] = [0]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["run", str(path), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "nodes" in err
    assert not (tmp_path / "x").exists()



def test_top_without_the_shortlist_is_refused_before_anything_is_planned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert main(["run", str(DEMO), "--out", str(out), "--strategy", "pruned", "--top", "2"]) == 2
    assert "--top applies to --strategy shortlist" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("visible", "message"), [
    ("", "gpu: h100-sxm asks for GPUs, and this machine shows none"),
    ("0,1,2", "runs of up to 4 GPUs (2 node(s) × gpus_per_node 2), and this machine has 3"),
])
def test_a_gpu_spec_needs_the_gpus_its_runs_ask_for_on_this_machine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        visible: str, message: str) -> None:
    """`sweep run` hands this machine's GPUs to its jobs (sweep.backends.local.backend); where there are too few,
    it says so before any run starts, instead of a failure per run."""
    spec = yaml.safe_load(DEMO.read_text())
    spec.update(gpu="h100-sxm", dtype="bf16")
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert main(["run", str(path), "--out", str(tmp_path / "x")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "gpu.yaml" in err and message in err
    assert not list((tmp_path / "x").glob("runs/*/attempts/*"))  # nothing ran
