"""`sweep status` output from one observation (no cluster: the poll itself is tested live in
tests/commands/test_submit.py and test_resume.py)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from sweep.backends.slurm.observation import Observation
from sweep.backends.slurm.submission import RunState
from sweep.backends.slurm.sweep_folder import SEARCH_RUNS_FILE, RunInfo, skipped_by_search, time_seconds
from sweep.commands.status import gpu_hours, render


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
    assert "skipped by the search │    1" in text and "unsubmitted" in text
