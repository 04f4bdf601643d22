"""sweep.core.yaml_locate: lines and field names for errors in a YAML file (what `sweep.plan.spec` reports
them with; tests/plan/test_spec.py checks the errors themselves)."""

from __future__ import annotations

import yaml

from sweep.core.yaml_locate import field_path, first_duplicate_key, line_of

TEXT = """\
name: demo
run:
  env: {A: '1'}
  steps: 5
overrides:
  - where: {model: x}
    set: {steps: 2}
"""


def tree(text: str) -> yaml.Node:
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    assert node is not None
    return node


def test_the_line_is_the_deepest_node_the_location_reaches() -> None:
    root = tree(TEXT)
    assert line_of(root, ("run", "steps")) == 4
    assert line_of(root, ("overrides", 0, "set", "steps")) == 7
    assert line_of(root, ("run", "time_limit")) == 3  # absent: where its mapping starts
    assert line_of(None, ("run",)) == 0


def test_a_repeated_key_is_found_at_any_depth_with_both_lines() -> None:
    assert first_duplicate_key(tree(TEXT)) is None
    assert first_duplicate_key(tree(TEXT + "run: {steps: 1}\n")) == ("run", 2, 8)
    nested = TEXT.replace("    set: {steps: 2}\n", "    set: {steps: 2}\n    set: {steps: 3}\n")
    assert first_duplicate_key(tree(nested)) == ("overrides[0].set", 7, 8)


def test_pydantic_locations_read_as_the_fields_a_user_wrote() -> None:
    assert field_path(("run", "env")) == "run.env"
    assert field_path(("models", 0, "str")) == "models[0]"  # a union branch marker dropped
    assert field_path(()) == "(top level)"
