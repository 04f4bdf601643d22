"""Failure breakdown counts: one row per placed cell, outcome classes in the schema's order."""

from __future__ import annotations

from analysis.figures import outcome_counts
from sweep.schema import to_table


def test_counts_per_cell_by_class_leave_out_attempts_without_a_configuration() -> None:
    rows = [{"model_label": "1B", "nodes": 2, "outcome": o} for o in ("oom", "completed", "oom")]
    rows += [{"model_label": "1B", "nodes": 1, "outcome": "timeout"},
             {"model_label": None, "nodes": None, "outcome": "crashed"}]  # no run.json
    counts = outcome_counts(to_table(rows).to_pandas())
    assert list(counts.columns) == ["completed", "oom", "timeout"]  # schema order, no `crashed`
    assert counts.loc[("1B", 2)].to_dict() == {"completed": 1, "oom": 2, "timeout": 0}
    assert list(counts.index) == [("1B", 1), ("1B", 2)]
