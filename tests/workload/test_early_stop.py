"""Early stop in the built-in workload: it ends itself at steady state, the budget stays the cap.

The assertions are about which rule ended a run, never about timings: the machine running the
tests may be loaded, so the steady rule here is loose (CV < 0.5 over 3 steps) and the budget large.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sweep.collect.attempts import collect_sweep
from sweep.core.state import read_json, read_jsonl
from tests.workload.runs import REPO, launch, run_config, workload_env, write_run_dir

LOOSE = {"window": 3, "max_cv": 0.5}
BUDGET = 300


def test_two_ranks_under_the_watchdog_stop_together_at_steady_state_and_the_run_is_completed(
        tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path / "runs", run_config(dp=2, steps=BUDGET, warmup_steps=1,
                                                 settings={"early_stop": LOOSE, "startup_timeout_s": 120}))
    attempt = run_dir / "attempts" / "1"
    attempt.mkdir(parents=True)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "-m", "sweep.workload", "--run-dir", str(run_dir)]
    proc = subprocess.run(
        [sys.executable, "-m", "sweep.job.watchdog", "--run-dir", str(run_dir), "--attempt-dir", str(attempt),
         "--poll-s", "0.1", "--node-wait-s", "0", "--shm-dir", str(tmp_path / "shm"),
         "--tmp-dir", str(tmp_path / "tmp"), "--", *launcher],
        capture_output=True, text=True, timeout=300, env=workload_env(), cwd=REPO)
    status = read_json(attempt / "status.json")
    assert status is not None, proc.stderr[-4000:]
    err = (attempt / "logs" / "node0.err").read_text()
    assert (proc.returncode, status["outcome"], status["rule"]) == (0, "completed", "clean_exit"), err[-4000:]
    assert status["ended_by"] == "steady_state"
    records = list(read_jsonl(attempt / "metrics.jsonl"))
    steps, summary = records[:-1], records[-1]
    assert summary["kind"] == "summary" and summary["ended_by"] == "steady_state"
    assert 1 + LOOSE["window"] <= summary["steps"] == len(steps) < BUDGET
    rule = summary["early_stop"]
    assert rule["window"] == 3 and rule["max_cv"] == 0.5 and rule["cv"] < 0.5
    assert (rule["first_step"], rule["last_step"]) == (len(steps) - 2, len(steps))
    assert "steps=" + str(len(steps)) in (attempt / "logs" / "node0.out").read_text()
    (row,) = collect_sweep(tmp_path).table.to_pylist()
    assert (row["outcome"], row["ended_by"], row["step_time_n"]) == ("completed", "steady_state", len(steps) - 1)


def test_the_step_budget_stays_the_cap_and_the_summary_says_so(tmp_path: Path) -> None:
    strict = {"window": 2, "max_cv": 1e-12}  # two CPU step times never agree to 1e-12
    run_dir = write_run_dir(tmp_path, run_config(steps=4, warmup_steps=1, settings={"early_stop": strict}))
    proc = launch(run_dir, 0)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = list(read_jsonl(run_dir / "metrics.jsonl"))[-1]
    assert (summary["ended_by"], summary["steps"]) == ("step_budget", 4)
    assert summary["early_stop"]["cv"] >= 1e-12 and summary["early_stop"]["last_step"] == 4


def test_a_bad_early_stop_in_run_json_is_a_clear_error(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, run_config(settings={"early_stop": {"window": 1, "max_cv": 0.1}}))
    proc = launch(run_dir, 0)
    assert proc.returncode == 2
    assert "run.json settings.early_stop.window: Input should be greater than or equal to 2" in proc.stderr
