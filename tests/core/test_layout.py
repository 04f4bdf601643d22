"""The layout's columns: one definition, which the plan, the memory model and the tables key by."""

from dataclasses import fields

import numpy as np
import pytest

from sweep.core import layout
from sweep.core.catalog import get_model
from sweep.core.layout import (
    CELL,
    LAYOUT_COLUMNS,
    LAYOUT_COLUMNS_BEYOND_PLAYBOOK,
    LAYOUT_INT_COLUMNS,
    LAYOUT_MODE_COLUMNS,
    MEMORY_SAVINGS,
    MICRO_BATCHING,
    PARALLEL_DEGREES,
    PIPELINE_SCHEDULE,
    PLAYBOOK_LAYOUT_COLUMNS,
    ROW_KEY,
    Layout,
)


def test_the_columns_are_the_layout_fields_in_their_order():
    assert LAYOUT_COLUMNS == tuple(f.name for f in fields(Layout))
    assert list(Layout(dp=2, tp=1, pp=1).to_dict()) == list(LAYOUT_COLUMNS)


def test_the_groups_partition_the_columns_in_order():
    assert (*PARALLEL_DEGREES, *MICRO_BATCHING, *MEMORY_SAVINGS, *PIPELINE_SCHEDULE) \
        == LAYOUT_COLUMNS
    assert len(set(LAYOUT_COLUMNS)) == len(LAYOUT_COLUMNS)


@pytest.mark.parametrize("subset", [LAYOUT_INT_COLUMNS, LAYOUT_MODE_COLUMNS,
                                    PLAYBOOK_LAYOUT_COLUMNS, LAYOUT_COLUMNS_BEYOND_PLAYBOOK])
def test_every_variant_is_a_subset_in_the_layout_order(subset):
    assert subset == tuple(c for c in LAYOUT_COLUMNS if c in subset)


def test_the_integer_columns_are_the_fields_that_hold_integers():
    values = Layout(dp=2, tp=1, pp=1).to_dict()
    assert LAYOUT_INT_COLUMNS == tuple(k for k, v in values.items()
                                       if isinstance(v, int) and not isinstance(v, bool))
    assert set(LAYOUT_INT_COLUMNS) | set(LAYOUT_MODE_COLUMNS) == set(LAYOUT_COLUMNS)
    assert set(PLAYBOOK_LAYOUT_COLUMNS) | set(LAYOUT_COLUMNS_BEYOND_PLAYBOOK) == set(LAYOUT_COLUMNS)


def test_a_row_key_is_a_layout_in_its_cell():
    assert ROW_KEY == (*CELL, *LAYOUT_COLUMNS) == ("model", "nodes", *LAYOUT_COLUMNS)


def test_the_memory_model_keys_by_the_layout_columns():
    from sweep.models import memory

    one = {k: np.asarray([v]) for k, v in Layout(dp=2, tp=2, pp=2).to_dict().items()}
    memory.estimate_columns(get_model("tiny-4l"), one, seq_len=128)
    for name in LAYOUT_COLUMNS:
        without = {k: v for k, v in one.items() if k != name}
        with pytest.raises(ValueError, match=rf"missing columns \['{name}'\]"):
            memory.estimate_columns(get_model("tiny-4l"), without, seq_len=128)


def test_the_plan_space_keys_by_the_layout_columns():
    from sweep.plan import space
    from sweep.plan.spec import OVERRIDE_COLUMNS, load_spec

    frame = space.plan(load_spec("examples/local-cpu.yaml"))
    columns = list(frame.columns)
    assert columns[columns.index("dp"):columns.index("dp") + len(LAYOUT_COLUMNS)] \
        == list(LAYOUT_COLUMNS)
    row = frame.iloc[-1]
    assert space.layout_of(row).to_dict() == {k: row[k] for k in LAYOUT_COLUMNS}
    assert set(OVERRIDE_COLUMNS) == set(ROW_KEY) - {"vpp"}


def test_the_search_keys_split_the_layout_by_what_has_a_memory_order():
    from sweep.search import oom_rules

    ordered = set(MICRO_BATCHING) | set(MEMORY_SAVINGS)  # `memory_order` ranks these
    assert set(oom_rules.PROOF_BASE) == set(LAYOUT_COLUMNS) - ordered
    assert oom_rules.CELL == layout.CELL
