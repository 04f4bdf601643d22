"""Best config per (model, nodes) cell. Oracle: the playbook's own published heatmap.

Ranked by the published MFU, the playbook's 1B and 8B runs must give back every cell of
playbook_best_configs_heatmap.csv: the layout exactly, MFU and memory to 2 decimals.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.best import BEST_CSV_COLUMNS, best_configs, best_csv_frame
from analysis.flags import basis_flags, selection_flags, value_flags
from sweep.collect.schema import to_table
from sweep.validation.playbook_import import import_playbook

RAW = re.compile(r"DP:(\d+)TP:(\d+)PP:(\d+) \| GAS:(\d+)MBS:(\d+) \| ZeRO-(\d)")


def frame(path: Path) -> pd.DataFrame:
    return to_table(import_playbook(path)).to_pandas()


@pytest.fixture(scope="module")
def runs(refdata: Path) -> pd.DataFrame:
    return frame(refdata / "playbook_runs_1B_8B.csv")


@pytest.fixture(scope="module")
def published(refdata: Path) -> pd.DataFrame:
    heatmap = pd.read_csv(refdata / "playbook_best_configs_heatmap.csv")
    return heatmap[heatmap["model_label"].isin(["1B", "8B"])].reset_index(drop=True)


@pytest.mark.parametrize("source", ["playbook_runs_1B_8B.csv", "playbook_bench_full_1B_8B.csv"])
def test_published_mfu_ranking_reproduces_the_playbook_heatmap(refdata, published, source) -> None:
    """Both published tables (the charts' runs and the sweep's own results) give the heatmap."""
    runs = frame(refdata / source)
    best = best_configs(runs, metric="mfu", convention="reported").set_index(["model", "nodes"])
    assert len(published) == 14 and len(best) == 14
    for _, cell in published.iterrows():
        ours = best.loc[(cell["model_label"], cell["nodes"])]
        layout = tuple(int(v) for v in RAW.fullmatch(cell["raw_config_text"]).groups())
        assert (ours["dp"], ours["tp"], ours["pp"], ours["grad_acc"], ours["mbs"],
                ours["zero_stage"]) == layout, (cell["model_label"], cell["nodes"])
        assert round(ours["mfu_pct"], 2) == cell["mfu_pct"]
        assert round(ours["gpu_memory_GB"], 2) == cell["gpu_memory_GB"]
        assert ours["empty_reason"] == ""


def test_best_configs_csv_has_the_issue_columns_at_full_precision(runs) -> None:
    table = best_csv_frame(best_configs(runs))
    assert tuple(table.columns) == BEST_CSV_COLUMNS
    first = table.iloc[0]
    assert first["mfu_pct"] == pytest.approx(44.32406064372896, rel=1e-15)  # not rounded
    assert (first["cp"], first["ep"], first["recompute"]) == (1, 1, "none")


def test_a_consistent_basis_explains_the_pp2_cells(runs) -> None:
    """refdata README: PP>1 runs of the tied 1B count the vocabulary twice (+16.7 % MFU)."""
    published = best_configs(runs, "mfu", "reported").set_index(["model", "nodes"])
    for metric, convention in (("mfu", "full_attention"), ("tokens_per_sec_per_gpu", "full_attention")):
        fair = best_configs(runs, metric, convention).set_index(["model", "nodes"])
        changed = sorted(key for key in fair.index
                         if fair.loc[key, "run_id"] != published.loc[key, "run_id"])
        assert changed == [("1B", 1), ("1B", 2), ("1B", 4), ("1B", 8)]
        for key in changed:
            assert published.loc[key, "pp"] == 2 and fair.loc[key, "pp"] == 1
            assert fair.loc[key, "tokens_per_sec_per_gpu"] > published.loc[key, "tokens_per_sec_per_gpu"]
    flags = selection_flags(runs, "mfu", "reported")
    assert sorted((f.model, f.nodes) for f in flags) == [("1B", 1), ("1B", 2), ("1B", 4), ("1B", 8)]
    assert all("not on one basis" in f.message and "faster run loses" in f.message for f in flags)
    (basis,) = basis_flags(runs)
    assert basis.model == "1B" and "it follows pp" in basis.message and "6·V·h" in basis.message


def test_an_empty_cell_says_why(refdata: Path) -> None:
    runs = frame(refdata / "playbook_bench_full_1B_8B.csv")
    one_node_8b = (runs["model_label"] == "8B") & (runs["nodes"] == 1)
    failed_only = runs[~one_node_8b | (runs["outcome"] != "completed")]
    best = best_configs(failed_only).set_index(["model", "nodes"])
    cell = best.loc[("8B", 1)]
    counts = failed_only[(failed_only["model_label"] == "8B") & (failed_only["nodes"] == 1)][
        "outcome"].value_counts()
    assert pd.isna(cell["run_id"])
    assert cell["empty_reason"] == ("no successful run: "
                                    + ", ".join(f"{n} {o}" for o, n in counts.items()))
    oom_only = failed_only[~(failed_only["model_label"].eq("8B") & failed_only["nodes"].eq(1))
                           | failed_only["outcome"].eq("oom")]
    assert best_configs(oom_only).set_index(["model", "nodes"]).loc[("8B", 1), "empty_reason"] == \
        f"no successful run: all {counts['oom']} oom"


def test_ties_break_on_throughput_then_run_id(runs) -> None:
    cell = runs[(runs["model_label"] == "8B") & (runs["nodes"] == 2) & (runs["outcome"] == "completed")]
    twin = cell.copy()
    twin["run_id"] = "zzz-" + twin["run_id"]
    winner = best_configs(pd.concat([twin, cell])).iloc[0]
    assert not winner["run_id"].startswith("zzz-")


def test_impossible_mfu_is_flagged(runs) -> None:
    broken = runs.copy()
    broken.loc[broken.index[0], "mfu_full_attention"] = 1.7
    kinds = [f.kind for f in value_flags(broken)]
    assert "mfu-above-1" in kinds and "mfu-above-1" not in [f.kind for f in value_flags(runs)]


def test_a_cell_the_planner_pruned_says_by_which_rules(runs) -> None:
    plan = pd.DataFrame({"model": ["playbook-80b"] * 3 + ["playbook-8b"],
                         "nodes": [1, 1, 2, 128],
                         "status": ["pruned:memory", "pruned:memory", "pruned:pp_layers", "kept"],
                         "prune_rule": ["memory", "memory", "pp_layers", None]})
    best = best_configs(runs, plan=plan).set_index(["model", "nodes"])
    assert best.loc[("playbook-80b", 1), "empty_reason"] == "not run: all 2 configurations pruned (memory 2)"
    assert best.loc[("playbook-80b", 2), "empty_reason"] == \
        "not run: all 1 configurations pruned (pp_layers 1)"
    assert best.loc[("8B", 128), "empty_reason"] == "not run: 1 planned configuration(s) without an attempt"
    assert best.loc[("1B", 1), "pp"] == 2  # cells that ran are unchanged


def test_completed_runs_that_cannot_be_ranked_are_flagged(runs) -> None:
    from analysis.flags import coverage_flags

    assert coverage_flags(runs, "mfu", "reported") == []
    partial = runs.copy()
    partial.loc[partial["outcome"] == "completed", "mfu_reported"] = None
    (flag,) = coverage_flags(partial.head(40), "mfu", "reported")
    completed = int((partial.head(40)["outcome"] == "completed").sum())
    assert flag.kind == "not-ranked" and flag.message.startswith(f"{completed} completed attempt(s)")
    assert coverage_flags(partial, "mfu", "full_attention") == []
