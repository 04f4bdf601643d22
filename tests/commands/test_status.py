"""`sweep status` output from one observation (no cluster), and on the local cluster, at every
phase of a detached sweep (before submit, submitted, driver running, finished), each line
checked against the sweep folder's files."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from sweep.backends.slurm.observation import Observation
from sweep.backends.slurm.submission import RunState
from sweep.backends.slurm.submit_record import read_submit
from sweep.backends.slurm.sweep_folder import SEARCH_RUNS_FILE, RunInfo, skipped_by_search, time_seconds
from sweep.cli import main
from sweep.commands.status import calibration_line, gpu_hours, render
from sweep.search.driver import read_progress, read_record
from sweep.search.round_calibration import read_rounds
from tests.slurm_sweeps import job_path

__all__ = ["job_path"]  # a fixture


def observation() -> Observation:
    infos = {r: RunInfo(r, "8b", 2, 16, 3600) for r in ("a", "b", "c", "d", "e")}
    states = [RunState("a", "completed", elapsed_s=1800.0, task="7_0", attempt=1),
              RunState("b", "completed", elapsed_s=900.0, task="7_1", attempt=1),
              RunState("c", "node_fail", reason="sacct: slurm_node_fail", elapsed_s=60.0,
                       task="7_2", attempt=1, nodes=("node2",)),
              RunState("d", "running", task="7_3"), RunState("e", "unsubmitted")]
    return Observation(states=states, infos=infos, failures=[], excluded=["node2"],
                       slurm_calls={"squeue": 1, "sacct": 1})


def test_gpu_hours_used_and_an_estimate_of_what_is_left() -> None:
    used, remaining = gpu_hours(observation())
    assert used == (1800 + 900 + 60) * 16 / 3600
    # c, d and e still to run, each at the median of the completed runs of its cell (1350 s)
    assert remaining == 3 * 1350 * 16 / 3600


def test_the_tables_show_counts_cells_failures_and_the_exclude_list() -> None:
    console = Console(file=io.StringIO(), width=140)
    for item in render(observation(), Path("results/demo"), 0.1):
        console.print(item)
    text = console.file.getvalue()
    assert "demo: 5 run(s)" in text and "node_fail" in text and "8b" in text
    assert "bad nodes excluded from later submissions: node2 (why: `sweep nodes" in text
    assert "1 sacct, 1 squeue" in text


def test_slurm_time_limits() -> None:
    assert [time_seconds(t) for t in ("30", "00:10:00", "1-02:00:00", "05:30", "")] == \
        [1800, 600, 93600, 330, 0]


def test_runs_a_search_chose_not_to_run_are_not_left_to_do(tmp_path: Path) -> None:
    """After a search, the candidates it skipped are rendered and never submitted: status shows
    them apart from the runs still to submit, and counts no GPU-hours for them."""
    (tmp_path / SEARCH_RUNS_FILE).write_text(
        "run_id,model,nodes,fate,round,status,reason\n"
        "a,8b,2,launched,1,completed,\n"
        "e,8b,2,skipped,,,shortlist: 8 runs predicted faster completed in its cell\n")
    skipped = skipped_by_search(tmp_path)
    assert skipped == {"e"} and skipped_by_search(tmp_path / "elsewhere") == frozenset()
    _, remaining = gpu_hours(observation(), skipped)
    assert remaining == 2 * 1350 * 16 / 3600  # c and d; not e
    console = Console(file=io.StringIO(), width=140)
    for item in render(observation(), tmp_path, 0.1, skipped):
        console.print(item)
    text = console.file.getvalue()
    assert re.search(r"skipped by the search +│ +1", text) and "unsubmitted" in text
    assert f"{tmp_path.name}: 5 run(s)" in text.splitlines()[0]  # the title on one line


def test_a_re_plan_that_had_nothing_to_learn_from_is_said_as_of_its_round(tmp_path: Path) -> None:
    """The one re-plan of a search was before round 1, when runs.parquet did not exist yet;
    the search has ended since and the file is there: the line says so, never `no such file`."""
    from sweep.core.state import append_jsonl
    from sweep.search.round_calibration import ROUNDS_FILE

    append_jsonl(tmp_path / ROUNDS_FILE, {"round": 0, "calibrated": False, "reason": (
        f"{tmp_path / 'runs.parquet'}: no such file; give the runs.parquet that `sweep run` or "
        "`sweep collect DIR` wrote (DIR/runs.parquet)")})
    assert "no such file" in str(calibration_line(tmp_path, {"phase": "searching", "round": 1}))
    (tmp_path / "runs.parquet").write_bytes(b"")
    assert calibration_line(tmp_path, {"phase": "searching", "round": 1}) == (
        "self-calibration before round 1: nothing to learn from yet (no attempt had been "
        "collected yet)")
    assert calibration_line(tmp_path, {"phase": "searching", "round": 2}) == (
        "self-calibration: the re-plan before round 1 had nothing to learn from (no attempt had "
        "been collected yet); round 2 is the current one")
    assert calibration_line(tmp_path, {"phase": "done", "round": 1}) == (
        "self-calibration: the re-plan before round 1 had nothing to learn from (no attempt had "
        "been collected yet); the search has ended since")


# -- every phase of a detached sweep, on the local cluster ----------------------------------

def status_lines(target: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["status", str(target)]) == 0
    return capsys.readouterr().out


def check_against_files(folder: Path, shown: str) -> None:
    """Each line of the driver and of the self-calibration says what the folder's files say
    now: the driver's job, phase, round and runs launched (driver.json, driver_progress.json),
    and no calibration line about a round other than the latest, nor a file missing that is
    there."""
    record, progress = read_record(folder), read_progress(folder)
    driver = next(line for line in shown.splitlines() if line.startswith("search driver:"))
    assert f"job {record['job_id']}," in driver
    assert f"phase {progress.get('phase')}," in driver
    assert f"round {progress.get('round', 0)}" in driver
    assert f"runs launched {progress.get('launched', 0)}," in driver
    if progress.get("summary"):
        assert progress["summary"] in shown
    calibration = [line for line in shown.splitlines() if "self-calibration" in line]
    rounds = read_rounds(folder)
    assert len(calibration) == (1 if rounds else 0), shown
    if rounds and rounds[-1].get("calibrated"):
        assert f"self-calibration after round {rounds[-1]['round']}:" in calibration[0]
    if rounds and not rounds[-1].get("calibrated"):
        assert f"before round {rounds[-1]['round'] + 1}" in calibration[0]
        if progress.get("phase") in ("done", "budget"):
            assert "the search has ended since" in calibration[0]
    if (folder / "runs.parquet").is_file():
        assert "no such file" not in shown.lower()
    assert "half-submitted" not in shown


def settled(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`sweep status` between two identical readings of the folder's driver files (the driver
    writes them as it goes: a line may only be checked against what it read)."""
    for _ in range(20):
        before = (read_progress(folder), len(read_rounds(folder)))
        shown = status_lines(folder, capsys)
        if (read_progress(folder), len(read_rounds(folder))) == before:
            return shown
    raise AssertionError("the driver's files never held still over one `sweep status`")


@pytest.mark.slurm
@pytest.mark.slow
def test_status_at_every_phase_of_a_detached_sweep_says_what_its_files_say(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.search import test_driver as detached

    monkeypatch.chdir(tmp_path)  # the spec's folder is results/<name>, as `sweep submit` chooses
    spec = detached.write_spec(tmp_path, sweep_name)
    folder = tmp_path / "results" / sweep_name

    # before submit: the spec is resolved, and there is nothing yet
    shown = status_lines(spec, capsys)
    assert shown.strip() == (f"{spec}: not submitted yet (no runs in results/{sweep_name}); "
                             f"`sweep submit {spec}` plans, renders and submits it")

    # submitted: the driver is recorded and the spec now shows its folder
    proc = subprocess.run([sys.executable, "-m", "sweep.cli", "submit", str(spec), "--strategy",
                           "adaptive", "--poll-s", "1", "--no-preflight"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    shown = status_lines(spec, capsys)
    assert "4 run(s)" in shown
    check_against_files(folder, shown)
    assert read_submit(folder)["phase"] == "done"

    # the driver running: a round in flight
    deadline = time.monotonic() + 90
    while not (read_progress(folder).get("phase") == "searching"
               and read_progress(folder).get("round")):
        assert time.monotonic() < deadline, read_progress(folder)
        time.sleep(0.2)
    check_against_files(folder, settled(folder, capsys))

    # finished
    progress = detached.wait_for_driver(folder, timeout_s=150)
    assert progress["phase"] == "done", progress
    shown = status_lines(spec, capsys)
    check_against_files(folder, shown)
    assert f"search driver: job {read_record(folder)['job_id']}, completed" in shown
