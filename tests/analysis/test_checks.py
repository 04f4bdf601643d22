"""A run whose numbers fail a check never wins a cell; the cell is marked and the flags say why.

The issue's CPU demo: the heatmap showed 464.22 % MFU as a best cell, unmarked, while flags.md
knew. Tables here are small runs.parquet frames built by hand (conftest.py).
"""

from __future__ import annotations

import pandas as pd

from analysis.best import best_configs
from analysis.checks import MARK, check_failures
from analysis.flags import all_flags, check_flags, collect_issue_flags, coverage_flags
from analysis.tables import best_display, check_footnotes, to_latex, to_markdown


def cell(best: pd.DataFrame, model: str, nodes: int) -> pd.Series:
    return best.set_index(["model", "nodes"]).loc[(model, nodes)]


def test_impossible_mfu_and_disagreeing_collect_issues_fail_a_check(cpu_runs) -> None:
    reasons = dict(zip(cpu_runs["run_id"], check_failures(cpu_runs)))
    (impossible,) = reasons["impossible"]
    assert "MFU above 1" in impossible and "mfu_full_attention 4.639" in impossible
    assert reasons["disputed"] == [f"collect: {cpu_runs.loc[1, 'collect_issues'][0]}"]
    # a torn line skipped leaves the numbers standing: no check fails
    assert reasons["clean"] == reasons["two-node"] == reasons["oom"] == []


def test_a_run_that_fails_a_check_is_never_the_best(cpu_runs) -> None:
    for metric in ("mfu", "tokens_per_sec_per_gpu"):
        for convention in ("reported", "full_attention", "6N"):
            best = best_configs(cpu_runs, metric, convention)
            assert best["mfu_pct"].max() <= 100.0
            one = cell(best, "tiny-4l", 1)
            assert one["run_id"] == "clean", (metric, convention)
            assert one["n_failed_checks"] == 2
            assert "impossible#1: MFU above 1" in one["failed_checks"]
            assert "disputed#1: collect: the log's tokens/s" in one["failed_checks"]
            assert cell(best, "tiny-4l", 2)["n_failed_checks"] == 0


def test_a_cell_where_every_completed_run_failed_a_check_says_so(cpu_runs) -> None:
    runs = cpu_runs[cpu_runs["run_id"] != "clean"]
    one = cell(best_configs(runs), "tiny-4l", 1)
    assert pd.isna(one["run_id"])
    assert one["empty_reason"] == "no trusted run: 2 completed run(s) failed a check"


def test_the_tables_mark_the_cell_and_a_footnote_names_the_runs(cpu_runs) -> None:
    best = best_configs(cpu_runs, "mfu", "full_attention")
    display = best_display(best).set_index(["Model", "Nodes"])
    assert display.loc[("tiny-4l", "1"), "MFU (%) (ranked)"] == f"60.00 {MARK}"
    assert display.loc[("tiny-4l", "2"), "MFU (%) (ranked)"] == "48.00"
    (note,) = check_footnotes(best)
    assert note.startswith(f"{MARK} tiny-4l, 1 node(s): 2 completed run(s) left out")
    assert "impossible#1" in note and "disputed#1" in note
    frame = best_display(best)
    markdown = to_markdown(frame, [note])
    assert markdown.splitlines()[1].count("---:") == 12  # the mark keeps the column numeric
    assert markdown.rstrip().endswith(note.rstrip())
    assert r"\footnotesize ! tiny-4l, 1 node(s)" in to_latex(frame, "c", "tab:x", [note])


def test_the_flags_name_each_failed_run_and_why(cpu_runs) -> None:
    flags = check_flags(cpu_runs)
    assert [(f.kind, f.model, f.nodes) for f in flags] == [("failed-check", "tiny-4l", 1)] * 2
    assert flags[0].message.startswith("impossible#1 is left out of every ranking: MFU above 1")
    assert flags[1].message.startswith("disputed#1 is left out of every ranking: collect: the log")
    kinds = [f.kind for f in all_flags(cpu_runs, "mfu", "reported")]
    assert kinds.count("failed-check") == 2 and "mfu-above-1" in kinds


def test_every_collect_issue_of_every_run_is_a_flag(cpu_runs, make_runs) -> None:
    """The winner of the two-node cell has a harmless issue: it must still be listed, and so
    must an attempt without run.json (no cell)."""
    runs = pd.concat([cpu_runs, make_runs([{
        "run_id": "no-config", "attempt": 1, "outcome": "crashed",
        "collect_issues": ["run.json: missing; configuration columns are empty",
                           "status.json missing: verdict taken from the node files"]}])],
        ignore_index=True)
    flags = collect_issue_flags(runs)
    assert [(f.model, f.nodes) for f in flags] == [("tiny-4l", 1), ("tiny-4l", 2), ("*", None)]
    text = "\n".join(f.message for f in flags)
    for issues in runs["collect_issues"]:
        for issue in issues:
            assert issue in text
    assert "two-node#1 (completed): metrics.jsonl: 1 unreadable line(s)" in text


def test_not_ranked_gives_each_runs_own_reason(run_row, make_runs) -> None:
    corrupt = ("metrics.jsonl: unreadable (JSONDecodeError: Expecting value: line 1 column 1 "
               "(char 0))")
    runs = make_runs([
        run_row("ok", 1000.0),
        run_row("corrupt", None,
                issues=(corrupt, "metrics.jsonl: no step records for a completed attempt")),
        run_row("no-mfu", 900.0, mfu_reported=None, mfu_reported_convention=None),
    ])
    (flag,) = coverage_flags(runs, "mfu", "reported")
    assert flag.message.startswith("2 completed attempt(s) have no mfu_reported")
    corrupt_part, no_mfu_part = flag.message.split(" | ")
    assert corrupt_part.endswith(f"corrupt#1: no throughput was measured (no metrics were read); "
                                 f"collect: {corrupt}; metrics.jsonl: no step records for a "
                                 "completed attempt")
    assert "logs no MFU" not in corrupt_part
    assert no_mfu_part == ("no-mfu#1: its framework logs no MFU; --convention full_attention "
                           "recomputes one")
    (full,) = coverage_flags(runs, "mfu", "full_attention")
    assert "corrupt#1: no throughput was measured" in full.message and "no-mfu" not in full.message
